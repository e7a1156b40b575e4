//! `xtc.kernels.*`: every entry point of `kernels/*.wgsl`, run through the
//! decode ops ([`xtc_decode::model::vulkan::ops::Ops::run`]) on seeded random inputs and
//! compared with the CPU reference ([`xtc_decode::model::cpu::f32_model`]): NMSE
//! under a per-op threshold ([`check::close`]), bit-exact for the exact ops
//! (embedding gather, KV append, argmax), NaN/Inf agreement, and guard
//! regions: every buffer is filled with a sentinel pattern, inputs are
//! written [`GUARD`] elements in, and after the run every element outside
//! the op's declared outputs must be as written (out-of-bounds writes, or
//! writes into inputs, fail the case).
//!
//! Names: `xtc.kernels.<op>.<dtype/form>.<shape>`; the form picks the entry
//! point (`f32_win` = `matmul_win`, `f32_tiled` = `matmul_tiled`, ...) and
//! each case checks that the op really dispatched it (so a change in
//! `decode::model::vulkan::ops`' choice of form cannot silently drop coverage). Shapes:
//! the real model's (SmolLM2-135M: dim 576, hidden 1536, 9 heads of 64
//! over 3 KV heads, vocab 49152) and awkward ones (1 row, sizes that are
//! not multiples of the workgroup or of 4).
//!
//! To add a kernel: a `*_cases` table line per shape, each a [`Spec`]
//! naming the entry points it dispatches (the unit test
//! `every_kernel_entry_point_has_a_case` fails while an entry point of the
//! build has no spec), and a body built on `Bench` (inputs, declared
//! outputs, one run, then [`check::close`] or [`check::exact`] against the
//! reference).

use std::ops::Range;
use std::sync::Arc;

use crate::case::{Case, CaseError, CaseResult, Ctx, Outcome, Suite, ensure};
use crate::check::{self, Guarded};
use crate::rig::Rig;
use xtc_decode::model::cpu::f32_model::{self, CpuKvCache, EPS};
use xtc_decode::model::vulkan::ops::{
    Argmax, Attention, AttentionImage, Embed, KvAppend, KvAppendImage, KvImage, Matmul, Op, Ops,
    RmsNorm, Rope, SwiGlu, Variant, pack_metadata,
};
use xtc_decode::model::{BatchPlan, Config, KvGeometry, SeqWork};
use xtc_vk::Recorder;

/// Elements of sentinel before (and after) every region a bench writes.
pub const GUARD: usize = 64;

/// NMSE thresholds (llama.cpp's default is 1e-7; these ops differ from the
/// reference only by f32 summation order, far below them).
const NMSE_REDUCE: f64 = 1e-8;
/// RoPE at positions up to 8191: f32 argument rounding of the angle.
const NMSE_ROPE: f64 = 1e-6;

/// One kernels case: its name, the entry points it must dispatch, and its body.
pub struct Spec {
    /// `xtc.kernels.<op>.<form>.<shape>`.
    pub name: String,
    /// Entry points this case dispatches (checked at run time).
    pub entries: Vec<&'static str>,
    body: Arc<dyn Fn(&mut Ctx) -> CaseResult + Send + Sync>,
}

pub(super) fn spec(
    name: String,
    entries: &[&'static str],
    body: impl Fn(&mut Ctx) -> CaseResult + Send + Sync + 'static,
) -> Spec {
    Spec {
        name,
        entries: entries.to_vec(),
        body: Arc::new(body),
    }
}

/// Registers the suite's cases.
pub fn cases(v: &mut Vec<Case>) {
    for s in specs() {
        let body = s.body.clone();
        v.push(Case::new(Suite::Kernels, s.name, move |ctx| body(ctx)));
    }
}

/// Every kernels case.
pub fn specs() -> Vec<Spec> {
    let mut v = Vec::new();
    embed_cases(&mut v);
    rmsnorm_cases(&mut v);
    matmul_cases(&mut v);
    rope_cases(&mut v);
    attention_cases(&mut v);
    swiglu_cases(&mut v);
    argmax_cases(&mut v);
    super::qkernels::cases(&mut v);
    v
}

/// A single-kernel bench with guard regions: a [`Rig`] whose buffers hold
/// each region [`GUARD`] elements in, a host copy of every word written,
/// and the ranges the op may write.
struct Bench {
    rig: Rig,
    words: Vec<Vec<u32>>,
    writable: Vec<Vec<Range<usize>>>,
    windows: bool,
    variant: Variant,
}

const NAMES: [&str; 5] = ["weights", "activations", "KV cache", "metadata", "tokens"];

/// Element offset of logical offset 0 in buffer `i` (the metadata holds
/// absolute offsets of block tables, so it starts at 0; nothing writes it).
fn base(i: usize) -> usize {
    if i == 3 { 0 } else { GUARD }
}

impl Bench {
    fn new(ctx: &mut Ctx, elems: [usize; 5], variant: Variant) -> Result<Bench, CaseError> {
        Bench::build(ctx, elems, variant, None)
    }

    fn build(
        ctx: &mut Ctx,
        elems: [usize; 5],
        variant: Variant,
        image: Option<[u32; 3]>,
    ) -> Result<Bench, CaseError> {
        let kernels = ctx.kernels()?;
        let sizes: [usize; 5] = std::array::from_fn(|i| base(i) + elems[i].max(1) + GUARD);
        let mut rig = match image {
            Some(e) => Rig::with_image(kernels, sizes, variant, e)?,
            None => Rig::new(kernels, sizes, variant)?,
        };
        let mut words = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let w = vec![0x7fa5_a500 | i as u32; n];
            rig.write(i, 0, &w)?;
            words.push(w);
        }
        Ok(Bench {
            rig,
            words,
            writable: vec![Vec::new(); 5],
            windows: true,
            variant,
        })
    }

    /// The storage-buffer forms only (no uniform windows).
    fn without_windows(mut self) -> Bench {
        self.rig.ops = self.rig.ops.clone().with_windows(false);
        self.windows = false;
        self
    }

    /// Absolute element offset of logical offset `off` in buffer `i`, as the
    /// kernels' push constants take it.
    fn at(&self, i: usize, off: usize) -> u32 {
        (base(i) + off) as u32
    }

    fn put<T: bytemuck::Pod>(&mut self, i: usize, off: usize, data: &[T]) -> Result<(), CaseError> {
        let at = base(i) + off;
        self.rig.write(i, at, data)?;
        let w: &[u32] = bytemuck::cast_slice(data);
        self.words[i][at..at + w.len()].copy_from_slice(w);
        Ok(())
    }

    /// Declares `n` elements at `off` of buffer `i` as an output.
    fn output(&mut self, i: usize, off: usize, n: usize) {
        let at = base(i) + off;
        self.writable[i].push(at..at + n);
    }

    fn get<T: bytemuck::Pod + Default + Clone>(
        &self,
        i: usize,
        off: usize,
        n: usize,
    ) -> Result<Vec<T>, CaseError> {
        Ok(self.rig.read(i, base(i) + off, n)?)
    }

    /// Fails unless `op` would dispatch `entry` in this bench.
    fn expect<O: Op>(&self, op: &O, entry: &str) -> Result<(), CaseError> {
        let win = self.rig.windows();
        let chosen = self
            .windows
            .then(|| op.windowed(self.variant, &win).map(|c| c[0].kernel))
            .flatten()
            .unwrap_or_else(|| op.dispatch(self.variant).0);
        ensure(chosen == entry, || {
            format!("this shape dispatches {chosen}, not {entry}: the case no longer covers it")
        })
    }

    /// Runs `f` in one command buffer, then checks the validation layer and
    /// every guard region.
    fn run(
        &mut self,
        f: impl FnOnce(&Ops, &mut Recorder<'_>) -> Result<(), CaseError>,
    ) -> Result<(), CaseError> {
        let before = xtc_vk::validation_errors();
        let after = self.rig.run(f)?;
        ensure(after == before, || {
            format!("{} Vulkan validation errors", after - before)
        })?;
        for (i, name) in NAMES.into_iter().enumerate() {
            let all: Vec<u32> = self.rig.read(i, 0, self.words[i].len())?;
            let g = Guarded {
                name,
                before: self.words[i].clone(),
                writable: self.writable[i].clone(),
            };
            g.check(&all)?;
            // The next run of the same bench starts from what this one left.
            self.words[i] = all;
        }
        Ok(())
    }
}

/// `n` seeded uniform values in `[-scale, scale)`.
fn rand_vec(rng: &mut fastrand::Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| (rng.f32() * 2.0 - 1.0) * scale).collect()
}

fn ok(what: String) -> CaseResult {
    Ok(Outcome::pass_with(what))
}

// ---------------------------------------------------------------- embed

fn embed_cases(v: &mut Vec<Spec>) {
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

fn rmsnorm_cases(v: &mut Vec<Spec>) {
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

fn matmul_cases(v: &mut Vec<Spec>) {
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

fn rope_cases(v: &mut Vec<Spec>) {
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

// ---------------------------------------------------------------- KV append + attention

/// Where the KV cache lives and which attention form reads it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AttForm {
    /// KV append only (buffer); the cache compared exactly.
    AppendOnly,
    /// `attention` (GPU form, KV buffer).
    Gpu,
    /// `attention_lane` (CPU form, KV buffer).
    Lane,
    /// `kv_append_img` + `attention_img` (CPU form, KV image).
    Image,
}

fn attention_cases(v: &mut Vec<Spec>) {
    // (heads, kv heads, head size, block size)
    let shapes: &[(AttForm, usize, usize, usize, usize)] = &[
        (AttForm::AppendOnly, 4, 2, 32, 16),
        (AttForm::AppendOnly, 3, 1, 6, 4),
        (AttForm::AppendOnly, 9, 3, 64, 16),
        (AttForm::Gpu, 4, 2, 32, 16),
        (AttForm::Gpu, 3, 1, 6, 4),
        (AttForm::Gpu, 2, 2, 130, 5),
        (AttForm::Gpu, 9, 3, 64, 16),
        (AttForm::Lane, 4, 2, 32, 16),
        (AttForm::Lane, 3, 1, 6, 4),
        (AttForm::Lane, 9, 3, 64, 16),
        (AttForm::Image, 4, 2, 32, 16),
        (AttForm::Image, 1, 1, 4, 3),
        (AttForm::Image, 9, 3, 64, 16),
    ];
    for &(form, h, kv, hs, bs) in shapes {
        let (op, fname, entries): (&str, &str, &[&'static str]) = match form {
            AttForm::AppendOnly => ("kv_append", "f32", &["kv_append"]),
            AttForm::Gpu => ("attention", "f32", &["kv_append", "attention"]),
            AttForm::Lane => ("attention", "f32_lane", &["kv_append", "attention_lane"]),
            AttForm::Image => ("attention", "f32_img", &["kv_append_img", "attention_img"]),
        };
        v.push(spec(
            format!("xtc.kernels.{op}.{fname}.h{h}_kv{kv}_hs{hs}_bs{bs}"),
            entries,
            move |ctx| attention(ctx, form, (h, kv, hs), bs),
        ));
    }
}

/// A ready vector mixing decode tokens after 0, 1, 70 and 129 cached
/// positions with prefill chunks of 9 and 20 tokens, over block tables in
/// scattered (descending) order: KV append of every row, then attention of
/// every (row, head) over positions `0..=pos`.
fn attention(ctx: &mut Ctx, form: AttForm, heads: (usize, usize, usize), bs: usize) -> CaseResult {
    let (n_heads, n_kv, hs) = heads;
    let mut rng = ctx.rng();
    let c = Config {
        dim: n_heads * hs,
        hidden_dim: 8,
        n_layers: 2,
        n_heads,
        n_kv_heads: n_kv,
        vocab_size: 16,
        seq_len: 256,
    };
    let (dim, kvd) = (c.dim, c.kv_dim());
    let geo = KvGeometry {
        block_size: bs,
        n_blocks: 300 / bs + 40,
    };
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
            let bt: Vec<u32> = (next_block..next_block + blocks).rev().collect();
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
    plan.validate(&c, geo)?;
    let layer = 1usize;
    let mut cache = CpuKvCache::new(&c, geo);
    // The cached positions: random K and V, appended on the device too (by
    // a first submission of their own for the image, written for buffers).
    let mut pre_k = Vec::new();
    let mut pre_v = Vec::new();
    for s in &plan.seqs {
        for p in 0..s.start_pos {
            let (k, v) = (rand_vec(&mut rng, kvd, 1.0), rand_vec(&mut rng, kvd, 1.0));
            cache.append(layer, &s.block_table, p, &k, &v);
            pre_k.extend_from_slice(&k);
            pre_v.extend_from_slice(&v);
        }
    }
    let rows = plan.n_tokens();
    let q = rand_vec(&mut rng, rows * dim, 1.0);
    let k = rand_vec(&mut rng, rows * kvd, 1.0);
    let v = rand_vec(&mut rng, rows * kvd, 1.0);
    let mut md = vec![];
    pack_metadata(&plan, bs, &mut md);
    let (kc, vc) = cache.raw();
    let (kc, vc) = (kc.to_vec(), vc.to_vec());
    let image = form == AttForm::Image;
    let variant = if form == AttForm::Gpu {
        Variant::Gpu
    } else {
        Variant::Cpu
    };
    // Activations: q, k, v, out; the cached rows' k, v (image only).
    let pre_rows = pre_k.len() / kvd;
    let act = rows * (2 * dim + 2 * kvd) + 2 * pre_rows * kvd;
    let kv_elems = if image { 1 } else { kc.len() * 2 };
    let pre_plan = BatchPlan {
        seqs: plan
            .seqs
            .iter()
            .filter(|s| s.start_pos > 0)
            .map(|s| SeqWork {
                tokens: vec![0; s.start_pos],
                start_pos: 0,
                block_table: s.block_table.clone(),
                sample: false,
            })
            .collect(),
    };
    let mut pre_md = vec![];
    pack_metadata(&pre_plan, bs, &mut pre_md);
    let md_elems = md.len().max(pre_md.len());
    let elems = [1, act, kv_elems, md_elems, 1];
    let mut b = if image {
        let limits = ctx.device()?.image_limits();
        let img = KvImage::new(&c, geo, limits)
            .ok_or_else(|| CaseError::Fail("the image form refuses this shape".into()))?;
        Bench::build(ctx, elems, variant, Some(img.extent))?
    } else {
        Bench::new(ctx, elems, variant)?
    };
    let (q_at, k_at, v_at, out_at) = (0, rows * dim, rows * (dim + kvd), rows * (dim + 2 * kvd));
    let pre_at = rows * (2 * dim + 2 * kvd);
    b.put(1, q_at, &q)?;
    b.put(1, k_at, &k)?;
    b.put(1, v_at, &v)?;
    let layer_len = geo.n_blocks * bs * kvd;
    let r = rows as u32;
    let (kc_off, vc_off) = if image {
        (layer as u32, (c.n_layers + layer) as u32)
    } else {
        b.put(2, 0, &kc)?;
        b.put(2, kc.len(), &vc)?;
        // The whole cache may be written: exactness is checked below.
        b.output(2, 0, kc.len() * 2);
        (
            b.at(2, layer * layer_len),
            b.at(2, (c.n_layers + layer) * layer_len),
        )
    };
    let append = KvAppend {
        n_rows: r,
        kv_dim: kvd as u32,
        block_size: bs as u32,
        rows_off: b.at(3, 0),
        k_off: b.at(1, k_at),
        v_off: b.at(1, v_at),
        kc_off,
        vc_off,
    };
    let att = Attention {
        n_rows: r,
        n_heads: n_heads as u32,
        n_kv_heads: n_kv as u32,
        head_size: hs as u32,
        block_size: bs as u32,
        rows_off: b.at(3, 0),
        q_off: b.at(1, q_at),
        out_off: b.at(1, out_at),
        kc_off,
        vc_off,
        kv_dim: kvd as u32,
        dim: dim as u32,
        max_pos: plan
            .seqs
            .iter()
            .map(|s| s.start_pos + s.tokens.len() - 1)
            .max()
            .unwrap_or(0) as u32,
    };
    if image {
        // First submission: the cached positions into the image.
        b.put(1, pre_at, &pre_k)?;
        b.put(1, pre_at + pre_rows * kvd, &pre_v)?;
        b.put(3, 0, &pre_md)?;
        let pre = KvAppendImage(KvAppend {
            n_rows: pre_rows as u32,
            k_off: b.at(1, pre_at),
            v_off: b.at(1, pre_at + pre_rows * kvd),
            ..append
        });
        b.expect(&pre, "kv_append_img")?;
        b.run(|ops, rec| Ok(ops.run(rec, &pre)?))?;
        let img_att = AttentionImage(att);
        ensure(img_att.fits(), || {
            "attention_img does not fit this shape".into()
        })?;
        b.expect(&img_att, "attention_img")?;
        b.put(3, 0, &md)?;
        b.output(1, out_at, rows * dim);
        let app = KvAppendImage(append);
        b.run(|ops, rec| {
            ops.run(rec, &app)?;
            rec.barrier();
            ops.run(rec, &img_att)?;
            Ok(())
        })?;
    } else {
        b.put(3, 0, &md)?;
        b.expect(&append, "kv_append")?;
        if form != AttForm::AppendOnly {
            b.expect(
                &att,
                if form == AttForm::Gpu {
                    "attention"
                } else {
                    "attention_lane"
                },
            )?;
            b.output(1, out_at, rows * dim);
        }
        b.run(|ops, rec| {
            ops.run(rec, &append)?;
            if form != AttForm::AppendOnly {
                rec.barrier();
                ops.run(rec, &att)?;
            }
            Ok(())
        })?;
    }
    // Reference: append row by row, then attend each row over 0..=pos.
    let mut row = 0;
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
        row += s.tokens.len();
    }
    if !image {
        let (kc, vc) = cache.raw();
        check::bits("K cache after the append", &b.get(2, 0, kc.len())?, kc)?;
        check::bits(
            "V cache after the append",
            &b.get(2, kc.len(), vc.len())?,
            vc,
        )?;
    }
    if form == AttForm::AppendOnly {
        return ok(format!("{rows} rows appended exactly"));
    }
    let mut want = vec![0f32; rows * dim];
    let mut row = 0;
    for s in &plan.seqs {
        for i in 0..s.tokens.len() {
            f32_model::attention(
                &mut want[(row + i) * dim..][..dim],
                &q[(row + i) * dim..][..dim],
                &cache,
                &c,
                layer,
                &s.block_table,
                s.start_pos + i,
            );
        }
        row += s.tokens.len();
    }
    let e = check::close(
        "attention output",
        &b.get(1, out_at, rows * dim)?,
        &want,
        NMSE_REDUCE,
    )?;
    ok(format!("{rows} rows, NMSE {e:.2e}"))
}

// ---------------------------------------------------------------- swiglu

fn swiglu_cases(v: &mut Vec<Spec>) {
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

fn argmax_cases(v: &mut Vec<Spec>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_entry_point_has_a_case() {
        let specs = specs();
        for (entry, _) in xtc_vk::kernels::KERNELS {
            assert!(
                specs.iter().any(|s| s.entries.contains(entry)),
                "kernel entry point {entry} has no xtc.kernels case"
            );
        }
        for s in &specs {
            for e in &s.entries {
                assert!(
                    xtc_vk::kernels::KERNELS.iter().any(|(k, _)| k == e),
                    "{} names {e}, which is not in kernels/",
                    s.name
                );
            }
        }
    }
}
