//! The quantized kernels' push constants and dispatch forms
//! (`kernels/qmatmul.wgsl`, `rope_tab` in `kernels/rope.wgsl`), callable
//! from outside the model (benches, conformance runs): each op is a plain
//! struct recorded with [`Ops::run`](super::ops::Ops::run), and its CPU reference is public
//! ([`reference_matmul`], [`reference_embed`], [`rope_table`] with
//! [`reference_rope`]).
//!
//! Weights are a [`TexelStream`](super::qweights::TexelStream) uploaded to
//! the weight image ([`Variant::Cpu`], kernel ABI binding 8) or to the
//! weights buffer at texel 0 ([`Variant::Gpu`], binding 0 viewed as
//! `vec4<u32>`): the op's `qs_off` / `sc_off` are texel offsets in it.

use bytemuck::{Pod, Zeroable};

use super::ops::{Op, Rope, Variant, Windowed, spans_of};
use super::quant::{self, QMatrix};
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
/// columns optionally split over up to three regions (q|k|v), optionally
/// with the RMSNorm of x fused in ([`QMatmul::with_norm`]) and SwiGLU on the
/// outputs ([`QMatmul::glu`]). Offsets in elements of the activation buffer
/// except `qs_off` / `sc_off` (texels) and `norm_off` (weights buffer).
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
    /// y1 `[m, n1]` (`h [m, n / 2]` in GLU mode).
    pub y_off: u32,
    /// Bits 0..8: [`MODE_STORE`], [`MODE_ADD`] (residual add) or
    /// [`MODE_GLU`]; bits 8..: [`KernelType`] of W (0 Q41, 1 Q80, 2 F16,
    /// 3 F32), which picks the entry point.
    pub mode: u32,
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
    /// RMSNorm weights `[k]` in the weights buffer (inside the weight window
    /// in a CPU-form chunk), or [`NO_NORM`].
    pub norm_off: u32,
    /// RMSNorm epsilon (with a norm).
    pub eps: f32,
}

/// [`QMatmul::mode`]: overwrite y.
pub const MODE_STORE: u32 = 0;
/// [`QMatmul::mode`]: add to y (the residual add).
pub const MODE_ADD: u32 = 1;
/// [`QMatmul::mode`]: W holds gate and up rows interleaved
/// ([`TexelStream::push_interleaved`](super::qweights::TexelStream::push_interleaved));
/// `h [m, n / 2] = silu(gate . x) * (up . x)` goes to `y_off`.
pub const MODE_GLU: u32 = 2;
/// [`QMatmul::mode`]: store y (no split) and per group of outputs the
/// largest value with its lowest index at `y2_off` (the LM head; see
/// [`ArgmaxPart`]).
pub const MODE_ARGMAX: u32 = 3;
/// [`QMatmul::norm_off`] without a fused RMSNorm.
pub const NO_NORM: u32 = u32::MAX;

impl QMatmul {
    /// `y [m, W.rows] (+)= x [m, W.cols] . W^T`, y at `y_off`.
    pub fn plain(w: &QTensor, m: u32, x_off: u32, y_off: u32, accumulate: bool) -> QMatmul {
        let mode = if accumulate { MODE_ADD } else { MODE_STORE };
        QMatmul {
            m,
            n: w.rows,
            k: w.cols,
            x_off,
            qs_off: w.qs_off,
            sc_off: w.sc_off,
            y_off,
            mode: mode | type_id(w.ty) << 8,
            n1: w.rows,
            n2: 0,
            y2_off: 0,
            y3_off: 0,
            m_base: 0,
            norm_off: NO_NORM,
            eps: 0.0,
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

    /// SwiGLU over interleaved gate|up rows `w` (`2 * hidden` rows): `h [m,
    /// hidden] = silu(gate . x) * (up . x)` at `h_off`.
    pub fn glu(w: &QTensor, m: u32, x_off: u32, h_off: u32) -> QMatmul {
        QMatmul {
            mode: MODE_GLU | type_id(w.ty) << 8,
            ..QMatmul::plain(w, m, x_off, h_off, false)
        }
    }

    /// `logits [m, W.rows] = x . W^T` at `y_off`, and the argmax partials of
    /// every row at `part_off` (`[m][argmax_groups(W.rows, variant)][2]`
    /// f32: value, index bits) for [`ArgmaxPart`].
    pub fn logits_argmax(w: &QTensor, m: u32, x_off: u32, y_off: u32, part_off: u32) -> QMatmul {
        QMatmul {
            mode: MODE_ARGMAX | type_id(w.ty) << 8,
            y2_off: part_off,
            ..QMatmul::plain(w, m, x_off, y_off, false)
        }
    }

    /// The same product of `rmsnorm(x) * g` instead of x, for `g [k]` at
    /// `norm_off` of the weights buffer (`1 / sqrt(mean(x^2) + eps)`).
    pub fn with_norm(self, norm_off: u32, eps: f32) -> QMatmul {
        QMatmul {
            norm_off,
            eps,
            ..self
        }
    }

    /// The weight format.
    pub fn kernel_type(&self) -> KernelType {
        kernel_type(self.mode >> 8)
    }
}

impl Op for QMatmul {
    const KERNEL: &'static str = "qmm_q41_gpu";
    fn grid(&self) -> [u32; 3] {
        [groups(self.n, 4), groups(self.m, 4), 1]
    }
    fn dispatch(&self, variant: Variant) -> (&'static str, [u32; 3]) {
        // The CPU form needs the windows; without them the GPU form runs
        // (correct on any device, slow where barriers are). Its x_off and
        // norm_off are absolute.
        let _ = variant;
        (qmm_name(self.kernel_type(), 4, Variant::Gpu), self.grid())
    }
    /// The CPU form (needs subgroups of at least 8 lanes with ballot and
    /// arithmetic operations, [`crate::vk::Device::subgroup_size`]): rows
    /// chunked so each chunk's x rows fit one placement
    /// of the activation window (`k` and `x_off` are multiples of 4 by the
    /// op's contract), the weight window placed over the norm vector;
    /// `None` on [`Variant::Gpu`], when a row does not fit a window, or the
    /// norm vector is not 16-byte aligned or does not fit one.
    fn windowed(
        &self,
        variant: Variant,
        win: &[Window; WINDOWS as usize],
    ) -> Option<Vec<Windowed<Self>>> {
        if variant != Variant::Cpu || self.m == 0 || self.n < 4 || !self.x_off.is_multiple_of(4) {
            return None;
        }
        let (w_window, norm_off) = match self.norm_off {
            NO_NORM => (0, NO_NORM),
            off => {
                let start = u64::from(off) * 4;
                let (at, covered) = win[0].place(start)?;
                if covered < u64::from(self.k) * 4 {
                    return None;
                }
                (at, u32::try_from((start - at) / 4).ok()?)
            }
        };
        let rows = spans_of(&win[1], self.x_off, self.m, u64::from(self.k), 4)?;
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
                            norm_off,
                            ..*self
                        },
                        grid: [groups(r.count, tile), groups(self.n, 32), 1],
                        offsets: [w_window, r.offset],
                    }
                })
                .collect(),
        )
    }
}

/// Output groups per row whose argmax partials [`QMatmul::logits_argmax`]
/// writes: `ceil(n / 32)` in the CPU form (a subgroup's 8 lanes x 4
/// outputs), `n / 4` in the GPU form (a workgroup's 4 outputs).
pub fn argmax_groups(n: u32, variant: Variant) -> u32 {
    match variant {
        Variant::Cpu => n.div_ceil(32),
        Variant::Gpu => n.div_ceil(4),
    }
}

/// `argmax_part` (`kernels/argmax.wgsl`): the greedy token of each row from
/// [`QMatmul::logits_argmax`]'s partials: the largest value, the lowest
/// index among equal ones (as [`super::ops::Argmax`] over the logits).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct ArgmaxPart {
    /// Rows.
    pub n_rows: u32,
    /// Unused (the layout of `argmax`'s parameters).
    pub vocab: u32,
    /// The partials `[n_rows][groups][2]` in activations.
    pub part_off: u32,
    /// Output token ids in the tokens buffer.
    pub out_off: u32,
    /// Groups per row ([`argmax_groups`]).
    pub groups: u32,
}

impl Op for ArgmaxPart {
    const KERNEL: &'static str = "argmax_part";
    fn grid(&self) -> [u32; 3] {
        [groups(self.n_rows, 64), 1, 1]
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

/// `rope_kv_img` / `rope_kv` (`kernels/rope.wgsl`): [`RopeTable`] and
/// [`super::ops::KvAppend`] in one dispatch: q turned in place, k turned and
/// written with v into the KV cache (the image in the
/// [`super::ops::KvImage`] layout with `image`, then `kc_off` / `vc_off` are
/// image layers; else the KV buffer, element offsets). Requires
/// `head_size % 4 == 0`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct RopeKv {
    /// The rotation and its table.
    pub rope: RopeTable,
    /// v `[n_rows, kv_dim]` in activations.
    pub v_off: u32,
    /// Positions per KV block.
    pub block_size: u32,
    /// This layer's K cache (image layer or buffer offset).
    pub kc_off: u32,
    /// This layer's V cache.
    pub vc_off: u32,
    /// 1: the cache is the image.
    pub image: u32,
}

impl Op for RopeKv {
    const KERNEL: &'static str = "rope_kv";
    fn grid(&self) -> [u32; 3] {
        [groups(self.rope.rope.dim / 4, 64), self.rope.rope.n_rows, 1]
    }
    fn dispatch(&self, _variant: Variant) -> (&'static str, [u32; 3]) {
        let name = if self.image != 0 {
            "rope_kv_img"
        } else {
            "rope_kv"
        };
        (name, self.grid())
    }
}

/// CPU reference of [`RopeKv`] for one row: q and k turned
/// ([`reference_rope`]); the cache then holds the turned k and v at the
/// row's position.
pub fn reference_rope_kv(
    table: &[f32],
    head_size: usize,
    q: &mut [f32],
    k: &mut [f32],
    pos: usize,
) {
    reference_rope(table, head_size, q, pos);
    reference_rope(table, head_size, k, pos);
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

/// CPU reference of [`QMatmul::with_norm`]: `reference_matmul` of
/// `rmsnorm(x) * g` row by row (the model's `llama::rmsnorm`).
pub fn reference_norm_matmul(
    w: &QMatrix<'_>,
    x: &[f32],
    m: usize,
    g: &[f32],
    eps: f32,
) -> Vec<f32> {
    let k = w.cols();
    let mut xn = vec![0f32; x.len()];
    for (o, r) in xn.chunks_exact_mut(k).zip(x.chunks_exact(k)) {
        super::llama::rmsnorm(o, r, g, eps);
    }
    reference_matmul(w, &xn, m)
}

/// CPU reference of [`QMatmul::glu`] on separate `gate` and `up` matrices:
/// `h [m, hidden] = silu(gate x) * (up x)`.
pub fn reference_glu(gate: &QMatrix<'_>, up: &QMatrix<'_>, x: &[f32], m: usize) -> Vec<f32> {
    let g = reference_matmul(gate, x, m);
    let u = reference_matmul(up, x, m);
    g.iter()
        .zip(&u)
        .map(|(a, b)| a / (1.0 + (-a).exp()) * b)
        .collect()
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
