//! The device's own multiply-add ceiling: the roofline as this device's
//! compiler reaches it (issue 23, item 2).
//!
//! `cargo bench --bench roofline` measures what the machine's cores do with
//! hand-written vector code (`vfmadd231ps`, `vpdpbusd`). A kernel runs at
//! most what the device's compiler makes of shader arithmetic on them, and on
//! lavapipe that is much less: llvmpipe lowers every `fma` to a multiply and
//! an add (its NIR options set `lower_ffma32`) and runs each invocation as a
//! lane of 8-wide code. [`measure`] runs three register-only kernels
//! (`kernels/peak.wgsl`: 12 independent accumulators an invocation, `acc =
//! acc * a + b`, no memory traffic in the loop) and reports their rates, so
//! a product's GFLOP/s can be read against both ceilings: the machine's
//! (what the cores could do) and the device's (what any shader on this
//! device can do).
//!
//! Every output is checked: with `a = b = 1` each accumulator ends at its
//! start plus the steps it ran, so a device that ends loops early (llvmpipe's
//! silent 65,535-turn budget) or miscompiles fails with [`VkError::Inval`]
//! instead of reporting a rate for work it did not do.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dev = xtc_vk::Device::open(&xtc_vk::Selector::Auto)?;
//! let p = xtc_model::vulkan::peak::measure(&dev, 32)?;
//! println!(
//!     "f32 {:.1} GFLOP/s (fma builtin {:.1}), i32 {:.1} GOP/s",
//!     p.f32_gflops(),
//!     p.f32_fma_gflops(),
//!     p.i32_gops()
//! );
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use xtc_vk::{
    BINDINGS, BindingSet, Buffer, CommandPool, Device, Kernels, Location, VkError, VkResult,
};

/// Loop turns per invocation: 8 unrolled steps a turn, well inside
/// llvmpipe's 65,535-turn budget ([`super::ops::LANE_LOOP_BUDGET`]), and
/// every f32 accumulator stays an exact integer (under 2^24).
pub const ITERS: u32 = 8192;
/// Multiply-adds per invocation: 12 accumulators x 8 steps x [`ITERS`].
pub const MADDS_PER_INVOCATION: u64 = 12 * 8 * ITERS as u64;
/// Invocations per workgroup: two warps of a GPU (a workgroup of 8 would
/// leave three quarters of a 32-lane warp idle and measure a quarter of
/// its peak); on lavapipe eight 8-lane subgroups run one after the other
/// on one thread, with no barrier between them.
pub const WORKGROUP: u32 = 64;
/// Timed runs of each kernel (the fastest counts).
const RUNS: usize = 5;

/// The three kernels, in [`Peaks`] order.
pub const KERNELS: [&str; 3] = ["peak_f32", "peak_f32_fma", "peak_i32"];

/// Fastest submit-to-completion time of each kernel over one grid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peaks {
    /// Workgroups of [`WORKGROUP`] per dispatch.
    pub groups: u32,
    /// `peak_f32`: `acc * a + b` in f32.
    pub f32: Duration,
    /// `peak_f32_fma`: `fma(acc, a, b)`.
    pub f32_fma: Duration,
    /// `peak_i32`: `acc * a + b` in i32 (the packed pairs' multiply-add).
    pub i32: Duration,
}

impl Peaks {
    /// Multiply-adds one dispatch did.
    pub fn madds(&self) -> f64 {
        f64::from(self.groups) * f64::from(WORKGROUP) * MADDS_PER_INVOCATION as f64
    }

    fn rate(&self, t: Duration) -> f64 {
        2.0 * self.madds() / t.as_secs_f64().max(1e-9) / 1e9
    }

    /// `peak_f32`'s rate, GFLOP/s (a multiply-add is 2 FLOPs), dispatch
    /// overhead included.
    pub fn f32_gflops(&self) -> f64 {
        self.rate(self.f32)
    }

    /// `peak_f32_fma`'s rate, GFLOP/s. Where it equals [`Self::f32_gflops`]
    /// the device does not fuse (lavapipe); where it is about twice, it does.
    pub fn f32_fma_gflops(&self) -> f64 {
        self.rate(self.f32_fma)
    }

    /// `peak_i32`'s rate, GOP/s (a multiply-add is 2 ops). One packed-pair
    /// multiply-add makes two int8 x int4 products, so the packed pairs'
    /// ceiling in the products' counting is twice this.
    pub fn i32_gops(&self) -> f64 {
        self.rate(self.i32)
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct PeakPush {
    iters: u32,
    out_off: u32,
    a: u32,
    b: u32,
}

/// What invocation `g` (global index) stores: the sum of its 12
/// accumulators, each `start + 8 * ITERS` with starts `g & 255`, `+ 1`,
/// `+ 2` (an exact integer in f32 and i32).
pub fn expected(g: u32) -> i64 {
    let start = i64::from(g & 255);
    4 * (3 * (start + 8 * i64::from(ITERS)) + 3)
}

/// Runs each kernel 5 times over `groups` workgroups,
/// alternating, and checks every invocation's output against [`expected`].
///
/// Shapes: `groups` workgroups of [`WORKGROUP`] invocations, each
/// [`MADDS_PER_INVOCATION`] multiply-adds; on lavapipe 32 workgroups take
/// about 25 ms a kernel on two cores, and a GPU needs thousands to fill.
///
/// # Errors
/// Device errors; [`VkError::Inval`] for `groups` 0 or when an output is
/// wrong (a device that did not run every step as written).
pub fn measure(dev: &Device, groups: u32) -> VkResult<Peaks> {
    if groups == 0 {
        return Err(VkError::Inval("peak: groups must be at least 1".into()));
    }
    let kernels = Kernels::only(dev, &KERNELS)?;
    let n = groups as usize * WORKGROUP as usize;
    let bufs = (0..BINDINGS)
        .map(|i| {
            let size = if i == 1 {
                (KERNELS.len() * n * 4) as u64
            } else {
                16
            };
            Buffer::new(dev, size, Location::Readback, "peak")
        })
        .collect::<VkResult<Vec<_>>>()?;
    let refs: Vec<&Buffer> = bufs.iter().collect();
    let set = BindingSet::new(&kernels, &refs)?;
    let mut pool = CommandPool::new(dev)?;
    let mut best = [Duration::MAX; 3];
    for _ in 0..RUNS {
        for (i, name) in KERNELS.iter().enumerate() {
            let (a, b) = if i == 2 {
                (1i32 as u32, 1i32 as u32)
            } else {
                (1f32.to_bits(), 1f32.to_bits())
            };
            let push = PeakPush {
                iters: ITERS,
                out_off: (i * n) as u32,
                a,
                b,
            };
            let t =
                super::form::time_dispatch(&mut pool, &kernels, &set, name, &push, [groups, 1, 1])?;
            best[i] = best[i].min(t);
        }
    }
    pool.reset()?;
    let mut out = vec![0f32; KERNELS.len() * n];
    bufs[1].read(0, &mut out)?;
    for (i, name) in KERNELS.iter().enumerate() {
        for g in 0..n {
            let v = out[i * n + g];
            let got = if i == 2 {
                i64::from(v.to_bits() as i32)
            } else {
                v as i64
            };
            let want = expected(g as u32);
            if got != want || (i != 2 && v != want as f32) {
                return Err(VkError::Inval(format!(
                    "{name}: invocation {g} computed {got}, expected {want} (the device \
                     did not run every step as written)"
                )));
            }
        }
    }
    Ok(Peaks {
        groups,
        f32: best[0],
        f32_fma: best[1],
        i32: best[2],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_is_the_sum_of_the_accumulators() {
        for g in [0u32, 1, 255, 256, 1000] {
            let start = i64::from(g & 255);
            let end = |s: i64| s + 8 * i64::from(ITERS);
            let want = 4 * (end(start) + end(start + 1) + end(start + 2));
            assert_eq!(expected(g), want);
            // Exact in f32: every partial sum is an integer under 2^24.
            assert!(want < 1 << 24);
        }
    }
}
