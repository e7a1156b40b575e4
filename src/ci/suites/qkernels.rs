//! The quantized kernels of `xtc.kernels` (`kernels/qmatmul.wgsl`,
//! `argmax_part`, `rope_tab`, `rope_kv`, `rope_kv_img`): the products of
//! Q4_1 / Q4_0 / Q8_0 / F16 / F32 weights in both forms (the CPU-device form
//! over the weight image, 1 / 2 / 4 / 8 token rows per invocation; the GPU
//! form over the weights buffer), the embedding lookup, the LM head's argmax
//! partials and `argmax_part`, RoPE from the table and RoPE fused with the
//! KV append. Each against its CPU reference in `decode::model::qops` on
//! seeded random inputs, at the real model's shapes (SmolLM2-135M: 576,
//! 1536, 49152; 9 heads of 64 over 3) and awkward ones (a ragged N, a K
//! whose rows take several window chunks): NMSE under [`NMSE_Q`], bit-exact
//! for the embedding rows of Q8_0 / F16 / F32, the KV append's v and the
//! argmax, NaN/Inf agreement, and a guard check of the activation and KV
//! buffers (every element outside the op's declared outputs comes back as
//! written).
//!
//! Names: `xtc.kernels.<op>.<type>_<form>.<shape>`, e.g.
//! `xtc.kernels.qmm.q4_1_r4.m9_n576_k1536`; each case checks that its entry
//! points really ran (the case names them; `specs` in `super::kernels`
//! fails while an entry point of the build has no case).

use std::ops::Range;
use std::sync::Arc;

use super::kernels::{Spec, spec};
use crate::ci::case::{CaseError, CaseResult, Ctx, Outcome, ensure};
use crate::ci::check::{self, Guarded};
use crate::decode::model::gguf::GgmlType;
use crate::decode::model::ops::{Op, Ops, Rope, Variant};
use crate::decode::model::qops::{
    ArgmaxPart, QEmbed, QMatmul, RopeKv, RopeTable, argmax_groups, reference_embed, reference_glu,
    reference_matmul, reference_rope, rope_table,
};
use crate::decode::model::quant::{self, QMatrix};
use crate::decode::model::qweights::{QTensor, TexelStream};
use crate::decode::model::reference::argmax;
use crate::vk::{
    BindingSet, Buffer, CommandPool, Kernels, Location, Recorder, StorageImage, TexelFormat,
};

/// NMSE threshold of the quantized products (they differ from the reference
/// only in f32 summation order; the worst seen is about 1e-12).
pub const NMSE_Q: f64 = 1e-8;

/// Sentinel of the guarded buffers (a NaN pattern no kernel writes).
const SENTINEL: u32 = 0x7fa5_a5a1;

/// Elements before the first input in the activation buffer.
const X_OFF: usize = 64;

/// Width in texels of the weight image rows.
const IMAGE_WIDTH: u32 = 4096;

/// A bench for one quantized op: the texel stream in the weight image (CPU
/// form) and at the start of the weights buffer (GPU form) with f32 data
/// after it, guarded activation and KV buffers, an optional KV image.
struct QBench {
    ops: Ops,
    // Field order is drop order: the pool and set go before what they use.
    pool: CommandPool,
    set: BindingSet,
    bufs: Vec<Buffer>,
    _img: StorageImage,
    kv_img: Option<(StorageImage, bool)>,
    kernels: Arc<Kernels>,
    /// f32 element offset of the f32 data in the weights buffer.
    f32_base: usize,
    /// What buffers 1 (activations) and 2 (KV) hold, as written.
    words: [Vec<u32>; 2],
    /// Declared outputs of buffers 1 and 2.
    writable: [Vec<Range<usize>>; 2],
}

impl QBench {
    fn new(
        ctx: &mut Ctx,
        s: &TexelStream,
        f32s: &[f32],
        act: usize,
        kv: usize,
        kv_image: Option<[u32; 3]>,
        variant: Variant,
    ) -> Result<QBench, CaseError> {
        let kernels = ctx.kernels()?;
        let dev = kernels.device().clone();
        let ops = Ops::new(&kernels, variant)?;
        let stream = s.bytes();
        let f32_base = stream.len() / 4;
        let mut w = Buffer::new(
            &dev,
            (stream.len() + f32s.len() * 4).max(16) as u64,
            Location::Readback,
            "weights",
        )?;
        if !stream.is_empty() {
            w.write(0, stream)?;
        }
        if !f32s.is_empty() {
            w.write(stream.len() as u64, f32s)?;
        }
        let mut bufs = vec![w];
        for n in [act, kv.max(4), 8192, 64] {
            bufs.push(Buffer::new(
                &dev,
                (n * 4) as u64,
                Location::Readback,
                "qbench",
            )?);
        }
        let mut words = [vec![SENTINEL; act], vec![SENTINEL; kv.max(4)]];
        for (i, w) in words.iter_mut().enumerate() {
            bufs[i + 1].write(0, w.as_slice())?;
            w.shrink_to_fit();
        }
        let rows = (s.texels().max(1) as u32).div_ceil(IMAGE_WIDTH);
        let mut img = StorageImage::with_format(
            &dev,
            TexelFormat::Rgba32U,
            [IMAGE_WIDTH, rows, 1],
            "weights (texel stream)",
        )?;
        if !stream.is_empty() {
            img.upload(stream)?;
        }
        let kv_img = match kv_image {
            Some([w, h, l]) => Some((StorageImage::new(&dev, w, h, l, "kv")?, false)),
            None => None,
        };
        let refs: Vec<&Buffer> = bufs.iter().collect();
        let set =
            BindingSet::with_images(&kernels, &refs, kv_img.as_ref().map(|(i, _)| i), Some(&img))?;
        Ok(QBench {
            ops,
            pool: CommandPool::new(&dev)?,
            set,
            bufs,
            _img: img,
            kv_img,
            kernels,
            f32_base,
            words,
            writable: [Vec::new(), Vec::new()],
        })
    }

    /// Writes `data` at element `off` of buffer `i` (1 or 2 are tracked).
    fn put<T: bytemuck::Pod>(&mut self, i: usize, off: usize, data: &[T]) -> Result<(), CaseError> {
        self.bufs[i].write((off * 4) as u64, data)?;
        if (1..=2).contains(&i) {
            let w: &[u32] = bytemuck::cast_slice(data);
            self.words[i - 1][off..off + w.len()].copy_from_slice(w);
        }
        Ok(())
    }

    /// Declares `n` elements at `off` of buffer `i` (1 or 2) an output.
    fn output(&mut self, i: usize, off: usize, n: usize) {
        self.writable[i - 1].push(off..off + n);
    }

    fn get<T: bytemuck::Pod + Default + Clone>(
        &self,
        i: usize,
        off: usize,
        n: usize,
    ) -> Result<Vec<T>, CaseError> {
        let mut v = vec![T::default(); n];
        self.bufs[i].read((off * 4) as u64, &mut v)?;
        Ok(v)
    }

    /// Records `f` in one command buffer, waits, checks the validation
    /// layer and the guards of buffers 1 and 2.
    fn run(
        &mut self,
        f: impl FnOnce(&Ops, &Kernels, &BindingSet, &mut Recorder<'_>) -> Result<(), CaseError>,
    ) -> Result<(), CaseError> {
        let before = crate::vk::validation_errors();
        self.pool.reset()?;
        let mut rec = self.pool.record(&self.kernels, &self.set)?;
        if let Some((img, false)) = &self.kv_img {
            rec.init_image(img);
        }
        f(&self.ops, &self.kernels, &self.set, &mut rec)?;
        rec.host_barrier();
        let cmd = rec.finish()?;
        self.pool.submit(vec![cmd])?.wait(None)?;
        if let Some((_, inited)) = &mut self.kv_img {
            *inited = true;
        }
        let after = crate::vk::validation_errors();
        ensure(after == before, || {
            format!("{} Vulkan validation errors", after - before)
        })?;
        for (j, name) in ["activations", "KV cache"].into_iter().enumerate() {
            let all: Vec<u32> = self.get(j + 1, 0, self.words[j].len())?;
            Guarded {
                name,
                before: self.words[j].clone(),
                writable: self.writable[j].clone(),
            }
            .check(&all)?;
            self.words[j] = all;
        }
        Ok(())
    }
}

/// The entry points `op` dispatches in `variant` over `win`'s windows.
fn entries_of(op: &QMatmul, variant: Variant, set: &BindingSet) -> Vec<&'static str> {
    match op.windowed(variant, &set.windows()) {
        Some(chunks) => chunks.iter().map(|c| c.kernel).collect(),
        None => vec![op.dispatch(variant).0],
    }
}

/// Records `op`; with `tile` = 8 the CPU form's chunks run the `_r8` entry
/// point (8 token rows per invocation, which the model does not pick).
fn record_qmm(
    ops: &Ops,
    kernels: &Kernels,
    set: &BindingSet,
    rec: &mut Recorder<'_>,
    op: &QMatmul,
    r8: bool,
) -> Result<(), CaseError> {
    if !r8 {
        return Ok(ops.run(rec, op)?);
    }
    let chunks = op
        .windowed(Variant::Cpu, &set.windows())
        .ok_or_else(|| CaseError::Fail("the CPU form refuses this shape".into()))?;
    let name = format!("qmm_{}_r8", op.kernel_type().name());
    let kern = kernels.get(&name)?;
    for c in chunks {
        let grid = [c.push.m.div_ceil(8), c.grid[1], 1];
        rec.dispatch_windowed(kern, &c.push, grid, c.offsets)?;
    }
    Ok(())
}

fn rand_vec(rng: &mut fastrand::Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| (rng.f32() * 2.0 - 1.0) * scale).collect()
}

/// Seeded weights `[n, k]` in `ty`'s block layout.
fn weights(rng: &mut fastrand::Rng, ty: GgmlType, n: usize, k: usize) -> Vec<u8> {
    quant::quantize(ty, &rand_vec(rng, n * k, 1.0 / (k as f32).sqrt()))
}

/// The name of a GGUF type in case names.
fn ty_name(ty: GgmlType) -> &'static str {
    match ty {
        GgmlType::Q4_1 => "q4_1",
        GgmlType::Q4_0 => "q4_0",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::F16 => "f16",
        _ => "f32",
    }
}

/// The kernels' name of a GGUF type (Q4_0 runs as Q4_1).
fn kty(ty: GgmlType) -> &'static str {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q4_0 => "q41",
        GgmlType::Q8_0 => "q80",
        GgmlType::F16 => "f16",
        _ => "f32",
    }
}

/// How a product case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `y = x W^T`, then `y0 += x W^T` (the residual add).
    Plain,
    /// RMSNorm of x fused in, then gate|up interleaved with SwiGLU.
    NormGlu,
}

/// `(label, form, token rows)`: the form a row count selects.
fn form_of(variant: Variant, m: usize, r8: bool) -> &'static str {
    match (variant, m, r8) {
        (Variant::Gpu, ..) => "gpu",
        (_, _, true) => "r8",
        (_, 1, _) => "r1",
        (_, 2, _) => "r2",
        _ => "r4",
    }
}

/// Registers the quantized cases into `v`.
pub(super) fn cases(v: &mut Vec<Spec>) {
    let types = [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F16, GgmlType::F32];
    // (variant, r8, m, n, k, mode): the real model's shapes (q: 576x576,
    // gate/up: 1536x576, down: 576x1536) in every form, awkward ones (a
    // ragged N of 20, K = 1536 over three window chunks, the fused norm and
    // SwiGLU).
    let shapes: &[(Variant, bool, usize, usize, usize, Mode)] = &[
        (Variant::Cpu, false, 1, 576, 576, Mode::Plain),
        (Variant::Cpu, false, 2, 1536, 576, Mode::Plain),
        (Variant::Cpu, false, 9, 576, 1536, Mode::Plain),
        (Variant::Cpu, false, 5, 20, 96, Mode::Plain),
        (Variant::Cpu, false, 23, 8, 1536, Mode::Plain),
        (Variant::Cpu, true, 16, 64, 576, Mode::Plain),
        (Variant::Cpu, false, 5, 24, 576, Mode::NormGlu),
        (Variant::Gpu, false, 5, 576, 576, Mode::Plain),
        (Variant::Gpu, false, 3, 20, 96, Mode::Plain),
        (Variant::Gpu, false, 3, 24, 576, Mode::NormGlu),
    ];
    for ty in types {
        for &(variant, r8, m, n, k, mode) in shapes {
            let form = form_of(variant, m, r8);
            let entry: &'static str = entry_name(kty(ty), form);
            let tag = if mode == Mode::NormGlu {
                "_norm_glu"
            } else {
                ""
            };
            v.push(spec(
                format!("xtc.kernels.qmm.{}_{form}.m{m}_n{n}_k{k}{tag}", ty_name(ty)),
                &[entry],
                move |ctx| qmm(ctx, ty, variant, r8, (m, n, k), mode, entry),
            ));
        }
    }
    // Q4_0 uploads as Q4_1 (m = -8d): one case per form.
    for (variant, m) in [(Variant::Cpu, 9), (Variant::Gpu, 3)] {
        let form = form_of(variant, m, false);
        let entry = entry_name("q41", form);
        v.push(spec(
            format!("xtc.kernels.qmm.q4_0_{form}.m{m}_n64_k576"),
            &[entry],
            move |ctx| {
                qmm(
                    ctx,
                    GgmlType::Q4_0,
                    variant,
                    false,
                    (m, 64, 576),
                    Mode::Plain,
                    entry,
                )
            },
        ));
    }
    // The LM head (Q8_0, tied to the embedding table) with argmax partials.
    for (variant, m, n) in [
        (Variant::Cpu, 4, 49152),
        (Variant::Cpu, 3, 200),
        (Variant::Gpu, 3, 200),
    ] {
        let form = form_of(variant, m, false);
        let entry = entry_name("q80", form);
        v.push(spec(
            format!("xtc.kernels.argmax_part.q8_0_{form}.m{m}_n{n}_k576"),
            &[entry, "argmax_part"],
            move |ctx| lm_head(ctx, variant, m, n, entry),
        ));
    }
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::F16,
        GgmlType::F32,
    ] {
        for (variant, vocab, dim, rows) in [
            (Variant::Cpu, 40, 96, 5),
            (Variant::Gpu, 40, 96, 5),
            (Variant::Cpu, 49152, 576, 9),
        ] {
            if vocab == 49152 && ty != GgmlType::Q8_0 {
                continue;
            }
            let entry = match variant {
                Variant::Cpu => entry_name(kty(ty), "embed"),
                Variant::Gpu => entry_name(kty(ty), "embed_buf"),
            };
            v.push(spec(
                format!(
                    "xtc.kernels.qembed.{}_{}.v{vocab}_d{dim}_r{rows}",
                    ty_name(ty),
                    if variant == Variant::Cpu {
                        "img"
                    } else {
                        "buf"
                    }
                ),
                &[entry],
                move |ctx| qembed(ctx, ty, variant, (vocab, dim, rows)),
            ));
        }
    }
    for (heads, kv_heads, hs) in [(9, 3, 64), (2, 1, 8)] {
        v.push(spec(
            format!("xtc.kernels.rope_tab.f32.h{heads}_kv{kv_heads}_hs{hs}"),
            &["rope_tab"],
            move |ctx| rope_tab(ctx, heads, kv_heads, hs),
        ));
        for image in [false, true] {
            let entry = if image { "rope_kv_img" } else { "rope_kv" };
            v.push(spec(
                format!(
                    "xtc.kernels.rope_kv.f32_{}.h{heads}_kv{kv_heads}_hs{hs}_bs4",
                    if image { "img" } else { "buf" }
                ),
                &[entry],
                move |ctx| rope_kv(ctx, (heads, kv_heads, hs), image),
            ));
        }
    }
}

/// The entry point of a kernel type and form (`'static` for the spec).
fn entry_name(ty: &str, form: &str) -> &'static str {
    crate::vk::kernels::KERNELS
        .iter()
        .map(|(k, _)| *k)
        .find(|k| match form {
            "embed" => *k == format!("qembed_{ty}"),
            "embed_buf" => *k == format!("qembed_{ty}_buf"),
            f => *k == format!("qmm_{ty}_{f}"),
        })
        .unwrap_or("missing entry point")
}

fn ok(what: String) -> CaseResult {
    Ok(Outcome::pass_with(what))
}

fn qmm(
    ctx: &mut Ctx,
    ty: GgmlType,
    variant: Variant,
    r8: bool,
    (m, n, k): (usize, usize, usize),
    mode: Mode,
    entry: &'static str,
) -> CaseResult {
    let mut rng = ctx.rng();
    let w_bytes = weights(&mut rng, ty, n, k);
    let w = QMatrix::new(ty, n, k, &w_bytes)?;
    let up_bytes = weights(&mut rng, ty, n, k);
    let up = QMatrix::new(ty, n, k, &up_bytes)?;
    let mut s = TexelStream::new();
    let (t, g): (QTensor, Vec<f32>) = match mode {
        Mode::Plain => (s.push(&w)?, vec![]),
        Mode::NormGlu => (
            s.push_interleaved(&w, &up)?,
            (0..k).map(|_| 0.5 + rng.f32()).collect(),
        ),
    };
    // Rows of x at different scales, so a fused norm matters.
    let x: Vec<f32> = (0..m * k)
        .map(|i| (rng.f32() - 0.5) * (1 + i / k) as f32)
        .collect();
    let y0 = rand_vec(&mut rng, m * n, 1.0);
    let y_off = (X_OFF + m * k).next_multiple_of(4);
    let y2_off = y_off + m * n;
    let act = y2_off + m * n + 64;
    let mut b = QBench::new(ctx, &s, &g, act, 4, None, variant)?;
    b.put(1, X_OFF, &x)?;
    let eps = 1e-5f32;
    let (ops, want): (Vec<QMatmul>, Vec<Vec<f32>>) = match mode {
        Mode::Plain => {
            b.put(1, y2_off, &y0)?;
            b.output(1, y_off, 2 * m * n);
            let prod = reference_matmul(&w, &x, m);
            let added = y0.iter().zip(&prod).map(|(a, p)| a + p).collect();
            (
                vec![
                    QMatmul::plain(&t, m as u32, X_OFF as u32, y_off as u32, false),
                    QMatmul::plain(&t, m as u32, X_OFF as u32, y2_off as u32, true),
                ],
                vec![prod, added],
            )
        }
        Mode::NormGlu => {
            let g_off = b.f32_base as u32;
            b.output(1, y_off, m * n);
            let mut xn = vec![0f32; x.len()];
            for (o, r) in xn.chunks_exact_mut(k).zip(x.chunks_exact(k)) {
                crate::decode::model::llama::rmsnorm(o, r, &g, eps);
            }
            (
                vec![QMatmul::glu(&t, m as u32, X_OFF as u32, y_off as u32).with_norm(g_off, eps)],
                vec![reference_glu(&w, &up, &xn, m)],
            )
        }
    };
    let ran = match r8 {
        true => vec![entry],
        false => entries_of(&ops[0], variant, &b.set),
    };
    ensure(r8 || ran.contains(&entry), || {
        format!("this shape dispatches {ran:?}, not {entry}: the case no longer covers it")
    })?;
    b.run(|o, kernels, set, rec| {
        for op in &ops {
            record_qmm(o, kernels, set, rec, op, r8)?;
        }
        Ok(())
    })?;
    let mut worst = 0f64;
    let outs = [y_off, y2_off];
    for (i, want) in want.iter().enumerate() {
        let got: Vec<f32> = b.get(1, outs[i], want.len())?;
        worst = worst.max(check::close(&format!("y{i}"), &got, want, NMSE_Q)?);
    }
    ok(format!(
        "{} dispatch(es) {ran:?}, NMSE {worst:.2e}",
        ops.len()
    ))
}

fn lm_head(ctx: &mut Ctx, variant: Variant, m: usize, n: usize, entry: &'static str) -> CaseResult {
    let k = 576;
    let mut rng = ctx.rng();
    let mut wf = rand_vec(&mut rng, n * k, 1.0 / (k as f32).sqrt());
    // Rows 37 and n - 3 equal and largest for x row 0 = ones: a tie, the
    // lower index wins.
    for r in [37, n - 3] {
        wf[r * k..(r + 1) * k].fill(0.25);
    }
    let bytes = quant::quantize(GgmlType::Q8_0, &wf);
    let w = QMatrix::new(GgmlType::Q8_0, n, k, &bytes)?;
    let mut s = TexelStream::new();
    let t = s.push(&w)?;
    let mut x = rand_vec(&mut rng, m * k, 1.0);
    x[..k].fill(1.0);
    let y_off = (X_OFF + m * k).next_multiple_of(4);
    let groups = argmax_groups(n as u32, variant) as usize;
    let part_off = y_off + m * n;
    let act = part_off + 2 * m * groups + 64;
    let mut b = QBench::new(ctx, &s, &[], act, 4, None, variant)?;
    b.put(1, X_OFF, &x)?;
    b.output(1, y_off, m * n + 2 * m * groups);
    b.put(4, 0, &vec![u32::MAX; m])?;
    let mm = QMatmul::logits_argmax(&t, m as u32, X_OFF as u32, y_off as u32, part_off as u32);
    let fin = ArgmaxPart {
        n_rows: m as u32,
        vocab: n as u32,
        part_off: part_off as u32,
        out_off: 0,
        groups: groups as u32,
    };
    let ran = entries_of(&mm, variant, &b.set);
    ensure(ran.contains(&entry), || {
        format!("this shape dispatches {ran:?}, not {entry}")
    })?;
    b.run(|o, _, _, rec| {
        o.run(rec, &mm)?;
        rec.barrier();
        o.run(rec, &fin)?;
        Ok(())
    })?;
    let want = reference_matmul(&w, &x, m);
    let got: Vec<f32> = b.get(1, y_off, m * n)?;
    let e = check::close("logits", &got, &want, NMSE_Q)?;
    let toks: Vec<u32> = b.get(4, 0, m)?;
    // The device's tokens are the argmax of its own logits (exact), and
    // the reference's up to near-ties.
    let own: Vec<u32> = got.chunks(n).map(argmax).collect();
    check::exact("greedy tokens (of the device's logits)", &toks, &own)?;
    ensure(toks[0] == 37, || {
        format!(
            "row 0: token {} (a tie of 37 and {}: 37 wins)",
            toks[0],
            n - 3
        )
    })?;
    ok(format!("{m} rows, logits NMSE {e:.2e}, tokens exact"))
}

fn qembed(
    ctx: &mut Ctx,
    ty: GgmlType,
    variant: Variant,
    (vocab, dim, rows): (usize, usize, usize),
) -> CaseResult {
    let mut rng = ctx.rng();
    let bytes = quant::quantize(ty, &rand_vec(&mut rng, vocab * dim, 1.0));
    let w = QMatrix::new(ty, vocab, dim, &bytes)?;
    let mut s = TexelStream::new();
    let t = s.push(&w)?;
    let mut tokens: Vec<u32> = (0..rows).map(|_| rng.u32(0..vocab as u32)).collect();
    tokens[rows - 1] = vocab as u32 - 1;
    let records: Vec<u32> = tokens.iter().flat_map(|&t| [t, 0, 0, 0]).collect();
    let out = 256;
    let act = out + rows * dim + 64;
    let mut b = QBench::new(ctx, &s, &[], act, 4, None, variant)?;
    b.put(3, 0, &records)?;
    b.output(1, out, rows * dim);
    let op = QEmbed::new(&t, rows as u32, 0, out as u32);
    b.run(|o, _, _, rec| Ok(o.run(rec, &op)?))?;
    let got: Vec<f32> = b.get(1, out, rows * dim)?;
    let want = reference_embed(&w, &tokens);
    if matches!(ty, GgmlType::Q4_1 | GgmlType::Q4_0) {
        // d * q + m may be fused on the device (one rounding, not two).
        let e = check::close("embedded rows", &got, &want, NMSE_Q)?;
        return ok(format!("{rows} rows, NMSE {e:.2e}"));
    }
    check::bits("embedded rows", &got, &want)?;
    ok(format!("{rows} rows exact"))
}

fn rope_tab(ctx: &mut Ctx, heads: usize, kv_heads: usize, hs: usize) -> CaseResult {
    let mut rng = ctx.rng();
    let positions = 1024;
    let table = rope_table(100000.0, hs, positions);
    let pos = [0u32, 1, 57, 299, 1023];
    let (d, kvd) = (heads * hs, kv_heads * hs);
    let q = rand_vec(&mut rng, pos.len() * d, 1.0);
    let k = rand_vec(&mut rng, pos.len() * kvd, 1.0);
    let records: Vec<u32> = pos.iter().flat_map(|&p| [0, 0, p, 0]).collect();
    let (q_at, k_at) = (X_OFF, X_OFF + q.len());
    let act = k_at + k.len() + 64;
    let mut b = QBench::new(ctx, &TexelStream::new(), &table, act, 4, None, Variant::Cpu)?;
    b.put(3, 0, &records)?;
    b.put(1, q_at, &q)?;
    b.put(1, k_at, &k)?;
    b.output(1, q_at, q.len() + k.len());
    let op = RopeTable {
        rope: Rope {
            n_rows: pos.len() as u32,
            dim: d as u32,
            kv_dim: kvd as u32,
            head_size: hs as u32,
            rows_off: 0,
            q_off: q_at as u32,
            k_off: k_at as u32,
        },
        tab_off: b.f32_base as u32,
    };
    b.run(|o, _, _, rec| Ok(o.run(rec, &op)?))?;
    let (wq, wk) = rope_rows(&table, hs, (&q, &k), (d, kvd), &pos);
    let e1 = check::close("q", &b.get(1, q_at, q.len())?, &wq, NMSE_Q)?;
    let e2 = check::close("k", &b.get(1, k_at, k.len())?, &wk, NMSE_Q)?;
    ok(format!("NMSE {:.2e}", e1.max(e2)))
}

/// The reference's q and k rows of `pos.len()` tokens (widths `d` and
/// `kvd`), each turned at its position.
fn rope_rows(
    table: &[f32],
    hs: usize,
    (q, k): (&[f32], &[f32]),
    (d, kvd): (usize, usize),
    pos: &[u32],
) -> (Vec<f32>, Vec<f32>) {
    let (mut wq, mut wk) = (q.to_vec(), k.to_vec());
    for (i, &p) in pos.iter().enumerate() {
        reference_rope(table, hs, &mut wq[i * d..(i + 1) * d], p as usize);
        reference_rope(table, hs, &mut wk[i * kvd..(i + 1) * kvd], p as usize);
    }
    (wq, wk)
}

/// `rope_kv` / `rope_kv_img`: rows at positions 0, 5, 13 of a sequence whose
/// block table is 7, 2, 5, 0 (blocks of 4). q is checked in place; in the
/// buffer form the cache's turned k and exact v at each slot, and nothing
/// else of the cache written; in the image form a second submission's
/// `attention_img`-free probe is not possible, so the image's contents are
/// covered end to end by the model's agreement tests (`tests/vk_llama.rs`)
/// and here q and the guards.
fn rope_kv(ctx: &mut Ctx, (heads, kv_heads, hs): (usize, usize, usize), image: bool) -> CaseResult {
    let mut rng = ctx.rng();
    let (bs, n_blocks) = (4usize, 8usize);
    let (d, kvd) = (heads * hs, kv_heads * hs);
    let table = rope_table(100000.0, hs, 64);
    let bt = [7u32, 2, 5, 0];
    let pos = [0u32, 5, 13];
    let mut md: Vec<u32> = pos.iter().flat_map(|&p| [0, 0, p, 12]).collect();
    md.extend(bt);
    let q = rand_vec(&mut rng, pos.len() * d, 1.0);
    let k = rand_vec(&mut rng, pos.len() * kvd, 1.0);
    let v = rand_vec(&mut rng, pos.len() * kvd, 1.0);
    let (wq, wk) = rope_rows(&table, hs, (&q, &k), (d, kvd), &pos);
    let layer = n_blocks * bs * kvd;
    let extent = [(bs * kvd / 4) as u32, n_blocks as u32, 2];
    let (q_at, k_at, v_at) = (X_OFF, X_OFF + q.len(), X_OFF + q.len() + k.len());
    let act = v_at + v.len() + 64;
    let mut b = QBench::new(
        ctx,
        &TexelStream::new(),
        &table,
        act,
        if image { 4 } else { 2 * layer },
        image.then_some(extent),
        Variant::Cpu,
    )?;
    b.put(3, 0, &md)?;
    b.put(1, q_at, &q)?;
    b.put(1, k_at, &k)?;
    b.put(1, v_at, &v)?;
    b.output(1, q_at, q.len());
    let slot = |p: u32| (bt[p as usize / bs] as usize * bs + p as usize % bs) * kvd;
    if !image {
        for &p in &pos {
            b.output(2, slot(p), kvd);
            b.output(2, layer + slot(p), kvd);
        }
    }
    let op = RopeKv {
        rope: RopeTable {
            rope: Rope {
                n_rows: pos.len() as u32,
                dim: d as u32,
                kv_dim: kvd as u32,
                head_size: hs as u32,
                rows_off: 0,
                q_off: q_at as u32,
                k_off: k_at as u32,
            },
            tab_off: b.f32_base as u32,
        },
        v_off: v_at as u32,
        block_size: bs as u32,
        kc_off: 0,
        vc_off: if image { 1 } else { layer as u32 },
        image: u32::from(image),
    };
    ensure(
        op.dispatch(Variant::Cpu).0 == if image { "rope_kv_img" } else { "rope_kv" },
        || "rope_kv dispatches another entry point".into(),
    )?;
    b.run(|o, _, _, rec| Ok(o.run(rec, &op)?))?;
    let e = check::close("q", &b.get(1, q_at, q.len())?, &wq, NMSE_Q)?;
    if image {
        return ok(format!(
            "q NMSE {e:.2e} (the image's K/V: tests/vk_llama.rs)"
        ));
    }
    let mut worst = e;
    for (i, &p) in pos.iter().enumerate() {
        let got_k: Vec<f32> = b.get(2, slot(p), kvd)?;
        let got_v: Vec<f32> = b.get(2, layer + slot(p), kvd)?;
        worst = worst.max(check::close(
            &format!("k at {p}"),
            &got_k,
            &wk[i * kvd..(i + 1) * kvd],
            NMSE_Q,
        )?);
        check::bits(&format!("v at {p}"), &got_v, &v[i * kvd..(i + 1) * kvd])?;
    }
    ok(format!(
        "q, k NMSE {worst:.2e}, v exact at {} slots",
        pos.len()
    ))
}
