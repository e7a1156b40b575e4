//! The *texel stream*: quantized weight matrices repacked at upload into
//! 16-byte texels that `kernels/qmatmul.wgsl` reads (the weight image on CPU
//! devices, the weights buffer on GPUs), with the quantized blocks kept as
//! they are (no f32 copy: a Q4_1 matrix takes its file size, 20 bytes per 32
//! weights).
//!
//! # Layout (per matrix `[rows, cols]`, `nb = cols / 32` blocks per row)
//! Rows go in *panels* of 32 (the last padded with zero rows): within a
//! panel `p`, block `b` of all 32 rows is contiguous. With `T` the code
//! texels per block of the type, row `n = 32p + j`:
//! - code texel `h` of block `(n, b)`: `qs_off + ((p*nb + b)*32 + j)*T + h`;
//! - scale texel of block `b` of rows `4(j/4) .. +3` of the panel:
//!   `sc_off + (p*nb + b)*8 + j/4`, holding `d | m << 16` (two binary16) of
//!   the four rows, one per channel.
//!
//! Types: [`KernelType::Q41`] (from Q4_1, and from Q4_0 with `m = -8 d`,
//! exact): `T = 1`, the 16 `qs` bytes; [`KernelType::Q80`] (from Q8_0):
//! `T = 2`, the 32 `i8` codes, scales with `m = 0`; [`KernelType::F16`]:
//! `T = 4` (binary16 values) and [`KernelType::F32`]: `T = 8`, no scales.
//!
//! Why: a subgroup of the CPU-form kernels (8 lanes x 4 output rows) reads
//! block `b` of one panel, so each block step of a whole workgroup is one
//! contiguous run of `512 T` bytes (one memory stream, where row-major
//! matrices gave 32 strided ones); scales in groups of four rows make one
//! fetch serve an invocation's four outputs; codes in their own texels make
//! each block an aligned 16-byte fetch (a GGUF Q4_1 block is 20 bytes).

use super::gguf::GgmlType;
use super::quant::{self, QMatrix};

/// Bytes of one texel.
pub const TEXEL: usize = 16;

/// Rows of a panel (module documentation).
pub const PANEL: usize = 32;

/// The block format a kernel reads (the `<ty>` of `qmm_<ty>_*` entry points).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelType {
    /// 4-bit codes with a scale and a min (Q4_1; Q4_0 is uploaded as this).
    Q41,
    /// 8-bit codes with a scale (Q8_0).
    Q80,
    /// binary16 weights.
    F16,
    /// binary32 weights.
    F32,
}

impl KernelType {
    /// The kernel type that reads GGUF type `ty`.
    pub fn of(ty: GgmlType) -> KernelType {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => KernelType::Q41,
            GgmlType::Q8_0 => KernelType::Q80,
            GgmlType::F16 => KernelType::F16,
            GgmlType::F32 => KernelType::F32,
        }
    }

    /// The `<ty>` of the entry point names.
    pub fn name(self) -> &'static str {
        match self {
            KernelType::Q41 => "q41",
            KernelType::Q80 => "q80",
            KernelType::F16 => "f16",
            KernelType::F32 => "f32",
        }
    }

    /// Nibble / code / value texels per 32-element block.
    pub fn block_texels(self) -> usize {
        match self {
            KernelType::Q41 => 1,
            KernelType::Q80 => 2,
            KernelType::F16 => 4,
            KernelType::F32 => 8,
        }
    }

    /// Whether the format has scale texels.
    pub fn has_scales(self) -> bool {
        matches!(self, KernelType::Q41 | KernelType::Q80)
    }

    /// Texels of a `[rows, cols]` matrix (`cols % 32 == 0`; rows padded to
    /// a multiple of [`PANEL`]).
    pub fn texels(self, rows: usize, cols: usize) -> usize {
        let nb = cols / quant::BLOCK;
        let rows = rows.next_multiple_of(PANEL);
        rows * nb * self.block_texels() + if self.has_scales() { rows / 4 * nb } else { 0 }
    }
}

/// Why a matrix cannot go into the stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepackError {
    /// The kernels compute four output rows per invocation.
    #[error("{rows} rows is not a multiple of 4 (the kernels' output tile)")]
    Rows {
        /// The row count.
        rows: usize,
    },
    /// Parts stacked into one matrix must share format and row length.
    #[error("stacked parts differ in type or row length ({0})")]
    Stack(String),
    /// The stream outgrew the 32-bit texel offsets of the kernels.
    #[error("the texel stream exceeds 2^32 texels")]
    TooLarge,
}

/// A matrix in the stream: where its texels are, in texels from the stream's
/// start (what [`super::qops::QMatmul`] takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QTensor {
    /// The block format the kernels read.
    pub ty: KernelType,
    /// Rows (outputs of a product; tokens of an embedding table).
    pub rows: u32,
    /// Row length (inputs of a product).
    pub cols: u32,
    /// First nibble/code/value texel.
    pub qs_off: u32,
    /// First scale texel (`qs_off` for formats without scales).
    pub sc_off: u32,
}

/// The stream being built: append matrices, then upload [`Self::bytes`].
#[derive(Debug, Clone, Default)]
pub struct TexelStream {
    words: Vec<u32>,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl TexelStream {
    /// An empty stream.
    pub fn new() -> TexelStream {
        TexelStream::default()
    }

    /// Texels so far.
    pub fn texels(&self) -> usize {
        self.words.len() / 4
    }

    /// The stream's bytes (little-endian words, [`TEXEL`] bytes a texel).
    pub fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.words)
    }

    /// Appends `m`.
    ///
    /// # Errors
    /// [`RepackError::Rows`] when its rows are not a multiple of 4;
    /// [`RepackError::TooLarge`] past 2^32 texels.
    pub fn push(&mut self, m: &QMatrix<'_>) -> Result<QTensor, RepackError> {
        self.push_stacked(&[*m])
    }

    /// Appends `gate` and `up` (same shape and type) as ONE matrix whose
    /// rows alternate, `gate_0, up_0, gate_1, up_1, ...`, for the fused
    /// SwiGLU product ([`super::qops::QMatmul::glu`]): every group of four
    /// output rows an invocation computes holds both halves of two hidden
    /// units.
    ///
    /// # Errors
    /// As [`push_stacked`](Self::push_stacked) (differing shapes or types are
    /// [`RepackError::Stack`]).
    pub fn push_interleaved(
        &mut self,
        gate: &QMatrix<'_>,
        up: &QMatrix<'_>,
    ) -> Result<QTensor, RepackError> {
        if gate.rows() != up.rows() || gate.ty() != up.ty() || gate.cols() != up.cols() {
            return Err(RepackError::Stack(format!(
                "gate {} [{}x{}] and up {} [{}x{}]",
                gate.ty(),
                gate.rows(),
                gate.cols(),
                up.ty(),
                up.rows(),
                up.cols()
            )));
        }
        let rows: Vec<&[u8]> = (0..gate.rows())
            .flat_map(|r| [gate.row(r), up.row(r)])
            .collect();
        self.push_rows(gate.ty(), gate.cols(), &rows)
    }

    /// Appends the rows of `parts` one after the other as ONE matrix (e.g.
    /// q|k|v, so one dispatch computes all three).
    ///
    /// # Errors
    /// As [`push`](Self::push) for the total rows; [`RepackError::Stack`]
    /// when the parts differ in type or row length (or there are none).
    pub fn push_stacked(&mut self, parts: &[QMatrix<'_>]) -> Result<QTensor, RepackError> {
        let first = parts
            .first()
            .ok_or_else(|| RepackError::Stack("no parts".into()))?;
        let (ty, cols) = (first.ty(), first.cols());
        if parts.iter().any(|p| p.ty() != ty || p.cols() != cols) {
            let what: Vec<String> = parts
                .iter()
                .map(|p| format!("{} x{}", p.ty(), p.cols()))
                .collect();
            return Err(RepackError::Stack(what.join(", ")));
        }
        let rows: Vec<&[u8]> = parts
            .iter()
            .flat_map(|p| (0..p.rows()).map(move |r| p.row(r)))
            .collect();
        self.push_rows(ty, cols, &rows)
    }

    /// Appends a matrix given as its rows' bytes (each `cols` elements of `ty`).
    fn push_rows(
        &mut self,
        ty: GgmlType,
        cols: usize,
        all: &[&[u8]],
    ) -> Result<QTensor, RepackError> {
        let rows = all.len();
        if !rows.is_multiple_of(4) {
            return Err(RepackError::Rows { rows });
        }
        let kt = KernelType::of(ty);
        let nb = cols / quant::BLOCK;
        let qs_off = self.texels();
        if qs_off + kt.texels(rows, cols) > u32::MAX as usize {
            return Err(RepackError::TooLarge);
        }
        let bb = quant::block_bytes(ty);
        let t = kt.block_texels();
        let padded = rows.next_multiple_of(PANEL);
        let zero = vec![0u8; bb];
        let block = |n: usize, b: usize| -> &[u8] {
            match all.get(n) {
                Some(row) => &row[b * bb..(b + 1) * bb],
                None => &zero,
            }
        };
        // Codes / values, panel by panel, block by block, row by row.
        for p in 0..padded / PANEL {
            for b in 0..nb {
                for j in 0..PANEL {
                    let blk = block(p * PANEL + j, b);
                    let words: &mut Vec<u32> = &mut self.words;
                    match ty {
                        GgmlType::Q4_0 => words.extend((0..4).map(|i| le32(blk, 2 + 4 * i))),
                        GgmlType::Q4_1 => words.extend((0..4).map(|i| le32(blk, 4 + 4 * i))),
                        GgmlType::Q8_0 => words.extend((0..8).map(|i| le32(blk, 2 + 4 * i))),
                        GgmlType::F16 => words.extend((0..16).map(|i| le32(blk, 4 * i))),
                        GgmlType::F32 => words.extend((0..32).map(|i| le32(blk, 4 * i))),
                    }
                }
            }
        }
        debug_assert_eq!(self.texels() - qs_off, padded * nb * t);
        let sc_off = self.texels();
        if kt.has_scales() {
            let scale = scale_word(ty);
            for p in 0..padded / PANEL {
                for b in 0..nb {
                    for j in 0..PANEL {
                        let n = p * PANEL + j;
                        self.words
                            .push(if n < rows { scale(block(n, b)) } else { 0 });
                    }
                }
            }
        }
        Ok(QTensor {
            ty: kt,
            rows: rows as u32,
            cols: cols as u32,
            qs_off: qs_off as u32,
            sc_off: sc_off as u32,
        })
    }
}

/// `d | m << 16` of one block (binary16 bits): Q4_1 as stored, Q4_0 with
/// `m = -8 d` (exact: a power-of-two multiple of a binary16 value, barring
/// overflow past 65504, which then rounds to infinity as the f16 math would),
/// Q8_0 with `m = 0`.
fn scale_word(ty: GgmlType) -> impl Fn(&[u8]) -> u32 {
    move |blk: &[u8]| {
        let d = le16(blk, 0);
        let m = match ty {
            GgmlType::Q4_1 => le16(blk, 2),
            GgmlType::Q4_0 => quant::f32_to_f16(-8.0 * quant::f16_to_f32(d)),
            _ => 0,
        };
        u32::from(d) | u32::from(m) << 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes element (n, k) of a streamed matrix back from the texels.
    fn element(s: &TexelStream, t: &QTensor, n: usize, k: usize) -> f32 {
        let w = |i: usize| s.words[i];
        let nb = t.cols as usize / 32;
        let (b, j) = (k / 32, k % 32);
        let (p, r) = (n / PANEL, n % PANEL);
        let dm = || {
            let v = w(4 * (t.sc_off as usize + (p * nb + b) * 8 + r / 4) + r % 4);
            (
                quant::f16_to_f32(v as u16),
                quant::f16_to_f32((v >> 16) as u16),
            )
        };
        let base = 4 * (t.qs_off as usize + ((p * nb + b) * PANEL + r) * t.ty.block_texels());
        match t.ty {
            KernelType::Q41 => {
                let byte = (w(base + (j % 16) / 4) >> (8 * (j % 4))) as u8;
                let q = if j < 16 { byte & 15 } else { byte >> 4 };
                let (d, m) = dm();
                d * f32::from(q) + m
            }
            KernelType::Q80 => {
                let q = (w(base + j / 4) >> (8 * (j % 4))) as u8 as i8;
                dm().0 * f32::from(q)
            }
            KernelType::F16 => quant::f16_to_f32((w(base + j / 2) >> (16 * (j % 2))) as u16),
            KernelType::F32 => f32::from_bits(w(base + j)),
        }
    }

    #[test]
    fn every_format_round_trips_through_the_stream() {
        let mut rng = fastrand::Rng::with_seed(4);
        let (rows, cols) = (40, 96);
        for ty in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
        ] {
            let x: Vec<f32> = (0..rows * cols).map(|_| rng.f32() * 2.0 - 1.0).collect();
            let bytes = quant::quantize(ty, &x);
            let m = QMatrix::new(ty, rows, cols, &bytes).unwrap();
            let mut s = TexelStream::new();
            s.push(&QMatrix::new(GgmlType::F32, 4, 32, &[0; 512]).unwrap())
                .unwrap();
            let t = s.push(&m).unwrap();
            assert_eq!(s.texels() - t.qs_off as usize, t.ty.texels(rows, cols));
            let mut want = vec![0f32; cols];
            for n in 0..rows {
                m.dequantize_row(n, &mut want);
                for (k, w) in want.iter().enumerate() {
                    let got = element(&s, &t, n, k);
                    // Q4_0 becomes d*q + (-8d): equal to d*(q-8) up to one rounding.
                    let tol = if ty == GgmlType::Q4_0 {
                        1e-6 * w.abs().max(1.0)
                    } else {
                        0.0
                    };
                    assert!((got - w).abs() <= tol, "{ty} ({n}, {k}): {got} vs {w}");
                }
            }
        }
    }

    #[test]
    fn stacking_and_bad_shapes() {
        let b = quant::quantize(GgmlType::Q8_0, &[0.5; 64]);
        let a = QMatrix::new(GgmlType::Q8_0, 2, 32, &b).unwrap();
        let mut s = TexelStream::new();
        assert_eq!(s.push(&a), Err(RepackError::Rows { rows: 2 }));
        let t = s.push_stacked(&[a, a]).unwrap();
        // 4 rows padded to a panel of 32: 64 code texels, then 8 scale texels.
        assert_eq!((t.rows, t.cols, t.qs_off, t.sc_off), (4, 32, 0, 64));
        assert_eq!(s.texels(), 72);
        let f = quant::quantize(GgmlType::F32, &[0.5; 64]);
        let other = QMatrix::new(GgmlType::F32, 2, 32, &f).unwrap();
        assert!(matches!(
            s.push_stacked(&[a, other]),
            Err(RepackError::Stack(_))
        ));
    }
}
