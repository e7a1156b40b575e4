//! Whether a device's products run faster with int8 activations, by
//! measurement: what `XTC_ACTIVATIONS=auto` ([`Activations::Auto`]) resolves
//! to.
//!
//! The probe ([`measure`]) times, in the kernel form the model will run
//! ([`Variant`]), one layer's worth of SmolLM2-135M's Q4_1 products at
//! [`ROWS`] rows (a decode iteration of 16 members): the attention input
//! `[576, 576]`, the FFN's gate-and-up `[1536, 576]` and down `[576, 1536]`,
//! random weights and activations, in a device-local buffer (the GPU form)
//! or the weight image (the CPU form):
//! - f32: `qmm_*` on f32 activations, as the model runs them by default;
//! - int8: `qmm8_*` in the dot form the model would use
//!   ([`Activations::dot_form`]: the packed pairs on CPU devices, `OpSDot`
//!   where the device has `VK_KHR_shader_integer_dot_product`, else the
//!   polyfill) against blocks `quant_q81` made. In the GPU form the
//!   quantizer's time counts (there the model runs each input's quantizer
//!   as a dispatch group of its own); in the CPU form it does not, since
//!   there the model's ops quantize what they write in their own stores
//!   (`GpuLlama::set_fuse_quantizers`), at about 3% of an iteration.
//!
//! Each form is recorded [`REPS`] times into one command buffer and
//! submitted [`RUNS`] times, alternating; the fastest submission counts.
//! The int8 outputs are then checked against the f32 form's (within 5% of
//! the output's RMS: quantizing x to 8 bits costs about 0.5%); a device that
//! computes otherwise is an error, not a choice.
//!
//! int8 is chosen ([`choose`]) when `f32 / int8 >=` [`INT8_RATIO`], and
//! then runs in iterations of at least [`ROWS`] rows, where it was measured
//! (`GpuLlama::set_int8_min_rows`; a one-row iteration pays the quantizers'
//! dispatches and gains little from 8-bit products): int8
//! activations change the logits by about 1e-3 nats of perplexity and part
//! greedy tokens where two candidates are close (`docs/arch/vk.md`), so a
//! gain within the probe's noise is not worth it. The ratio is kept for the
//! process and in `${XDG_CACHE_HOME:-$HOME/.cache}/xtc/activations-probe/<key>-<form>-<dot>`
//! (the key as [`super::form::cache_key`], then `v2`, the form and the dot
//! form: `v2-cpu-swar`, `v2-gpu-native`, ...; an absent or unreadable file,
//! or one measured on a busy machine ([`super::form::cache_text`]), is
//! measured again; a cache that cannot be written is not an error).
//!
//! It measures products, not the model: the LM head (Q8_0, one row per
//! member) runs 0.7-0.9x with int8 on lavapipe and is left out, being about
//! 1/30 of a decode iteration's product work.

use std::time::{Duration, Instant};

use super::form::{cache_key, cached_ratio};
use super::ops::{Op, Variant};
use super::qops::QMatmul;
use super::qops8::{Activations, DotForm, QMatmul8, QuantizeQ81, q81_len};
use super::qweights::TexelStream;
use crate::format::gguf::GgmlType;
use crate::format::quant::{self, QMatrix};
use xtc_vk::{
    BindingSet, Buffer, CommandPool, Device, Kernels, Location, StorageImage, TexelFormat, VkError,
    VkResult,
};

/// `f32 time / int8 time` at or above which [`choose`] picks int8.
pub const INT8_RATIO: f64 = 1.1;
/// Activation rows of each probed product.
pub const ROWS: u32 = 16;
/// Repetitions of the layer's products in one command buffer.
pub const REPS: usize = 3;
/// Timed submissions of each form (the fastest counts).
pub const RUNS: usize = 5;

/// The probed products: (rows of W, columns of W = k).
const SHAPES: [(u32, u32); 3] = [(576, 576), (1536, 576), (576, 1536)];

/// What the probe measured on one device in one kernel form.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActivationsProbe {
    /// The kernel form measured.
    pub variant: Variant,
    /// How the int8 products computed their dot products.
    pub dot: DotForm,
    /// Fastest submission of the f32 products ([`REPS`] layers).
    pub f32: Duration,
    /// Fastest submission of the quantizers and int8 products.
    pub int8: Duration,
}

impl ActivationsProbe {
    /// `f32 / int8` (above 1: int8 is faster).
    pub fn ratio(&self) -> f64 {
        self.f32.as_secs_f64() / self.int8.as_secs_f64().max(1e-9)
    }
}

/// One dispatch as recorded: kernel name, push constants, grid, window
/// offsets (`None`: a plain dispatch).
type Rec = (&'static str, QMatmul, [u32; 3], Option<[u64; 2]>);

fn op_dispatches<O: Op + Copy>(
    op: O,
    variant: Variant,
    set: &BindingSet,
    push: fn(O) -> QMatmul,
) -> Vec<Rec> {
    match op.windowed(variant, &set.windows()) {
        Some(ws) => ws
            .into_iter()
            .map(|w| (w.kernel, push(w.push), w.grid, Some(w.offsets)))
            .collect(),
        None => {
            let (name, grid) = op.dispatch(variant);
            vec![(name, push(op), grid, None)]
        }
    }
}

/// Runs the probe of the module documentation on `dev` in `variant`'s form.
///
/// # Errors
/// Device errors (allocation, pipelines, submission); [`VkError::Inval`]
/// when an int8 product disagrees with the f32 one (a device that does not
/// run the kernels as written).
pub fn measure(dev: &Device, variant: Variant) -> VkResult<ActivationsProbe> {
    let dot = match Activations::Int8.dot_form(dev) {
        Some(d) => d,
        None => DotForm::Poly,
    };
    let kernels = Kernels::with_int8(dev)?;
    let mut rng = fastrand::Rng::with_seed(0x1a7e);
    let mut stream = TexelStream::new();
    let mut tensors = Vec::new();
    for (n, k) in SHAPES {
        let w: Vec<f32> = (0..n * k).map(|_| rng.f32() - 0.5).collect();
        let bytes = quant::quantize(GgmlType::Q4_1, &w);
        let mat = QMatrix::new(GgmlType::Q4_1, n as usize, k as usize, &bytes)
            .map_err(|e| VkError::Inval(format!("activations probe: {e}")))?;
        tensors.push(
            stream
                .push(&mat)
                .map_err(|e| VkError::Inval(format!("activations probe: {e}")))?,
        );
    }
    let rows = (stream.texels() as u32).div_ceil(4096).max(1);
    let mut img = StorageImage::with_format(dev, TexelFormat::Rgba32U, [4096, rows, 1], "probe w")?;
    img.upload(stream.bytes())?;
    let mut wbuf = Buffer::new(
        dev,
        stream.bytes().len() as u64,
        Location::Device,
        "probe w",
    )?;
    wbuf.upload(0, stream.bytes())?;
    // Activations (elements): x [ROWS, 1536] at 0, its blocks at xq (as
    // [ROWS, 1536]) and xq2 (as [ROWS, 576]), then per shape y (f32 form)
    // and y (int8 form) [ROWS, n].
    let kmax = 1536;
    let xq = ROWS * kmax;
    let xq2 = xq + q81_len(ROWS, kmax);
    let mut at = xq2 + q81_len(ROWS, kmax);
    let mut ys = Vec::new();
    for (n, _) in SHAPES {
        ys.push((at, at + ROWS * n));
        at += 2 * ROWS * n;
    }
    let mut act = Buffer::new(dev, u64::from(at) * 4, Location::Device, "probe act")?;
    let x: Vec<f32> = (0..ROWS * kmax).map(|_| rng.f32() * 2.0 - 1.0).collect();
    act.upload(0, &x)?;
    let out_len = u64::from(at - ys[0].0) * 4;
    let out = Buffer::new(dev, out_len, Location::Readback, "probe readback")?;
    let dummy = (0..3)
        .map(|_| Buffer::new(dev, 1024, Location::Device, "probe unused"))
        .collect::<VkResult<Vec<_>>>()?;
    let bufs = [&wbuf, &act, &dummy[0], &dummy[1], &dummy[2]];
    let set = BindingSet::with_images(&kernels, &bufs, None, Some(&img))?;
    // Stages: each is a list of dispatches, a barrier after it.
    let mut f32_stages: Vec<Vec<Rec>> = Vec::new();
    let mut int8_stages: Vec<Vec<Rec>> = Vec::new();
    // The quantizers, untimed in the CPU form (see the module documentation).
    let mut quant_stages: Vec<Vec<Rec>> = Vec::new();
    for ((t, &(_, k)), &(y0, y1)) in tensors.iter().zip(&SHAPES).zip(&ys) {
        let f = QMatmul::plain(t, ROWS, 0, y0, false);
        f32_stages.push(op_dispatches(f, variant, &set, |o| o));
        let blocks = if k == kmax { xq } else { xq2 };
        let q = QuantizeQ81::new(ROWS, k, 0, blocks, u32::MAX);
        match variant {
            Variant::Gpu => int8_stages.push(op_dispatches(q, variant, &set, |o| o.0)),
            Variant::Cpu => quant_stages.push(op_dispatches(q, variant, &set, |o| o.0)),
        }
        let op8 = QMatmul8::new(QMatmul::plain(t, ROWS, 0, y1, false), blocks, dot)
            .ok_or_else(|| VkError::Inval("activations probe: no int8 product".into()))?;
        int8_stages.push(op_dispatches(op8, variant, &set, |o| o.0));
    }
    let mut pool = CommandPool::new(dev)?;
    let mut record = |stages: &[Vec<Rec>], reps: usize, read: bool| -> VkResult<Duration> {
        pool.reset()?;
        let mut rec = pool.record(&kernels, &set)?;
        for _ in 0..reps {
            for stage in stages {
                for &(name, push, grid, offs) in stage {
                    let kern = kernels.get(name)?;
                    match offs {
                        Some(o) => rec.dispatch_windowed(kern, &push, grid, o)?,
                        None => rec.dispatch(kern, &push, grid)?,
                    }
                }
                rec.barrier();
            }
        }
        if read {
            rec.copy(&act, u64::from(ys[0].0) * 4, &out, 0, out_len)?;
        }
        rec.host_barrier();
        let cmd = rec.finish()?;
        let t = Instant::now();
        pool.submit(vec![cmd])?.wait(None)?;
        Ok(t.elapsed())
    };
    // One untimed pass of each (pipelines' first use; the quantizers first),
    // then the timed runs.
    record(&f32_stages, 1, false)?;
    let first: Vec<Vec<Rec>> = quant_stages.iter().chain(&int8_stages).cloned().collect();
    record(&first, 1, true)?;
    let (mut best_f32, mut best_int8) = (Duration::MAX, Duration::MAX);
    for _ in 0..RUNS {
        best_f32 = best_f32.min(record(&f32_stages, REPS, false)?);
        best_int8 = best_int8.min(record(&int8_stages, REPS, false)?);
    }
    let mut got = vec![0f32; (out_len / 4) as usize];
    out.read(0, &mut got)?;
    let base = ys[0].0;
    for (&(n, _), &(y0, y1)) in SHAPES.iter().zip(&ys) {
        let len = (ROWS * n) as usize;
        let f = &got[(y0 - base) as usize..][..len];
        let i = &got[(y1 - base) as usize..][..len];
        let rms = (f.iter().map(|v| v * v).sum::<f32>() / len as f32).sqrt();
        let worst = f.iter().zip(i).fold(0f32, |e, (a, b)| e.max((a - b).abs()));
        let finite = f.iter().chain(i).all(|v| v.is_finite());
        if !finite || worst > 0.05 * rms {
            return Err(VkError::Inval(format!(
                "activations probe: the int8 product [{n} rows] differs from the f32 one by {worst} (output RMS {rms})"
            )));
        }
    }
    Ok(ActivationsProbe {
        variant,
        dot,
        f32: best_f32,
        int8: best_int8,
    })
}

fn form_name(variant: Variant) -> &'static str {
    match variant {
        Variant::Cpu => "cpu",
        Variant::Gpu => "gpu",
    }
}

/// The `f32 / int8` ratio of `dev` in `variant`'s form: from this process's
/// memory, else the cache file, else [`measure`]d and stored in both.
///
/// # Errors
/// As [`measure`].
pub fn int8_ratio(dev: &Device, variant: Variant) -> VkResult<f64> {
    // The dot form is part of the key: a ratio measured with another one
    // (an older build's) says nothing about this one.
    let dot = match Activations::Int8.dot_form(dev) {
        Some(DotForm::Native) => "native",
        Some(DotForm::Swar { .. }) => "swar",
        Some(DotForm::Poly) | None => "poly",
    };
    // `v2`: since the CPU form's ratio leaves the quantizers out.
    let key = format!("{}-v2-{}-{dot}", cache_key(dev), form_name(variant));
    cached_ratio("activations-probe", key, "f32_over_int8", || {
        Ok(measure(dev, variant)?.ratio())
    })
}

/// [`Activations::Int8`] where [`int8_ratio`] is at least [`INT8_RATIO`],
/// else [`Activations::F32`].
///
/// # Errors
/// As [`measure`] (only when no ratio is cached).
pub fn choose(dev: &Device, variant: Variant) -> VkResult<Activations> {
    Ok(if int8_ratio(dev, variant)? >= INT8_RATIO {
        Activations::Int8
    } else {
        Activations::F32
    })
}
