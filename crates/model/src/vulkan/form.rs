//! Which kernel form ([`Variant`]) a device runs: by what it supports and
//! what it measures, never by its device type.
//!
//! The rule ([`choose`]):
//! 1. The GPU form ([`Variant::Gpu`]: workgroup memory and barriers, storage
//!    buffers) needs nothing beyond Vulkan 1.2 compute: always eligible.
//! 2. The CPU form ([`Variant::Cpu`]: barrier-free, subgroups, the weight and
//!    KV images) is eligible only where the compute stage has subgroups of
//!    at least 8 lanes with the basic, ballot and arithmetic operations its
//!    kernels use ([`xtc_vk::Device::subgroup_size`]; `XTC_VK_MASK=subgroups`
//!    hides them) and the shape fits its limits (the caller's `cpu_fits`:
//!    the KV image and the attention loop budget, see
//!    [`super::llama::GpuLlamaOptions::max_context`]).
//!    (The f32 model's CPU form uses no subgroups: eligible everywhere.)
//! 3. Where both are eligible, a probe measures the cost of a workgroup
//!    barrier ([`BarrierProbe`]: the same arithmetic with and without two
//!    barriers per step, `kernels/form_probe.wgsl`); the CPU form is chosen
//!    when barriers make that work at least [`CPU_FORM_RATIO`] times slower
//!    (a CPU device switches between a workgroup's fibers at every barrier;
//!    a GPU pays a few cycles), else the GPU form.
//!
//! The probe runs once per device and driver (tens of milliseconds), then the
//! ratio is kept for the process and in
//! `${XDG_CACHE_HOME:-$HOME/.cache}/xtc/form-probe/<key>` (the key: PCI
//! vendor and device ids, `driverVersion` and a hash of the device and
//! driver names; a file that is absent or unreadable is measured again; a
//! cache that cannot be written is not an error).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::ops::Variant;
use xtc_vk::{
    BINDINGS, BindingSet, Buffer, CommandPool, Device, Kernels, Location, VkError, VkResult,
};

/// Barrier-to-plain time ratio ([`BarrierProbe::ratio`]) at or above which
/// the CPU form is chosen. lavapipe measures 10 or more (its barriers switch
/// coroutines); a GPU about 1.
pub const CPU_FORM_RATIO: f64 = 3.0;

/// Steps per invocation of the probe kernels (well inside llvmpipe's loop
/// budget, [`super::ops::LANE_LOOP_BUDGET`]).
const ITERS: u32 = 512;
/// Workgroups of 64 per probe dispatch.
const GROUPS: u32 = 64;
/// Timed runs of each kernel (the fastest counts).
const RUNS: usize = 5;

/// What the barrier probe measured on one device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BarrierProbe {
    /// Fastest submit-to-completion time of `form_probe_barrier`.
    pub barrier: Duration,
    /// Fastest submit-to-completion time of `form_probe_plain`.
    pub plain: Duration,
}

impl BarrierProbe {
    /// `barrier / plain` (how much two barriers per step slow the same
    /// work down; 1 where barriers are free).
    pub fn ratio(&self) -> f64 {
        self.barrier.as_secs_f64() / self.plain.as_secs_f64().max(1e-9)
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ProbePush {
    iters: u32,
    out_off: u32,
}

/// The host's result of one probe kernel for `l` (invocation in its
/// workgroup): what `form_probe_barrier` (`barrier`) or `form_probe_plain`
/// computes, in the same f32 operations.
pub fn probe_expected(barrier: bool) -> Vec<f32> {
    let mut acc: Vec<f32> = (0..64).map(|l| l as f32).collect();
    for _ in 0..ITERS {
        acc = (0..64)
            .map(|l| {
                let from = if barrier { acc[(l + 1) & 63] } else { acc[l] };
                from * 0.5 + l as f32
            })
            .collect();
    }
    acc
}

/// Runs both probe kernels `RUNS` (5) times each, alternating, and checks
/// their results against [`probe_expected`].
///
/// # Errors
/// Device errors; [`VkError::Inval`] when a kernel's output is wrong (a
/// device that does not run it as written).
pub fn measure(dev: &Device) -> VkResult<BarrierProbe> {
    let kernels = Kernels::only(dev, &["form_probe_barrier", "form_probe_plain"])?;
    let n = (GROUPS * 64) as usize;
    let bufs = (0..BINDINGS)
        .map(|i| {
            let size = if i == 1 { 2 * n as u64 * 4 } else { 16 };
            Buffer::new(dev, size, Location::Readback, "form probe")
        })
        .collect::<VkResult<Vec<_>>>()?;
    let refs: Vec<&Buffer> = bufs.iter().collect();
    let set = BindingSet::new(&kernels, &refs)?;
    let mut pool = CommandPool::new(dev)?;
    let mut best = [Duration::MAX; 2];
    for _ in 0..RUNS {
        for (i, name) in ["form_probe_barrier", "form_probe_plain"]
            .iter()
            .enumerate()
        {
            let push = ProbePush {
                iters: ITERS,
                out_off: (i * n) as u32,
            };
            let t = time_dispatch(&mut pool, &kernels, &set, name, &push, [GROUPS, 1, 1])?;
            best[i] = best[i].min(t);
        }
    }
    pool.reset()?;
    let mut out = vec![0f32; 2 * n];
    bufs[1].read(0, &mut out)?;
    for (i, barrier) in [true, false].into_iter().enumerate() {
        let want = probe_expected(barrier);
        let got = &out[i * n..(i + 1) * n];
        if let Some(j) = (0..n).find(|&j| got[j] != want[j % 64]) {
            return Err(VkError::Inval(format!(
                "form probe ({}): invocation {j} computed {}, expected {}",
                if barrier { "barrier" } else { "plain" },
                got[j],
                want[j % 64]
            )));
        }
    }
    Ok(BarrierProbe {
        barrier: best[0],
        plain: best[1],
    })
}

/// Submit-to-completion time of one dispatch of `name` over `grid` with
/// `push`, alone in its command buffer (`pool` is reset first; the results
/// are visible to the host after it).
///
/// # Errors
/// Device errors; an unknown or unsupported `name`.
pub(crate) fn time_dispatch<P: bytemuck::Pod>(
    pool: &mut CommandPool,
    kernels: &Kernels,
    set: &BindingSet,
    name: &str,
    push: &P,
    grid: [u32; 3],
) -> VkResult<Duration> {
    pool.reset()?;
    let mut rec = pool.record(kernels, set)?;
    rec.dispatch(kernels.get(name)?, push, grid)?;
    rec.host_barrier();
    let cmd = rec.finish()?;
    let t = Instant::now();
    pool.submit(vec![cmd])?.wait(None)?;
    Ok(t.elapsed())
}

/// The cache key of `dev`: vendor and device ids, driver version, and an
/// FNV-1a hash of the device name and driver.
pub fn cache_key(dev: &Device) -> String {
    let i = dev.info();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in i.name.bytes().chain([0]).chain(i.driver.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!(
        "{:04x}-{:04x}-{:08x}-{h:016x}",
        i.vendor_id, i.device_id, i.driver_version
    )
}

/// `${XDG_CACHE_HOME:-$HOME/.cache}/xtc/<sub>` (`form-probe` here), or
/// `None` without either variable.
pub(crate) fn cache_dir(sub: &str) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("xtc").join(sub))
}

/// The 1-minute load average per online CPU (`/proc/loadavg`), or `None`
/// where it cannot be read.
fn load_per_cpu() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let load: f64 = text.split_whitespace().next()?.parse().ok()?;
    let cpus = std::thread::available_parallelism().ok()?.get();
    Some(load / cpus as f64)
}

/// Load per CPU (1-minute average) from which a probe's measurement is
/// taken as made on a busy machine ([`cache_text`]).
pub const BUSY_LOAD_PER_CPU: f64 = 0.5;

/// What `cached_ratio` writes for a ratio `r` of `field`: the line
/// `<field>=<r>`, and where the load per CPU before measuring was at least
/// [`BUSY_LOAD_PER_CPU`], a second line `busy_load_per_cpu=<load>`: such a
/// ratio is used by the process that measured it, but the next process
/// measures again ([`cached_value`]), so a ratio measured while, say, a CI
/// job shared the cores does not decide for good.
pub fn cache_text(field: &str, r: f64, load_per_cpu: Option<f64>) -> String {
    match load_per_cpu {
        Some(l) if l >= BUSY_LOAD_PER_CPU => format!("{field}={r}\nbusy_load_per_cpu={l:.2}\n"),
        _ => format!("{field}={r}\n"),
    }
}

/// The ratio of `field` that a cache file's `text` settles: `None` (measure
/// again) for a missing line, a value that is not a positive finite number,
/// or a measurement made on a busy machine ([`cache_text`]).
pub fn cached_value(text: &str, field: &str) -> Option<f64> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let r = lines
        .next()?
        .strip_prefix(field)?
        .strip_prefix('=')?
        .parse::<f64>()
        .ok()?;
    let busy = lines.any(|l| l.starts_with("busy_load_per_cpu="));
    (r.is_finite() && r > 0.0 && !busy).then_some(r)
}

/// A ratio a probe measures once per device: from this process's memory,
/// else the file `<cache_dir(sub)>/<key>` ([`cached_value`] of its text),
/// else `measure()`d and stored in both ([`cache_text`]: a ratio measured
/// on a busy machine is measured again by the next process; a cache that
/// cannot be written is not an error).
///
/// # Errors
/// As `measure`.
pub(crate) fn cached_ratio(
    sub: &str,
    key: String,
    field: &str,
    measure: impl FnOnce() -> VkResult<f64>,
) -> VkResult<f64> {
    static SEEN: Mutex<Option<HashMap<String, f64>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let seen = seen.get_or_insert_with(HashMap::new);
    let mem_key = format!("{sub}/{key}");
    if let Some(&r) = seen.get(&mem_key) {
        return Ok(r);
    }
    let file = cache_dir(sub).map(|d| d.join(&key));
    let cached = file
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .and_then(|s| cached_value(&s, field));
    let ratio = match cached {
        Some(r) => r,
        None => {
            let load = load_per_cpu();
            let r = measure()?;
            if let Some(f) = &file {
                // Best effort: a read-only home only costs the next process
                // the probe again.
                let _ = std::fs::create_dir_all(f.parent().unwrap_or(f));
                let _ = std::fs::write(f, cache_text(field, r, load));
            }
            r
        }
    };
    seen.insert(mem_key, ratio);
    Ok(ratio)
}

/// The barrier ratio of `dev`: from this process's memory, else the cache
/// file, else measured ([`measure`]) and stored in both.
///
/// # Errors
/// As [`measure`].
pub fn barrier_ratio(dev: &Device) -> VkResult<f64> {
    cached_ratio("form-probe", cache_key(dev), "barrier_ratio", || {
        Ok(measure(dev)?.ratio())
    })
}

/// Whether `dev` has what the CPU form's kernels use: subgroups of at least
/// 8 lanes with the basic, ballot and arithmetic operations.
pub fn cpu_form_supported(dev: &Device) -> bool {
    dev.subgroup_size().is_some_and(|s| s >= 8)
}

/// The form `dev` runs by the rule of the module documentation, where
/// `cpu_eligible` says whether the CPU form can run the caller's kernels and
/// shape there (for the quantized model: [`cpu_form_supported`] and its
/// limits; the f32 model's CPU form uses no subgroups).
///
/// # Errors
/// As [`measure`] (only where both forms are eligible and no ratio is cached).
pub fn choose(dev: &Device, cpu_eligible: bool) -> VkResult<Variant> {
    if !cpu_eligible {
        return Ok(Variant::Gpu);
    }
    Ok(if barrier_ratio(dev)? >= CPU_FORM_RATIO {
        Variant::Cpu
    } else {
        Variant::Gpu
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_measured_on_a_busy_machine_is_measured_again() {
        let quiet = cache_text("f32_over_int8", 1.25, Some(0.2));
        assert_eq!(quiet, "f32_over_int8=1.25\n");
        assert_eq!(cached_value(&quiet, "f32_over_int8"), Some(1.25));
        assert_eq!(
            cache_text("r", 2.0, None),
            "r=2\n",
            "no load average: quiet"
        );
        let busy = cache_text("f32_over_int8", 0.77, Some(1.4));
        assert_eq!(busy, "f32_over_int8=0.77\nbusy_load_per_cpu=1.40\n");
        assert_eq!(cached_value(&busy, "f32_over_int8"), None);
        assert_eq!(
            cached_value(&cache_text("r", 3.0, Some(BUSY_LOAD_PER_CPU)), "r"),
            None,
            "at the bound: busy"
        );
        // Absent, another field, not a positive finite number.
        for text in [
            "",
            "barrier_ratio=2\n",
            "r=0\n",
            "r=-1\n",
            "r=NaN\n",
            "r=x\n",
            "rr=2\n",
        ] {
            assert_eq!(cached_value(text, "r"), None, "{text:?}");
        }
        assert_eq!(cached_value("  r=2.5  \n\n", "r"), Some(2.5));
    }
}
