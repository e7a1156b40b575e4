//! The quantized kernels' push constants and dispatch forms
//! (`kernels/qmatmul.wgsl`, `rope_tab` in `kernels/rope.wgsl`), callable
//! from outside the model (benches, conformance runs): each op is a plain
//! struct recorded with [`Ops::run`], and its CPU reference is public
//! ([`reference_matmul`], [`reference_embed`], [`rope_table`] with
//! [`reference_rope`]).
//!
//! Weights are a [`TexelStream`](super::qweights::TexelStream) uploaded to
//! the weight image ([`Variant::Cpu`], kernel ABI binding 8) or to the
//! weights buffer at texel 0 ([`Variant::Gpu`], binding 0 viewed as
//! `vec4<u32>`): the op's `qs_off` / `sc_off` are texel offsets in it.

use bytemuck::{Pod, Zeroable};

use super::model::quant::{self, QMatrix};
use super::ops::{Op, Rope, Variant, Windowed, spans};
use super::qweights::{KernelType, QTensor};
use crate::vk::{WINDOWS, Window};

/// Token rows one invocation of the CPU form computes, by chunk rows: one
/// row alone, pairs, then tiles of four (measured on lavapipe: the 4-row tile
/// is fastest from 4 rows up, see `docs/arch/vk.md`).
fn rows_per_invocation(m: u32) -> u32 {
    match m {
        0 | 1 => 1,
        2 => 2,
        _ => 4,
    }
}

fn kernel_type(id: u32) -> KernelType {
    match id {
        0 => KernelType::Q41,
        1 => KernelType::Q80,
        2 => KernelType::F16,
        _ => KernelType::F32,
    }
}

fn type_id(t: KernelType) -> u32 {
    match t {
        KernelType::Q41 => 0,
        KernelType::Q80 => 1,
        KernelType::F16 => 2,
        KernelType::F32 => 3,
    }
}

/// Every entry point name of the quantized products, by type and form (the
/// names are `'static` so [`Op::dispatch`] can return them).
fn qmm_name(t: KernelType, rows: u32, variant: Variant) -> &'static str {
    use KernelType::*;
    match (variant, t, rows) {
        (Variant::Gpu, Q41, _) => "qmm_q41_gpu",
        (Variant::Gpu, Q80, _) => "qmm_q80_gpu",
        (Variant::Gpu, F16, _) => "qmm_f16_gpu",
        (Variant::Gpu, F32, _) => "qmm_f32_gpu",
        (Variant::Cpu, Q41, 1) => "qmm_q41_r1",
        (Variant::Cpu, Q41, 2) => "qmm_q41_r2",
        (Variant::Cpu, Q41, _) => "qmm_q41_r4",
        (Variant::Cpu, Q80, 1) => "qmm_q80_r1",
        (Variant::Cpu, Q80, 2) => "qmm_q80_r2",
        (Variant::Cpu, Q80, _) => "qmm_q80_r4",
        (Variant::Cpu, F16, 1) => "qmm_f16_r1",
        (Variant::Cpu, F16, 2) => "qmm_f16_r2",
        (Variant::Cpu, F16, _) => "qmm_f16_r4",
        (Variant::Cpu, F32, 1) => "qmm_f32_r1",
        (Variant::Cpu, F32, 2) => "qmm_f32_r2",
        (Variant::Cpu, F32, _) => "qmm_f32_r4",
    }
}

fn groups(n: u32, per: u32) -> u32 {
    n.div_ceil(per).max(1)
}

/// `qmm_<ty>_*`: `y [m, n] (+)= x [m, k] . W [n, k]^T` for `W` a [`QTensor`]
/// (`n = W.rows`, `k = W.cols`), f32 activations and accumulation; the output
/// columns optionally split over up to three regions (q|k|v). Offsets in
/// elements of the activation buffer except `qs_off` / `sc_off` (texels).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct QMatmul {
    /// Token rows (of the whole product; of the chunk inside a CPU-form dispatch).
    pub m: u32,
    /// Outputs per row (rows of W, a multiple of 4).
    pub n: u32,
    /// Inputs per row (a multiple of 32).
    pub k: u32,
    /// x `[m, k]` (inside the activation window in a CPU-form chunk).
    pub x_off: u32,
    /// W's first code texel.
    pub qs_off: u32,
    /// W's first scale texel.
    pub sc_off: u32,
    /// y1 `[m, n1]`.
    pub y_off: u32,
    /// 1: add to y (residual add), 0: overwrite.
    pub accumulate: u32,
    /// Columns `0..n1` go to y1.
    pub n1: u32,
    /// Columns `n1..n1 + n2` go to y2 `[m, n2]`.
    pub n2: u32,
    /// y2.
    pub y2_off: u32,
    /// y3 `[m, n - n1 - n2]` (the rest).
    pub y3_off: u32,
    /// First row of the product a CPU-form chunk computes (0 otherwise).
    pub m_base: u32,
    /// [`KernelType`] of W (0 Q41, 1 Q80, 2 F16, 3 F32): picks the entry point.
    pub ty: u32,
}

impl QMatmul {
    /// `y [m, W.rows] (+)= x [m, W.cols] . W^T`, y at `y_off`.
    pub fn plain(w: &QTensor, m: u32, x_off: u32, y_off: u32, accumulate: bool) -> QMatmul {
        QMatmul {
            m,
            n: w.rows,
            k: w.cols,
            x_off,
            qs_off: w.qs_off,
            sc_off: w.sc_off,
            y_off,
            accumulate: u32::from(accumulate),
            n1: w.rows,
            n2: 0,
            y2_off: 0,
            y3_off: 0,
            m_base: 0,
            ty: type_id(w.ty),
        }
    }

    /// One dispatch over stacked `W = [ns[0] + ns[1] + ns[2], k]` whose
    /// column ranges go to `ys[0] [m, ns[0]]`, `ys[1] [m, ns[1]]`,
    /// `ys[2] [m, ns[2]]`. Overwrites.
    pub fn split(w: &QTensor, m: u32, x_off: u32, ns: [u32; 3], ys: [u32; 3]) -> QMatmul {
        QMatmul {
            n1: ns[0],
            n2: ns[1],
            y2_off: ys[1],
            y3_off: ys[2],
            ..QMatmul::plain(w, m, x_off, ys[0], false)
        }
    }

    /// The weight format.
    pub fn kernel_type(&self) -> KernelType {
        kernel_type(self.ty)
    }
}

impl Op for QMatmul {
    const KERNEL: &'static str = "qmm_q41_gpu";
    fn grid(&self) -> [u32; 3] {
        [groups(self.n, 4), groups(self.m, 4), 1]
    }
    fn dispatch(&self, variant: Variant) -> (&'static str, [u32; 3]) {
        // The CPU form needs the windows; without them the GPU form runs
        // (correct on any device, slow where barriers are).
        let _ = variant;
        (qmm_name(self.kernel_type(), 4, Variant::Gpu), self.grid())
    }
    /// The CPU form: rows chunked so each chunk's x rows fit one placement
    /// of the activation window (`k` and `x_off` are multiples of 4 by the
    /// op's contract); `None` on [`Variant::Gpu`] or when a row does not fit
    /// a window.
    fn windowed(
        &self,
        variant: Variant,
        win: &[Window; WINDOWS as usize],
    ) -> Option<Vec<Windowed<Self>>> {
        if variant != Variant::Cpu || self.m == 0 || self.n < 4 || !self.x_off.is_multiple_of(4) {
            return None;
        }
        let rows = spans(&win[1], self.x_off, self.m, u64::from(self.k))?;
        Some(
            rows.iter()
                .map(|r| {
                    let tile = rows_per_invocation(r.count);
                    Windowed {
                        kernel: qmm_name(self.kernel_type(), tile, Variant::Cpu),
                        push: QMatmul {
                            m: r.count,
                            x_off: r.rel,
                            m_base: r.first,
                            ..*self
                        },
                        grid: [groups(self.n, 64), groups(r.count, tile), 1],
                        offsets: [0, r.offset],
                    }
                })
                .collect(),
        )
    }
}

/// `qembed_<ty>`: `x[r, :] = row token(r)` of an embedding table in the
/// stream (a [`QTensor`] of `[vocab, dim]`), dequantized (`d * q` for Q8_0:
/// exactly [`QMatrix::dequantize_row`]'s values). The fields are
/// [`QMatmul`]'s, reused: `m` = token rows, `k` = dim, `x_off` = the row
/// records in the metadata buffer (token first), `y_off` = the output
/// `[m, dim]`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct QEmbed(pub QMatmul);

impl QEmbed {
    /// Rows `n_rows` of tokens from the row records at `rows_off` into `out_off`.
    pub fn new(table: &QTensor, n_rows: u32, rows_off: u32, out_off: u32) -> QEmbed {
        QEmbed(QMatmul::plain(table, n_rows, rows_off, out_off, false))
    }
}

impl Op for QEmbed {
    const KERNEL: &'static str = "qembed_q80";
    fn grid(&self) -> [u32; 3] {
        [groups(self.0.k / 32, 64), self.0.m.max(1), 1]
    }
    fn dispatch(&self, variant: Variant) -> (&'static str, [u32; 3]) {
        use KernelType::*;
        let name = match (variant, self.0.kernel_type()) {
            (Variant::Cpu, Q41) => "qembed_q41",
            (Variant::Cpu, Q80) => "qembed_q80",
            (Variant::Cpu, F16) => "qembed_f16",
            (Variant::Cpu, F32) => "qembed_f32",
            (Variant::Gpu, Q41) => "qembed_q41_buf",
            (Variant::Gpu, Q80) => "qembed_q80_buf",
            (Variant::Gpu, F16) => "qembed_f16_buf",
            (Variant::Gpu, F32) => "qembed_f32_buf",
        };
        (name, self.grid())
    }
}

/// `rope_tab` (`kernels/rope.wgsl`): [`Rope`] with the angles' cosines and
/// sines read from a table in the weights buffer ([`rope_table`]) instead of
/// computed on the device, so any RoPE base works and the rotation uses the
/// reference's own `sin_cos` values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct RopeTable {
    /// The rotation (rows, widths, head size, row records, q and k).
    pub rope: Rope,
    /// The table in the weights buffer (f32 elements).
    pub tab_off: u32,
}

impl Op for RopeTable {
    const KERNEL: &'static str = "rope_tab";
    fn grid(&self) -> [u32; 3] {
        [groups(self.rope.dim / 2, 64), self.rope.n_rows, 1]
    }
}

/// The RoPE table for positions `0..positions`: `[positions][head_size / 2]
/// [cos, sin]` of `pos * θ_i`, `θ_i = 1 / base^(2i / head_size)`, computed
/// in f32 exactly as the CPU reference (`decode::model::llama`) does (f32
/// `powf`, then `sin_cos` of the f32 product), so the device rotates by the
/// reference's values.
pub fn rope_table(base: f32, head_size: usize, positions: usize) -> Vec<f32> {
    let freq: Vec<f32> = (0..head_size / 2)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / head_size as f32))
        .collect();
    let mut out = Vec::with_capacity(positions * head_size);
    for pos in 0..positions {
        for f in &freq {
            let (s, c) = (pos as f32 * f).sin_cos();
            out.extend([c, s]);
        }
    }
    out
}

/// CPU reference of `rope_tab` on one row `v` (`[heads * head_size]`) at
/// `pos`: pairs `(2i, 2i+1)` of every head turned by the table's angle.
pub fn reference_rope(table: &[f32], head_size: usize, v: &mut [f32], pos: usize) {
    let half = head_size / 2;
    for head in v.chunks_exact_mut(head_size) {
        for i in 0..half {
            let (c, s) = (table[(pos * half + i) * 2], table[(pos * half + i) * 2 + 1]);
            let (a, b) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = a * c - b * s;
            head[2 * i + 1] = a * s + b * c;
        }
    }
}

/// CPU reference of [`QMatmul`] (plain, overwriting): the model's own
/// quantized product (`quant::matmul`, `y [m, rows]`). The kernels agree
/// with it within f32 rounding of a different summation order (the tests
/// bound the difference), not bit for bit.
pub fn reference_matmul(w: &QMatrix<'_>, x: &[f32], m: usize) -> Vec<f32> {
    let mut y = vec![0f32; m * w.rows()];
    quant::matmul(w, x, m, &mut y);
    y
}

/// CPU reference of [`QEmbed`]: the rows `tokens` of `table` dequantized.
pub fn reference_embed(table: &QMatrix<'_>, tokens: &[u32]) -> Vec<f32> {
    let d = table.cols();
    let mut out = vec![0f32; tokens.len() * d];
    for (o, &t) in out.chunks_exact_mut(d).zip(tokens) {
        table.dequantize_row(t as usize, o);
    }
    out
}
