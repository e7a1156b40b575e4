//! The machine's roofline (issue 23, item 2): memory bandwidth (a
//! STREAM-like triad `a[i] = b[i] + s * c[i]` over f64 arrays well past the
//! last-level cache, one thread per core), and the f32 fused multiply-add and
//! int8 multiply-add peaks of these cores (every core busy, independent
//! accumulators in registers).
//!
//! Paths: on x86_64 the widest the CPU has, detected at run time: AVX-512
//! (`vfmadd231ps zmm`, `vpdpbusd zmm`, through `asm!`: the AVX-512
//! intrinsics are newer than the workspace's rust-version), else AVX2 + FMA
//! (`_mm256_fmadd_ps`; int8 as `vpmaddubsw` + `vpmaddwd`, llama.cpp's AVX2
//! form), else portable scalar Rust. The table says which ran. Counting:
//! an FMA is 2 FLOPs; an int8 multiply-add (u8 x i8 summed into i32) is 2
//! ops; the triad moves 24 bytes per element (STREAM's convention).
//!
//! Then the device's own ceiling, where a Vulkan device opens
//! (`decode::model::vulkan::peak`: register-only multiply-add kernels, every
//! output checked): what the device's compiler makes of shader arithmetic on
//! these cores. On lavapipe it is a fraction of the machine's FMA peak
//! (llvmpipe emits a multiply and an add for every `fma`, 8 lanes wide), and
//! the kernel profile of `--bench llama` reads each product against both.
//!
//! `cargo bench --bench roofline`; `XTC_BENCH_QUICK=1` runs fewer
//! repetitions; `XTC_BENCH_JSON=PATH` writes the figures as JSON (the peer
//! harness passes it to `--bench llama` through `XTC_ROOFLINE_JSON`, which
//! prints each product's fraction of these peaks).

use std::hint::black_box;
use std::time::Instant;

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Best GB/s of `reps` triads over `n` f64 elements per array, split
/// between the threads (each first-touches its own part).
fn triad(n: usize, reps: usize) -> f64 {
    let t = threads();
    let chunk = n.div_ceil(t);
    let mut a = Vec::<f64>::with_capacity(n);
    let mut b = Vec::<f64>::with_capacity(n);
    let mut c = Vec::<f64>::with_capacity(n);
    // SAFETY: f64 has no invalid bit patterns; every element is written in
    // the first-touch pass below before any read.
    unsafe {
        a.set_len(n);
        b.set_len(n);
        c.set_len(n);
    }
    std::thread::scope(|s| {
        for ((a, b), c) in a
            .chunks_mut(chunk)
            .zip(b.chunks_mut(chunk))
            .zip(c.chunks_mut(chunk))
        {
            s.spawn(move || {
                a.fill(0.0);
                b.fill(1.0);
                c.fill(2.0);
            });
        }
    });
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for ((a, b), c) in a
                .chunks_mut(chunk)
                .zip(b.chunks(chunk))
                .zip(c.chunks(chunk))
            {
                s.spawn(move || {
                    let q = black_box(3.0);
                    for ((a, b), c) in a.iter_mut().zip(b).zip(c) {
                        *a = b + q * c;
                    }
                });
            }
        });
        best = best.min(t0.elapsed().as_secs_f64());
        black_box(&a);
    }
    24.0 * n as f64 / best / 1e9
}

/// Runs `kernel(iters)` (which returns the ops it did) on every core at
/// once, `reps` times; the best aggregate ops/s in G.
fn peak(reps: usize, iters: u64, kernel: fn(u64) -> f64) -> f64 {
    let t = threads();
    let mut best = 0f64;
    for _ in 0..reps {
        let t0 = Instant::now();
        let ops: f64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..t).map(|_| s.spawn(move || kernel(iters))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        best = best.max(ops / t0.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// Scalar f32 FMA chains (the compiler may vectorize them; `mul_add` is
/// not used: without hardware FMA it is a library call).
fn f32_scalar(iters: u64) -> f64 {
    let mut acc = [0f32; 16];
    let (x, y) = (black_box(1.000_001f32), black_box(0.999_999f32));
    for _ in 0..iters {
        for a in &mut acc {
            *a = *a * x + y;
        }
    }
    black_box(acc);
    2.0 * 16.0 * iters as f64
}

fn i8_scalar(iters: u64) -> f64 {
    let mut acc = [0i32; 16];
    let (x, y) = (black_box(3u8), black_box(-5i8));
    for _ in 0..iters {
        for a in &mut acc {
            *a = a.wrapping_add(i32::from(x) * i32::from(y));
        }
    }
    black_box(acc);
    2.0 * 16.0 * iters as f64
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::hint::black_box;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn f32_avx2_inner(iters: u64) -> f64 {
        let x = _mm256_set1_ps(black_box(1.000_001));
        let y = _mm256_set1_ps(black_box(0.999_999));
        let mut a = [_mm256_setzero_ps(); 10];
        for _ in 0..iters {
            for v in &mut a {
                *v = _mm256_fmadd_ps(*v, x, y);
            }
        }
        black_box(a);
        2.0 * 8.0 * 10.0 * iters as f64
    }

    pub fn f32_avx2(iters: u64) -> f64 {
        // SAFETY: called only when avx2 and fma were detected.
        unsafe { f32_avx2_inner(iters) }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn i8_avx2_inner(iters: u64) -> f64 {
        let u = _mm256_set1_epi8(black_box(3));
        let s = _mm256_set1_epi8(black_box(-5));
        let ones = _mm256_set1_epi16(1);
        let mut a = [_mm256_setzero_si256(); 8];
        for _ in 0..iters {
            for v in &mut a {
                let p = _mm256_maddubs_epi16(u, s);
                *v = _mm256_add_epi32(*v, _mm256_madd_epi16(p, ones));
            }
        }
        black_box(a);
        2.0 * 32.0 * 8.0 * iters as f64
    }

    pub fn i8_avx2(iters: u64) -> f64 {
        // SAFETY: called only when avx2 was detected.
        unsafe { i8_avx2_inner(iters) }
    }

    /// 12 independent `vfmadd231ps zmm` per iteration.
    pub fn f32_avx512(iters: u64) -> f64 {
        let x = [black_box(1.000_001f32); 16];
        let y = [black_box(0.999_999f32); 16];
        // SAFETY: called only when avx512f was detected; reads 64 bytes from
        // each of `x` and `y`; clobbers the vector registers it names (all
        // caller-saved) and ends with vzeroupper.
        unsafe {
            asm!(
                "vmovups zmm12, [{x}]",
                "vmovups zmm13, [{y}]",
                "vpxord zmm0, zmm0, zmm0", "vpxord zmm1, zmm1, zmm1",
                "vpxord zmm2, zmm2, zmm2", "vpxord zmm3, zmm3, zmm3",
                "vpxord zmm4, zmm4, zmm4", "vpxord zmm5, zmm5, zmm5",
                "vpxord zmm6, zmm6, zmm6", "vpxord zmm7, zmm7, zmm7",
                "vpxord zmm8, zmm8, zmm8", "vpxord zmm9, zmm9, zmm9",
                "vpxord zmm10, zmm10, zmm10", "vpxord zmm11, zmm11, zmm11",
                "2:",
                "vfmadd231ps zmm0, zmm12, zmm13", "vfmadd231ps zmm1, zmm12, zmm13",
                "vfmadd231ps zmm2, zmm12, zmm13", "vfmadd231ps zmm3, zmm12, zmm13",
                "vfmadd231ps zmm4, zmm12, zmm13", "vfmadd231ps zmm5, zmm12, zmm13",
                "vfmadd231ps zmm6, zmm12, zmm13", "vfmadd231ps zmm7, zmm12, zmm13",
                "vfmadd231ps zmm8, zmm12, zmm13", "vfmadd231ps zmm9, zmm12, zmm13",
                "vfmadd231ps zmm10, zmm12, zmm13", "vfmadd231ps zmm11, zmm12, zmm13",
                "dec {n}",
                "jnz 2b",
                "vzeroupper",
                x = in(reg) x.as_ptr(),
                y = in(reg) y.as_ptr(),
                n = inout(reg) iters.max(1) => _,
                out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
                out("xmm12") _, out("xmm13") _,
                options(nostack, readonly),
            );
        }
        2.0 * 16.0 * 12.0 * iters.max(1) as f64
    }

    /// 12 independent `vpdpbusd zmm` (64 u8 x i8 products into i32 each)
    /// per iteration.
    pub fn i8_avx512vnni(iters: u64) -> f64 {
        let u = [black_box(3u8); 64];
        let s = [black_box(-5i8); 64];
        // SAFETY: called only when avx512f and avx512vnni were detected;
        // reads 64 bytes from each of `u` and `s`; clobbers only the vector
        // registers it names (caller-saved) and ends with vzeroupper.
        unsafe {
            asm!(
                "vmovdqu8 zmm12, [{u}]",
                "vmovdqu8 zmm13, [{s}]",
                "vpxord zmm0, zmm0, zmm0", "vpxord zmm1, zmm1, zmm1",
                "vpxord zmm2, zmm2, zmm2", "vpxord zmm3, zmm3, zmm3",
                "vpxord zmm4, zmm4, zmm4", "vpxord zmm5, zmm5, zmm5",
                "vpxord zmm6, zmm6, zmm6", "vpxord zmm7, zmm7, zmm7",
                "vpxord zmm8, zmm8, zmm8", "vpxord zmm9, zmm9, zmm9",
                "vpxord zmm10, zmm10, zmm10", "vpxord zmm11, zmm11, zmm11",
                "2:",
                "vpdpbusd zmm0, zmm12, zmm13", "vpdpbusd zmm1, zmm12, zmm13",
                "vpdpbusd zmm2, zmm12, zmm13", "vpdpbusd zmm3, zmm12, zmm13",
                "vpdpbusd zmm4, zmm12, zmm13", "vpdpbusd zmm5, zmm12, zmm13",
                "vpdpbusd zmm6, zmm12, zmm13", "vpdpbusd zmm7, zmm12, zmm13",
                "vpdpbusd zmm8, zmm12, zmm13", "vpdpbusd zmm9, zmm12, zmm13",
                "vpdpbusd zmm10, zmm12, zmm13", "vpdpbusd zmm11, zmm12, zmm13",
                "dec {n}",
                "jnz 2b",
                "vzeroupper",
                u = in(reg) u.as_ptr(),
                s = in(reg) s.as_ptr(),
                n = inout(reg) iters.max(1) => _,
                out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
                out("xmm12") _, out("xmm13") _,
                options(nostack, readonly),
            );
        }
        2.0 * 64.0 * 12.0 * iters.max(1) as f64
    }
}

type Kernel = fn(u64) -> f64;

/// The default Vulkan device's multiply-add ceiling
/// (`decode::model::vulkan::peak`), printed; `None` (with the reason
/// printed) where no device opens.
fn device_ceiling() -> Option<(String, xtc_model::vulkan::peak::Peaks)> {
    use xtc_vk::{Device, DeviceKind, Selector};
    let dev = match Device::open(&Selector::Auto) {
        Ok(d) => d,
        Err(e) => {
            println!("device ceiling: no Vulkan device ({e})");
            return None;
        }
    };
    // Enough workgroups of 64 to keep every lavapipe thread busy for tens
    // of milliseconds (its rate stops rising from about 2,048 invocations
    // on two cores); a GPU needs hundreds of thousands of invocations.
    let groups = if dev.info().kind == DeviceKind::Cpu {
        32
    } else {
        8_192
    };
    let name = dev.info().name.clone();
    match xtc_model::vulkan::peak::measure(&dev, groups) {
        Ok(p) => {
            println!(
                "device ceiling on {name} (kernels/peak.wgsl, {groups} workgroups of 64, outputs checked):"
            );
            println!(
                "{:<28} {:>10.1} GFLOP/s (acc * a + b)",
                "f32 multiply-add",
                p.f32_gflops()
            );
            println!(
                "{:<28} {:>10.1} GFLOP/s (fma(acc, a, b): {})",
                "f32 fma builtin",
                p.f32_fma_gflops(),
                if p.f32_fma_gflops() > 1.5 * p.f32_gflops() {
                    "fused"
                } else {
                    "not faster: no fused multiply-add"
                }
            );
            println!(
                "{:<28} {:>10.1} GOP/s   (acc * a + b in i32; the packed pairs' two products a multiply: {:.1})",
                "i32 multiply-add",
                p.i32_gops(),
                2.0 * p.i32_gops()
            );
            Some((name, p))
        }
        Err(e) => {
            println!("device ceiling on {name}: {e}");
            None
        }
    }
}

/// The widest f32 FMA and int8 kernels this CPU runs, with their names.
fn kernels() -> ((&'static str, Kernel), (&'static str, Kernel)) {
    #[cfg(target_arch = "x86_64")]
    {
        let f = if std::arch::is_x86_feature_detected!("avx512f") {
            ("avx512f vfmadd231ps zmm (asm)", x86::f32_avx512 as Kernel)
        } else if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            ("avx2+fma _mm256_fmadd_ps", x86::f32_avx2 as Kernel)
        } else {
            ("scalar", f32_scalar as Kernel)
        };
        let i = if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vnni")
        {
            (
                "avx512vnni vpdpbusd zmm (asm)",
                x86::i8_avx512vnni as Kernel,
            )
        } else if std::arch::is_x86_feature_detected!("avx2") {
            ("avx2 vpmaddubsw+vpmaddwd", x86::i8_avx2 as Kernel)
        } else {
            ("scalar", i8_scalar as Kernel)
        };
        (f, i)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        (
            ("scalar", f32_scalar as Kernel),
            ("scalar", i8_scalar as Kernel),
        )
    }
}

fn main() {
    let quick = std::env::var_os("XTC_BENCH_QUICK").is_some();
    let reps = if quick { 3 } else { 7 };
    let t = threads();
    // 3 x 64 Mi f64 = 1.5 GiB: past any last-level cache a VM reports
    // (this one reports 480 MiB, the host's).
    let n = 64 << 20;
    let gbs = triad(n, reps);
    let ((fname, fk), (iname, ik)) = kernels();
    let iters = if quick { 20_000_000 } else { 50_000_000 };
    let scalar_iters = iters / 8;
    let f32_g = peak(reps, iters, fk);
    let i8_g = peak(reps, iters, ik);
    let f32_scalar_g = peak(reps.min(3), scalar_iters, f32_scalar);
    println!("roofline on {t} thread(s), best of {reps}:");
    println!(
        "{:<28} {:>10.1} GB/s   (3 x {} MiB f64 arrays)",
        "triad a = b + s*c",
        gbs,
        (n * 8) >> 20
    );
    println!("{:<28} {:>10.1} GFLOP/s ({fname})", "f32 FMA peak", f32_g);
    println!(
        "{:<28} {:>10.1} GOP/s   ({iname})",
        "int8 multiply-add peak", i8_g
    );
    println!(
        "{:<28} {:>10.1} GFLOP/s (scalar Rust, for reference)",
        "f32 scalar-loop FMA", f32_scalar_g
    );
    println!(
        "ridge points: f32 {:.1} FLOP/byte, int8 {:.1} op/byte",
        f32_g / gbs,
        i8_g / gbs
    );
    let device = device_ceiling();
    if let Some((_, d)) = &device {
        println!(
            "the device's f32 ceiling is {:.1}% of the machine's FMA peak",
            100.0 * d.f32_gflops() / f32_g
        );
    }
    if let Some(p) = std::env::var_os("XTC_BENCH_JSON") {
        let mut v = serde_json::json!({
            "threads": t, "triad_gbs": gbs, "triad_mib_per_array": (n * 8) >> 20,
            "f32_fma_gflops": f32_g, "f32_path": fname,
            "int8_gops": i8_g, "int8_path": iname,
            "f32_scalar_gflops": f32_scalar_g,
            "path": format!("{fname}; {iname}"),
        });
        if let Some((name, p)) = device {
            v["device"] = serde_json::json!({
                "name": name, "groups": p.groups,
                "f32_gflops": p.f32_gflops(), "f32_fma_gflops": p.f32_fma_gflops(),
                "i32_gops": p.i32_gops(),
                "f32_fraction_of_fma_peak": p.f32_gflops() / f32_g,
            });
        }
        std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    }
}
