//! The quantized kernels (`kernels/qmatmul.wgsl`, `rope_tab`) against their
//! CPU references (`decode::model::qops`), in both forms: the CPU-device form
//! (weights in the weight image, x through the uniform window, chunked) and
//! the GPU form (weights in the storage buffer, workgroup tiles), on the
//! default device (lavapipe in CI; with `CI` set a missing device fails).

mod vk_support;

use xtc::decode::model::gguf::GgmlType;
use xtc::decode::model::ops::{Ops, Rope, Variant};
use xtc::decode::model::qops::{
    ArgmaxPart, QEmbed, QMatmul, RopeKv, RopeTable, argmax_groups, reference_embed, reference_glu,
    reference_matmul, reference_norm_matmul, reference_rope, rope_table,
};
use xtc::decode::model::quant::{self, QMatrix};
use xtc::decode::model::qweights::{QTensor, TexelStream};
use xtc::decode::model::sampling::argmax;
use xtc::vk::{
    BindingSet, Buffer, CommandPool, Device, Kernels, Location, StorageImage, TexelFormat,
};

const TYPES: [GgmlType; 5] = [
    GgmlType::Q4_1,
    GgmlType::Q4_0,
    GgmlType::Q8_0,
    GgmlType::F16,
    GgmlType::F32,
];

/// The kernel ABI's buffers (host-visible) with a texel stream in the
/// weight image and at the start of the weights buffer (f32 data after it).
struct QRig {
    ops: Ops,
    pool: CommandPool,
    set: BindingSet,
    bufs: Vec<Buffer>,
    _img: StorageImage,
    kv_img: Option<StorageImage>,
    kernels: Kernels,
    /// Element offset of the f32 area in the weights buffer.
    f32_base: usize,
}

impl QRig {
    fn new(dev: &Device, s: &TexelStream, f32s: &[f32], act: usize, variant: Variant) -> QRig {
        QRig::with_kv(dev, s, f32s, act, variant, None)
    }

    /// As `new`, with a KV buffer of `kv.0` elements and, when `kv.1` is
    /// given, a KV image of that extent.
    fn with_kv(
        dev: &Device,
        s: &TexelStream,
        f32s: &[f32],
        act: usize,
        variant: Variant,
        kv: Option<(usize, Option<[u32; 3]>)>,
    ) -> QRig {
        let kernels = Kernels::new(dev).unwrap();
        let ops = Ops::new(&kernels, variant).unwrap();
        let stream = s.bytes();
        let f32_base = stream.len() / 4;
        let mut w = Buffer::new(
            dev,
            (stream.len() + f32s.len() * 4).max(16) as u64,
            Location::Readback,
            "weights",
        )
        .unwrap();
        if !stream.is_empty() {
            w.write(0, stream).unwrap();
        }
        if !f32s.is_empty() {
            w.write(stream.len() as u64, f32s).unwrap();
        }
        let mut bufs = vec![w];
        let kv_len = kv.map_or(4, |k| k.0);
        for n in [act, kv_len, 4096, 64] {
            bufs.push(Buffer::new(dev, (n * 4) as u64, Location::Readback, "rig").unwrap());
        }
        let rows = (s.texels().max(1) as u32).div_ceil(4096);
        let mut img =
            StorageImage::with_format(dev, TexelFormat::Rgba32U, [4096, rows, 1], "w").unwrap();
        img.upload(stream).unwrap();
        let kv_img = kv
            .and_then(|k| k.1)
            .map(|[w, h, l]| StorageImage::new(dev, w, h, l, "kv").unwrap());
        let refs: Vec<&Buffer> = bufs.iter().collect();
        let set = BindingSet::with_images(&kernels, &refs, kv_img.as_ref(), Some(&img)).unwrap();
        QRig {
            ops,
            pool: CommandPool::new(dev).unwrap(),
            set,
            bufs,
            _img: img,
            kv_img,
            kernels,
            f32_base,
        }
    }

    fn write<T: bytemuck::Pod>(&mut self, i: usize, off: usize, data: &[T]) {
        self.bufs[i].write((off * 4) as u64, data).unwrap();
    }

    fn read(&self, off: usize, n: usize) -> Vec<f32> {
        let mut v = vec![0f32; n];
        self.bufs[1].read((off * 4) as u64, &mut v).unwrap();
        v
    }

    fn run(&mut self, f: impl FnOnce(&Ops, &mut xtc::vk::Recorder<'_>)) {
        self.pool.reset().unwrap();
        let mut rec = self.pool.record(&self.kernels, &self.set).unwrap();
        if let Some(img) = self.kv_img.take() {
            rec.init_image(&img);
            self.kv_img = Some(img);
        }
        f(&self.ops, &mut rec);
        rec.host_barrier();
        let cmd = rec.finish().unwrap();
        let sub = self.pool.submit(vec![cmd]).unwrap();
        vk_support::wait_readable(sub.fence_fd());
        assert_eq!(xtc::vk::validation_errors(), 0, "Vulkan validation errors");
    }
}

fn rand(rng: &mut fastrand::Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.f32() * 2.0 - 1.0).collect()
}

/// Largest difference relative to the reference's scale.
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(1f32, |a, v| a.max(v.abs()));
    vk_support::max_abs_diff(got, want) / scale
}

struct Case {
    ty: GgmlType,
    bytes: Vec<u8>,
    rows: usize,
    cols: usize,
}

impl Case {
    fn new(rng: &mut fastrand::Rng, ty: GgmlType, rows: usize, cols: usize) -> Case {
        Case {
            ty,
            bytes: quant::quantize(ty, &rand(rng, rows * cols)),
            rows,
            cols,
        }
    }
    fn matrix(&self) -> QMatrix<'_> {
        QMatrix::new(self.ty, self.rows, self.cols, &self.bytes).unwrap()
    }
}

const X_OFF: usize = 64;

/// Runs `op` (x at `X_OFF`, y after it) and returns y `[m, n]`.
fn product(rig: &mut QRig, op: QMatmul, x: &[f32]) -> Vec<f32> {
    rig.write(1, X_OFF, x);
    let y_off = op.y_off as usize;
    rig.write(1, y_off, &vec![0f32; (op.m * op.n) as usize]);
    rig.run(|ops, rec| ops.run(rec, &op).unwrap());
    rig.read(y_off, (op.m * op.n) as usize)
}

#[test]
fn quantized_products_match_the_reference_in_both_forms() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    // The CPU form needs subgroups of at least 8 lanes (lavapipe: 8).
    let sg = dev.subgroup_size();
    assert!(sg.is_some_and(|s| s >= 8), "subgroups {sg:?}");
    let mut rng = fastrand::Rng::with_seed(11);
    // (rows N, cols K, token rows M): a multiple-of-64 N, a ragged N (20: the
    // last invocations compute a clamped copy and store nothing), and
    // K = 1536, where a 64 KiB window holds 10 rows so M = 23 takes three
    // windowed dispatches.
    let shapes = [
        (20, 96, [1, 2, 3, 5]),
        (64, 576, [1, 4, 9, 9]),
        (8, 1536, [1, 2, 23, 23]),
    ];
    for (rows, cols, ms) in shapes {
        let cases: Vec<Case> = TYPES
            .iter()
            .map(|&t| Case::new(&mut rng, t, rows, cols))
            .collect();
        let mut s = TexelStream::new();
        let ts: Vec<QTensor> = cases.iter().map(|c| s.push(&c.matrix()).unwrap()).collect();
        for variant in [Variant::Cpu, Variant::Gpu] {
            let mut rig = QRig::new(&dev, &s, &[], X_OFF + 32 * cols + 64 * rows + 4096, variant);
            for (c, t) in cases.iter().zip(&ts) {
                for m in ms {
                    let x = rand(&mut rng, m * cols);
                    let y_off = (X_OFF + m * cols).next_multiple_of(4);
                    let got = product(
                        &mut rig,
                        QMatmul::plain(t, m as u32, X_OFF as u32, y_off as u32, false),
                        &x,
                    );
                    let want = reference_matmul(&c.matrix(), &x, m);
                    let err = rel_err(&got, &want);
                    assert!(
                        err < 1e-5,
                        "{:?} {} [{rows}x{cols}] m={m}: relative error {err}",
                        variant,
                        c.ty
                    );
                }
            }
        }
    }
}

#[test]
fn split_outputs_and_the_residual_add() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(12);
    let (cols, ns) = (64usize, [16usize, 8, 8]);
    let parts: Vec<Case> = ns
        .iter()
        .map(|&n| Case::new(&mut rng, GgmlType::Q4_1, n, cols))
        .collect();
    let mut s = TexelStream::new();
    let mats: Vec<QMatrix> = parts.iter().map(Case::matrix).collect();
    let t = s.push_stacked(&mats).unwrap();
    for variant in [Variant::Cpu, Variant::Gpu] {
        let mut rig = QRig::new(&dev, &s, &[], 8192, variant);
        let m = 3;
        let x = rand(&mut rng, m * cols);
        rig.write(1, X_OFF, &x);
        let ys = [1024u32, 2048, 3072];
        let base = rand(&mut rng, m * 16);
        rig.write(1, 4096, &base);
        let split = QMatmul::split(&t, m as u32, X_OFF as u32, [16, 8, 8], ys);
        // The residual add over the first 16 rows of the stacked matrix (part 0).
        let acc = QMatmul {
            n: 16,
            n1: 16,
            ..QMatmul::plain(&t, m as u32, X_OFF as u32, 4096, true)
        };
        rig.run(|ops, rec| {
            ops.run(rec, &split).unwrap();
            ops.run(rec, &acc).unwrap();
        });
        for (i, (p, &y)) in mats.iter().zip(&ys).enumerate() {
            let want = reference_matmul(p, &x, m);
            let got = rig.read(y as usize, want.len());
            assert!(rel_err(&got, &want) < 1e-5, "{variant:?} part {i}");
        }
        let prod = reference_matmul(&mats[0], &x, m);
        let want: Vec<f32> = base.iter().zip(&prod).map(|(a, b)| a + b).collect();
        assert!(
            rel_err(&rig.read(4096, want.len()), &want) < 1e-5,
            "{variant:?} accumulate"
        );
    }
}

#[test]
fn embedding_rows_are_the_dequantized_table() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(13);
    let (vocab, dim) = (40, 96);
    let cases: Vec<Case> = TYPES
        .iter()
        .map(|&t| Case::new(&mut rng, t, vocab, dim))
        .collect();
    let mut s = TexelStream::new();
    let ts: Vec<QTensor> = cases.iter().map(|c| s.push(&c.matrix()).unwrap()).collect();
    let tokens = [3u32, 39, 0, 17, 17];
    let records: Vec<u32> = tokens.iter().flat_map(|&t| [t, 0, 0, 0]).collect();
    for variant in [Variant::Cpu, Variant::Gpu] {
        let mut rig = QRig::new(&dev, &s, &[], 4096, variant);
        rig.write(3, 0, &records);
        for (c, t) in cases.iter().zip(&ts) {
            let op = QEmbed::new(t, tokens.len() as u32, 0, 256);
            rig.run(|ops, rec| ops.run(rec, &op).unwrap());
            let got = rig.read(256, tokens.len() * dim);
            let want = reference_embed(&c.matrix(), &tokens);
            // d*q (Q8_0, Q4_0 as d*q + m, F16, F32) is one rounding as on the
            // CPU; Q4_1's d*q + m may be fused on the device (one rounding
            // instead of two).
            let tol = match c.ty {
                GgmlType::Q4_1 | GgmlType::Q4_0 => 1e-6,
                _ => 0.0,
            };
            let err = vk_support::max_abs_diff(&got, &want);
            assert!(err <= tol, "{variant:?} {}: {err}", c.ty);
        }
    }
}

#[test]
fn rope_from_the_table_turns_q_and_k_as_the_reference() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(14);
    let (hs, heads, kv_heads, positions) = (64usize, 9usize, 3usize, 300usize);
    let table = rope_table(100000.0, hs, positions);
    let s = TexelStream::new();
    let mut rig = QRig::new(&dev, &s, &table, 8192, Variant::Cpu);
    let pos = [0u32, 1, 57, 299];
    let records: Vec<u32> = pos.iter().flat_map(|&p| [0, 0, p, 0]).collect();
    rig.write(3, 0, &records);
    let (d, kvd) = (heads * hs, kv_heads * hs);
    let q = rand(&mut rng, pos.len() * d);
    let k = rand(&mut rng, pos.len() * kvd);
    rig.write(1, 0, &q);
    rig.write(1, 4096, &k);
    let op = RopeTable {
        rope: Rope {
            n_rows: pos.len() as u32,
            dim: d as u32,
            kv_dim: kvd as u32,
            head_size: hs as u32,
            rows_off: 0,
            q_off: 0,
            k_off: 4096,
        },
        tab_off: rig.f32_base as u32,
    };
    rig.run(|ops, rec| ops.run(rec, &op).unwrap());
    let (mut wq, mut wk) = (q.clone(), k.clone());
    for (i, &p) in pos.iter().enumerate() {
        reference_rope(&table, hs, &mut wq[i * d..(i + 1) * d], p as usize);
        reference_rope(&table, hs, &mut wk[i * kvd..(i + 1) * kvd], p as usize);
    }
    assert!(vk_support::max_abs_diff(&rig.read(0, q.len()), &wq) <= 1e-6);
    assert!(vk_support::max_abs_diff(&rig.read(4096, k.len()), &wk) <= 1e-6);
}

#[test]
fn fused_rmsnorm_and_swiglu_products() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(15);
    let (hidden, cols, eps) = (12usize, 576usize, 1e-5f32);
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F32] {
        let gate = Case::new(&mut rng, ty, hidden, cols);
        let up = Case::new(&mut rng, ty, hidden, cols);
        let mut s = TexelStream::new();
        let inter = s.push_interleaved(&gate.matrix(), &up.matrix()).unwrap();
        let plain = s.push(&gate.matrix()).unwrap();
        let g: Vec<f32> = (0..cols).map(|_| 0.5 + rng.f32()).collect();
        for variant in [Variant::Cpu, Variant::Gpu] {
            let mut rig = QRig::new(&dev, &s, &g, 65536, variant);
            let g_off = rig.f32_base as u32;
            for m in [1usize, 5, 30] {
                // Rows of x at different scales, so the norm matters.
                let x: Vec<f32> = (0..m * cols)
                    .map(|i| (rng.f32() - 0.5) * (1 + i / cols) as f32)
                    .collect();
                let y_off = (X_OFF + m * cols).next_multiple_of(4) as u32;
                let op = QMatmul::plain(&plain, m as u32, X_OFF as u32, y_off, false)
                    .with_norm(g_off, eps);
                let want = reference_norm_matmul(&gate.matrix(), &x, m, &g, eps);
                let err = rel_err(&product(&mut rig, op, &x), &want);
                assert!(err < 1e-5, "{variant:?} {ty} m={m} norm: {err}");
                let op = QMatmul::glu(&inter, m as u32, X_OFF as u32, y_off);
                let want = reference_glu(&gate.matrix(), &up.matrix(), &x, m);
                let got = product(&mut rig, op, &x);
                let err = rel_err(&got[..m * hidden], &want);
                assert!(err < 1e-5, "{variant:?} {ty} m={m} glu: {err}");
                let op = QMatmul::glu(&inter, m as u32, X_OFF as u32, y_off).with_norm(g_off, eps);
                let mut xn = vec![0f32; x.len()];
                for (o, r) in xn.chunks_exact_mut(cols).zip(x.chunks_exact(cols)) {
                    xtc::decode::model::llama::rmsnorm(o, r, &g, eps);
                }
                let want = reference_glu(&gate.matrix(), &up.matrix(), &xn, m);
                let got = product(&mut rig, op, &x);
                let err = rel_err(&got[..m * hidden], &want);
                assert!(err < 1e-5, "{variant:?} {ty} m={m} norm+glu: {err}");
            }
        }
    }
}

#[test]
fn rope_kv_turns_q_and_writes_turned_k_and_v_to_the_cache() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(16);
    let (hs, heads, kv_heads, bs, n_blocks) = (64usize, 9usize, 3usize, 4usize, 8usize);
    let (d, kvd) = (heads * hs, kv_heads * hs);
    let table = rope_table(100000.0, hs, 64);
    // Rows at positions 0, 5, 13 of one sequence whose block table is 7, 2, 5, 0.
    let bt = [7u32, 2, 5, 0];
    let pos = [0u32, 5, 13];
    let mut md: Vec<u32> = pos.iter().flat_map(|&p| [0, 0, p, 12]).collect();
    md.extend(bt);
    let q = rand(&mut rng, pos.len() * d);
    let k = rand(&mut rng, pos.len() * kvd);
    let v = rand(&mut rng, pos.len() * kvd);
    let (mut wq, mut wk) = (q.clone(), k.clone());
    for (i, &p) in pos.iter().enumerate() {
        reference_rope(&table, hs, &mut wq[i * d..(i + 1) * d], p as usize);
        reference_rope(&table, hs, &mut wk[i * kvd..(i + 1) * kvd], p as usize);
    }
    let slot = |p: u32| (bt[p as usize / bs] as usize * bs + p as usize % bs) * kvd;
    for image in [false, true] {
        let layer = n_blocks * bs * kvd;
        let extent = [(bs * kvd / 4) as u32, n_blocks as u32, 2];
        let kv = Some((2 * layer, image.then_some(extent)));
        let mut rig = QRig::with_kv(&dev, &TexelStream::new(), &table, 16384, Variant::Cpu, kv);
        rig.write(3, 0, &md);
        rig.write(1, 0, &q);
        rig.write(1, 4096, &k);
        rig.write(1, 8192, &v);
        let op = RopeKv {
            rope: RopeTable {
                rope: Rope {
                    n_rows: pos.len() as u32,
                    dim: d as u32,
                    kv_dim: kvd as u32,
                    head_size: hs as u32,
                    rows_off: 0,
                    q_off: 0,
                    k_off: 4096,
                },
                tab_off: rig.f32_base as u32,
            },
            v_off: 8192,
            block_size: bs as u32,
            kc_off: 0,
            vc_off: if image { 1 } else { layer as u32 },
            image: u32::from(image),
        };
        rig.run(|ops, rec| ops.run(rec, &op).unwrap());
        assert!(
            vk_support::max_abs_diff(&rig.read(0, q.len()), &wq) <= 1e-6,
            "image {image}: q"
        );
        if image {
            // Copy the image's layers out through attention-free means: the
            // KV-image layout is checked end to end by tests/vk_llama.rs; here
            // the buffer form's bits stand for both (same arithmetic).
            continue;
        }
        let mut cache = vec![0f32; 2 * layer];
        rig.bufs[2].read(0, &mut cache).unwrap();
        for (i, &p) in pos.iter().enumerate() {
            let at = slot(p);
            let got_k = &cache[at..at + kvd];
            let got_v = &cache[layer + at..layer + at + kvd];
            assert!(
                vk_support::max_abs_diff(got_k, &wk[i * kvd..(i + 1) * kvd]) <= 1e-6,
                "k at {p}"
            );
            assert_eq!(got_v, &v[i * kvd..(i + 1) * kvd], "v at {p}");
        }
    }
}

/// The LM head's argmax partials and `argmax_part` pick the same token as an
/// argmax over the logits, the lowest index among equal maxima included.
#[test]
fn the_lm_head_argmax_matches_an_argmax_over_its_logits() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(17);
    let (n, k, m) = (200usize, 64usize, 5usize);
    for ty in [GgmlType::Q8_0, GgmlType::F32] {
        // Rows 37 and 140 are all ones: with x all ones (row 0 of x) they tie
        // for the largest logit, and the lower index must win.
        let mut w = rand(&mut rng, n * k);
        for r in [37, 140] {
            w[r * k..(r + 1) * k].fill(1.0);
        }
        let bytes = quant::quantize(ty, &w);
        let mat = QMatrix::new(ty, n, k, &bytes).unwrap();
        let mut s = TexelStream::new();
        let t = s.push(&mat).unwrap();
        let mut x = rand(&mut rng, m * k);
        x[..k].fill(1.0);
        for variant in [Variant::Cpu, Variant::Gpu] {
            let mut rig = QRig::new(&dev, &s, &[], 16384, variant);
            rig.write(1, X_OFF, &x);
            let (y_off, part_off) = (4096u32, 8192u32);
            let mm = QMatmul::logits_argmax(&t, m as u32, X_OFF as u32, y_off, part_off);
            let fin = ArgmaxPart {
                n_rows: m as u32,
                vocab: n as u32,
                part_off,
                out_off: 0,
                groups: argmax_groups(n as u32, variant),
            };
            rig.run(|ops, rec| {
                ops.run(rec, &mm).unwrap();
                rec.barrier();
                ops.run(rec, &fin).unwrap();
            });
            let logits = rig.read(y_off as usize, m * n);
            let want = reference_matmul(&mat, &x, m);
            assert!(rel_err(&logits, &want) < 1e-5, "{variant:?} {ty}: logits");
            let mut toks = vec![0u32; m];
            rig.bufs[4].read(0, &mut toks).unwrap();
            for (r, tok) in toks.iter().enumerate() {
                assert_eq!(
                    *tok,
                    argmax(&logits[r * n..(r + 1) * n]),
                    "{variant:?} {ty} row {r}"
                );
            }
            assert_eq!(
                toks[0], 37,
                "{variant:?} {ty}: the lower of two equal maxima"
            );
        }
    }
}
