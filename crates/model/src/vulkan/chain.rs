//! The persistent chain: on a CPU device, a run of an iteration's dispatch
//! groups recorded as ONE dispatch (`chain_r1`, generated from the products'
//! own code by `crates/vk/build/chain_gen.rs`) whose few workgroups stay on
//! the driver's threads and meet at a grid barrier between groups.
//!
//! # Why
//! lavapipe runs each dispatch by handing its workgroups to its worker
//! threads and waiting for them; in a virtual machine whose idle vCPUs halt,
//! that costs 40-85 us a group, and a one-member decode iteration of
//! SmolLM2-135M is 154 groups: more time than its arithmetic. Inside one
//! dispatch of as many workgroups as the driver has threads, each group's
//! work is spread over the workgroups and a grid barrier (an atomic counter
//! the workgroups poll) costs about a microsecond.
//!
//! # What it owns
//! - [`ChainStep`]: one dispatch group as a record of the chain's program in
//!   the metadata buffer (`CHAIN_STEP_WORDS` words: kind, the dispatched
//!   form's grid, the group's push constants with x's and the norm vector's
//!   offsets relative to the chain's one placement of each uniform window),
//!   made by [`ChainStep::product`],
//!   [`ChainStep::product_rkv`] and [`ChainStep::attention`] (f32
//!   activations), [`ChainStep::attention_split`], and
//!   [`ChainStep::product8`], [`ChainStep::product8_rkv`] and
//!   [`ChainStep::attention_q81`] (int8 activations, the packed pairs) for
//!   exactly the dispatches the plan would record (`None` otherwise: that
//!   group stays a dispatch).
//! - [`Chain`]: the chain dispatch's push constants, grid, entry point (one
//!   a tile: `chain_r1`, `chain_r2`, `chain_r4`) and window placements.
//! - [`workgroups`]: how many workgroups a chain may have (the driver's
//!   threads), and [`probe`]: whether the device runs them at once.
//!
//! # Invariants
//! - A chained group computes the same bits as the dispatched one: the same
//!   code, parameters and per-workgroup work; only which thread runs which
//!   workgroup, and how the groups are separated, differ
//!   (`crates/model/tests/vk_chain.rs` compares whole iterations bit for
//!   bit).
//! - The chain's workgroups are no more than the device runs at once, or the
//!   first grid barrier waits for a workgroup that never starts. The shader
//!   gives up after [`Chain::spin_rounds`] rounds of polls and raises the abort
//!   flag; [`probe`] runs a chain of empty groups before the model uses one,
//!   and a model whose chain aborts reruns the iteration as dispatches
//!   ([`crate::vulkan::llama::GpuLlama`]).
//! - The counter and abort flag (two words of the tokens buffer, binding 4,
//!   per chain) are zeroed by a fill before each chain dispatch.

use bytemuck::{Pod, Zeroable};
use xtc_vk::kernels::{CHAIN_ENTRIES, CHAIN_KINDS, CHAIN_STEP_WORDS};
use xtc_vk::{
    Buffer, CommandPool, Device, DeviceKind, Kernels, VkError, VkResult, WINDOWS, Window,
};

use super::ops::{Attention, AttentionImage, AttentionImageQ81, Op, Variant};
use super::qops::{QMatmul, QMatmulRopeKv};
use super::qops8::{QMatmul8, QMatmul8RopeKv, QOUT_BIT, q81_len};

/// The chain's entry point for one-row iterations (and the probe's); tiles 2
/// and 4 (iterations of 2 and 3-4 rows) have `chain_r2` and `chain_r4`
/// ([`entry`]).
pub const KERNEL: &str = "chain_r1";

/// The f32 family of entry points (`chain_r<T>`: the image attention, the
/// f32 products, the split attention).
pub const F32: u32 = 0;
/// The int8 family (`chain8_r<T>`: the packed pairs, the int8 attention).
pub const INT8: u32 = 1;

/// The chain entry point of `family` ([`F32`] or [`INT8`]) for `tile` token
/// rows per invocation (1, 2 or 4), or `None`.
pub fn entry(family: u32, tile: u32) -> Option<&'static str> {
    let prefix = match family {
        F32 => "chain",
        INT8 => "chain8",
        _ => return None,
    };
    let name = format!("{prefix}_r{tile}");
    CHAIN_ENTRIES.iter().copied().find(|e| *e == name)
}

/// The family whose entry points run chain kind `kind`
/// (`xtc_vk::kernels::CHAIN_KINDS`): [`INT8`] for the int8 products and
/// attention, else [`F32`].
pub fn family_of(kind: u32) -> u32 {
    match CHAIN_KINDS.get(kind as usize) {
        Some(k) if k.starts_with("qmm8_") || *k == "attention_img_q81" => INT8,
        _ => F32,
    }
}

/// llvmpipe's loop budget: the loops of one workgroup's invocation of a
/// kernel go round at most 65535 times IN ALL (one counter for the whole
/// inlined shader, decremented at every loop's back edge; past it every loop
/// ends after its current turn, silently). A chain runs many groups' loops in
/// one invocation, so the host sizes each chain to fit: the steps' loops
/// ([`ChainStep::cost`], an upper bound) at most [`WORK_BUDGET`], and what is
/// left, less a margin, goes to the grid barriers' polling rounds
/// ([`Chain::spin_rounds`]).
pub const LOOP_BUDGET: u32 = 65_535;

/// The most loop turns a chain's steps may take ([`ChainStep::cost`] summed
/// with one turn a step for the chain's own loop); a run that would take
/// more is split into chains.
pub const WORK_BUDGET: u32 = 40_000;

/// Loop turns kept back from the polling rounds (the chain's own loops
/// outside the steps).
const MARGIN: u32 = 256;

/// Loop turns a step costs in the kinds it is not (llvmpipe runs each kind's
/// loop once with every lane masked off: a turn of it and of each loop
/// inside: at most 8 for the f32 and split attentions, 10 for the int8 one,
/// 2 + tile for a product (its blocks' loop and `partial`'s, one a row);
/// in the f32 family's other kinds 31 at most, in the int8 family's 22; 40
/// leaves a margin).
const NOT_TAKEN: u32 = 40;

/// Polls a round (`build/chain_gen.rs`'s `POLLS`, as the build exports it).
pub const POLLS_A_ROUND: u32 = xtc_vk::kernels::CHAIN_POLLS;

/// The most chains an iteration records (each needs its own two words of
/// the tokens buffer); runs past these stay dispatches.
pub const MAX_CHAINS: u32 = 64;

/// Steps of [`probe`]'s chain (its program takes `PROBE_STEPS *
/// CHAIN_STEP_WORDS` metadata words).
pub const PROBE_STEPS: u32 = 64;

/// Workgroups of the chain's dispatched forms: 8 invocations (the CPU
/// form's), so a step's workgroup `w` is invocations `8w .. 8w + 7`.
const WG: u32 = 8;

/// Push constants of `chain_r1` (its `Chain` struct) and its grid.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Chain {
    /// The first step's record in the metadata buffer (u32 words).
    pub prog_off: u32,
    /// Steps (dispatch groups) the chain runs, a grid barrier between each
    /// two.
    pub n_steps: u32,
    /// The counter (`sync_off`) and abort flag (`sync_off + 1`) in the
    /// tokens buffer (u32 words), zeroed before the dispatch.
    pub sync_off: u32,
    /// Rounds of [`POLLS_A_ROUND`] polls a workgroup may make at the
    /// chain's grid barriers in all before it gives up (what
    /// [`Chain::rounds_left`] leaves of [`LOOP_BUDGET`]).
    pub spin_rounds: u32,
    /// Workgroups of the dispatch (the shader reads `num_workgroups`).
    pub workgroups: u32,
    /// Token rows per invocation of its products: picks the entry point
    /// ([`entry`]).
    pub tile: u32,
    /// Byte offset of the weights window (the norm vectors' placement).
    pub w_at: u32,
    /// Byte offset of the activations window (x, att and h, or their
    /// blocks).
    pub x_at: u32,
    /// The entry point's family ([`F32`] or [`INT8`]): every step's kind is
    /// one of its kinds ([`family_of`]).
    pub family: u32,
}

impl Chain {
    /// The polling rounds left of [`LOOP_BUDGET`] to a chain whose steps
    /// cost `work` loop turns ([`ChainStep::cost`] plus one a step).
    pub fn rounds_left(work: u32) -> u32 {
        LOOP_BUDGET.saturating_sub(work).saturating_sub(MARGIN)
    }
}

impl Op for Chain {
    const KERNEL: &'static str = KERNEL;
    fn grid(&self) -> [u32; 3] {
        [self.workgroups.max(1), 1, 1]
    }
    fn dispatch(&self, _variant: Variant) -> (&'static str, [u32; 3]) {
        (
            entry(self.family, self.tile).unwrap_or(NO_ENTRY),
            self.grid(),
        )
    }
    /// One dispatch with the windows at `w_at` and `x_at` (the steps'
    /// offsets are relative to them); `None` where the recorder has no
    /// windows (then [`Op::dispatch`]'s form records the chain without
    /// them, which only a chain of attention steps may be).
    fn windowed(
        &self,
        _variant: Variant,
        _win: &[Window; WINDOWS as usize],
    ) -> Option<Vec<super::ops::Windowed<Self>>> {
        Some(vec![super::ops::Windowed {
            kernel: entry(self.family, self.tile).unwrap_or(NO_ENTRY),
            push: *self,
            grid: self.grid(),
            offsets: [u64::from(self.w_at), u64::from(self.x_at)],
        }])
    }
}

/// What [`Chain`] names for a tile without an entry point: no such kernel.
const NO_ENTRY: &str = "chain_has_no_entry_point_for_this_tile";

/// One dispatch group as a record of the chain's program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainStep {
    /// Index into `xtc_vk::kernels::CHAIN_KINDS` (0: the image attention).
    pub kind: u32,
    /// The dispatched form's grid (x, y); the attention's in workgroups of 8.
    pub grid: [u32; 2],
    /// Its push constants (u32 words, f32 bit patterns; zero padded).
    pub params: [u32; 20],
    /// Loop turns one invocation of the step takes, at most (for one of the
    /// step's workgroups; see [`cost`](Self::cost)).
    pub turns: u32,
    /// Token rows per invocation of a product (the chain entry point it
    /// needs); 0 for the attention, which any chain runs.
    pub tile: u32,
    /// The bytes of the activations a product reads through the x window
    /// (`[start, end)`), and of its norm vector in the weights buffer; its
    /// `x_off` / `norm_off` are relative to the window placements the chain
    /// picks ([`words`](Self::words)).
    pub x_bytes: Option<(u64, u64)>,
    /// As `x_bytes`, for the norm vector.
    pub norm_bytes: Option<(u64, u64)>,
    /// The parameter word that holds the norm vector's offset: `norm_off`
    /// for the f32 products, `y3_off` for the int8 ones (whose input
    /// blocks carry no norm; their quantized output's norm vector is read
    /// through the weights window).
    pub norm_word: usize,
}

/// [`QMatmul`]'s words: `x_off`, `y3_off` and `norm_off`.
const X_OFF_WORD: usize = 3;
const Y3_OFF_WORD: usize = 11;
const NORM_OFF_WORD: usize = 13;

impl ChainStep {
    /// The loop turns one chain workgroup of `workgroups` takes for this
    /// step, at most: its share of the step's workgroups (ceil of total /
    /// `workgroups`), each a turn of its kind's loop plus
    /// [`turns`](Self::turns), and the masked turns of the other kinds' loops.
    pub fn cost(&self, workgroups: u32) -> u32 {
        let total = self.grid[0].saturating_mul(self.grid[1]);
        total
            .div_ceil(workgroups.max(1))
            .saturating_mul(self.turns.saturating_add(1))
            .saturating_add(NOT_TAKEN)
    }

    /// The words of the record (`CHAIN_STEP_WORDS`) for windows placed at
    /// bytes `w_at` and `x_at` (a product's x and norm vector must lie in
    /// them: [`in_windows`](Self::in_windows)).
    pub fn words(&self, w_at: u64, x_at: u64) -> [u32; CHAIN_STEP_WORDS as usize] {
        let mut w = [0; CHAIN_STEP_WORDS as usize];
        w[0] = self.kind;
        w[1] = self.grid[0];
        w[2] = self.grid[1];
        w[4..24].copy_from_slice(&self.params);
        if let Some((start, _)) = self.x_bytes {
            w[4 + X_OFF_WORD] = ((start - x_at) / 4) as u32;
        }
        if let Some((start, _)) = self.norm_bytes {
            w[4 + self.norm_word] = ((start - w_at) / 4) as u32;
        }
        w
    }

    /// Whether this step's x and norm vector lie in the weights window `w`
    /// and the activations window `x` (each the bytes `[at, end)` it
    /// covers; `None`: anything fits).
    pub fn in_windows(&self, w: Option<(u64, u64)>, x: Option<(u64, u64)>) -> bool {
        let inside = |r: Option<(u64, u64)>, win: Option<(u64, u64)>| match (r, win) {
            (Some((s, e)), Some((at, end))) => s >= at && e <= end,
            _ => true,
        };
        inside(self.x_bytes, x) && inside(self.norm_bytes, w)
    }

    fn of_chunk(
        kernel: &str,
        grid: [u32; 3],
        push: &QMatmul,
        offsets: [u64; WINDOWS as usize],
    ) -> Option<ChainStep> {
        // `qmm_<ty>_r<T>[_rkv]`: the kind is tile 1's name's position.
        let (tile, kind) = [1u32, 2, 4].into_iter().find_map(|t| {
            let suffix = format!("_r{t}");
            if !kernel.contains(&suffix) {
                return None;
            }
            let one = kernel.replacen(&suffix, "_r1", 1);
            CHAIN_KINDS
                .iter()
                .position(|k| *k == one)
                .map(|kind| (t, kind))
        })?;
        entry(family_of(kind as u32), tile)?;
        let mut params = [0u32; 20];
        let words: &[u32] = bytemuck::cast_slice(std::slice::from_ref(push));
        params[..words.len()].copy_from_slice(words);
        let x0 = offsets[1] + u64::from(push.x_off) * 4;
        // The int8 products (the packed pairs) read Q8_1 blocks, and the
        // norm vector of their quantized output (`q81_out`, `y3_off`) when
        // they make one; the f32 products read f32 rows and their own norm.
        let int8 = kernel.starts_with("qmm8_");
        let x_len = match int8 {
            true => u64::from(q81_len(push.m, push.k)) * 4,
            false => u64::from(push.m) * u64::from(push.k) * 4,
        };
        let x_bytes = Some((x0, x0 + x_len));
        let (norm_word, norm_off, norm_len) = match int8 {
            true if push.mode & QOUT_BIT != 0 => (Y3_OFF_WORD, push.y3_off, push.n),
            true => (Y3_OFF_WORD, super::qops::NO_NORM, 0),
            false => (NORM_OFF_WORD, push.norm_off, push.k),
        };
        let norm_bytes = (norm_off != super::qops::NO_NORM).then(|| {
            let n0 = offsets[0] + u64::from(norm_off) * 4;
            (n0, n0 + u64::from(norm_len) * 4)
        });
        // The products' one loop over K's blocks, and `partial`'s three.
        (grid[2] == 1).then_some(ChainStep {
            kind: kind as u32,
            grid: [grid[0], grid[1]],
            params,
            turns: push.k / 32 + 4,
            tile,
            x_bytes,
            norm_bytes,
            norm_word,
        })
    }

    /// `op` as [`Ops::run`](super::ops::Ops::run) records it on a CPU device
    /// with windows `win`, if that is one dispatch of a product the chain
    /// runs: its push constants, and the bytes of x and of the norm vector
    /// it reads through the windows ([`words`](Self::words) makes their
    /// offsets relative to the chain's placements).
    pub fn product(op: &QMatmul, win: &[Window; WINDOWS as usize]) -> Option<ChainStep> {
        let chunks = op.windowed(Variant::Cpu, win)?;
        let [c] = chunks.as_slice() else {
            return None;
        };
        ChainStep::of_chunk(c.kernel, c.grid, &c.push, c.offsets)
    }

    /// As [`product`](Self::product) for the q|k|v product with RoPE and the
    /// KV append in its stores.
    pub fn product_rkv(op: &QMatmulRopeKv, win: &[Window; WINDOWS as usize]) -> Option<ChainStep> {
        let chunks = op.windowed(Variant::Cpu, win)?;
        let [c] = chunks.as_slice() else {
            return None;
        };
        ChainStep::of_chunk(c.kernel, c.grid, &c.push.0, c.offsets)
    }

    /// As [`product`](Self::product) for a product against int8 activations
    /// (the packed pairs, `qmm8_q41_r<T>_swar` and its `_h` twin; the other
    /// int8 forms stay dispatched).
    pub fn product8(op: &QMatmul8, win: &[Window; WINDOWS as usize]) -> Option<ChainStep> {
        let chunks = op.windowed(Variant::Cpu, win)?;
        let [c] = chunks.as_slice() else {
            return None;
        };
        ChainStep::of_chunk(c.kernel, c.grid, &c.push.0, c.offsets)
    }

    /// As [`product8`](Self::product8) for the int8 q|k|v product with RoPE
    /// and the KV append in its stores (`qmm8_q41_r<T>_swar_rkv`).
    pub fn product8_rkv(
        op: &QMatmul8RopeKv,
        win: &[Window; WINDOWS as usize],
    ) -> Option<ChainStep> {
        let chunks = op.windowed(Variant::Cpu, win)?;
        let [c] = chunks.as_slice() else {
            return None;
        };
        ChainStep::of_chunk(c.kernel, c.grid, &c.push.0, c.offsets)
    }

    /// The attention over the KV image ([`AttentionImage`], kind 0, where it
    /// fits).
    pub fn attention(op: &Attention) -> Option<ChainStep> {
        if !AttentionImage(*op).fits() {
            return None;
        }
        let mut params = [0u32; 20];
        let words: &[u32] = bytemuck::cast_slice(std::slice::from_ref(op));
        params[..words.len()].copy_from_slice(words);
        let pairs = op.n_rows.checked_mul(op.n_heads)?;
        // `attend_img`: a loop over q's texels, then per position one over
        // K's and one over V's (16 turns at most each, left at head_size /
        // 4), then one over the output; `attention_img`'s store loop.
        let turns = (op.max_pos.checked_add(1)?)
            .checked_mul(33)?
            .checked_add(48)?;
        Some(ChainStep {
            kind: 0,
            grid: [pairs.div_ceil(WG).max(1), 1],
            params,
            turns,
            tile: 0,
            x_bytes: None,
            norm_bytes: None,
            norm_word: NORM_OFF_WORD,
        })
    }

    /// The attention over the KV image with its output also quantized for
    /// the int8 `o` product ([`AttentionImageQ81`], kind
    /// `attention_img_q81`, where it fits).
    pub fn attention_q81(op: &AttentionImageQ81) -> Option<ChainStep> {
        if !op.fits() {
            return None;
        }
        let mut step = ChainStep::attention(&op.att)?;
        step.kind = CHAIN_KINDS.iter().position(|k| *k == "attention_img_q81")? as u32;
        let words: &[u32] = bytemuck::cast_slice(std::slice::from_ref(op));
        step.params = [0; 20];
        step.params[..words.len()].copy_from_slice(words);
        // `attend_img`'s loops (the query's 16, 33 a position, the
        // output's 16), then the stores' loop (16), the two blocks' inverse
        // scales (2), the codes' loop (16) and the scales' stores (2).
        step.turns = (op.att.max_pos.checked_add(1)?)
            .checked_mul(33)?
            .checked_add(68)?;
        Some(step)
    }

    /// The attention over the KV image with each (row, head)'s positions
    /// split over the lanes ([`AttentionImageSplit`](super::ops::AttentionImageSplit), kind
    /// `attention_img_split`, where it fits): one chain workgroup turn a
    /// (row, head).
    pub fn attention_split(op: &Attention) -> Option<ChainStep> {
        let mut step = ChainStep::attention(op)?;
        step.kind = CHAIN_KINDS
            .iter()
            .position(|k| *k == "attention_img_split")? as u32;
        step.grid = [op.n_rows.checked_mul(op.n_heads)?.max(1), 1];
        // A lane's positions (every 8th), each a loop over K's texels and
        // one over V's, then the merge's loop over the output.
        step.turns = (op.max_pos / WG + 1).checked_mul(33)?.checked_add(40)?;
        Some(step)
    }
}

/// The workgroups a chain on `dev` may have: on a CPU device, the threads
/// lavapipe runs compute on (`LP_NUM_THREADS` where set, else the CPUs this
/// process may use; at least 1, at most 32); `None` on any other device,
/// which the chain is not for (a GPU runs the GPU form).
pub fn workgroups(dev: &Device) -> Option<u32> {
    if dev.info().kind != DeviceKind::Cpu {
        return None;
    }
    let threads = match std::env::var("LP_NUM_THREADS")
        .ok()
        .map(|v| v.trim().parse::<u32>())
    {
        Some(Ok(n)) => n,
        _ => std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
    };
    Some(threads.clamp(1, 32))
}

/// Runs a chain of `steps` empty groups with `workgroups` workgroups and
/// polls bounded by `spin_rounds`, through `kernels` and `set` (whose
/// metadata buffer `meta`, binding 3, and tokens buffer `tokens`, binding 4,
/// are written: metadata words from `prog_off`, tokens words `sync_off`,
/// `sync_off + 1`). `kv_image`: the set's KV image where it is still in
/// layout `UNDEFINED` (a model's before its first iteration): the probe's
/// command buffer moves it to `GENERAL` first (the chain's kernel uses its
/// binding), and the caller counts it initialised. Returns whether it
/// completed with every workgroup at every barrier (the counter at
/// `(steps - 1) * workgroups`, no abort).
///
/// # Errors
/// Device errors; `Inval` when the kernel is missing from `kernels`.
#[allow(clippy::too_many_arguments)]
pub fn probe(
    dev: &Device,
    kernels: &Kernels,
    set: &xtc_vk::BindingSet,
    meta: &mut Buffer,
    tokens: &Buffer,
    kv_image: Option<&xtc_vk::StorageImage>,
    prog_off: u32,
    sync_off: u32,
    workgroups: u32,
) -> VkResult<bool> {
    const STEPS: u32 = PROBE_STEPS;
    // 4096 rounds of 256 polls: milliseconds, plenty for workgroups that
    // run at once, and a quick answer where they do not.
    const PROBE_ROUNDS: u32 = 4096;
    // Kind past the table: the switch's default, no work.
    let empty = ChainStep {
        kind: u32::MAX,
        grid: [0, 1],
        params: [0; 20],
        turns: 0,
        tile: 1,
        x_bytes: None,
        norm_bytes: None,
        norm_word: NORM_OFF_WORD,
    };
    let words: Vec<u32> = (0..STEPS).flat_map(|_| empty.words(0, 0)).collect();
    meta.write(u64::from(prog_off) * 4, &words)?;
    let chain = Chain {
        prog_off,
        n_steps: STEPS,
        sync_off,
        spin_rounds: PROBE_ROUNDS.min(Chain::rounds_left(STEPS)),
        workgroups,
        tile: 1,
        w_at: 0,
        x_at: 0,
        family: F32,
    };
    let k = kernels.get(KERNEL)?;
    let mut pool = CommandPool::new(dev)?;
    let mut rec = pool.record(kernels, set)?;
    if let Some(img) = kv_image {
        rec.init_image(img);
    }
    rec.fill(tokens, u64::from(sync_off) * 4, 8, 0)?;
    rec.barrier();
    rec.dispatch_windowed(k, &chain, chain.grid(), [0, 0])?;
    rec.host_barrier();
    let cmd = rec.finish()?;
    if !pool.submit(vec![cmd])?.wait(None)? {
        return Err(VkError::Inval(
            "chain probe: the submission was lost".into(),
        ));
    }
    let mut sync = [0u32; 2];
    tokens.read(u64::from(sync_off) * 4, &mut sync)?;
    Ok(sync[1] == 0 && sync[0] == (STEPS - 1) * workgroups)
}
