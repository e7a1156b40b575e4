//! `xtc.kernels.*`: every entry point of `kernels/*.wgsl`, run through the
//! decode ops ([`xtc_model::vulkan::ops::Ops::run`]) on seeded random inputs and
//! compared with the CPU reference ([`xtc_model::cpu::f32_model`]): NMSE
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
//! This file holds the harness ([`Spec`], `Bench`) and the case list; the
//! cases are its children: `dense` (embed, RMSNorm, matmul, RoPE, SwiGLU,
//! argmax), `attention` (KV append and attention) and [`qkernels`] (the
//! quantized kernels).
//!
//! To add a kernel: a `*_cases` table line per shape, each a [`Spec`]
//! naming the entry points it dispatches (the unit test
//! `every_kernel_entry_point_has_a_case` fails while an entry point of the
//! build has no spec), and a body built on `Bench` (inputs, declared
//! outputs, one run, then [`check::close`] or [`check::exact`] against the
//! reference).
//!
//! [`check::close`]: crate::check::close
//! [`check::exact`]: crate::check::exact

use std::ops::Range;
use std::sync::Arc;

use crate::case::{Case, CaseError, CaseResult, Ctx, Outcome, Suite, ensure};
use crate::check::Guarded;
use crate::rig::Rig;
use xtc_model::vulkan::ops::{Op, Ops, Variant};
use xtc_vk::Recorder;

mod attention;
mod dense;
pub mod qkernels;

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
    dense::embed_cases(&mut v);
    dense::rmsnorm_cases(&mut v);
    dense::matmul_cases(&mut v);
    dense::rope_cases(&mut v);
    attention::attention_cases(&mut v);
    dense::swiglu_cases(&mut v);
    dense::argmax_cases(&mut v);
    qkernels::cases(&mut v);
    // The kernel-form probe (`kernels/form_probe.wgsl`): both kernels'
    // outputs against the host's (`form::measure` checks them); its timing
    // is reported, never judged.
    v.push(spec(
        "xtc.kernels.form_probe.barrier_vs_plain".into(),
        &["form_probe_barrier", "form_probe_plain"],
        |ctx| {
            let dev = ctx.device()?;
            let p = xtc_model::vulkan::form::measure(&dev)?;
            ok(format!(
                "outputs exact; {:?} with barriers, {:?} without (ratio {:.1})",
                p.barrier,
                p.plain,
                p.ratio()
            ))
        },
    ));
    // The device's multiply-add ceiling (`kernels/peak.wgsl`): every
    // invocation's accumulators against the host's (`peak::measure` checks
    // them, so a device that ends loops early fails); its rates are
    // reported, never judged.
    v.push(spec(
        "xtc.kernels.peak.outputs_exact".into(),
        &xtc_model::vulkan::peak::KERNELS,
        |ctx| {
            let dev = ctx.device()?;
            let p = xtc_model::vulkan::peak::measure(&dev, 2)?;
            ok(format!(
                "outputs exact; f32 {:.1} GFLOP/s, fma builtin {:.1}, i32 {:.1} GOP/s \
                 (2 workgroups of 64: a lower bound of the ceiling)",
                p.f32_gflops(),
                p.f32_fma_gflops(),
                p.i32_gops()
            ))
        },
    ));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_entry_point_has_a_case() {
        let specs = specs();
        // The int8-activation entry points (built only by
        // `Kernels::with_int8`) are checked by crates/model/tests/vk_qkernels8.rs
        // and, the int8 chain's `chain8_r<T>`, by crates/model/tests/vk_chain.rs,
        // not by an xtc.kernels case yet.
        let int8 = |e: &&str| xtc_vk::kernels::INT8.contains(e);
        for (entry, _) in xtc_vk::kernels::KERNELS.iter().filter(|(e, _)| !int8(e)) {
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
