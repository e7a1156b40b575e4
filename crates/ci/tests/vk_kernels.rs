//! Every decode kernel on lavapipe against the CPU reference
//! (`decode::model::cpu::f32_model`), over several shapes including odd sizes, and a
//! ready vector that mixes prefill chunks with single decode tokens of
//! different sequence lengths (KV append + attention over the paged cache).
//!
//! Matmul and attention have a GPU form (workgroup memory, barriers) and a CPU
//! form (barrier-free); both are checked here.
//!
//! Tolerance: `TOL` = 1e-4 absolute on values of magnitude ~1 (f32, different
//! summation order); gathers, copies and argmax are exact.

mod rig_support;
#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use rig_support::{Rig, rand_vec};
use vk_support::max_abs_diff;
use xtc_model::cpu::f32_model::{self, CpuKvCache, EPS};
use xtc_model::vulkan::ops::{
    Argmax, Attention, Embed, KvAppend, Matmul, RmsNorm, Rope, SwiGlu, Variant, pack_metadata,
};
use xtc_model::{BatchPlan, Config, KvGeometry, SeqWork};

const TOL: f32 = 1e-4;

#[test]
fn embed_gathers_rows_for_odd_shapes() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(1);
    for (vocab, dim, rows) in [(1, 1, 1), (37, 5, 3), (512, 67, 33), (100, 128, 70)] {
        let table = rand_vec(&mut rng, vocab * dim);
        let toks: Vec<u32> = (0..rows).map(|_| rng.u32(0..vocab as u32)).collect();
        let md: Vec<u32> = toks.iter().flat_map(|&t| [t, 0, 0, 0]).collect();
        let mut rig = Rig::new(&dev, [vocab * dim, rows * dim, 1, md.len(), 1]);
        rig.write(0, 0, &table);
        rig.write(3, 0, &md);
        let op = Embed {
            n_rows: rows as u32,
            dim: dim as u32,
            rows_off: 0,
            emb_off: 0,
            x_off: 0,
        };
        rig.run(|ops, rec| ops.run(rec, &op).unwrap());
        let got: Vec<f32> = rig.read(1, 0, rows * dim);
        let want: Vec<f32> = toks
            .iter()
            .flat_map(|&t| table[t as usize * dim..][..dim].to_vec())
            .collect();
        assert_eq!(got, want, "vocab {vocab} dim {dim} rows {rows}");
    }
}

#[test]
fn rmsnorm_matches_reference_with_and_without_a_row_list() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(2);
    for (dim, rows) in [(1, 1), (7, 3), (64, 5), (130, 2), (300, 9)] {
        let x = rand_vec(&mut rng, rows * dim);
        let w = rand_vec(&mut rng, dim);
        let list: Vec<u32> = (0..rows as u32).rev().step_by(2).collect();
        let mut rig = Rig::new(&dev, [dim, 3 * rows * dim, 1, list.len(), 1]);
        rig.write(0, 0, &w);
        rig.write(1, 0, &x);
        rig.write(3, 0, &list);
        let (d, r) = (dim as u32, rows as u32);
        let all = RmsNorm {
            n_rows: r,
            dim: d,
            in_off: 0,
            out_off: r * d,
            w_off: 0,
            row_list: u32::MAX,
            eps: EPS,
            row_base: 0,
        };
        let some = RmsNorm {
            n_rows: list.len() as u32,
            out_off: 2 * r * d,
            row_list: 0,
            ..all
        };
        rig.run(|ops, rec| {
            ops.run(rec, &all).unwrap();
            ops.run(rec, &some).unwrap();
        });
        let mut want = vec![0f32; dim];
        for (i, got) in rig
            .read::<f32>(1, rows * dim, rows * dim)
            .chunks(dim)
            .enumerate()
        {
            f32_model::rmsnorm(&mut want, &x[i * dim..][..dim], &w);
            assert!(max_abs_diff(got, &want) <= TOL, "dim {dim} row {i}");
        }
        for (j, got) in rig
            .read::<f32>(1, 2 * rows * dim, list.len() * dim)
            .chunks(dim)
            .enumerate()
        {
            f32_model::rmsnorm(&mut want, &x[list[j] as usize * dim..][..dim], &w);
            assert!(max_abs_diff(got, &want) <= TOL, "dim {dim} listed row {j}");
        }
    }
}

#[test]
fn matmul_matches_reference_over_odd_shapes_and_accumulates() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(3);
    let shapes = [
        (1, 1, 1),
        (1, 17, 33),
        (5, 64, 64),
        (33, 47, 129),
        (70, 16, 15),
        (3, 300, 200),
    ];
    for ((m, n, k), variant) in shapes
        .into_iter()
        .flat_map(|s| [(s, Variant::Gpu), (s, Variant::Cpu)])
    {
        let x = rand_vec(&mut rng, m * k);
        let w = rand_vec(&mut rng, n * k);
        let y0 = rand_vec(&mut rng, m * n);
        let mut rig = Rig::with_variant(&dev, [n * k, m * k + 2 * m * n, 1, 1, 1], variant);
        rig.write(0, 0, &w);
        rig.write(1, 0, &x);
        rig.write(1, m * k + m * n, &y0);
        let (mu, nu, ku) = (m as u32, n as u32, k as u32);
        let set = Matmul::plain(mu, nu, ku, 0, 0, mu * ku, false);
        let add = Matmul::plain(mu, nu, ku, 0, 0, mu * ku + mu * nu, true);
        rig.run(|ops, rec| {
            ops.run(rec, &set).unwrap();
            ops.run(rec, &add).unwrap();
        });
        let got_set: Vec<f32> = rig.read(1, m * k, m * n);
        let got_add: Vec<f32> = rig.read(1, m * k + m * n, m * n);
        let mut want = vec![0f32; n];
        for r in 0..m {
            f32_model::matmul(&mut want, &x[r * k..][..k], &w);
            let tol = TOL * (k as f32).sqrt();
            assert!(
                max_abs_diff(&got_set[r * n..][..n], &want) <= tol,
                "({m},{n},{k}) row {r}"
            );
            let with_y: Vec<f32> = want.iter().zip(&y0[r * n..]).map(|(a, b)| a + b).collect();
            assert!(
                max_abs_diff(&got_add[r * n..][..n], &with_y) <= tol,
                "{variant:?} ({m},{n},{k}) accumulate row {r}"
            );
        }
    }
}

/// One dispatch over stacked weights (q|k|v, w1|w3) writes each column range
/// to its own region, in both forms.
#[test]
fn split_matmul_writes_each_column_range_to_its_region() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(6);
    let shapes = [
        (1, 5, [3, 2, 2]),
        (6, 33, [16, 8, 8]),
        (37, 64, [64, 32, 32]),
        (9, 20, [7, 7, 0]),
    ];
    for ((m, k, ns), variant) in shapes
        .into_iter()
        .flat_map(|s| [(s, Variant::Gpu), (s, Variant::Cpu)])
    {
        let n: usize = ns.iter().map(|&v| v as usize).sum();
        let x = rand_vec(&mut rng, m * k);
        let w = rand_vec(&mut rng, n * k);
        // Regions in reverse order, apart from each other.
        let ys = [m * k + 2 * m * n, m * k + m * n, m * k];
        let mut rig = Rig::with_variant(&dev, [n * k, m * k + 3 * m * n, 1, 1, 1], variant);
        rig.write(0, 0, &w);
        rig.write(1, 0, &x);
        let op = Matmul::split(m as u32, k as u32, ns, 0, 0, ys.map(|y| y as u32));
        rig.run(|ops, rec| ops.run(rec, &op).unwrap());
        let mut want = vec![0f32; n];
        for r in 0..m {
            f32_model::matmul(&mut want, &x[r * k..][..k], &w);
            let mut col = 0;
            for (part, &np) in ns.iter().enumerate() {
                let np = np as usize;
                let got: Vec<f32> = rig.read(1, ys[part] + r * np, np);
                let d = max_abs_diff(&got, &want[col..col + np]);
                assert!(
                    d <= TOL * (k as f32).sqrt(),
                    "{variant:?} m {m} k {k} part {part} row {r}: {d}"
                );
                col += np;
            }
        }
    }
}

#[test]
fn rope_matches_run_c_convention_at_many_positions() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(4);
    for (n_heads, n_kv, hs) in [(1, 1, 2), (4, 2, 8), (3, 1, 6), (4, 4, 32)] {
        let (dim, kvd) = (n_heads * hs, n_kv * hs);
        let pos = [0u32, 1, 7, 63, 200, 1000];
        let rows = pos.len();
        let q = rand_vec(&mut rng, rows * dim);
        let k = rand_vec(&mut rng, rows * kvd);
        let md: Vec<u32> = pos.iter().flat_map(|&p| [0, 0, p, 0]).collect();
        let mut rig = Rig::new(&dev, [1, rows * (dim + kvd), 1, md.len(), 1]);
        rig.write(1, 0, &q);
        rig.write(1, rows * dim, &k);
        rig.write(3, 0, &md);
        let op = Rope {
            n_rows: rows as u32,
            dim: dim as u32,
            kv_dim: kvd as u32,
            head_size: hs as u32,
            rows_off: 0,
            q_off: 0,
            k_off: (rows * dim) as u32,
        };
        rig.run(|ops, rec| ops.run(rec, &op).unwrap());
        let (gq, gk): (Vec<f32>, Vec<f32>) = (
            rig.read(1, 0, rows * dim),
            rig.read(1, rows * dim, rows * kvd),
        );
        for (r, &p) in pos.iter().enumerate() {
            let (mut wq, mut wk) = (q[r * dim..][..dim].to_vec(), k[r * kvd..][..kvd].to_vec());
            f32_model::rope(&mut wq, &mut wk, p as usize, hs);
            // Angles up to 1000 rad: f32 argument rounding dominates the error.
            let tol = 1e-3;
            assert!(
                max_abs_diff(&gq[r * dim..][..dim], &wq) <= tol,
                "q hs {hs} pos {p}"
            );
            assert!(
                max_abs_diff(&gk[r * kvd..][..kvd], &wk) <= tol,
                "k hs {hs} pos {p}"
            );
        }
    }
}

#[test]
fn swiglu_and_argmax_match_reference() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(5);
    for (rows, hidden) in [(1, 1), (3, 65), (17, 384)] {
        let h1: Vec<f32> = rand_vec(&mut rng, rows * hidden)
            .iter()
            .map(|v| v * 6.0)
            .collect();
        let h3 = rand_vec(&mut rng, rows * hidden);
        let mut rig = Rig::new(&dev, [1, 2 * rows * hidden, 1, 1, 1]);
        rig.write(1, 0, &h1);
        rig.write(1, rows * hidden, &h3);
        let op = SwiGlu {
            n_rows: rows as u32,
            hidden_dim: hidden as u32,
            h1_off: 0,
            h3_off: (rows * hidden) as u32,
        };
        rig.run(|ops, rec| ops.run(rec, &op).unwrap());
        let mut want = h1.clone();
        f32_model::swiglu(&mut want, &h3);
        assert!(max_abs_diff(&rig.read::<f32>(1, 0, rows * hidden), &want) <= TOL);
    }
    for vocab in [1usize, 63, 64, 65, 1000] {
        let rows = 4;
        let mut logits = rand_vec(&mut rng, rows * vocab);
        if vocab > 10 {
            // Row 1: a tie between positions 3 and vocab-1 (the lowest wins);
            // row 2: the maximum at the last position.
            logits[vocab + 3] = 5.0;
            logits[2 * vocab - 1] = 5.0;
            logits[3 * vocab - 1] = 9.0;
        }
        let mut rig = Rig::new(&dev, [1, rows * vocab, 1, 1, rows + 2]);
        rig.write(1, 0, &logits);
        let op = Argmax {
            n_rows: rows as u32,
            vocab: vocab as u32,
            logits_off: 0,
            out_off: 2,
        };
        rig.run(|ops, rec| ops.run(rec, &op).unwrap());
        let want: Vec<u32> = logits.chunks(vocab).map(f32_model::argmax).collect();
        assert_eq!(rig.read::<u32>(4, 2, rows), want, "vocab {vocab}");
    }
}

/// A ready vector mixing prefill chunks and decode tokens of sequences with
/// different cached lengths: KV append into the paged cache, then attention
/// of every (row, head), against the reference, for several head layouts.
#[test]
fn kv_append_and_attention_over_a_mixed_vector() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    for (n_heads, n_kv, hs, bs) in [
        (4, 2, 32, 16),
        (3, 1, 6, 4),
        (2, 1, 64, 8),
        (2, 2, 130, 5),
        (1, 1, 256, 8),
    ] {
        for variant in [Variant::Gpu, Variant::Cpu] {
            check_attention(&dev, variant, (n_heads, n_kv, hs), bs);
        }
    }
}

fn check_attention(
    dev: &xtc_vk::Device,
    variant: Variant,
    heads: (usize, usize, usize),
    bs: usize,
) {
    let (n_heads, n_kv, hs) = heads;
    let mut rng = fastrand::Rng::with_seed((n_heads * 1000 + hs) as u64);
    let c = Config {
        dim: n_heads * hs,
        hidden_dim: 8,
        n_layers: 2,
        n_heads,
        n_kv_heads: n_kv,
        vocab_size: 16,
        seq_len: 200,
    };
    let (dim, kvd) = (c.dim, c.kv_dim());
    let geo = KvGeometry {
        block_size: bs,
        n_blocks: 300 / bs + 40,
    };
    // (cached positions, new tokens): decode after 0 / 1 / 70 cached, prefill chunks.
    let shape = [
        (70usize, 1usize),
        (0, 9),
        (1, 1),
        (13, 20),
        (0, 1),
        (129, 3),
    ];
    let mut next_block = 0u32;
    let seqs: Vec<SeqWork> = shape
        .iter()
        .map(|&(cached, n)| {
            let blocks = (cached + n).div_ceil(bs) as u32;
            let bt: Vec<u32> = (next_block..next_block + blocks).rev().collect(); // non-contiguous order
            next_block += blocks;
            SeqWork {
                tokens: vec![0; n],
                start_pos: cached,
                block_table: bt,
                sample: true,
            }
        })
        .collect();
    let plan = BatchPlan { seqs };
    plan.validate(&c, geo).unwrap();
    let mut cache = CpuKvCache::new(&c, geo);
    let layer = 1;
    for s in &plan.seqs {
        for p in 0..s.start_pos {
            cache.append(
                layer,
                &s.block_table,
                p,
                &rand_vec(&mut rng, kvd),
                &rand_vec(&mut rng, kvd),
            );
        }
    }
    let rows = plan.n_tokens();
    let (q, k, v) = (
        rand_vec(&mut rng, rows * dim),
        rand_vec(&mut rng, rows * kvd),
        rand_vec(&mut rng, rows * kvd),
    );
    let mut md = vec![];
    pack_metadata(&plan, bs, &mut md);
    let (kc, vc) = cache.raw();
    let elems = [1, rows * (2 * dim + 2 * kvd), kc.len() * 2, md.len(), 1];
    let mut rig = Rig::with_variant(dev, elems, variant);
    rig.write(1, 0, &q);
    rig.write(1, rows * dim, &k);
    rig.write(1, rows * (dim + kvd), &v);
    rig.write(2, 0, kc);
    rig.write(2, kc.len(), vc);
    rig.write(3, 0, &md);
    let layer_len = (geo.n_blocks * bs * kvd) as u32;
    let (kc_off, vc_off) = (layer as u32 * layer_len, (2 + layer as u32) * layer_len);
    let r = rows as u32;
    let app = KvAppend {
        n_rows: r,
        kv_dim: kvd as u32,
        block_size: bs as u32,
        rows_off: 0,
        k_off: r * dim as u32,
        v_off: r * (dim + kvd) as u32,
        kc_off,
        vc_off,
    };
    let att = Attention {
        n_rows: r,
        n_heads: n_heads as u32,
        n_kv_heads: n_kv as u32,
        head_size: hs as u32,
        block_size: bs as u32,
        rows_off: 0,
        q_off: 0,
        out_off: r * (dim + 2 * kvd) as u32,
        kc_off,
        vc_off,
        kv_dim: kvd as u32,
        dim: dim as u32,
        max_pos: plan
            .seqs
            .iter()
            .map(|s| s.start_pos + s.tokens.len() - 1)
            .max()
            .unwrap() as u32,
    };
    rig.run(|ops, rec| {
        ops.run(rec, &app).unwrap();
        rec.barrier();
        ops.run(rec, &att).unwrap();
    });
    // The reference appends row by row, then attends each row over 0..=pos.
    let mut row = 0;
    let mut want = vec![0f32; dim];
    let got: Vec<f32> = rig.read(1, rows * (dim + 2 * kvd), rows * dim);
    for s in &plan.seqs {
        for i in 0..s.tokens.len() {
            cache.append(
                layer,
                &s.block_table,
                s.start_pos + i,
                &k[(row + i) * kvd..][..kvd],
                &v[(row + i) * kvd..][..kvd],
            );
        }
        for i in 0..s.tokens.len() {
            f32_model::attention(
                &mut want,
                &q[(row + i) * dim..][..dim],
                &cache,
                &c,
                layer,
                &s.block_table,
                s.start_pos + i,
            );
            let d = max_abs_diff(&got[(row + i) * dim..][..dim], &want);
            assert!(
                d <= TOL,
                "{variant:?} heads {n_heads}/{n_kv} hs {hs} row {} pos {}: {d}",
                row + i,
                s.start_pos + i
            );
        }
        row += s.tokens.len();
    }
    let (kc, vc) = cache.raw();
    assert_eq!(rig.read::<f32>(2, 0, kc.len()), kc, "K cache after append");
    assert_eq!(
        rig.read::<f32>(2, kc.len(), vc.len()),
        vc,
        "V cache after append"
    );
}
