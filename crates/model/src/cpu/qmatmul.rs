//! The quantized matrix product of the CPU reference, over the block
//! formats of [`crate::format::quant`]: the oracle of the Vulkan
//! kernels.
//!
//! # The product, and why it is the oracle
//! [`matmul`] computes `y[i][o] = sum_k W[o][k] * x[i][k]` for `W` of
//! `[rows, cols]` in any of the formats and `x` of `[m, cols]` f32, without
//! ever materialising `W` in f32: each 32-element block is decoded into a
//! stack array as it is used (its integer codes as f32, plus the scale `d`
//! and min `m`), once for all `m` rows of `x`.
//!
//! The arithmetic is defined exactly, f32 throughout, so every build and
//! every thread split gives the same bits (the Vulkan kernels are compared to
//! it with a tolerance; this is the reference they are measured against):
//! 1. per block `b` and lane `l in 0..8`, with `c_k = q[8k+l]·x[8k+l]`:
//!    `p[l] = ((c_0 + c_1) + c_2) + c_3`, each product and sum rounded (no
//!    fused multiply-add: Rust never contracts, with or without FMA);
//! 2. `acc[l] += d · p[l]` over the blocks in order (`acc` starts at 0);
//! 3. blocks with a min (Q4_1): `mins += m · xsum_b` over the blocks in order,
//!    `xsum_b` the block's sum of `x` in the same lane order and tree as 4;
//! 4. `y = reduce(acc) + mins` with `reduce(a) = ((a0+a4) + (a2+a6)) +
//!    ((a1+a5) + (a3+a7))`.
//!
//! Activations are never quantized (llama.cpp's Q8 activation trick is not
//! used): the only rounding is that of f32 arithmetic.
//!
//! # Speed
//! The portable kernel's lane arrays are 8 f32 wide (one AVX2 register). The
//! crate is built for baseline x86-64 (SSE2), where LLVM vectorizes them
//! poorly, so on x86-64 an AVX2 form written with intrinsics is chosen at run
//! time when the CPU has AVX2; the two are bit-identical by construction
//! (test `avx2_and_baseline_kernels_agree_bit_for_bit`). Rows are split over the
//! rayon pool when the product is large enough to pay for it.
//!
//! # Safety
//! Calling the AVX2 kernel (`avx2::rows`, 256-bit intrinsics doing the
//! portable code's operations lane for lane) is unsafe: it executes AVX2
//! instructions. It is called only with [`Isa::Avx2`], which
//! [`best_isa`] returns only when the CPU reports AVX2 at run time, and
//! [`matmul_with`] asserts the same before any call.
#![allow(unsafe_code)]

use std::ops::Range;

use rayon::prelude::*;

use crate::format::gguf::GgmlType;
use crate::format::quant::{BLOCK, Block, F16B, F32B, Q40, Q41, Q80, QMatrix, f16_to_f32};

/// Lanes of the kernel's accumulators (one AVX2 register of f32).
const LANES: usize = 8;

/// Multiply-adds below which a product runs on the calling thread only.
const PARALLEL_MIN_MACS: usize = 1 << 16;

/// The kernel's fixed reduction of 8 lanes: halves, then quarters, then the pair.
#[inline(always)]
fn reduce8(a: &[f32; LANES]) -> f32 {
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let u = [t[0] + t[2], t[1] + t[3]];
    u[0] + u[1]
}

/// Step 1 of the module's definition: the 8 lane partials of one block.
#[inline(always)]
fn lane_dot(q: &[f32; BLOCK], x: &[f32; BLOCK]) -> [f32; LANES] {
    let mut p = [0f32; LANES];
    for l in 0..LANES {
        p[l] = q[l] * x[l];
    }
    for c in 1..BLOCK / LANES {
        for l in 0..LANES {
            p[l] += q[c * LANES + l] * x[c * LANES + l];
        }
    }
    p
}

/// Sum of one block of `x` in the kernel's lane order and tree.
#[inline(always)]
fn block_sum(x: &[f32; BLOCK]) -> f32 {
    let mut s = [0f32; LANES];
    s.copy_from_slice(&x[..LANES]);
    for c in 1..BLOCK / LANES {
        for l in 0..LANES {
            s[l] += x[c * LANES + l];
        }
    }
    reduce8(&s)
}

#[inline(always)]
fn xblock(x: &[f32], at: usize) -> &[f32; BLOCK] {
    x[at..at + BLOCK].try_into().expect("a whole block")
}

/// Rows `rows` of `W · xᵀ` into `out` (`[rows.len(), m]`, row-major by output
/// row), for `x` of `[m, cols]` and `xsum` its block sums (`[m, cols / 32]`,
/// used only by formats with a min).
#[inline(always)]
fn rows_body<B: Block>(
    w: &QMatrix<'_>,
    rows: Range<usize>,
    x: &[f32],
    m: usize,
    xsum: &[f32],
    out: &mut [f32],
) {
    let nb = w.cols / BLOCK;
    let mut q = [0f32; BLOCK];
    if m == 1 {
        for (o, r) in out.iter_mut().zip(rows) {
            let row = w.row(r);
            let mut acc = [0f32; LANES];
            let mut mins = 0f32;
            for b in 0..nb {
                let (d, mn) = B::decode(&row[b * B::BYTES..(b + 1) * B::BYTES], &mut q);
                let p = lane_dot(&q, xblock(x, b * BLOCK));
                for l in 0..LANES {
                    acc[l] += d * p[l];
                }
                if B::HAS_MIN {
                    mins += mn * xsum[b];
                }
            }
            *o = reduce8(&acc) + mins;
        }
        return;
    }
    let mut acc = vec![[0f32; LANES]; m];
    let mut mins = vec![0f32; m];
    for (o, r) in out.chunks_exact_mut(m).zip(rows) {
        let row = w.row(r);
        acc.fill([0.0; LANES]);
        mins.fill(0.0);
        for b in 0..nb {
            let (d, mn) = B::decode(&row[b * B::BYTES..(b + 1) * B::BYTES], &mut q);
            for i in 0..m {
                let p = lane_dot(&q, xblock(x, i * w.cols + b * BLOCK));
                for l in 0..LANES {
                    acc[i][l] += d * p[l];
                }
                if B::HAS_MIN {
                    mins[i] += mn * xsum[i * nb + b];
                }
            }
        }
        for i in 0..m {
            o[i] = reduce8(&acc[i]) + mins[i];
        }
    }
}

/// The AVX2 form of the kernel: the same operations as [`rows_body`], lane
/// for lane, written with 256-bit intrinsics (compiled with AVX2 enabled,
/// the portable code still had its nibble decode split into 2-byte pieces on
/// 128-bit registers; the intrinsics cut the model's CPU time by a third).
/// Every `mul`/`add`
/// is the IEEE single operation the portable code does, so the bits agree.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{BLOCK, Block, GgmlType, LANES, QMatrix, f16_to_f32, reduce8};

    /// Bytes ahead of the block in use that the kernel asks the CPU to
    /// fetch. The weights stream from memory once per token and the hardware
    /// prefetcher alone left the kernel waiting on loads: a 35 MB Q4_1
    /// product ran at 0.6 GB/s without, 3.2-3.7 GB/s with 2048 bytes ahead
    /// (1024: 2.4-3.2, 4096 and 8192 no better; shared 2-core machine,
    /// interleaved runs).
    const PREFETCH_AHEAD: usize = 2048;

    /// Hints the cache to fetch the line at `base + off` (past the end of
    /// `base` too: a prefetch never faults).
    #[inline(always)]
    fn prefetch(base: &[u8], off: usize) {
        let p = base.as_ptr().wrapping_add(off).cast::<i8>();
        // SAFETY: a prefetch is a hint that never faults and reads nothing
        // into the program, whatever the address; SSE is part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p) }
    }

    #[inline(always)]
    fn bytes16(b: &[u8]) -> __m128i {
        bytemuck::cast(u128::from_le_bytes(b.try_into().expect("16 bytes")))
    }

    #[inline(always)]
    fn f32x8(x: &[f32]) -> __m256 {
        let a: [f32; 8] = x.try_into().expect("8 floats");
        bytemuck::cast(a)
    }

    /// Bytes 0..8 and 8..16 of `v`, zero-extended to 32 bits, as f32.
    #[target_feature(enable = "avx2")]
    fn u8_halves(v: __m128i) -> (__m256, __m256) {
        let lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
        let hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(v, v)));
        (lo, hi)
    }

    /// The block's 32 codes as four 8-lane f32 vectors, and `(d, m)`.
    #[target_feature(enable = "avx2")]
    fn decode<B: Block>(b: &[u8]) -> ([__m256; 4], f32, f32) {
        match B::TYPE {
            GgmlType::Q4_1 | GgmlType::Q4_0 => {
                let at = if B::TYPE == GgmlType::Q4_1 { 4 } else { 2 };
                let v = bytes16(&b[at..at + 16]);
                let mask = _mm_set1_epi8(15);
                let lo = _mm_and_si128(v, mask);
                let hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
                let (q0, q1) = u8_halves(lo);
                let (q2, q3) = u8_halves(hi);
                let d = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                if B::TYPE == GgmlType::Q4_1 {
                    (
                        [q0, q1, q2, q3],
                        d,
                        f16_to_f32(u16::from_le_bytes([b[2], b[3]])),
                    )
                } else {
                    let eight = _mm256_set1_ps(8.0);
                    let s = |q| _mm256_sub_ps(q, eight);
                    ([s(q0), s(q1), s(q2), s(q3)], d, 0.0)
                }
            }
            GgmlType::Q8_0 => {
                let v0 = bytes16(&b[2..18]);
                let v1 = bytes16(&b[18..34]);
                let c = |v| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
                let q = [
                    c(v0),
                    c(_mm_unpackhi_epi64(v0, v0)),
                    c(v1),
                    c(_mm_unpackhi_epi64(v1, v1)),
                ];
                (q, f16_to_f32(u16::from_le_bytes([b[0], b[1]])), 0.0)
            }
            GgmlType::F32 | GgmlType::F16 => {
                let mut q = [0f32; BLOCK];
                let (d, m) = B::decode(b, &mut q);
                let v = |c: usize| f32x8(&q[c * LANES..(c + 1) * LANES]);
                ([v(0), v(1), v(2), v(3)], d, m)
            }
        }
    }

    /// `((q0·x0 + q1·x1) + q2·x2) + q3·x3`, lane by lane.
    #[target_feature(enable = "avx2")]
    fn lane_dot(q: &[__m256; 4], x: &[f32]) -> __m256 {
        let mut p = _mm256_mul_ps(q[0], f32x8(&x[0..8]));
        p = _mm256_add_ps(p, _mm256_mul_ps(q[1], f32x8(&x[8..16])));
        p = _mm256_add_ps(p, _mm256_mul_ps(q[2], f32x8(&x[16..24])));
        _mm256_add_ps(p, _mm256_mul_ps(q[3], f32x8(&x[24..32])))
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn rows<B: Block>(
        w: &QMatrix<'_>,
        rows: Range<usize>,
        x: &[f32],
        m: usize,
        xsum: &[f32],
        out: &mut [f32],
    ) {
        let nb = w.cols / BLOCK;
        if m == 1 {
            // One row of x: the accumulator stays in a register.
            for (o, r) in out.iter_mut().zip(rows) {
                let row = w.row(r);
                let mut acc = _mm256_setzero_ps();
                let mut mins = 0f32;
                for b in 0..nb {
                    prefetch(row, b * B::BYTES + PREFETCH_AHEAD);
                    let (q, d, mn) = decode::<B>(&row[b * B::BYTES..(b + 1) * B::BYTES]);
                    let p = lane_dot(&q, &x[b * BLOCK..(b + 1) * BLOCK]);
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(d), p));
                    if B::HAS_MIN {
                        mins += mn * xsum[b];
                    }
                }
                let a: [f32; LANES] = bytemuck::cast(acc);
                *o = reduce8(&a) + mins;
            }
            return;
        }
        // Several rows of x (prefill, a batch of streams): the weight row is
        // decoded once into `qs`, then x is taken in tiles of 4 rows whose
        // accumulators stay in registers; the min terms are summed after, in
        // block order (the same sums as the one-row path).
        let mut qs = vec![[_mm256_setzero_ps(); 4]; nb];
        let mut ds = vec![0f32; nb];
        let mut ms = vec![0f32; nb];
        for (o, r) in out.chunks_exact_mut(m).zip(rows) {
            let row = w.row(r);
            for b in 0..nb {
                prefetch(row, b * B::BYTES + PREFETCH_AHEAD);
                (qs[b], ds[b], ms[b]) = decode::<B>(&row[b * B::BYTES..(b + 1) * B::BYTES]);
            }
            let mut i = 0;
            while i < m {
                let n = (m - i).min(4);
                let xt = &x[i * w.cols..(i + n) * w.cols];
                let acc = match n {
                    4 => tile::<4>(&qs, &ds, xt, w.cols),
                    3 => pad(tile::<3>(&qs, &ds, xt, w.cols)),
                    2 => pad(tile::<2>(&qs, &ds, xt, w.cols)),
                    _ => pad(tile::<1>(&qs, &ds, xt, w.cols)),
                };
                for t in 0..n {
                    let a: [f32; LANES] = bytemuck::cast(acc[t]);
                    let mut mins = 0f32;
                    if B::HAS_MIN {
                        let xs = &xsum[(i + t) * nb..(i + t + 1) * nb];
                        for (mn, s) in ms.iter().zip(xs) {
                            mins += mn * s;
                        }
                    }
                    o[i + t] = reduce8(&a) + mins;
                }
                i += n;
            }
        }
    }

    /// `T` rows of x (`x` is `[T, cols]`) against one decoded weight row:
    /// `acc[t] += d_b · lane_dot(q_b, x_t[b])` over the blocks in order.
    #[target_feature(enable = "avx2")]
    fn tile<const T: usize>(qs: &[[__m256; 4]], ds: &[f32], x: &[f32], cols: usize) -> [__m256; T] {
        let mut acc = [_mm256_setzero_ps(); T];
        for (b, (q, &d)) in qs.iter().zip(ds).enumerate() {
            let dv = _mm256_set1_ps(d);
            for (t, a) in acc.iter_mut().enumerate() {
                let at = t * cols + b * BLOCK;
                *a = _mm256_add_ps(*a, _mm256_mul_ps(dv, lane_dot(q, &x[at..at + BLOCK])));
            }
        }
        acc
    }

    #[inline(always)]
    fn pad<const T: usize>(a: [__m256; T]) -> [__m256; 4] {
        let mut out = [a[0]; 4];
        out[..T].copy_from_slice(&a);
        out
    }
}

#[cfg(target_arch = "x86_64")]
fn rows_avx2<B: Block>(
    w: &QMatrix<'_>,
    rows: Range<usize>,
    x: &[f32],
    m: usize,
    xsum: &[f32],
    out: &mut [f32],
) {
    // SAFETY: `avx2::rows` executes AVX2 instructions; this function is only
    // reached through `Isa::Avx2`, which `best_isa` returns only when the CPU
    // reports AVX2 and `matmul_with` re-checks before any call.
    unsafe { avx2::rows::<B>(w, rows, x, m, xsum, out) }
}

fn rows_baseline<B: Block>(
    w: &QMatrix<'_>,
    rows: Range<usize>,
    x: &[f32],
    m: usize,
    xsum: &[f32],
    out: &mut [f32],
) {
    rows_body::<B>(w, rows, x, m, xsum, out)
}

/// Which compiled form of the kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// The crate's baseline target (SSE2 on x86-64).
    Baseline,
    /// AVX2 (x86-64 CPUs that have it).
    Avx2,
}

/// The best kernel form this CPU runs.
pub fn best_isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        return Isa::Avx2;
    }
    Isa::Baseline
}

fn rows_dispatch<B: Block>(
    isa: Isa,
    w: &QMatrix<'_>,
    rows: Range<usize>,
    x: &[f32],
    m: usize,
    xsum: &[f32],
    out: &mut [f32],
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => rows_avx2::<B>(w, rows, x, m, xsum, out),
        _ => rows_baseline::<B>(w, rows, x, m, xsum, out),
    }
}

/// `y = x · Wᵀ`: `y[i][o] = sum_k W[o][k] * x[i][k]` for `x` of `[m, cols]`
/// and `y` of `[m, rows]`, with the arithmetic the module documentation
/// defines (the same bits for any thread split and kernel form). Large
/// products split their rows over the rayon pool.
///
/// # Panics
/// If `x.len() != m * cols` or `y.len() != m * rows`.
pub fn matmul(w: &QMatrix<'_>, x: &[f32], m: usize, y: &mut [f32]) {
    matmul_with(best_isa(), w, x, m, y)
}

/// [`matmul`] with a chosen kernel form (tests compare them).
///
/// # Panics
/// As [`matmul`]; also if `isa` is [`Isa::Avx2`] on a CPU without AVX2.
pub fn matmul_with(isa: Isa, w: &QMatrix<'_>, x: &[f32], m: usize, y: &mut [f32]) {
    assert_eq!(x.len(), m * w.cols, "matmul: x is not [m, cols]");
    assert_eq!(y.len(), m * w.rows, "matmul: y is not [m, rows]");
    if isa == Isa::Avx2 {
        assert_eq!(best_isa(), Isa::Avx2, "matmul_with: this CPU lacks AVX2");
    }
    if m == 0 || w.rows == 0 {
        return;
    }
    let nb = w.cols / BLOCK;
    let xsum: Vec<f32> = if w.ty == GgmlType::Q4_1 {
        (0..m * nb)
            .map(|i| block_sum(xblock(x, i * BLOCK)))
            .collect()
    } else {
        Vec::new()
    };
    let run = |rows: Range<usize>, out: &mut [f32]| match w.ty {
        GgmlType::F32 => rows_dispatch::<F32B>(isa, w, rows, x, m, &xsum, out),
        GgmlType::F16 => rows_dispatch::<F16B>(isa, w, rows, x, m, &xsum, out),
        GgmlType::Q4_0 => rows_dispatch::<Q40>(isa, w, rows, x, m, &xsum, out),
        GgmlType::Q4_1 => rows_dispatch::<Q41>(isa, w, rows, x, m, &xsum, out),
        GgmlType::Q8_0 => rows_dispatch::<Q80>(isa, w, rows, x, m, &xsum, out),
    };
    // Output rows computed per task: enough tasks to balance the pool, each
    // large enough that scheduling costs little.
    let macs = w.rows * w.cols * m;
    let threads = rayon::current_num_threads();
    let serial = macs < PARALLEL_MIN_MACS || threads == 1;
    if serial && m == 1 {
        run(0..w.rows, y);
        return;
    }
    let chunk = if serial {
        w.rows
    } else {
        w.rows.div_ceil(threads * 4).max(4)
    };
    if m == 1 {
        y.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(t, out)| run(t * chunk..t * chunk + out.len(), out));
        return;
    }
    // Rows × m scratch, then transposed into y's [m, rows].
    let mut yt = vec![0f32; w.rows * m];
    if serial {
        run(0..w.rows, &mut yt);
    } else {
        yt.par_chunks_mut(chunk * m)
            .enumerate()
            .for_each(|(t, out)| run(t * chunk..t * chunk + out.len() / m, out));
    }
    for (r, v) in yt.chunks_exact(m).enumerate() {
        for (i, v) in v.iter().enumerate() {
            y[i * w.rows + r] = *v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::quant::{dequantize, quantize};

    const TYPES: [GgmlType; 5] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
    ];

    fn rand_vec(rng: &mut fastrand::Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.f32() * 2.0 - 1.0).collect()
    }

    #[test]
    fn matmul_matches_the_dequantized_product() {
        let mut rng = fastrand::Rng::with_seed(1);
        let (rows, cols) = (37, 96);
        for ty in TYPES {
            let bytes = quantize(ty, &rand_vec(&mut rng, rows * cols));
            let w = QMatrix::new(ty, rows, cols, &bytes).unwrap();
            let mut wf = vec![0f32; rows * cols];
            dequantize(ty, &bytes, &mut wf);
            for m in [1, 3] {
                let x = rand_vec(&mut rng, m * cols);
                let mut y = vec![0f32; m * rows];
                matmul(&w, &x, m, &mut y);
                for i in 0..m {
                    for o in 0..rows {
                        let want: f64 = (0..cols)
                            .map(|k| f64::from(wf[o * cols + k]) * f64::from(x[i * cols + k]))
                            .sum();
                        let got = y[i * rows + o];
                        assert!(
                            (f64::from(got) - want).abs() < 1e-4,
                            "{ty} m={m}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// One row of a batched product has the bits of the same row alone, and
    /// a parallel split the bits of a serial one.
    #[test]
    fn batched_and_parallel_products_have_the_same_bits() {
        let mut rng = fastrand::Rng::with_seed(2);
        let (rows, cols, m) = (300, 256, 4);
        for ty in TYPES {
            let bytes = quantize(ty, &rand_vec(&mut rng, rows * cols));
            let w = QMatrix::new(ty, rows, cols, &bytes).unwrap();
            let x = rand_vec(&mut rng, m * cols);
            let mut y = vec![0f32; m * rows];
            matmul(&w, &x, m, &mut y);
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap();
            for i in 0..m {
                let mut yi = vec![0f32; rows];
                pool.install(|| matmul(&w, &x[i * cols..(i + 1) * cols], 1, &mut yi));
                let a: Vec<u32> = yi.iter().map(|v| v.to_bits()).collect();
                let b: Vec<u32> = y[i * rows..(i + 1) * rows]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                assert_eq!(a, b, "{ty} row {i}");
            }
        }
    }

    #[test]
    fn avx2_and_baseline_kernels_agree_bit_for_bit() {
        if best_isa() != Isa::Avx2 {
            eprintln!("no AVX2 on this CPU: only the baseline kernel exists here");
            return;
        }
        let mut rng = fastrand::Rng::with_seed(3);
        let (rows, cols) = (64, 160);
        for ty in TYPES {
            let bytes = quantize(ty, &rand_vec(&mut rng, rows * cols));
            let w = QMatrix::new(ty, rows, cols, &bytes).unwrap();
            // Every tile shape of the several-row path: 1..=4 and tails.
            for m in [1, 2, 3, 4, 6, 7, 9] {
                let x = rand_vec(&mut rng, m * cols);
                let (mut a, mut b) = (vec![0f32; m * rows], vec![0f32; m * rows]);
                matmul_with(Isa::Avx2, &w, &x, m, &mut a);
                matmul_with(Isa::Baseline, &w, &x, m, &mut b);
                assert!(
                    a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "{ty} m={m}"
                );
            }
        }
    }
}
