//! The dense f32 kernels' cases of `xtc.kernels`: embedding gather,
//! RMSNorm, every matmul form, RoPE, SwiGLU and argmax, each on a [`Bench`].

use super::{Bench, NMSE_REDUCE, NMSE_ROPE, Spec, ok, rand_vec, spec};
use crate::case::{CaseResult, Ctx};
use crate::check;
use xtc_model::cpu::f32_model::{self, EPS};
use xtc_model::vulkan::ops::{Argmax, Embed, Matmul, RmsNorm, Rope, SwiGlu, Variant};

// ---------------------------------------------------------------- embed

pub(super) fn embed_cases(v: &mut Vec<Spec>) {
    for (vocab, dim, rows) in [(1, 1, 1), (37, 5, 3), (512, 67, 33), (49152, 576, 9)] {
        v.push(spec(
            format!("xtc.kernels.embed.f32.v{vocab}_d{dim}_r{rows}"),
            &["embed"],
            move |ctx| embed(ctx, vocab, dim, rows),
        ));
    }
}

fn embed(ctx: &mut Ctx, vocab: usize, dim: usize, rows: usize) -> CaseResult {
    let mut rng = ctx.rng();
    let table = rand_vec(&mut rng, vocab * dim, 1.0);
    let mut toks: Vec<u32> = (0..rows).map(|_| rng.u32(0..vocab as u32)).collect();
    toks[rows - 1] = vocab as u32 - 1; // the table's last row
    let md: Vec<u32> = toks.iter().flat_map(|&t| [t, 0, 0, 0]).collect();
    let mut b = Bench::new(ctx, [vocab * dim, rows * dim, 1, md.len(), 1], Variant::Cpu)?;
    b.put(0, 0, &table)?;
    b.put(3, 0, &md)?;
    b.output(1, 0, rows * dim);
    let op = Embed {
        n_rows: rows as u32,
        dim: dim as u32,
        rows_off: b.at(3, 0),
        emb_off: b.at(0, 0),
        x_off: b.at(1, 0),
    };
    b.expect(&op, "embed")?;
    b.run(|ops, rec| Ok(ops.run(rec, &op)?))?;
    let want: Vec<f32> = toks
        .iter()
        .flat_map(|&t| table[t as usize * dim..][..dim].to_vec())
        .collect();
    check::bits("embedded rows", &b.get::<f32>(1, 0, rows * dim)?, &want)?;
    ok(format!("{rows} rows exact"))
}

// ---------------------------------------------------------------- rmsnorm

pub(super) fn rmsnorm_cases(v: &mut Vec<Spec>) {
    // (form, variant, dim, rows, with a row list)
    let shapes = [
        ("f32", Variant::Gpu, 1, 1, false),
        ("f32", Variant::Gpu, 7, 3, false),
        ("f32", Variant::Gpu, 130, 2, false),
        ("f32", Variant::Gpu, 576, 32, false),
        ("f32", Variant::Cpu, 576, 9, true),
        ("f32", Variant::Cpu, 300, 5, true),
        ("f32_win", Variant::Cpu, 64, 5, false),
        ("f32_win", Variant::Cpu, 576, 1, false),
        ("f32_win", Variant::Cpu, 576, 32, false),
    ];
    for (form, variant, dim, rows, list) in shapes {
        let entry = if form == "f32_win" {
            "rmsnorm_win"
        } else {
            "rmsnorm"
        };
        let tag = if list { "_list" } else { "" };
        v.push(spec(
            format!("xtc.kernels.rmsnorm.{form}.d{dim}_r{rows}{tag}"),
            &[entry],
            move |ctx| rmsnorm(ctx, variant, entry, dim, rows, list),
        ));
    }
}

fn rmsnorm(
    ctx: &mut Ctx,
    variant: Variant,
    entry: &'static str,
    dim: usize,
    rows: usize,
    list: bool,
) -> CaseResult {
    let mut rng = ctx.rng();
    let x = rand_vec(&mut rng, rows * dim, 1.0);
    let w: Vec<f32> = rand_vec(&mut rng, dim, 0.1)
        .iter()
        .map(|v| 1.0 + v)
        .collect();
    // The final norm's row list: the sampled rows, last first.
    let rows_list: Vec<u32> = if list {
        (0..rows as u32).rev().step_by(2).collect()
    } else {
        (0..rows as u32).collect()
    };
    let n_out = rows_list.len();
    let mut b = Bench::new(ctx, [dim, rows * dim + n_out * dim, 1, n_out, 1], variant)?;
    b.put(0, 0, &w)?;
    b.put(1, 0, &x)?;
    if list {
        b.put(3, 0, &rows_list)?;
    }
    b.output(1, rows * dim, n_out * dim);
    let op = RmsNorm {
        n_rows: n_out as u32,
        dim: dim as u32,
        in_off: b.at(1, 0),
        out_off: b.at(1, rows * dim),
        w_off: b.at(0, 0),
        row_list: if list { b.at(3, 0) } else { u32::MAX },
        eps: EPS,
        row_base: 0,
    };
    b.expect(&op, entry)?;
    b.run(|ops, rec| Ok(ops.run(rec, &op)?))?;
    let mut want = vec![0f32; n_out * dim];
    for (j, &r) in rows_list.iter().enumerate() {
        let r = r as usize;
        f32_model::rmsnorm(&mut want[j * dim..][..dim], &x[r * dim..][..dim], &w);
    }
    let e = check::close(
        "normalized rows",
        &b.get(1, rows * dim, n_out * dim)?,
        &want,
        NMSE_REDUCE,
    )?;
    ok(format!("NMSE {e:.2e}"))
}

// ---------------------------------------------------------------- matmul

/// How a matmul case runs: variant, windows, and the entry point it must hit.
#[derive(Clone, Copy)]
struct MmForm {
    name: &'static str,
    variant: Variant,
    windows: bool,
    entry: &'static str,
}

const TILED: MmForm = MmForm {
    name: "f32_tiled",
    variant: Variant::Gpu,
    windows: true,
    entry: "matmul_tiled",
};
const WIN: MmForm = MmForm {
    name: "f32_win",
    variant: Variant::Cpu,
    windows: true,
    entry: "matmul_win",
};
const R8: MmForm = MmForm {
    name: "f32_r8",
    variant: Variant::Cpu,
    windows: false,
    entry: "matmul8",
};
const R4: MmForm = MmForm {
    name: "f32_r4",
    variant: Variant::Cpu,
    windows: false,
    entry: "matmul",
};
const VEC: MmForm = MmForm {
    name: "f32_vec",
    variant: Variant::Cpu,
    windows: false,
    entry: "matmul_vec",
};

pub(super) fn matmul_cases(v: &mut Vec<Spec>) {
    let plain: &[(MmForm, (usize, usize, usize))] = &[
        (TILED, (1, 1, 1)),
        (TILED, (33, 47, 129)),
        (TILED, (32, 576, 576)),
        (TILED, (1, 1536, 576)),
        (WIN, (5, 64, 64)),
        (WIN, (70, 16, 16)),
        (WIN, (32, 576, 576)),
        (WIN, (32, 1536, 576)),
        (WIN, (32, 576, 1536)),
        (WIN, (1, 49152, 576)),
        (R8, (33, 47, 129)),
        (R8, (32, 192, 576)),
        (R4, (5, 300, 200)),
        (R4, (7, 17, 33)),
        (VEC, (1, 1, 1)),
        (VEC, (1, 17, 33)),
        (VEC, (3, 576, 576)),
    ];
    for &(form, (m, n, k)) in plain {
        v.push(spec(
            format!("xtc.kernels.matmul.{}.m{m}_n{n}_k{k}", form.name),
            &[form.entry],
            move |ctx| matmul(ctx, form, m, k, [n, 0, 0]),
        ));
    }
    // One dispatch over stacked weights: q|k|v of the real model, w1|w3, odd.
    let split: &[(MmForm, usize, usize, [usize; 3])] = &[
        (WIN, 32, 576, [576, 192, 192]),
        (WIN, 1, 576, [1536, 1536, 0]),
        (TILED, 9, 576, [576, 192, 192]),
        (R8, 9, 33, [16, 8, 8]),
        (VEC, 1, 5, [3, 2, 2]),
    ];
    for &(form, m, k, ns) in split {
        v.push(spec(
            format!(
                "xtc.kernels.matmul.{}.split_m{m}_k{k}_n{}_{}_{}",
                form.name, ns[0], ns[1], ns[2]
            ),
            &[form.entry],
            move |ctx| matmul(ctx, form, m, k, ns),
        ));
    }
}

/// `y = x W^T` (columns split into up to three regions when `ns[1] > 0`),
/// and for a plain product also `y0 += x W^T` (the residual add).
fn matmul(ctx: &mut Ctx, form: MmForm, m: usize, k: usize, ns: [usize; 3]) -> CaseResult {
    let n: usize = ns.iter().sum();
    let split = ns[1] > 0;
    let mut rng = ctx.rng();
    let x = rand_vec(&mut rng, m * k, 1.0);
    let w = rand_vec(&mut rng, n * k, 1.0 / (k as f32).sqrt());
    let y0 = rand_vec(&mut rng, m * n, 1.0);
    let mut b = Bench::new(ctx, [n * k, m * k + 2 * m * n, 1, 1, 1], form.variant)?;
    if !form.windows {
        b = b.without_windows();
    }
    b.put(0, 0, &w)?;
    b.put(1, 0, &x)?;
    b.put(1, m * k + m * n, &y0)?;
    b.output(1, m * k, 2 * m * n);
    let (mu, ku) = (m as u32, k as u32);
    let y = m * k;
    // Split regions in reverse order inside y's space: y3 first, then y2, y1.
    let ys = [y + m * (ns[1] + ns[2]), y + m * ns[2], y];
    let set = if split {
        Matmul::split(
            mu,
            ku,
            ns.map(|v| v as u32),
            b.at(0, 0),
            b.at(1, 0),
            ys.map(|o| b.at(1, o)),
        )
    } else {
        Matmul::plain(mu, n as u32, ku, b.at(1, 0), b.at(0, 0), b.at(1, y), false)
    };
    let add = Matmul::plain(
        mu,
        n as u32,
        ku,
        b.at(1, 0),
        b.at(0, 0),
        b.at(1, y + m * n),
        true,
    );
    b.expect(&set, form.entry)?;
    b.run(|ops, rec| {
        ops.run(rec, &set)?;
        if !split {
            ops.run(rec, &add)?;
        }
        Ok(())
    })?;
    let mut want = vec![0f32; m * n];
    for r in 0..m {
        f32_model::matmul(&mut want[r * n..][..n], &x[r * k..][..k], &w);
    }
    let e = if split {
        let mut worst = 0f64;
        let mut col = 0;
        for (part, &np) in ns.iter().enumerate() {
            let got: Vec<f32> = b.get(1, ys[part], m * np)?;
            let part_want: Vec<f32> = (0..m)
                .flat_map(|r| want[r * n + col..][..np].to_vec())
                .collect();
            worst = worst.max(check::close(
                &format!("y{}", part + 1),
                &got,
                &part_want,
                NMSE_REDUCE,
            )?);
            col += np;
        }
        worst
    } else {
        let e1 = check::close("y = x W^T", &b.get(1, y, m * n)?, &want, NMSE_REDUCE)?;
        let with_y0: Vec<f32> = want.iter().zip(&y0).map(|(a, b)| a + b).collect();
        let e2 = check::close(
            "y += x W^T",
            &b.get(1, y + m * n, m * n)?,
            &with_y0,
            NMSE_REDUCE,
        )?;
        e1.max(e2)
    };
    ok(format!("NMSE {e:.2e}"))
}

// ---------------------------------------------------------------- rope

pub(super) fn rope_cases(v: &mut Vec<Spec>) {
    for (n_heads, n_kv, hs) in [(1, 1, 2), (4, 2, 8), (3, 1, 6), (9, 3, 64)] {
        v.push(spec(
            format!("xtc.kernels.rope.f32.h{n_heads}_kv{n_kv}_hs{hs}"),
            &["rope"],
            move |ctx| rope(ctx, n_heads, n_kv, hs),
        ));
    }
}

fn rope(ctx: &mut Ctx, n_heads: usize, n_kv: usize, hs: usize) -> CaseResult {
    let (dim, kvd) = (n_heads * hs, n_kv * hs);
    let pos = [0u32, 1, 7, 63, 200, 1000, 8191];
    let rows = pos.len();
    let mut rng = ctx.rng();
    let q = rand_vec(&mut rng, rows * dim, 1.0);
    let k = rand_vec(&mut rng, rows * kvd, 1.0);
    let md: Vec<u32> = pos.iter().flat_map(|&p| [0, 0, p, 0]).collect();
    let mut b = Bench::new(ctx, [1, rows * (dim + kvd), 1, md.len(), 1], Variant::Cpu)?;
    b.put(1, 0, &q)?;
    b.put(1, rows * dim, &k)?;
    b.put(3, 0, &md)?;
    b.output(1, 0, rows * (dim + kvd));
    let op = Rope {
        n_rows: rows as u32,
        dim: dim as u32,
        kv_dim: kvd as u32,
        head_size: hs as u32,
        rows_off: b.at(3, 0),
        q_off: b.at(1, 0),
        k_off: b.at(1, rows * dim),
    };
    b.expect(&op, "rope")?;
    b.run(|ops, rec| Ok(ops.run(rec, &op)?))?;
    let (mut wq, mut wk) = (q.clone(), k.clone());
    for (r, &p) in pos.iter().enumerate() {
        f32_model::rope(
            &mut wq[r * dim..][..dim],
            &mut wk[r * kvd..][..kvd],
            p as usize,
            hs,
        );
    }
    let e1 = check::close("q", &b.get(1, 0, rows * dim)?, &wq, NMSE_ROPE)?;
    let e2 = check::close("k", &b.get(1, rows * dim, rows * kvd)?, &wk, NMSE_ROPE)?;
    ok(format!("NMSE {:.2e}", e1.max(e2)))
}

// ---------------------------------------------------------------- swiglu

pub(super) fn swiglu_cases(v: &mut Vec<Spec>) {
    for (rows, hidden) in [(1, 1), (3, 65), (32, 1536)] {
        v.push(spec(
            format!("xtc.kernels.swiglu.f32.r{rows}_h{hidden}"),
            &["swiglu"],
            move |ctx| swiglu(ctx, rows, hidden),
        ));
    }
}

fn swiglu(ctx: &mut Ctx, rows: usize, hidden: usize) -> CaseResult {
    let mut rng = ctx.rng();
    let h1 = rand_vec(&mut rng, rows * hidden, 6.0);
    let h3 = rand_vec(&mut rng, rows * hidden, 1.0);
    let mut b = Bench::new(ctx, [1, 2 * rows * hidden, 1, 1, 1], Variant::Cpu)?;
    b.put(1, 0, &h1)?;
    b.put(1, rows * hidden, &h3)?;
    b.output(1, 0, rows * hidden);
    let op = SwiGlu {
        n_rows: rows as u32,
        hidden_dim: hidden as u32,
        h1_off: b.at(1, 0),
        h3_off: b.at(1, rows * hidden),
    };
    b.expect(&op, "swiglu")?;
    b.run(|ops, rec| Ok(ops.run(rec, &op)?))?;
    let mut want = h1.clone();
    f32_model::swiglu(&mut want, &h3);
    let e = check::close(
        "silu(h1) * h3",
        &b.get(1, 0, rows * hidden)?,
        &want,
        NMSE_REDUCE,
    )?;
    ok(format!("NMSE {e:.2e}"))
}

// ---------------------------------------------------------------- argmax

pub(super) fn argmax_cases(v: &mut Vec<Spec>) {
    for vocab in [1usize, 63, 65, 1000, 49152] {
        v.push(spec(
            format!("xtc.kernels.argmax.f32.v{vocab}_r4"),
            &["argmax"],
            move |ctx| argmax(ctx, vocab),
        ));
    }
}

fn argmax(ctx: &mut Ctx, vocab: usize) -> CaseResult {
    let rows = 4;
    let mut rng = ctx.rng();
    let mut logits = rand_vec(&mut rng, rows * vocab, 8.0);
    if vocab > 10 {
        // Row 1: a tie (the lowest index wins); row 2: the maximum last.
        logits[vocab + 3] = 9.0;
        logits[2 * vocab - 1] = 9.0;
        logits[3 * vocab - 1] = 9.5;
    }
    let mut b = Bench::new(ctx, [1, rows * vocab, 1, 1, rows], Variant::Cpu)?;
    b.put(1, 0, &logits)?;
    b.output(4, 0, rows);
    let op = Argmax {
        n_rows: rows as u32,
        vocab: vocab as u32,
        logits_off: b.at(1, 0),
        out_off: b.at(4, 0),
    };
    b.expect(&op, "argmax")?;
    b.run(|ops, rec| Ok(ops.run(rec, &op)?))?;
    let want: Vec<u32> = logits.chunks(vocab).map(f32_model::argmax).collect();
    check::exact("greedy tokens", &b.get::<u32>(4, 0, rows)?, &want)?;
    ok(format!("{rows} rows exact"))
}
