//! ggml block formats (F32, F16, Q4_0, Q4_1, Q8_0): decoding, quantizing,
//! and the quantized matrix product of the CPU reference.
//!
//! # Block layouts (ggml `ggml-common.h`; all little-endian)
//! A row of `cols` elements is `cols / 32` blocks of 32 consecutive
//! elements (F32 and F16 rows are cut into blocks of 32 too, so every kernel
//! walks blocks):
//! - Q4_0, 18 bytes: f16 `d`, 16 bytes `qs`; element `j < 16` is the low
//!   nibble of `qs[j]`, element `j + 16` its high nibble; `x = d * (q - 8)`.
//! - Q4_1, 20 bytes: f16 `d`, f16 `m`, 16 bytes `qs` (nibbles as Q4_0);
//!   `x = d * q + m`.
//! - Q8_0, 34 bytes: f16 `d`, 32 × i8 `q`; `x = d * q`.
//! - F16, 64 bytes: 32 × binary16. F32, 128 bytes: 32 × binary32.
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

use crate::model::format::gguf::GgmlType;

/// Elements per block of every format here.
pub const BLOCK: usize = 32;

/// Lanes of the kernel's accumulators (one AVX2 register of f32).
const LANES: usize = 8;

/// Multiply-adds below which a product runs on the calling thread only.
const PARALLEL_MIN_MACS: usize = 1 << 16;

/// Why a [`QMatrix`] could not be formed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The row length is not a multiple of [`BLOCK`].
    #[error("row length {cols} is not a multiple of {BLOCK}")]
    Cols {
        /// The row length.
        cols: usize,
    },
    /// The byte length disagrees with the shape and type.
    #[error("{ty} matrix [{rows}, {cols}] needs {needed} bytes, got {got}")]
    Bytes {
        /// Element type.
        ty: GgmlType,
        /// Rows.
        rows: usize,
        /// Row length.
        cols: usize,
        /// Bytes the shape needs.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
}

/// A row-major matrix `[rows, cols]` in one of the block formats, borrowed
/// (from a mapped GGUF file, or a test's buffer).
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: &'a [u8],
}

impl<'a> QMatrix<'a> {
    /// Views `data` as `[rows, cols]` of `ty`.
    ///
    /// # Errors
    /// [`QuantError::Cols`] when `cols` is not a multiple of [`BLOCK`];
    /// [`QuantError::Bytes`] when `data` is not exactly the matrix's bytes.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, QuantError> {
        if cols == 0 || !cols.is_multiple_of(BLOCK) {
            return Err(QuantError::Cols { cols });
        }
        let needed = rows * row_bytes(ty, cols);
        if data.len() != needed {
            return Err(QuantError::Bytes {
                ty,
                rows,
                cols,
                needed,
                got: data.len(),
            });
        }
        Ok(QMatrix {
            ty,
            rows,
            cols,
            data,
        })
    }
    /// Element type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }
    /// Rows (outputs of a product).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Row length (inputs of a product).
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// The bytes of row `r`.
    ///
    /// # Panics
    /// If `r >= rows`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = row_bytes(self.ty, self.cols);
        &self.data[r * rb..(r + 1) * rb]
    }
    /// Row `r` decoded to f32 into `out` (`[cols]`): `d * q (+ m)` per
    /// element, one rounding each (an embedding lookup).
    ///
    /// # Panics
    /// If `r >= rows` or `out.len() != cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        dequantize(self.ty, self.row(r), out);
    }
}

/// Bytes of a row of `cols` elements (a multiple of [`BLOCK`]) of `ty`.
pub fn row_bytes(ty: GgmlType, cols: usize) -> usize {
    cols / BLOCK * block_bytes(ty)
}

/// Bytes of one 32-element block of `ty`.
pub fn block_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::F32 => 128,
        GgmlType::F16 => 64,
        GgmlType::Q4_0 => 18,
        GgmlType::Q4_1 => 20,
        GgmlType::Q8_0 => 34,
    }
}

/// IEEE binary16 bits → f32, exact for every value (subnormals, infinities
/// and NaNs included). Inline and branch-light: the kernels decode one or two
/// per block.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let mag = u32::from(h & 0x7fff);
    let bits = if mag >= 0x7c00 {
        // Infinity or NaN: all-ones exponent, the payload kept.
        0x7f80_0000 | ((mag & 0x3ff) << 13)
    } else {
        // Normal and subnormal: shift into f32's fields, then rescale the
        // exponent bias (15 -> 127) by 2^112, exact for every f16 value.
        (f32::from_bits(mag << 13) * f32::from_bits(0x7780_0000)).to_bits()
    };
    f32::from_bits(sign | bits)
}

/// f32 → binary16 bits, rounded to nearest even (for the quantizers).
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

#[inline(always)]
fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// A block format: how one 32-element block decodes.
trait Block {
    /// Bytes per block.
    const BYTES: usize;
    /// Whether blocks carry a min `m` (`x = d * q + m`).
    const HAS_MIN: bool;
    /// Which format (the AVX2 kernel picks its decoder by it).
    const TYPE: GgmlType;
    /// Decodes `b` (exactly [`Block::BYTES`]) into its 32 codes as f32;
    /// returns `(d, m)` (`m` is 0 without a min).
    fn decode(b: &[u8], q: &mut [f32; BLOCK]) -> (f32, f32);
}

struct F32B;
struct F16B;
struct Q40;
struct Q41;
struct Q80;

impl Block for F32B {
    const BYTES: usize = 128;
    const HAS_MIN: bool = false;
    const TYPE: GgmlType = GgmlType::F32;
    #[inline(always)]
    fn decode(b: &[u8], q: &mut [f32; BLOCK]) -> (f32, f32) {
        for (j, v) in q.iter_mut().enumerate() {
            *v = f32::from_le_bytes([b[4 * j], b[4 * j + 1], b[4 * j + 2], b[4 * j + 3]]);
        }
        (1.0, 0.0)
    }
}

impl Block for F16B {
    const BYTES: usize = 64;
    const HAS_MIN: bool = false;
    const TYPE: GgmlType = GgmlType::F16;
    #[inline(always)]
    fn decode(b: &[u8], q: &mut [f32; BLOCK]) -> (f32, f32) {
        for (j, v) in q.iter_mut().enumerate() {
            *v = f16_to_f32(le_u16(b, 2 * j));
        }
        (1.0, 0.0)
    }
}

impl Block for Q40 {
    const BYTES: usize = 18;
    const HAS_MIN: bool = false;
    const TYPE: GgmlType = GgmlType::Q4_0;
    #[inline(always)]
    fn decode(b: &[u8], q: &mut [f32; BLOCK]) -> (f32, f32) {
        let qs: &[u8; 16] = b[2..18].try_into().expect("18-byte block");
        // Two straight 16-wide loops (low nibbles, then high) vectorize;
        // one loop writing both halves does not.
        for j in 0..16 {
            q[j] = (i32::from(qs[j] & 15) - 8) as f32;
        }
        for j in 0..16 {
            q[j + 16] = (i32::from(qs[j] >> 4) - 8) as f32;
        }
        (f16_to_f32(le_u16(b, 0)), 0.0)
    }
}

impl Block for Q41 {
    const BYTES: usize = 20;
    const HAS_MIN: bool = true;
    const TYPE: GgmlType = GgmlType::Q4_1;
    #[inline(always)]
    fn decode(b: &[u8], q: &mut [f32; BLOCK]) -> (f32, f32) {
        let qs: &[u8; 16] = b[4..20].try_into().expect("20-byte block");
        for j in 0..16 {
            q[j] = f32::from(qs[j] & 15);
        }
        for j in 0..16 {
            q[j + 16] = f32::from(qs[j] >> 4);
        }
        (f16_to_f32(le_u16(b, 0)), f16_to_f32(le_u16(b, 2)))
    }
}

impl Block for Q80 {
    const BYTES: usize = 34;
    const HAS_MIN: bool = false;
    const TYPE: GgmlType = GgmlType::Q8_0;
    #[inline(always)]
    fn decode(b: &[u8], q: &mut [f32; BLOCK]) -> (f32, f32) {
        let qs: &[u8; 32] = b[2..34].try_into().expect("34-byte block");
        for j in 0..BLOCK {
            q[j] = f32::from(qs[j] as i8);
        }
        (f16_to_f32(le_u16(b, 0)), 0.0)
    }
}

/// Decodes `bytes` (whole blocks of `ty`) into `out` (`[32 * blocks]`):
/// `d * q`, `d * (q - 8)` or `d * q + m` per element, f32.
///
/// # Panics
/// If `bytes` is not `out.len() / 32` blocks of `ty`, or `out.len()` is not a
/// multiple of 32.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    fn run<B: Block>(bytes: &[u8], out: &mut [f32]) {
        assert!(out.len().is_multiple_of(BLOCK) && bytes.len() == out.len() / BLOCK * B::BYTES);
        let mut q = [0f32; BLOCK];
        for (b, o) in bytes
            .chunks_exact(B::BYTES)
            .zip(out.chunks_exact_mut(BLOCK))
        {
            let (d, m) = B::decode(b, &mut q);
            for (o, q) in o.iter_mut().zip(&q) {
                *o = if B::HAS_MIN { d * q + m } else { d * q };
            }
        }
    }
    match ty {
        GgmlType::F32 => run::<F32B>(bytes, out),
        GgmlType::F16 => run::<F16B>(bytes, out),
        GgmlType::Q4_0 => run::<Q40>(bytes, out),
        GgmlType::Q4_1 => run::<Q41>(bytes, out),
        GgmlType::Q8_0 => run::<Q80>(bytes, out),
    }
}

/// Quantizes `x` (a multiple of 32 elements) to `ty`, block by block, as
/// ggml's reference quantizers define the codes: Q8_0 `d = max|x| / 127`,
/// `q = round(x / d)`; Q4_0 `d = -v / 8` for `v` the element of largest
/// magnitude, `q = min(15, trunc(x / d + 8.5))`; Q4_1 `d = (max - min) / 15`,
/// `m = min`, `q = min(15, trunc((x - min) / d + 0.5))`; F16 rounds to
/// nearest even. Used to build test models and files.
///
/// # Panics
/// If `x.len()` is not a multiple of 32.
pub fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    assert!(
        x.len().is_multiple_of(BLOCK),
        "quantize: {} elements",
        x.len()
    );
    let mut out = Vec::with_capacity(x.len() / BLOCK * block_bytes(ty));
    for blk in x.chunks_exact(BLOCK) {
        match ty {
            GgmlType::F32 => blk
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            GgmlType::F16 => blk
                .iter()
                .for_each(|v| out.extend_from_slice(&f32_to_f16(*v).to_le_bytes())),
            GgmlType::Q8_0 => {
                let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
                blk.iter()
                    .for_each(|v| out.push((v * id).round() as i8 as u8));
            }
            GgmlType::Q4_0 => {
                let max = blk
                    .iter()
                    .fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
                let code = |v: f32| ((v * id + 8.5) as u8).min(15);
                for j in 0..16 {
                    out.push(code(blk[j]) | (code(blk[j + 16]) << 4));
                }
            }
            GgmlType::Q4_1 => {
                let min = blk.iter().fold(f32::INFINITY, |a, &v| a.min(v));
                let max = blk.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
                out.extend_from_slice(&f32_to_f16(min).to_le_bytes());
                let code = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
                for j in 0..16 {
                    out.push(code(blk[j]) | (code(blk[j + 16]) << 4));
                }
            }
        }
    }
    out
}

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
    fn f16_decode_is_exact_for_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = f16_to_f32(h);
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}");
                assert_eq!(got.to_bits() & 0x8000_0000, want.to_bits() & 0x8000_0000);
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
            }
        }
    }

    #[test]
    fn block_layouts_decode_as_ggml_defines_them() {
        // Q4_1: d = 0.5, m = -1, low nibbles 0..16, high nibbles 15.
        let mut b = vec![];
        b.extend_from_slice(&f32_to_f16(0.5).to_le_bytes());
        b.extend_from_slice(&f32_to_f16(-1.0).to_le_bytes());
        b.extend((0..16u8).map(|j| j | 0xf0));
        let mut out = [0f32; 32];
        dequantize(GgmlType::Q4_1, &b, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], 0.5 * j as f32 - 1.0);
            assert_eq!(out[j + 16], 0.5 * 15.0 - 1.0);
        }
        // Q4_0: d = 2, nibble 3 low / 12 high -> 2*(3-8), 2*(12-8).
        let mut b = f32_to_f16(2.0).to_le_bytes().to_vec();
        b.extend([0xc3u8; 16]);
        dequantize(GgmlType::Q4_0, &b, &mut out);
        assert!(out[..16].iter().all(|&v| v == -10.0) && out[16..].iter().all(|&v| v == 8.0));
        // Q8_0: d = 0.25, q = j - 16.
        let mut b = f32_to_f16(0.25).to_le_bytes().to_vec();
        b.extend((0..32i32).map(|j| (j - 16) as i8 as u8));
        dequantize(GgmlType::Q8_0, &b, &mut out);
        for (j, v) in out.iter().enumerate() {
            assert_eq!(*v, 0.25 * (j as f32 - 16.0));
        }
    }

    #[test]
    fn quantization_error_is_within_half_a_step() {
        let mut rng = fastrand::Rng::with_seed(9);
        let x = rand_vec(&mut rng, 32 * 64);
        for ty in TYPES {
            let mut back = vec![0f32; x.len()];
            dequantize(ty, &quantize(ty, &x), &mut back);
            let tol = match ty {
                GgmlType::F32 => 0.0,
                GgmlType::F16 => 1e-3,
                GgmlType::Q8_0 => 1.0 / 127.0 * 0.51 + 1e-3,
                GgmlType::Q4_1 => 2.0 / 15.0 * 0.51 + 2e-3,
                GgmlType::Q4_0 => 1.0 / 8.0 * 1.01 + 2e-3,
            };
            let err = x
                .iter()
                .zip(&back)
                .fold(0f32, |a, (p, q)| a.max((p - q).abs()));
            assert!(err <= tol, "{ty}: max error {err} > {tol}");
        }
    }

    /// The product against f64 sums of the dequantized matrix.
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

    #[test]
    fn bad_matrix_views_are_refused() {
        assert_eq!(
            QMatrix::new(GgmlType::Q8_0, 1, 48, &[0; 34]).unwrap_err(),
            QuantError::Cols { cols: 48 }
        );
        assert!(matches!(
            QMatrix::new(GgmlType::Q4_1, 2, 32, &[0; 20]),
            Err(QuantError::Bytes {
                needed: 40,
                got: 20,
                ..
            })
        ));
    }
}
