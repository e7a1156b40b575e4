//! The decode kernels' push constants and dispatch grids (`kernels/*.wgsl`).
//!
//! Every kernel uses the [`xtc_vk::pipeline`] ABI: binding 0 = weights
//! (f32), 1 = activations (f32), 2 = KV cache (f32), 3 = per-iteration
//! metadata (u32), 4 = sampled tokens (u32); 5 and 6 = the uniform windows
//! over weights and activations; 7 = the storage image holding the KV cache
//! on CPU devices ([`KvImage`]). Offsets are in elements of their buffer.
//! Each struct below is the kernel's `var<immediate>` block field for field
//! (`#[repr(C)]`, all 4-byte fields), so it is uploaded as is.
//!
//! On [`Variant::Cpu`] an op runs its windowed form when it has one and it
//! applies ([`Op::windowed`]: operands read through the uniform windows, the
//! op split into chunks that fit them), else its storage-buffer form; the
//! choice never changes an op's results for a given vector, and the matmul
//! forms agree bit for bit.
//!
//! Row records in the metadata buffer are `[n_rows][4]` u32:
//! `(token, sequence index, position, block-table offset)`.

use bytemuck::{Pod, Zeroable};

use crate::BatchPlan;
use xtc_vk::{Kernel, Kernels, Recorder, VkError, VkResult, WINDOWS, Window};

/// Packs one iteration's metadata into `out` (cleared first): the row records
/// `[n_tokens][4]` at offset 0 (token, sequence index, position, offset of the
/// sequence's block table), then each sequence's block table (the blocks its
/// positions `0..start_pos + len` use), then the list of sampled rows (the last
/// row of each sequence with `sample`). Returns the offset of that list.
/// `plan` must have passed [`BatchPlan::validate`].
pub fn pack_metadata(plan: &BatchPlan, block_size: usize, out: &mut Vec<u32>) -> u32 {
    let n_rows = plan.n_tokens();
    out.clear();
    out.resize(4 * n_rows, 0);
    let mut row = 0;
    for (si, s) in plan.seqs.iter().enumerate() {
        let bt_off = out.len() as u32;
        let blocks = (s.start_pos + s.tokens.len()).div_ceil(block_size);
        out.extend_from_slice(&s.block_table[..blocks]);
        for (i, &tok) in s.tokens.iter().enumerate() {
            out[4 * row..4 * row + 4].copy_from_slice(&[
                tok,
                si as u32,
                (s.start_pos + i) as u32,
                bt_off,
            ]);
            row += 1;
        }
    }
    let samples = out.len() as u32;
    let mut row = 0u32;
    for s in &plan.seqs {
        row += s.tokens.len() as u32;
        if s.sample {
            out.push(row - 1);
        }
    }
    samples
}

/// Which form of the kernels that have two (matmul, attention) to run. The
/// `Cpu` form is used only where it fits [`LANE_LOOP_BUDGET`]. Which form a
/// device runs follows what it supports and measures, not its type
/// ([`super::form`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Cooperative workgroups with workgroup memory and barriers (where
    /// barriers are cheap: GPUs; needs no subgroups).
    Gpu,
    /// Barrier-free forms with subgroups of at least 8 lanes (where a
    /// workgroup barrier is dear: CPU devices such as lavapipe, where it
    /// switches between all of the workgroup's fibers).
    Cpu,
}

impl Variant {
    /// The form of the quantized kernels for `dev` by
    /// [`super::form::choose`]: `Gpu` where the CPU form's subgroups are missing (or masked, `XTC_VK_MASK=subgroups`),
    /// else the one the barrier probe favours (measured once per device and
    /// driver, cached).
    ///
    /// # Errors
    /// Device errors of the probe.
    pub fn for_device(dev: &xtc_vk::Device) -> VkResult<Variant> {
        super::form::choose(dev, super::form::cpu_form_supported(dev))
    }

    /// `"gpu"` or `"cpu"` (the `--kernels` value and case-name component).
    pub fn name(self) -> &'static str {
        match self {
            Variant::Gpu => "gpu",
            Variant::Cpu => "cpu",
        }
    }
}

/// Loop iterations a barrier-free ([`Variant::Cpu`]) invocation may run:
/// llvmpipe ends an invocation's loops after 65535 iterations in total (gallivm
/// `LP_MAX_TGSI_LOOP_ITERATIONS`, shared by every loop of the invocation), so
/// larger work takes the [`Variant::Gpu`] form.
pub const LANE_LOOP_BUDGET: u32 = 60_000;

/// A kernel invocation: its entry point and grid.
pub trait Op: Pod {
    /// Entry point name in `kernels/` (the [`Variant::Gpu`] form).
    const KERNEL: &'static str;
    /// Workgroups in x, y, z.
    fn grid(&self) -> [u32; 3];
    /// Entry point and grid of `variant` (the same kernel for most ops).
    fn dispatch(&self, variant: Variant) -> (&'static str, [u32; 3]) {
        let _ = variant;
        (Self::KERNEL, self.grid())
    }
    /// The dispatches of this op's windowed form in `variant` over the
    /// recorder's uniform windows, or `None` (the default) when it has none
    /// or it does not apply; [`Ops::run`] then uses [`Op::dispatch`].
    fn windowed(
        &self,
        variant: Variant,
        win: &[Window; WINDOWS as usize],
    ) -> Option<Vec<Windowed<Self>>> {
        let _ = (variant, win);
        None
    }
}

/// One dispatch of an op's windowed form: entry point, push constants, grid
/// and the byte offsets of the uniform windows (`[weights, activations]`,
/// see [`Recorder::dispatch_windowed`]).
#[derive(Debug, Clone, Copy)]
pub struct Windowed<O> {
    /// Entry point.
    pub kernel: &'static str,
    /// Push constants of this dispatch.
    pub push: O,
    /// Workgroups in x, y, z.
    pub grid: [u32; 3],
    /// Byte offsets of the two uniform windows.
    pub offsets: [u64; WINDOWS as usize],
}

fn groups(n: u32, per: u32) -> u32 {
    n.div_ceil(per).max(1)
}

/// `embed.wgsl`: `x[r] = embedding[token[r]]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct Embed {
    /// Token rows.
    pub n_rows: u32,
    /// Row width.
    pub dim: u32,
    /// Row records in the metadata buffer.
    pub rows_off: u32,
    /// Embedding table in weights.
    pub emb_off: u32,
    /// Output `[n_rows, dim]` in activations.
    pub x_off: u32,
}

impl Op for Embed {
    const KERNEL: &'static str = "embed";
    fn grid(&self) -> [u32; 3] {
        [groups(self.dim, 64), self.n_rows, 1]
    }
}

/// `rmsnorm.wgsl`: `out[r] = w * x[src(r)] / rms(x[src(r)])`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct RmsNorm {
    /// Output rows.
    pub n_rows: u32,
    /// Row width.
    pub dim: u32,
    /// Input rows in activations.
    pub in_off: u32,
    /// Output `[n_rows, dim]` in activations.
    pub out_off: u32,
    /// `w [dim]` in weights.
    pub w_off: u32,
    /// Metadata offset of a row-index list, or `u32::MAX` for identity.
    pub row_list: u32,
    /// Epsilon (1e-5).
    pub eps: f32,
    /// `rmsnorm_win` chunks only (0 otherwise): the chunk's first output row
    /// (`n_rows` is then the chunk's row count and `in_off` an offset inside
    /// the activation window).
    pub row_base: u32,
}

impl Op for RmsNorm {
    const KERNEL: &'static str = "rmsnorm";
    fn grid(&self) -> [u32; 3] {
        [self.n_rows, 1, 1]
    }
    /// `rmsnorm_win` on CPU devices: rows chunked so each chunk's input rows
    /// fit one placement of the activation window; identity row list only,
    /// `dim` and both input offsets multiples of 4.
    fn windowed(
        &self,
        variant: Variant,
        win: &[Window; WINDOWS as usize],
    ) -> Option<Vec<Windowed<Self>>> {
        let aligned = self.dim.is_multiple_of(4)
            && self.in_off.is_multiple_of(4)
            && self.w_off.is_multiple_of(4);
        if variant != Variant::Cpu || self.row_list != u32::MAX || !aligned || self.n_rows == 0 {
            return None;
        }
        let (w_window, w_covered) = win[0].place(u64::from(self.w_off) * 4)?;
        if w_covered < u64::from(self.dim) * 4 {
            return None;
        }
        let w_rel = u32::try_from((u64::from(self.w_off) * 4 - w_window) / 4).ok()?;
        let rows = spans(&win[1], self.in_off, self.n_rows, u64::from(self.dim))?;
        Some(
            rows.iter()
                .map(|r| Windowed {
                    kernel: "rmsnorm_win",
                    push: RmsNorm {
                        n_rows: r.count,
                        in_off: r.rel,
                        w_off: w_rel,
                        row_base: r.first,
                        ..*self
                    },
                    grid: [groups(r.count, 64), 1, 1],
                    offsets: [w_window, r.offset],
                })
                .collect(),
        )
    }
}

/// `matmul.wgsl`: `y[m, n] (+)= sum_k x[m, k] W[n, k]`, the output columns
/// optionally split over up to three regions (see [`Matmul::split`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct Matmul {
    /// Rows of x and y (token rows).
    pub m: u32,
    /// Outputs per row (rows of W).
    pub n: u32,
    /// Inputs per row (columns of W).
    pub k: u32,
    /// x `[m, k]` in activations.
    pub x_off: u32,
    /// W `[n, k]` in weights.
    pub w_off: u32,
    /// y1 `[m, n1]` in activations (all of y for a plain matmul).
    pub y_off: u32,
    /// 1: add to y (residual add), 0: overwrite.
    pub accumulate: u32,
    /// Columns `0..n1` go to y1 (`n` for a plain matmul).
    pub n1: u32,
    /// Columns `n1..n1 + n2` go to y2 `[m, n2]`.
    pub n2: u32,
    /// y2 in activations.
    pub y2_off: u32,
    /// Columns `n1 + n2..n` go to y3 `[m, n - n1 - n2]` at this offset.
    pub y3_off: u32,
    /// `matmul_win` chunks only (0 otherwise): first row of the whole
    /// product this chunk computes (`m` is then the chunk's row count and
    /// `x_off` an offset inside the activation window).
    pub m_base: u32,
    /// `matmul_win` chunks only (0 otherwise): first column of the chunk
    /// (`w_off` is then an offset inside the weight window).
    pub n_base: u32,
    /// Columns this dispatch computes: `n` for a whole product, the chunk's
    /// width for a `matmul_win` chunk.
    pub n_count: u32,
}

impl Matmul {
    /// `y [m, n] (+)= x [m, k] . W [n, k]^T`.
    pub fn plain(
        m: u32,
        n: u32,
        k: u32,
        x_off: u32,
        w_off: u32,
        y_off: u32,
        accumulate: bool,
    ) -> Matmul {
        let accumulate = u32::from(accumulate);
        Matmul {
            m,
            n,
            k,
            x_off,
            w_off,
            y_off,
            accumulate,
            n1: n,
            n2: 0,
            y2_off: 0,
            y3_off: 0,
            m_base: 0,
            n_base: 0,
            n_count: n,
        }
    }

    /// One dispatch for stacked weights `[ns[0] + ns[1] + ns[2], k]` (e.g.
    /// q|k|v): columns go to `ys[0] [m, ns[0]]`, `ys[1] [m, ns[1]]`,
    /// `ys[2] [m, ns[2]]`. Overwrites.
    pub fn split(m: u32, k: u32, ns: [u32; 3], w_off: u32, x_off: u32, ys: [u32; 3]) -> Matmul {
        let n = ns[0] + ns[1] + ns[2];
        let [y_off, y2_off, y3_off] = ys;
        Matmul {
            m,
            n,
            k,
            x_off,
            w_off,
            y_off,
            accumulate: 0,
            n1: ns[0],
            n2: ns[1],
            y2_off,
            y3_off,
            m_base: 0,
            n_base: 0,
            n_count: n,
        }
    }

    /// The `matmul_win` chunks of this product over the uniform windows `win`
    /// (`[weights, activations]`): each chunk's x rows fit one placement of
    /// the activation window and its W rows one placement of the weight
    /// window. `None` when the windowed form does not apply: `k` or an offset
    /// not a multiple of 4 (the kernel reads `vec4`s), a window that holds
    /// fewer than [`MIN_WINDOW_ROWS`] rows of x or W (fewer than the operand
    /// has), or an operand outside its buffer.
    fn window_chunks(&self, win: &[Window; WINDOWS as usize]) -> Option<Vec<Windowed<Matmul>>> {
        if self.m == 0 || self.n == 0 || !self.k.is_multiple_of(4) || self.k == 0 {
            return None;
        }
        if !self.x_off.is_multiple_of(4) || !self.w_off.is_multiple_of(4) {
            return None;
        }
        let k = u64::from(self.k);
        let holds = |w: &Window, rows: u32| w.range / (k * 4) >= MIN_WINDOW_ROWS.min(rows.into());
        if !holds(&win[0], self.n) || !holds(&win[1], self.m) {
            return None;
        }
        let rows = spans(&win[1], self.x_off, self.m, k)?;
        let cols = spans(&win[0], self.w_off, self.n, k)?;
        let mut out = Vec::with_capacity(rows.len() * cols.len());
        for r in &rows {
            for c in &cols {
                let push = Matmul {
                    m: r.count,
                    x_off: r.rel,
                    w_off: c.rel,
                    m_base: r.first,
                    n_base: c.first,
                    n_count: c.count,
                    ..*self
                };
                out.push(Windowed {
                    kernel: "matmul_win",
                    push,
                    grid: [groups(c.count, 128), groups(r.count, 8), 1],
                    offsets: [c.offset, r.offset],
                });
            }
        }
        Some(out)
    }
}

/// Fewest rows of x and of W (or all of them, when the operand has fewer)
/// that one window must hold for [`Matmul`]'s windowed form to apply: with
/// fewer, most of `matmul_win`'s 8 x 2 register tile and 128-column
/// workgroup idles and the product splits into a dispatch per handful of
/// outputs. On lavapipe (64 KiB windows) that ran far slower than the
/// storage forms from K = 4096 up (4 rows a window: about 2x slower;
/// K = 8192 to 16384: 7-20x), and about even at K = 3072; at K <= 2048
/// (8 rows or more) the windowed form wins.
pub const MIN_WINDOW_ROWS: u64 = 8;

/// One window placement over consecutive rows of an operand: rows
/// `first .. first + count`, the window's byte offset, and the first row's
/// element offset inside the window.
pub(crate) struct Span {
    pub(crate) first: u32,
    pub(crate) count: u32,
    pub(crate) offset: u64,
    pub(crate) rel: u32,
}

/// Covers `rows` rows of `k` f32 elements starting at element `base` of the
/// window's buffer with as few window placements as possible.
pub(crate) fn spans(win: &Window, base: u32, rows: u32, k: u64) -> Option<Vec<Span>> {
    spans_of(win, base, rows, k, 1)
}

/// As [`spans`], with each placement's row count rounded down to a multiple
/// of `tile` where it holds more than `tile` rows and more rows follow (so a
/// kernel computing `tile` rows per invocation wastes none: at K = 1536 a
/// 64 KiB window holds 10 rows, taken as 8 + 8 + ... rather than 10 + 10 +
/// ..., whose 4-row tiles compute 12).
pub(crate) fn spans_of(win: &Window, base: u32, rows: u32, k: u64, tile: u32) -> Option<Vec<Span>> {
    let row_bytes = k * 4;
    let mut out = Vec::new();
    let mut first = 0u32;
    while first < rows {
        let start = (u64::from(base) + u64::from(first) * k) * 4;
        let (offset, covered) = win.place(start)?;
        let mut fit = (covered / row_bytes).min(u64::from(rows - first));
        let tile = u64::from(tile.max(1));
        if fit > tile && fit < u64::from(rows - first) {
            fit = fit / tile * tile;
        }
        if fit == 0 {
            return None;
        }
        out.push(Span {
            first,
            count: fit as u32,
            offset,
            rel: u32::try_from((start - offset) / 4).ok()?,
        });
        first += fit as u32;
    }
    Some(out)
}

impl Op for Matmul {
    const KERNEL: &'static str = "matmul_tiled";
    fn grid(&self) -> [u32; 3] {
        [groups(self.n, 16), groups(self.m, 16), 1]
    }
    fn windowed(
        &self,
        variant: Variant,
        win: &[Window; WINDOWS as usize],
    ) -> Option<Vec<Windowed<Self>>> {
        (variant == Variant::Cpu)
            .then(|| self.window_chunks(win))
            .flatten()
    }
    fn dispatch(&self, variant: Variant) -> (&'static str, [u32; 3]) {
        match variant {
            Variant::Cpu if self.k < LANE_LOOP_BUDGET && self.m < 4 => {
                ("matmul_vec", [groups(self.n, 256), self.m, 1])
            }
            Variant::Cpu if self.k < LANE_LOOP_BUDGET && self.m < 8 => {
                ("matmul", [groups(self.n, 256), groups(self.m, 4), 1])
            }
            Variant::Cpu if self.k < LANE_LOOP_BUDGET => {
                ("matmul8", [groups(self.n, 512), groups(self.m, 8), 1])
            }
            _ => (Self::KERNEL, self.grid()),
        }
    }
}

/// `rope.wgsl`: rotary embedding of q and k in place at each row's position.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct Rope {
    /// Token rows.
    pub n_rows: u32,
    /// Width of q.
    pub dim: u32,
    /// Width of k.
    pub kv_dim: u32,
    /// Head size.
    pub head_size: u32,
    /// Row records in metadata.
    pub rows_off: u32,
    /// q `[n_rows, dim]` in activations.
    pub q_off: u32,
    /// k `[n_rows, kv_dim]` in activations.
    pub k_off: u32,
}

impl Op for Rope {
    const KERNEL: &'static str = "rope";
    fn grid(&self) -> [u32; 3] {
        [groups(self.dim / 2, 64), self.n_rows, 1]
    }
}

/// `kv_append.wgsl`: k, v rows into the paged KV cache.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct KvAppend {
    /// Token rows.
    pub n_rows: u32,
    /// Width of k and v.
    pub kv_dim: u32,
    /// Positions per block.
    pub block_size: u32,
    /// Row records in metadata.
    pub rows_off: u32,
    /// k `[n_rows, kv_dim]` in activations.
    pub k_off: u32,
    /// v `[n_rows, kv_dim]` in activations.
    pub v_off: u32,
    /// This layer's K cache in the KV buffer.
    pub kc_off: u32,
    /// This layer's V cache in the KV buffer.
    pub vc_off: u32,
}

impl Op for KvAppend {
    const KERNEL: &'static str = "kv_append";
    fn grid(&self) -> [u32; 3] {
        [groups(self.kv_dim, 64), self.n_rows, 1]
    }
}

/// `kv_append_img` (`kv_append.wgsl`): [`KvAppend`] into the KV cache held in
/// the kernel ABI's storage image ([`KvImage`] layout); `kc_off` / `vc_off`
/// are then this layer's K and V image layers. Requires `kv_dim % 4 == 0`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct KvAppendImage(pub KvAppend);

impl Op for KvAppendImage {
    const KERNEL: &'static str = "kv_append_img";
    fn grid(&self) -> [u32; 3] {
        [groups(self.0.kv_dim / 4, 64), self.0.n_rows, 1]
    }
}

/// Layout of a KV cache held in the kernel ABI's storage image (the CPU-device
/// form, read by `attention_img`): layer `l` of the model has its K in image
/// layer `l` and its V in layer `n_layers + l`; image row `y` is block `y`;
/// texel `x = slot * kv_dim / 4 + i` holds values `4i .. 4i + 4` of the
/// position in slot `slot` of the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvImage {
    /// `[width, height, layers]` in texels: `[block_size * kv_dim / 4,
    /// n_blocks, 2 * n_layers]`.
    pub extent: [u32; 3],
}

impl KvImage {
    /// The layout for a model of `c` over `kv`, or `None` when it cannot be
    /// used: `kv_dim` or `head_size` not a multiple of 4, `head_size > 64`
    /// (the attention form's registers), or an extent above `limits`
    /// (`(maxImageDimension2D, maxImageArrayLayers)`).
    pub fn new(c: &crate::Config, kv: crate::KvGeometry, limits: (u32, u32)) -> Option<KvImage> {
        let (kv_dim, hs) = (c.kv_dim(), c.head_size());
        if !kv_dim.is_multiple_of(4) || !hs.is_multiple_of(4) || hs > 64 {
            return None;
        }
        let width = u32::try_from(kv.block_size.checked_mul(kv_dim / 4)?).ok()?;
        let height = u32::try_from(kv.n_blocks).ok()?;
        let layers = u32::try_from(c.n_layers.checked_mul(2)?).ok()?;
        let (max_dim, max_layers) = limits;
        (width <= max_dim && height <= max_dim && layers <= max_layers && width > 0 && height > 0)
            .then_some(KvImage {
                extent: [width, height, layers],
            })
    }
}

/// `attention_img` (`attention.wgsl`): [`Attention`] over the KV cache held in
/// the kernel ABI's storage image ([`KvImage`] layout); `kc_off` / `vc_off`
/// are then this layer's K and V image layers. Requires `head_size % 4 == 0`,
/// `head_size <= 64`, `kv_dim % 4 == 0` and a sequence no longer than the
/// loop budget ([`AttentionImage::fits`]). Same results, bit for bit, as the
/// `attention_lane` form over a KV buffer.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct AttentionImage(pub Attention);

impl AttentionImage {
    /// Whether this form can run the op: the shape conditions above and
    /// llvmpipe's loop budget, `(max_pos + 1) * (head_size / 2 + 1) +
    /// head_size / 2 < LANE_LOOP_BUDGET`.
    pub fn fits(&self) -> bool {
        let a = &self.0;
        let hs = u64::from(a.head_size);
        let loops = (u64::from(a.max_pos) + 1) * (hs / 2 + 1) + hs / 2;
        hs.is_multiple_of(4)
            && hs <= 64
            && a.kv_dim.is_multiple_of(4)
            && loops < u64::from(LANE_LOOP_BUDGET)
    }
}

impl Op for AttentionImage {
    const KERNEL: &'static str = "attention_img";
    fn grid(&self) -> [u32; 3] {
        [groups(self.0.n_rows * self.0.n_heads, 64), 1, 1]
    }
}

/// `attention_img_split` (`attention.wgsl`): [`AttentionImage`] with each
/// (row, head)'s positions split over the 8 lanes of a workgroup (lane `l`
/// takes positions `l, l + 8, ..` under a softmax of its own; subgroup
/// operations merge the 8 shares: the largest max, each share rescaled to
/// it, the sums added; flash-decoding's split). One workgroup of 8 a (row,
/// head), grid `(n_rows * n_heads, 1, 1)`. For iterations of few rows on
/// CPU devices, at enough positions ([`AttentionImageSplit::pays`]): `attention_img`'s
/// 64-invocation workgroups hold up to 64 (row, head) pairs each, so at one
/// row SmolLM2's 9 heads are one workgroup on one thread, 8 lanes looping
/// over every position; split, they are 9 workgroups spread over the
/// threads, each lane looping over an eighth of the positions. The same
/// conditions and loop budget as [`AttentionImage::fits`]; needs subgroups
/// of at least 8 lanes (the CPU form's). The results differ from
/// `attention_img`'s in the last bits (another summation order).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct AttentionImageSplit(pub Attention);

impl AttentionImageSplit {
    /// Whether the split form runs the op faster than `attention_img` on a
    /// CPU device of `threads` threads (`chained`: the unsplit form would
    /// run in a persistent chain, 8 invocations a chain turn, instead of
    /// dispatched, 64 a workgroup), by a cost model in loop turns of one
    /// 8-lane vector per thread, fitted on a 2-vCPU Xeon guest
    /// (`docs/arch/vk.md`, "The split attention"):
    /// - unsplit: the (row, head) pairs are `ceil(pairs / 8)` vectors, each
    ///   looping over all `max_pos + 1` positions; chained they spread over
    ///   the threads, dispatched each workgroup's 8 vectors run on one
    ///   thread;
    /// - split: `pairs` workgroups spread over the threads, each looping over
    ///   an eighth of the positions at 1.3 times an unsplit turn (each lane
    ///   fetches another position's texels), plus 4 turns for the query's
    ///   loads and the merge.
    ///
    /// Also requires [`AttentionImage::fits`].
    pub fn pays(op: &Attention, threads: u32, chained: bool) -> bool {
        if !AttentionImage(*op).fits() {
            return false;
        }
        let t = u64::from(threads.max(1));
        let pairs = u64::from(op.n_rows) * u64::from(op.n_heads);
        let positions = u64::from(op.max_pos) + 1;
        let vectors = pairs.div_ceil(8);
        let per_thread = if chained {
            vectors.div_ceil(t)
        } else {
            vectors.div_ceil(t).max(vectors.min(8))
        };
        let unsplit = per_thread * positions * 10;
        let split = pairs.div_ceil(t) * (positions.div_ceil(8) * 13 + 40);
        split < unsplit
    }
}

impl Op for AttentionImageSplit {
    const KERNEL: &'static str = "attention_img_split";
    fn grid(&self) -> [u32; 3] {
        [self.0.n_rows * self.0.n_heads, 1, 1]
    }
}

/// `attention_img_q81` (`attention.wgsl`): [`AttentionImage`] that also
/// leaves its output `[n_rows, dim]` as the int8 products' Q8_1 blocks at
/// `q_out` (absolute, in the activations; `q81_len(n_rows, dim)` elements,
/// [`crate::vulkan::qops8`]'s layout), each invocation quantizing the
/// head it wrote: the next product's input without a `quant_q81` dispatch
/// group. The codes and scales are `quant_q81`'s bits; the blocks' sums of
/// squares are not (summed in another order), so only a product without a
/// fused norm may read them. Requires what [`AttentionImage`] does,
/// `head_size % 32 == 0` and `dim % 32 == 0` ([`AttentionImageQ81::fits`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct AttentionImageQ81 {
    /// The attention.
    pub att: Attention,
    /// The blocks' offset in the activations (a multiple of 4).
    pub q_out: u32,
}

impl AttentionImageQ81 {
    /// Whether this form can run the op: [`AttentionImage::fits`] with
    /// `head_size / 4` loop iterations more, whole blocks per head and row,
    /// `q_out` a multiple of 4.
    pub fn fits(&self) -> bool {
        let a = &self.att;
        let hs = u64::from(a.head_size);
        let loops = (u64::from(a.max_pos) + 1) * (hs / 2 + 1) + hs / 2 + hs / 4;
        AttentionImage(*a).fits()
            && a.head_size.is_multiple_of(32)
            && a.dim.is_multiple_of(32)
            && self.q_out.is_multiple_of(4)
            && loops < u64::from(LANE_LOOP_BUDGET)
    }
}

impl Op for AttentionImageQ81 {
    const KERNEL: &'static str = "attention_img_q81";
    fn grid(&self) -> [u32; 3] {
        [groups(self.att.n_rows * self.att.n_heads, 64), 1, 1]
    }
}

/// `attention.wgsl`: causal GQA attention per (row, head) over the paged cache.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct Attention {
    /// Token rows.
    pub n_rows: u32,
    /// Query heads.
    pub n_heads: u32,
    /// KV heads.
    pub n_kv_heads: u32,
    /// Head size (<= 256).
    pub head_size: u32,
    /// Positions per block.
    pub block_size: u32,
    /// Row records in metadata.
    pub rows_off: u32,
    /// q `[n_rows, dim]` in activations.
    pub q_off: u32,
    /// Output `[n_rows, dim]` in activations.
    pub out_off: u32,
    /// This layer's K cache in the KV buffer.
    pub kc_off: u32,
    /// This layer's V cache in the KV buffer.
    pub vc_off: u32,
    /// `n_kv_heads * head_size`.
    pub kv_dim: u32,
    /// `n_heads * head_size`.
    pub dim: u32,
    /// Largest position among the rows (picks the kernel form, see [`Variant`]).
    pub max_pos: u32,
}

impl Op for Attention {
    const KERNEL: &'static str = "attention";
    fn grid(&self) -> [u32; 3] {
        [self.n_heads, self.n_rows, 1]
    }
    fn dispatch(&self, variant: Variant) -> (&'static str, [u32; 3]) {
        let hs = u64::from(self.head_size);
        let lane_loops = (u64::from(self.max_pos) + 1) * (2 * hs + 2) + 2 * hs;
        match variant {
            Variant::Cpu if hs <= 64 && lane_loops < u64::from(LANE_LOOP_BUDGET) => (
                "attention_lane",
                [groups(self.n_rows * self.n_heads, 64), 1, 1],
            ),
            // Past the lane loop budget the CPU form keeps per-invocation
            // reads (`attention_direct`: same arithmetic, bit for bit, as
            // the GPU form's K/V staging, which is slower on llvmpipe).
            Variant::Cpu => ("attention_direct", self.grid()),
            _ => (Self::KERNEL, self.grid()),
        }
    }
}

/// `swiglu.wgsl`: `h1 = silu(h1) * h3`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct SwiGlu {
    /// Token rows.
    pub n_rows: u32,
    /// Hidden width.
    pub hidden_dim: u32,
    /// h1 `[n_rows, hidden_dim]` in activations (in place).
    pub h1_off: u32,
    /// h3 `[n_rows, hidden_dim]` in activations.
    pub h3_off: u32,
}

impl Op for SwiGlu {
    const KERNEL: &'static str = "swiglu";
    fn grid(&self) -> [u32; 3] {
        [groups(self.hidden_dim, 64), self.n_rows, 1]
    }
}

/// `argmax.wgsl`: greedy token of each logits row.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct Argmax {
    /// Logits rows.
    pub n_rows: u32,
    /// Vocabulary size.
    pub vocab: u32,
    /// Logits `[n_rows, vocab]` in activations.
    pub logits_off: u32,
    /// Output token ids in the tokens buffer.
    pub out_off: u32,
}

impl Op for Argmax {
    const KERNEL: &'static str = "argmax";
    fn grid(&self) -> [u32; 3] {
        [self.n_rows, 1, 1]
    }
}

/// The decode kernels looked up once from [`Kernels`], in one [`Variant`].
#[derive(Debug, Clone)]
pub struct Ops {
    table: Vec<(&'static str, Kernel)>,
    variant: Variant,
    windows: bool,
}

impl Ops {
    /// Looks up every kernel; `variant` picks the form of matmul and attention
    /// ([`Variant::for_device`] is the usual choice).
    ///
    /// # Errors
    /// `Inval` if a kernel cannot be looked up.
    pub fn new(k: &Kernels, variant: Variant) -> VkResult<Ops> {
        let table = k
            .names()
            .map(|n| Ok((n, k.get(n)?)))
            .collect::<VkResult<_>>()?;
        Ok(Ops {
            table,
            variant,
            windows: true,
        })
    }

    /// The same kernels with the windowed forms (uniform-window operand
    /// loads, [`Op::windowed`]) on (the default) or off (storage-buffer forms
    /// only: for benches and cross-checks).
    pub fn with_windows(mut self, on: bool) -> Ops {
        self.windows = on;
        self
    }

    /// Whether the windowed forms are on ([`with_windows`](Self::with_windows)).
    pub fn windows_on(&self) -> bool {
        self.windows
    }

    /// The variant in use.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    fn kernel(&self, name: &str) -> VkResult<Kernel> {
        let k = self.table.iter().find(|(n, _)| *n == name).map(|(_, k)| *k);
        k.ok_or_else(|| VkError::Inval(format!("no kernel named {name:?}")))
    }

    /// Records `op` (no barrier: call [`Recorder::barrier`] before a dependent
    /// op): its windowed form where it applies (one or more dispatches that
    /// write disjoint outputs), else its storage-buffer form.
    ///
    /// # Errors
    /// As [`Recorder::dispatch`] and [`Recorder::dispatch_windowed`]; `Inval`
    /// if the kernel is missing from the build.
    pub fn run<O: Op>(&self, rec: &mut Recorder<'_>, op: &O) -> VkResult<()> {
        if self.windows
            && let Some(win) = rec.windows()
            && let Some(chunks) = op.windowed(self.variant, &win)
        {
            for c in &chunks {
                rec.dispatch_windowed(self.kernel(c.kernel)?, &c.push, c.grid, c.offsets)?;
            }
            return Ok(());
        }
        let (name, grid) = op.dispatch(self.variant);
        rec.dispatch(self.kernel(name)?, op, grid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2's attention (9 heads, 3 KV heads, head size 64) over
    /// `rows` rows, the longest at position `max_pos`.
    fn smollm2(rows: u32, max_pos: u32) -> Attention {
        Attention {
            n_rows: rows,
            n_heads: 9,
            n_kv_heads: 3,
            head_size: 64,
            block_size: 16,
            rows_off: 0,
            q_off: 0,
            out_off: 0,
            kc_off: 0,
            vc_off: 1,
            kv_dim: 192,
            dim: 576,
            max_pos,
        }
    }

    /// The split attention's cost model on two threads picks what the
    /// side-by-side runs measured (`docs/arch/vk.md`, "The split
    /// attention"): one row gains from a few hundred positions, not at 32;
    /// four chained rows do not gain; eight dispatched rows (one 64-lane
    /// workgroup on one thread unsplit) do; sixteen do not.
    #[test]
    fn the_split_attention_pays_where_threads_would_idle() {
        assert!(!AttentionImageSplit::pays(&smollm2(1, 32), 2, true));
        assert!(AttentionImageSplit::pays(&smollm2(1, 256), 2, true));
        assert!(AttentionImageSplit::pays(&smollm2(1, 960), 2, true));
        assert!(!AttentionImageSplit::pays(&smollm2(4, 256), 2, true));
        assert!(AttentionImageSplit::pays(&smollm2(8, 256), 2, false));
        assert!(!AttentionImageSplit::pays(&smollm2(16, 256), 2, false));
        // More threads: four chained rows are 5 vectors for 16 threads.
        assert!(AttentionImageSplit::pays(&smollm2(4, 256), 16, true));
        // Beyond the image form's conditions: never.
        let wide = Attention {
            head_size: 128,
            dim: 1152,
            ..smollm2(1, 960)
        };
        assert!(!AttentionImageSplit::pays(&wide, 2, true));
        let long = smollm2(1, 4000);
        assert!(!AttentionImage(long).fits());
        assert!(!AttentionImageSplit::pays(&long, 2, true));
    }
}
