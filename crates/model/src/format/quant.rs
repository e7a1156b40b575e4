//! ggml block formats (F32, F16, Q4_0, Q4_1, Q8_0): their layouts, a
//! matrix of them ([`QMatrix`]), decoding and quantizing. The quantized
//! matrix product of the CPU reference is `cpu::qmatmul`.
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

use crate::format::gguf::GgmlType;

/// Elements per block of every format here.
pub const BLOCK: usize = 32;

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
    pub(crate) ty: GgmlType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) data: &'a [u8],
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
pub(crate) trait Block {
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

pub(crate) struct F32B;
pub(crate) struct F16B;
pub(crate) struct Q40;
pub(crate) struct Q41;
pub(crate) struct Q80;

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
