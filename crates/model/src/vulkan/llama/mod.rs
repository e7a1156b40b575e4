//! [`GpuLlama`]: a GGUF llama model ([`Llama`]) on a Vulkan device with its
//! matrices quantized in device memory, run as ONE command buffer per
//! iteration for a whole ready vector ([`BatchPlan`]: decode rows and prefill
//! chunks of any number of sequences packed together), completing on a
//! fence fd ([`InFlight`], B-066), with the greedy next token of each
//! sampling sequence chosen on the device (only token ids come back, unless
//! [`GpuLlamaOptions::keep_logits`] asks for the logits too; sampling with a
//! temperature stays on the host over those logits, see `docs/arch/vk.md`).
//!
//! # Device memory
//! - The texel stream ([`TexelStream`](crate::vulkan::qweights::TexelStream)): every layer's `q|k|v` and
//!   `gate|up` stacked (one dispatch each) plus `attn_output`, `ffn_down`,
//!   and the token embedding table, which is also the LM head when the model
//!   ties them. Q4_1 blocks stay 20 bytes per 32 weights, Q8_0 34 bytes:
//!   SmolLM2-135M-Instruct takes about 96 MB. On CPU devices
//!   ([`Variant::Cpu`]) it is the weight image (kernel ABI binding 8), on GPUs
//!   the start of the weights buffer.
//! - The weights buffer (f32): the RMSNorm vectors and the RoPE table
//!   ([`rope_table`](crate::vulkan::qops::rope_table): `[max_context][head_size / 2][cos, sin]`).
//! - Activations, metadata, tokens: as [`crate::vulkan::f32_model::GpuModel`]
//!   (`x, xb, q, att [T, dim]`, `k, v [T, kv_dim]`, `h1, h3 [T, hidden]`,
//!   `sel [S, dim]`, `logits [S, vocab]`).
//! - The KV cache: the storage image in the [`KvImage`](crate::vulkan::ops::KvImage) layout on CPU
//!   devices, else a buffer `[2 * n_layers][n_blocks][block_size][kv_dim]`.
//!
//! # One iteration
//! `qembed | per layer: qmm(rmsnorm(x) . q|k|v), rope_kv (RoPE on q and k, k
//! and v into the KV cache), attention, qmm(o, += x), qmm(rmsnorm(x) .
//! gate|up interleaved, SwiGLU) -> h, qmm(down . h, += x) | rmsnorm of the
//! sampled rows | qmm(LM head, argmax partials) | argmax_part`: six dispatches a layer, a barrier
//! between dependent ones (lavapipe pays for each dispatch, see
//! `docs/arch/vk.md`). The CPU-device products split into one dispatch per
//! window of activation rows (64 KiB: 28 rows at K = 576, 10 at K = 1536).
//! On a CPU device an f32 iteration of at most 4 rows runs its layers as a
//! few persistent chains ([`chain`]: a run of dispatch groups as one
//! dispatch with grid barriers; [`GpuLlama::set_chain`]), its activations
//! laid out so one window placement serves a chain.
//!
//! With int8 activations ([`Activations`]) each product input is quantized
//! to Q8_1 blocks before its products read them: by a `quant_q81` dispatch
//! group, or, where the op that makes the input can (the fused quantizers,
//! [`GpuLlama::set_fuse_quantizers`]), by that op itself: the residual adds
//! quantize the new x for the next products' norm
//! ([`QMatmul8::with_quantized_out`]), the attention over the KV image its
//! output ([`AttentionImageQ81`]) and the GLU products h as half blocks
//! ([`QMatmul8::with_half_blocks_out`], [`GpuLlama::set_half_blocks`]); with
//! the int8 q|k|v product fused with RoPE and the KV append
//! ([`QMatmul8RopeKv`]) an int8 iteration on lavapipe is 156 dispatch
//! groups (2 quantizers) against the f32 path's 154.

use std::os::fd::BorrowedFd;

mod build;
mod options;

use build::{LayerW, Proj};
pub use options::{GpuLlamaError, GpuLlamaOptions};

use crate::cpu::llama::Llama;
use crate::vulkan::{ActOffsets, InFlight};

use crate::vulkan::act_probe;
use crate::vulkan::chain::{self, Chain, ChainStep};
use crate::vulkan::ops::{
    Attention, AttentionImage, AttentionImageQ81, AttentionImageSplit, Ops, RmsNorm, Rope, SwiGlu,
    Variant, pack_metadata,
};
use crate::vulkan::qops::{
    ArgmaxPart, NO_NORM, QEmbed, QMatmul, QMatmulRopeKv, RopeKv, RopeTable, argmax_groups,
};
use crate::vulkan::qops8::{Activations, DotForm, QMatmul8, QMatmul8RopeKv, QuantizeQ81, q81_len};
use crate::vulkan::qweights::{KernelType, QTensor};
use crate::{BatchPlan, Config};
use xtc::{Error, Result};
use xtc_vk::{
    BindingSet, Buffer, CommandPool, Device, Kernels, Recorder, StorageImage, Timestamps, VkResult,
};

/// Device time of each group of dispatches of one iteration, in order:
/// Aborted persistent chains after which a model leaves the chain off
/// ([`GpuLlama::set_chain`]).
pub const MAX_CHAIN_ABORTS: u32 = 3;

/// `(label, nanoseconds)` ([`GpuLlama::profile`]).
pub type GroupTimes = Vec<(&'static str, f64)>;

/// The model on one device with its own command pool (one per loop). One
/// iteration in flight at a time.
pub struct GpuLlama {
    // Field order is drop order: the pool and set go before what they use.
    pool: CommandPool,
    set: BindingSet,
    wbuf: Buffer,
    wimg: Option<StorageImage>,
    act: Buffer,
    kv: Buffer,
    kv_image: Option<(StorageImage, bool)>,
    meta: Buffer,
    tokens: Buffer,
    logits: Option<Buffer>,
    ops: Ops,
    kernels: Kernels,
    dev: Device,
    shape: Config,
    rms_eps: f32,
    opts: GpuLlamaOptions,
    layers: Vec<LayerW>,
    embed: QTensor,
    head: QTensor,
    out_norm: u32,
    rope_tab: u32,
    a: ActOffsets,
    /// The LM head's argmax partials `[max_seqs][groups][2]` (after `a.len`).
    part_off: u32,
    /// The int8 products' dot form and the quantized activations' offsets.
    act8: Option<Act8>,
    kv_layer: u32,
    weight_bytes: u64,
    scratch: Vec<u32>,
    iteration: u64,
    /// Record the q|k|v product and RoPE + KV append as one op where it
    /// applies ([`QMatmulRopeKv`]); on by default.
    fuse_rope_kv: bool,
    /// With `act8`: the token rows an iteration needs for its products to
    /// take int8 activations; smaller iterations run the f32 products.
    int8_min_rows: u32,
    /// With `act8`: the residual-add products quantize the new x for the
    /// next products where they apply ([`QMatmul8::with_quantized_out`]);
    /// on by default.
    fuse_quant: bool,
    /// With `fuse_quant`: the GLU products leave h as half blocks for the
    /// `down` products; on by default.
    half_blocks: bool,
    /// The persistent chain's workgroups where this device runs it (a CPU
    /// device whose [`chain::probe`] passed), else `None`.
    chain_workgroups: Option<u32>,
    /// Record runs of dispatch groups as persistent chains where
    /// `chain_workgroups` allows ([`GpuLlama::set_chain`]); on by default.
    chain_on: bool,
    /// Split the image attention's positions over the lanes where its cost
    /// model says it pays ([`GpuLlama::set_split_attention`]); on by default.
    split_attention: bool,
    /// With `act8` in the packed pairs' form: iterations the persistent
    /// chain holds take the int8 products whatever `int8_min_rows` says
    /// ([`GpuLlama::set_int8_chain`]).
    int8_chain: bool,
    /// The threads lavapipe computes on ([`chain::workgroups`]) on a CPU
    /// device, else `None`.
    cpu_threads: Option<u32>,
    /// The plan of the iteration in flight and its chains' count, where it
    /// runs any: rerun as dispatches if a chain aborted.
    chained: Option<(BatchPlan, u32)>,
    /// Iterations whose chains all completed, and chains that aborted.
    chain_stats: (u64, u32),
}

/// Where an int8 iteration's products find their quantized inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Act8 {
    /// How the products compute their dot products.
    form: DotForm,
    /// Blocks of the inputs that are not the residual stream (the attention
    /// output, the gated FFN activations, the sampled rows' norm).
    xq: u32,
    /// Blocks of the residual stream x (of `x * g` for the next products'
    /// norm vector g).
    xq_x: u32,
}

impl std::fmt::Debug for GpuLlama {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuLlama")
            .field("shape", &self.shape)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl GpuLlama {
    /// Uploads `model` to `dev` (its matrices in their block formats, see the
    /// module documentation) and allocates a KV cache and buffers for `opts`.
    ///
    /// # Errors
    /// [`GpuLlamaError::Options`] for zero sizes or a `max_context` above the
    /// model's context length (or, on CPU devices, the attention kernel's
    /// loop budget); [`GpuLlamaError::Repack`] for a matrix whose rows are not
    /// a multiple of 4; [`GpuLlamaError::StorageRange`] for a buffer above
    /// `maxStorageBufferRange`; [`GpuLlamaError::Range`] when offsets overflow 32
    /// bits; [`GpuLlamaError::Vk`] for device errors (out of memory, limits).
    pub fn new(
        dev: &Device,
        model: &Llama,
        opts: GpuLlamaOptions,
    ) -> std::result::Result<GpuLlama, GpuLlamaError> {
        let acts = Activations::from_env().map_err(|e| GpuLlamaError::Options {
            option: "activations",
            why: e.to_string(),
        })?;
        GpuLlama::with_activations(dev, model, opts, acts)
    }

    /// As [`new`](Self::new), with the products' activations given instead
    /// of read from `XTC_ACTIVATIONS` ([`Activations::from_env`]).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_activations(
        dev: &Device,
        model: &Llama,
        opts: GpuLlamaOptions,
        acts: Activations,
    ) -> std::result::Result<GpuLlama, GpuLlamaError> {
        let lc = *model.config();
        let (shape, variant) = build::validate(dev, &lc, &opts)?;
        let form = acts.resolve(dev, variant)?.dot_form(dev);
        let kernels = match form {
            Some(_) => Kernels::with_int8(dev)?,
            None => Kernels::new(dev)?,
        };
        let ops = Ops::new(&kernels, variant)?;
        let mut w = build::repack(model, &shape, &opts)?;
        let up = build::upload(dev, variant, &mut w)?;
        let b = build::allocate(dev, &shape, &opts, variant, form.is_some())?;
        let set = build::bind(dev, &kernels, &up, &b)?;
        let mut meta = b.meta;
        let mut kv_image = b.kv_image;
        // The chain's kernel uses the KV image's binding: only with the image.
        let chain_workgroups = match (variant, chain::workgroups(dev)) {
            (Variant::Cpu, Some(n)) if kv_image.is_some() && kernels.get(chain::KERNEL).is_ok() => {
                // Up to three tries: a probe on a machine busy with other
                // work can miss its bound without anything being wrong.
                let sync_off = opts.max_seqs as u32;
                let mut ok = false;
                for _ in 0..3 {
                    // The first probe moves the KV image to GENERAL (the
                    // chain's kernel uses its binding).
                    let init = match &mut kv_image {
                        Some((img, ready @ false)) => {
                            *ready = true;
                            Some(&*img)
                        }
                        _ => None,
                    };
                    ok = chain::probe(
                        dev, &kernels, &set, &mut meta, &b.tokens, init, 0, sync_off, n,
                    )?;
                    if ok {
                        break;
                    }
                }
                ok.then_some(n)
            }
            _ => None,
        };
        Ok(GpuLlama {
            pool: CommandPool::new(dev)?,
            set,
            wbuf: up.wbuf,
            wimg: up.wimg,
            act: b.act,
            kv: b.kv,
            kv_image,
            meta,
            tokens: b.tokens,
            logits: b.logits,
            ops,
            kernels,
            dev: dev.clone(),
            shape,
            rms_eps: lc.rms_eps,
            opts,
            layers: w.layers,
            embed: w.embed,
            head: w.head,
            out_norm: w.out_norm,
            rope_tab: w.rope_tab,
            a: b.a,
            part_off: b.part_off,
            act8: form
                .zip(b.xq_off)
                .map(|(form, (xq, xq_x))| Act8 { form, xq, xq_x }),
            kv_layer: b.kv_layer,
            weight_bytes: up.weight_bytes,
            scratch: Vec::with_capacity(b.meta_len),
            iteration: 0,
            fuse_rope_kv: true,
            int8_min_rows: match acts {
                Activations::Auto => act_probe::ROWS,
                _ => 1,
            },
            fuse_quant: true,
            half_blocks: true,
            chain_workgroups,
            chain_on: std::env::var("XTC_CHAIN").map_or(true, |v| v != "0"),
            split_attention: std::env::var("XTC_SPLIT_ATTENTION").map_or(true, |v| v != "0"),
            int8_chain: std::env::var("XTC_INT8_CHAIN").map_or(true, |v| v != "0"),
            cpu_threads: chain::workgroups(dev),
            chained: None,
            chain_stats: (0, 0),
        })
    }

    /// Turns the persistent chain on (the default; `XTC_CHAIN=0` in the
    /// environment makes it off) or off. On a CPU device that runs it
    /// ([`chain_workgroups`](Self::chain_workgroups)), each run of two or
    /// more dispatch groups the chain can hold (the f32 products of an
    /// iteration of at most 4 rows, with or without RoPE and the KV append
    /// fused, and the attention over the KV image) is recorded as ONE
    /// dispatch whose workgroups meet at a grid barrier between the groups
    /// ([`chain`]), as long as its loop turns fit llvmpipe's budget: a
    /// one-member iteration of SmolLM2-135M is 7 dispatch groups (three
    /// chains on two threads) instead of 154, with the same results bit for
    /// bit. Off: every group its own dispatch.
    pub fn set_chain(&mut self, on: bool) {
        self.chain_on = on;
    }

    /// Turns the split attention on (the default; `XTC_SPLIT_ATTENTION=0`
    /// in the environment makes it off) or off. On, an iteration whose
    /// attention over the KV image the split form runs faster by its cost
    /// model ([`AttentionImageSplit::pays`]: few (row, head) pairs for the
    /// device's threads, enough cached positions) in the CPU form runs
    /// `attention_img_split` (dispatched, or as the chain's split kind):
    /// each (row, head) a workgroup of 8 lanes that share its positions and
    /// merge their softmaxes, instead of `attention_img`'s one invocation a
    /// (row, head), which leaves one thread looping over every position of
    /// every head at one row. The logits differ from the unsplit form's in
    /// the last bits (another summation order). Off: `attention_img`.
    pub fn set_split_attention(&mut self, on: bool) {
        self.split_attention = on;
    }

    /// Turns the int8 chain on (the default; `XTC_INT8_CHAIN=0` in the
    /// environment makes it off) or off. It matters only where the model
    /// has int8 activations in the packed pairs' form (lavapipe with
    /// `XTC_ACTIVATIONS=auto` when the probe took int8, or `int8`) and
    /// the persistent chain runs (the CPU kernel form with the KV image, and
    /// a model whose layer products are stacked Q4_1 tensors): on, an
    /// iteration of at most 4 rows takes the int8 products whatever
    /// [`int8_min_rows`](Self::int8_min_rows) says, and the chain holds them (the packed pairs, the int8 q|k|v
    /// product with RoPE and the KV append, the attention that quantizes
    /// its output: `qmm8_q41_r<T>_swar*` and `attention_img_q81` as chain
    /// kinds), so such an iteration is as few dispatch groups as an f32
    /// one, with the int8 products' smaller arithmetic. Its logits are the
    /// int8 path's (within the int8 accuracy bounds of the f32 ones, not
    /// the same bits); the dispatched rerun of an aborted chain runs the
    /// same int8 plan, and so does the iteration with the chain turned off
    /// ([`set_chain`](Self::set_chain)), left off after
    /// [`MAX_CHAIN_ABORTS`] aborts or missing after a failed probe: the
    /// plan follows the device's kind (a CPU device) and the iteration's
    /// rows, never a timing, so its bits do not depend on the machine's
    /// load. Off: `int8_min_rows` alone decides.
    pub fn set_int8_chain(&mut self, on: bool) {
        self.int8_chain = on;
    }

    /// Whether the int8 chain can hold this model's small iterations: int8
    /// activations in the packed pairs' form, the CPU kernel form with the
    /// KV image (the chain's attention), and every layer's products one
    /// stacked Q4_1 tensor (the chain's int8 kinds are the packed pairs; a
    /// Q8_0 product would stay dispatched, slower than the f32 chain).
    fn int8_chainable(&self) -> bool {
        let q41 = |t: &QTensor| t.ty == KernelType::Q41;
        let stacked_q41 = |p: &Proj| matches!(p, Proj::Stacked(t) if q41(t));
        self.act8
            .is_some_and(|a8| matches!(a8.form, DotForm::Swar { .. }))
            && self.ops.variant() == Variant::Cpu
            && self.kv_image.is_some()
            && self
                .layers
                .iter()
                .all(|l| stacked_q41(&l.qkv) && q41(&l.wo) && stacked_q41(&l.w13) && q41(&l.w2))
    }

    /// Makes the persistent chain `workgroups` wide without the probe (for
    /// tests: a chain wider than the device runs at once aborts, and the
    /// iteration reruns as dispatches).
    #[doc(hidden)]
    pub fn force_chain_workgroups(&mut self, workgroups: u32) {
        self.chain_workgroups = Some(workgroups.max(1));
    }

    /// The persistent chain's workgroups on this device, or `None` where it
    /// does not run one (not a CPU device, or [`chain::probe`] failed).
    pub fn chain_workgroups(&self) -> Option<u32> {
        self.chain_workgroups
    }

    /// The model's shape (`seq_len` is [`GpuLlamaOptions::max_context`]).
    pub fn config(&self) -> &Config {
        &self.shape
    }

    /// The options it was made with.
    pub fn options(&self) -> &GpuLlamaOptions {
        &self.opts
    }

    /// Turns the fused q|k|v product with RoPE and the KV append
    /// ([`QMatmulRopeKv`], one dispatch group per layer fewer) on (the
    /// default) or off (the product, a barrier, then `rope_kv_img`: the
    /// same results bit for bit; for benches and cross-checks). It applies
    /// in the CPU form with the KV image, f32 activations and stacked q|k|v
    /// weights in Q4_1 or Q8_0; elsewhere the two ops run apart anyway.
    pub fn set_fuse_rope_kv(&mut self, on: bool) {
        self.fuse_rope_kv = on;
    }

    /// Turns the quantized outputs of int8 iterations on (the default) or
    /// off: the `o` and `down` products (residual adds) also write the new
    /// x as the next products' Q8_1 blocks
    /// ([`QMatmul8::with_quantized_out`]), so two of a layer's four
    /// `quant_q81` dispatch groups go. Off: every input quantized by its own
    /// `quant_q81` (the same blocks bit for bit; for benches and
    /// cross-checks). It applies in the CPU form; elsewhere every input has
    /// its quantizer anyway.
    pub fn set_fuse_quantizers(&mut self, on: bool) {
        self.fuse_quant = on;
    }

    /// With the fused quantizers on, turns the GLU products' half blocks on
    /// (the default) or off: the GLU product also leaves h as half blocks
    /// (each 16 values with their own scale:
    /// [`QMatmul8::with_half_blocks_out`]) and the `down` product reads them
    /// ([`QMatmul8::with_half_blocks`]), so the quantizer of h goes too.
    /// Finer scales than `quant_q81`'s blocks, so not the same bits (the
    /// int8 path's accuracy checks in `crates/model/tests/vk_llama_int8.rs`
    /// cover it); off, every other fused quantizer still gives the same bits
    /// as the quantizers apart.
    pub fn set_half_blocks(&mut self, on: bool) {
        self.half_blocks = on;
    }

    /// Sets the token rows an iteration needs for its products to take int8
    /// activations (where the model has them, [`int8_dot`](Self::int8_dot));
    /// an iteration of fewer rows runs the f32 products (the same ops, and
    /// so the same results bit for bit, as a model built with
    /// [`Activations::F32`]), without the quantizers' dispatch groups.
    /// `rows` 0 or 1: every iteration. The default is 1 for
    /// [`Activations::Int8`] and [`Activations::Int8Poly`], and for
    /// [`Activations::Auto`] the probe's [`act_probe::ROWS`]: the probe
    /// chose int8 by its speed at that many rows; at one row on lavapipe
    /// (`docs/arch/vk.md`) the quantizers' 151 more dispatch groups an
    /// iteration (305 against 154) cost far more than int8 gains: one
    /// stream decoded at 36.9 tokens/s with int8 against 49.0 with f32.
    pub fn set_int8_min_rows(&mut self, rows: u32) {
        self.int8_min_rows = rows.max(1);
    }

    /// The token rows an iteration needs for int8 activations
    /// ([`set_int8_min_rows`](Self::set_int8_min_rows)).
    pub fn int8_min_rows(&self) -> u32 {
        self.int8_min_rows
    }

    /// How the int8 products compute their dot products, or `None` where
    /// the products take f32 activations (`XTC_ACTIVATIONS` unset, `f32`,
    /// or `auto` resolved to f32).
    pub fn int8_dot(&self) -> Option<DotForm> {
        self.act8.map(|a| a.form)
    }

    /// The kernel forms in use.
    pub fn variant(&self) -> Variant {
        self.ops.variant()
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Bytes of device memory: `(quantized matrices, f32 weights (norms and
    /// RoPE table), KV cache)`.
    pub fn memory_bytes(&self) -> (u64, u64, u64) {
        let kv = match &self.kv_image {
            Some((img, _)) => img.texels() * 16,
            None => self.kv.size(),
        };
        let f32s = match &self.wimg {
            Some(_) => self.wbuf.size(),
            None => self.wbuf.size() - self.weight_bytes,
        };
        (self.weight_bytes, f32s, kv)
    }

    /// Records ONE command buffer for the whole `plan` (all layers, all token
    /// rows of all sequences), submits it, and returns the iteration in flight.
    /// Waits first for the previous iteration's command buffer.
    ///
    /// # Errors
    /// `Inval` for a plan that fails [`BatchPlan::validate`] (positions at
    /// most `max_context`, block ids below `n_blocks`) or has no token,
    /// `Range` for more tokens or sequences than the options allow,
    /// `Internal`/`Nomem` for device failures. Nothing is submitted on error.
    pub fn submit(&mut self, plan: &BatchPlan) -> Result<InFlight> {
        self.submit_with(plan, false).map(|(f, _)| f)
    }

    /// Runs `plan` as [`step`](Self::step) does, with a timestamp after each
    /// group of dispatches; returns the tokens and the device time of each
    /// group in order (`(label, nanoseconds)`: `qembed`, then per layer
    /// `rmsnorm`, `qmm q|k|v`, ..., then the LM head and `argmax`). For
    /// benches: it advances the sequences like any iteration.
    ///
    /// # Errors
    /// As [`step`](Self::step); `Inval` on a device without compute
    /// timestamps.
    pub fn profile(&mut self, plan: &BatchPlan) -> Result<(Vec<u32>, GroupTimes)> {
        let (f, ts) = self.submit_with(plan, true)?;
        let toks = self.finish(f)?;
        let (ts, labels) = ts.ok_or(Error::Internal)?;
        let ns = ts.read_ns(labels.len() as u32 + 1)?;
        let times = labels
            .iter()
            .zip(ns.windows(2))
            .map(|(l, w)| (*l, w[1] - w[0]))
            .collect();
        Ok((toks, times))
    }

    fn submit_with(&mut self, plan: &BatchPlan, timed: bool) -> Result<(InFlight, Option<Timed>)> {
        plan.validate(&self.shape, self.opts.kv)?;
        let n_rows = plan.n_tokens();
        if n_rows == 0 {
            return Err(Error::Inval);
        }
        if n_rows > self.opts.max_tokens || plan.seqs.len() > self.opts.max_seqs {
            return Err(Error::Range);
        }
        self.pool.reset()?;
        let sample_list = pack_metadata(plan, self.opts.kv.block_size, &mut self.scratch);
        let n_samples = plan.n_samples();
        let max_pos = plan
            .seqs
            .iter()
            .map(|s| s.start_pos + s.tokens.len() - 1)
            .max()
            .unwrap_or(0) as u32;
        let chain = self
            .chain_workgroups
            .filter(|_| self.chain_on && self.ops.windows_on());
        // int8 from `int8_min_rows` rows, or in an iteration of at most 4
        // rows on a CPU device where the int8 chain is on; then the blocks
        // of x follow the first rows' of the other inputs, so one window
        // placement covers both. By the iteration's shape and the device's
        // kind, not by whether the chain is on, passed its probe or ran:
        // chained, its dispatched rerun and the chain off, the same plan
        // and bits.
        let small = self.cpu_threads.is_some() && self.ops.windows_on() && n_rows <= 4;
        let widest = self.shape.dim.max(self.shape.hidden_dim) as u32;
        let int8_chain = small && self.int8_chain && self.int8_chainable();
        let act8 = self.act8.and_then(|a8| {
            if int8_chain {
                Some(Act8 {
                    xq_x: a8.xq + q81_len(n_rows as u32, widest),
                    ..a8
                })
            } else {
                (n_rows as u32 >= self.int8_min_rows).then_some(a8)
            }
        });
        // An iteration the chain may hold (f32 products of at most 4 rows)
        // lays its activations out so x, att and h fit one window.
        let a = match (chain, act8) {
            (Some(_), None) if n_rows <= 4 => {
                ActOffsets::compact(&self.shape, n_rows, n_samples).unwrap_or(self.a)
            }
            _ => self.a,
        };
        let rec_ctx = Recording {
            m: self,
            a,
            act8,
            head_f32: int8_chain,
            t: n_rows as u32,
            s: n_samples as u32,
            sample_list,
            max_pos,
        };
        let mut plan_rec = rec_ctx.plan();
        let mut n_chains = 0;
        if let Some(n) = chain {
            let sync_base = self.opts.max_seqs as u32;
            let win = self.set.windows();
            // The products' inputs: x, att and h (f32), or the int8
            // chain's blocks.
            let x_base = u64::from(match (int8_chain, act8) {
                (true, Some(a8)) => a8.xq,
                _ => a.x,
            }) * 4;
            (plan_rec, n_chains) = plan_rec.chained(&win, x_base, n, sync_base, &mut self.scratch);
        }
        if (self.scratch.len() * 4) as u64 > self.meta.size() {
            return Err(Error::Range);
        }
        self.meta.write(0, &self.scratch)?;
        self.chained = (n_chains > 0).then(|| (plan.clone(), n_chains));
        let ts = match timed {
            true => Some(Timestamps::new(&self.dev, plan_rec.groups() as u32 + 1)?),
            false => None,
        };
        let mut rec = self.pool.record(&self.kernels, &self.set)?;
        let init = match &self.kv_image {
            Some((img, false)) => {
                rec.init_image(img);
                true
            }
            _ => false,
        };
        let labels = plan_rec.record(&self.ops, &mut rec, ts.as_ref(), &self.tokens)?;
        if let Some(l) = &self.logits {
            let bytes = (n_samples * self.shape.vocab_size * 4) as u64;
            if bytes > 0 {
                rec.copy(&self.act, u64::from(a.logits) * 4, l, 0, bytes)?;
            }
        }
        rec.host_barrier();
        let cmd = rec.finish()?;
        let sub = self.pool.submit(vec![cmd])?;
        if init && let Some((_, ready)) = &mut self.kv_image {
            *ready = true;
        }
        self.iteration += 1;
        let timed = ts.map(|t| (t, labels));
        Ok((InFlight::new(sub, n_samples, self.iteration), timed))
    }

    /// Waits for `f` and returns the greedy next token of each sampling
    /// sequence of its plan, in plan order.
    ///
    /// # Errors
    /// `Inval` for an `InFlight` that is not this model's latest iteration,
    /// `Internal` for a lost device.
    pub fn finish(&mut self, f: InFlight) -> Result<Vec<u32>> {
        let toks = f.read_tokens(self.iteration, &self.tokens)?;
        match self.rerun_if_a_chain_aborted()? {
            Some(f) => self.finish(f),
            None => Ok(toks),
        }
    }

    /// After the iteration in flight completed: where it ran persistent
    /// chains and one of them aborted (a workgroup waited at a grid barrier
    /// longer than its polling bound: for a workgroup that never ran, or one
    /// whose thread the machine did not run for that long), says so on
    /// stderr and submits the same plan again as dispatches (every op of an
    /// iteration writes what it reads later, from the embedding on, and the
    /// KV cache rows again at the same positions, so the rerun is the
    /// iteration); after [`MAX_CHAIN_ABORTS`] aborts the chain stays off
    /// for this model. `None` when nothing aborted.
    fn rerun_if_a_chain_aborted(&mut self) -> Result<Option<InFlight>> {
        let Some((plan, n)) = self.chained.take() else {
            return Ok(None);
        };
        let mut sync = vec![0u32; 2 * n as usize];
        self.tokens.read(self.opts.max_seqs as u64 * 4, &mut sync)?;
        if sync.chunks(2).all(|w| w[1] == 0) {
            self.chain_stats.0 += 1;
            return Ok(None);
        }
        self.chain_stats.1 += 1;
        let off = self.chain_stats.1 >= MAX_CHAIN_ABORTS;
        eprintln!(
            "xtc: a persistent chain aborted at a grid barrier ({} workgroups, abort {} of at most {MAX_CHAIN_ABORTS}); \
             rerunning the iteration as dispatches{}",
            self.chain_workgroups.unwrap_or(0),
            self.chain_stats.1,
            if off {
                " and leaving the chain off"
            } else {
                ""
            }
        );
        if off {
            self.chain_workgroups = None;
        }
        let on = std::mem::replace(&mut self.chain_on, false);
        let rerun = self.submit(&plan);
        self.chain_on = on;
        Ok(Some(rerun?))
    }

    /// Iterations whose persistent chains all completed, and chains that
    /// aborted (their iterations rerun as dispatches), since the model was
    /// made.
    pub fn chain_stats(&self) -> (u64, u32) {
        self.chain_stats
    }

    /// As [`finish`](Self::finish), also returning each sampling sequence's
    /// logits (`[vocab_size]`, plan order).
    ///
    /// # Errors
    /// As [`finish`](Self::finish); `Inval` if `keep_logits` is off.
    pub fn finish_with_logits(&mut self, f: InFlight) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
        let vocab = self.shape.vocab_size;
        let out =
            f.read_tokens_and_logits(self.iteration, &self.tokens, self.logits.as_ref(), vocab)?;
        match self.rerun_if_a_chain_aborted()? {
            Some(f) => self.finish_with_logits(f),
            None => Ok(out),
        }
    }

    /// `finish(submit(plan))`.
    ///
    /// # Errors
    /// As [`submit`](Self::submit) and [`finish`](Self::finish).
    pub fn step(&mut self, plan: &BatchPlan) -> Result<Vec<u32>> {
        let f = self.submit(plan)?;
        self.finish(f)
    }

    /// The completion fd of an iteration in flight (as [`InFlight::fence_fd`]).
    pub fn fence_fd(f: &InFlight) -> BorrowedFd<'_> {
        f.fence_fd()
    }
}

/// The timestamps of a profiled iteration and the labels of its groups.
type Timed = (Timestamps, Vec<&'static str>);

/// One recording's inputs, copied out of the model so the command pool can
/// be borrowed mutably while recording.
struct Recording<'a> {
    m: &'a GpuLlama,
    /// The iteration's activation layout: the model's, or for an iteration
    /// a persistent chain may hold, [`ActOffsets::compact`].
    a: ActOffsets,
    /// The model's int8 activations, where this iteration has the rows for
    /// them ([`GpuLlama::set_int8_min_rows`]) or is one the int8 chain
    /// holds ([`GpuLlama::set_int8_chain`]).
    act8: Option<Act8>,
    /// The LM head runs the f32 product even with `act8` (an iteration the
    /// int8 chain holds: at a few rows the head's int8 form, `OpSDot` or
    /// its polyfill for Q8_0, and its quantizer's group cost more than
    /// they save).
    head_f32: bool,
    t: u32,
    s: u32,
    sample_list: u32,
    max_pos: u32,
}

/// The ops of one iteration, in order, with a barrier after each group.
pub(crate) struct PlanOps {
    steps: Vec<Step>,
}

enum Step {
    Embed(QEmbed),
    Norm(RmsNorm),
    Mm(QMatmul),
    /// Activations quantized for the [`Step::Mm8`] products after it.
    Quant(QuantizeQ81),
    Mm8(QMatmul8),
    /// The int8 q|k|v product with RoPE and the KV append in its stores.
    Mm8Rkv(QMatmul8RopeKv),
    /// The q|k|v product with RoPE and the KV append in its stores.
    MmRkv(QMatmulRopeKv),
    RopeKv(RopeKv),
    Attend(Attention, bool),
    /// The attention over the KV image, each (row, head)'s positions split
    /// over 8 lanes (iterations of few rows).
    AttendSplit(AttentionImageSplit),
    /// The attention over the KV image, its output also quantized for the
    /// int8 `o` product after it.
    AttendQ81(AttentionImageQ81),
    Glu(SwiGlu),
    Argmax(ArgmaxPart),
    /// A run of dispatch groups as one persistent chain ([`chain`]): its
    /// counter zeroed, then the chain dispatch.
    Chain(Chain),
    /// A barrier after the group of dispatches named by the label.
    Barrier(&'static str),
}

impl Recording<'_> {
    fn plan(&self) -> PlanOps {
        let m = self.m;
        let (c, a, t) = (&m.shape, &self.a, self.t);
        let (d, kvd, hs, h) = (
            c.dim as u32,
            c.kv_dim() as u32,
            c.head_size() as u32,
            c.hidden_dim as u32,
        );
        let img = m.kv_image.is_some();
        let mut p = vec![
            Step::Embed(QEmbed::new(&m.embed, t, 0, a.x)),
            Step::Barrier("qembed"),
        ];
        let norm = |w_off, out_off| RmsNorm {
            n_rows: t,
            dim: d,
            in_off: a.x,
            out_off,
            w_off,
            row_list: u32::MAX,
            eps: m.rms_eps,
            row_base: 0,
        };
        // With int8 activations: which inputs' blocks are already written.
        let mut x_blocks = Blocks::default();
        for (l, lw) in m.layers.iter().enumerate() {
            let next_norm = m.layers.get(l + 1).map(|n| n.attn_norm);
            let l = l as u32;
            let eps = m.rms_eps;
            let qkv = match &lw.qkv {
                Proj::Stacked(q) => vec![
                    QMatmul::split(q, t, a.x, [d, kvd, kvd], [a.q, a.k, a.v])
                        .with_norm(lw.attn_norm, eps),
                ],
                Proj::Parts(parts) => parts
                    .iter()
                    .zip([a.q, a.k, a.v])
                    .map(|(q, y)| QMatmul::plain(q, t, a.x, y, false).with_norm(lw.attn_norm, eps))
                    .collect(),
            };
            let (kc_off, vc_off) = match img {
                true => (l, c.n_layers as u32 + l),
                false => (l * m.kv_layer, (c.n_layers as u32 + l) * m.kv_layer),
            };
            let bs = m.opts.kv.block_size as u32;
            let rk = RopeKv {
                rope: RopeTable {
                    rope: Rope {
                        n_rows: t,
                        dim: d,
                        kv_dim: kvd,
                        head_size: hs,
                        rows_off: 0,
                        q_off: a.q,
                        k_off: a.k,
                    },
                    tab_off: m.rope_tab,
                },
                v_off: a.v,
                block_size: bs,
                kc_off,
                vc_off,
                image: u32::from(img),
            };
            match self.fused_rope_kv(&qkv, &rk) {
                Some(f) => {
                    p.push(Step::MmRkv(f));
                    p.push(Step::Barrier("qmm norm.q|k|v, rope_kv"));
                }
                None if self.products_rope_kv8(&mut p, &qkv, &rk, &mut x_blocks) => {}
                None => {
                    self.products(&mut p, &qkv, &mut x_blocks, Out::Stores);
                    p.push(Step::Barrier("qmm norm.q|k|v"));
                    p.push(Step::RopeKv(rk));
                    p.push(Step::Barrier("rope_kv"));
                }
            }
            let att = Attention {
                n_rows: t,
                n_heads: c.n_heads as u32,
                n_kv_heads: c.n_kv_heads as u32,
                head_size: hs,
                block_size: bs,
                rows_off: 0,
                q_off: a.q,
                out_off: a.att,
                kc_off,
                vc_off,
                kv_dim: kvd,
                dim: d,
                max_pos: self.max_pos,
            };
            let o = QMatmul::plain(&lw.wo, t, a.att, a.x, true);
            match self.attention_q81(att, img, &o) {
                Some(f) => {
                    p.push(Step::AttendQ81(f));
                    x_blocks.att = true;
                }
                None if img && self.split_pays(&att) => {
                    p.push(Step::AttendSplit(AttentionImageSplit(att)))
                }
                None => p.push(Step::Attend(att, img)),
            }
            p.push(Step::Barrier("attention"));
            self.products(&mut p, &[o], &mut x_blocks, Out::X(lw.ffn_norm));
            p.push(Step::Barrier("qmm o (+x)"));
            match &lw.w13 {
                Proj::Stacked(w) => {
                    let glu = QMatmul::glu(w, t, a.x, a.h1).with_norm(lw.ffn_norm, eps);
                    let down = QMatmul::plain(&lw.w2, t, a.h1, a.x, true);
                    let out = match self.reads_half_blocks(&down) {
                        true => Out::Half,
                        false => Out::Stores,
                    };
                    self.products(&mut p, &[glu], &mut x_blocks, out);
                    p.push(Step::Barrier("qmm norm.gate|up, swiglu"));
                }
                Proj::Parts(parts) => {
                    let up: Vec<QMatmul> = parts
                        .iter()
                        .zip([a.h1, a.h3])
                        .map(|(w, y)| {
                            QMatmul::plain(w, t, a.x, y, false).with_norm(lw.ffn_norm, eps)
                        })
                        .collect();
                    self.products(&mut p, &up, &mut x_blocks, Out::Stores);
                    p.push(Step::Barrier("qmm norm.gate|up"));
                    p.push(Step::Glu(SwiGlu {
                        n_rows: t,
                        hidden_dim: h,
                        h1_off: a.h1,
                        h3_off: a.h3,
                    }));
                    p.push(Step::Barrier("swiglu"));
                }
            }
            let down = QMatmul::plain(&lw.w2, t, a.h1, a.x, true);
            let out = next_norm.map_or(Out::Stores, Out::X);
            self.products(&mut p, &[down], &mut x_blocks, out);
            p.push(Step::Barrier("qmm down (+x)"));
        }
        if self.s > 0 {
            p.push(Step::Norm(RmsNorm {
                n_rows: self.s,
                row_list: self.sample_list,
                ..norm(m.out_norm, a.sel)
            }));
            p.push(Step::Barrier("rmsnorm (sampled rows)"));
            let v = c.vocab_size as u32;
            let head = QMatmul::logits_argmax(&m.head, self.s, a.sel, a.logits, m.part_off);
            match self.head_f32 {
                true => p.push(Step::Mm(head)),
                false => self.products(&mut p, &[head], &mut x_blocks, Out::Stores),
            }
            p.push(Step::Barrier("qmm LM head (+argmax partials)"));
            p.push(Step::Argmax(ArgmaxPart {
                n_rows: self.s,
                vocab: v,
                part_off: m.part_off,
                out_off: 0,
                groups: argmax_groups(v, m.ops.variant()),
            }));
            p.push(Step::Barrier("argmax_part"));
        }
        PlanOps { steps: p }
    }

    /// The q|k|v product `qkv` and `rk` as one op ([`QMatmulRopeKv`]) where
    /// the model fuses them (on, f32 activations, one stacked product) and
    /// the op applies and fits the uniform windows; else `None`.
    fn fused_rope_kv(&self, qkv: &[QMatmul], rk: &RopeKv) -> Option<QMatmulRopeKv> {
        let m = self.m;
        match qkv {
            [one] if m.fuse_rope_kv && self.act8.is_none() => QMatmulRopeKv::new(*one, rk)
                .filter(|f| m.ops.windows_on() && f.fits(m.ops.variant(), &m.set.windows())),
            _ => None,
        }
    }

    /// Products of one input (same x, rows, width and fused norm): as they
    /// are, or with int8 activations (the input quantized, a barrier, then
    /// every product against the blocks) when the model runs them and every
    /// product's weights have an int8 form.
    ///
    /// `blocks` says which inputs need no quantizer ([`Blocks`]). `out`:
    /// what the products also leave for the next ones where the fused
    /// quantizers are on and the CPU form runs them ([`Out`]); a product
    /// that adds into x without leaving its blocks leaves them stale.
    fn products(&self, p: &mut Vec<Step>, ops: &[QMatmul], blocks: &mut Blocks, out: Out) {
        let m = self.m;
        let x = self.a.x;
        let adds_x = ops.iter().any(|o| o.y_off == x);
        let Some(first) = ops.first() else {
            return;
        };
        let reads_x = first.x_off == x;
        let att = std::mem::take(&mut blocks.att) && first.x_off == self.a.att;
        let half = std::mem::take(&mut blocks.half) && first.x_off == self.a.h1;
        let int8 = self.act8.and_then(|a8| {
            let at = if reads_x { a8.xq_x } else { a8.xq };
            ops.iter()
                .map(|o| QMatmul8::new(*o, at, a8.form))
                .collect::<Option<Vec<_>>>()
                .map(|v| (v, at, a8))
        });
        let Some((mut mm8, at, a8)) = int8 else {
            p.extend(ops.iter().map(|o| Step::Mm(*o)));
            if adds_x {
                blocks.x_norm = None;
            }
            return;
        };
        let halves = half
            .then(|| {
                mm8.iter()
                    .map(|o| o.with_half_blocks().filter(|h| self.fits(h)))
                    .collect::<Option<Vec<_>>>()
            })
            .flatten();
        match halves {
            Some(h) => mm8 = h,
            None => Self::quantize_input(p, first, at, reads_x, att, blocks),
        }
        let mut made = None;
        for op in mm8 {
            let fused = match out {
                _ if !m.fuse_quant => None,
                Out::X(g) if op.0.y_off == x => op.with_quantized_out(a8.xq_x, g),
                Out::Half => op.with_half_blocks_out(a8.xq),
                _ => None,
            };
            match fused.filter(|f| self.fits(f)) {
                Some(f) => {
                    match out {
                        Out::X(g) => made = Some(g),
                        Out::Half => blocks.half = true,
                        Out::Stores => {}
                    }
                    p.push(Step::Mm8(f));
                }
                None => p.push(Step::Mm8(op)),
            }
        }
        if adds_x {
            blocks.x_norm = made;
        }
    }

    /// Whether this iteration's attention over the KV image runs split
    /// ([`GpuLlama::set_split_attention`], [`AttentionImageSplit::pays`]
    /// with the device's threads, costed as chained where the iteration is
    /// one the persistent chain holds: f32 products of at most 4 rows over
    /// the windows). By the iteration's shape alone, not by whether the
    /// chain is on or ran: a chained iteration, its dispatched rerun and
    /// the same iteration with the chain off run the same attention, so
    /// their logits are the same bits.
    fn split_pays(&self, att: &Attention) -> bool {
        let m = self.m;
        let Some(threads) = m.cpu_threads.filter(|_| m.split_attention) else {
            return false;
        };
        let chained = m.ops.windows_on() && self.act8.is_none() && self.t <= 4;
        m.ops.variant() == Variant::Cpu && AttentionImageSplit::pays(att, threads, chained)
    }

    /// Whether `op` runs in the CPU form over the model's windows.
    fn fits(&self, op: &QMatmul8) -> bool {
        let m = self.m;
        m.ops.windows_on() && op.fits(m.ops.variant(), &m.set.windows())
    }

    /// Whether `down` (the product after a GLU product) would read the GLU
    /// product's half blocks ([`QMatmul8::with_half_blocks`]): int8
    /// activations, the fused quantizers on, the packed pairs' `_h` twin
    /// for its weights, in the CPU form.
    fn reads_half_blocks(&self, down: &QMatmul) -> bool {
        let Some(a8) = self.act8 else {
            return false;
        };
        self.m.fuse_quant
            && self.m.half_blocks
            && QMatmul8::new(*down, a8.xq, a8.form)
                .and_then(QMatmul8::with_half_blocks)
                .is_some_and(|h| self.fits(&h))
    }

    /// The quantizer of `first`'s input into the blocks at `at` (and its
    /// barrier), unless they are already there: x's (`reads_x`) for the
    /// same norm vector ([`Blocks::x_norm`]), or the attention output's
    /// just written (`att`) for a product without a norm.
    fn quantize_input(
        p: &mut Vec<Step>,
        first: &QMatmul,
        at: u32,
        reads_x: bool,
        att: bool,
        blocks: &mut Blocks,
    ) {
        let ready = match reads_x {
            true => blocks.x_norm == Some(first.norm_off),
            false => att && first.norm_off == NO_NORM,
        };
        if !ready {
            let q = QuantizeQ81::new(first.m, first.k, first.x_off, at, first.norm_off);
            p.push(Step::Quant(q));
            p.push(Step::Barrier("quant_q81"));
            if reads_x {
                blocks.x_norm = Some(first.norm_off);
            }
        }
    }

    /// With int8 activations, the q|k|v product `qkv` (one stacked product
    /// of x) and `rk` as one op ([`QMatmul8RopeKv`]) after x's quantizer
    /// where it is needed, as [`fused_rope_kv`](Self::fused_rope_kv) does
    /// for f32; `false` (nothing pushed) where the model does not fuse them,
    /// the dot form or weights have no such twin, or it does not fit.
    fn products_rope_kv8(
        &self,
        p: &mut Vec<Step>,
        qkv: &[QMatmul],
        rk: &RopeKv,
        blocks: &mut Blocks,
    ) -> bool {
        let m = self.m;
        let (Some(a8), [one]) = (self.act8, qkv) else {
            return false;
        };
        if !m.fuse_rope_kv || !m.ops.windows_on() || one.x_off != self.a.x {
            return false;
        }
        let fused = QMatmulRopeKv::new(*one, rk)
            .and_then(|f| QMatmul8RopeKv::new(f, a8.xq_x, a8.form))
            .filter(|f| f.fits(m.ops.variant(), &m.set.windows()));
        let Some(f) = fused else {
            return false;
        };
        blocks.att = false;
        Self::quantize_input(p, one, a8.xq_x, true, false, blocks);
        p.push(Step::Mm8Rkv(f));
        p.push(Step::Barrier("qmm norm.q|k|v, rope_kv"));
        true
    }

    /// The attention with its output quantized for the `o` product after it
    /// ([`AttentionImageQ81`]), where the iteration runs int8 products, the
    /// fused quantizers are on, the attention runs over the KV image, `o`
    /// has an int8 form and the op fits; else `None`.
    fn attention_q81(&self, att: Attention, img: bool, o: &QMatmul) -> Option<AttentionImageQ81> {
        let a8 = self.act8?;
        let int8_o = QMatmul8::new(*o, a8.xq, a8.form).is_some();
        let op = AttentionImageQ81 { att, q_out: a8.xq };
        (self.m.fuse_quant && img && int8_o && o.norm_off == NO_NORM && op.fits()).then_some(op)
    }
}

/// Which int8 product inputs an iteration's plan has already quantized
/// (where an op that makes the input quantizes it too).
#[derive(Debug, Default)]
struct Blocks {
    /// `Some(g)`: the blocks at [`Act8::xq_x`] are those of the current x
    /// times the norm vector at `g` (written by a quantizer or the last
    /// residual add).
    x_norm: Option<u32>,
    /// The blocks at [`Act8::xq`] are the attention output's, just written
    /// by [`AttentionImageQ81`] (for the next products only).
    att: bool,
    /// The blocks at [`Act8::xq`] are half blocks of the GLU output h, just
    /// written by the GLU product ([`QMatmul8::with_half_blocks_out`]; for
    /// the next products only, which must read them as half blocks).
    half: bool,
}

/// What the int8 products of [`Recording::products`] leave besides their
/// stores.
#[derive(Debug, Clone, Copy)]
enum Out {
    /// Nothing more.
    Stores,
    /// A residual add: the new x's blocks for the norm vector at the offset
    /// ([`QMatmul8::with_quantized_out`]).
    X(u32),
    /// A GLU product: h's half blocks ([`QMatmul8::with_half_blocks_out`]).
    Half,
}

impl PlanOps {
    /// Records the steps; with `ts`, timestamp 0 first and one after each
    /// barrier (the labels of the groups timed, in order, are returned).
    fn record(
        &self,
        ops: &Ops,
        rec: &mut Recorder<'_>,
        ts: Option<&Timestamps>,
        tokens: &Buffer,
    ) -> VkResult<Vec<&'static str>> {
        let mut labels = vec![];
        if let Some(ts) = ts {
            rec.reset_timestamps(ts);
            rec.timestamp(ts, 0)?;
        }
        for s in &self.steps {
            match s {
                Step::Embed(o) => ops.run(rec, o)?,
                Step::Norm(o) => ops.run(rec, o)?,
                Step::Mm(o) => ops.run(rec, o)?,
                Step::Quant(o) => ops.run(rec, o)?,
                Step::Mm8(o) => ops.run(rec, o)?,
                Step::Mm8Rkv(o) => ops.run(rec, o)?,
                Step::MmRkv(o) => ops.run(rec, o)?,
                Step::RopeKv(o) => ops.run(rec, o)?,
                Step::Attend(o, true) => ops.run(rec, &AttentionImage(*o))?,
                Step::AttendSplit(o) => ops.run(rec, o)?,
                Step::Attend(o, false) => ops.run(rec, o)?,
                Step::AttendQ81(o) => ops.run(rec, o)?,
                Step::Glu(o) => ops.run(rec, o)?,
                Step::Argmax(o) => ops.run(rec, o)?,
                Step::Chain(c) => {
                    rec.fill(tokens, u64::from(c.sync_off) * 4, 8, 0)?;
                    rec.barrier();
                    ops.run(rec, c)?;
                }
                Step::Barrier(label) => {
                    rec.barrier();
                    if let Some(ts) = ts {
                        labels.push(*label);
                        rec.timestamp(ts, labels.len() as u32)?;
                    }
                }
            }
        }
        Ok(labels)
    }

    /// The plan with each run of two or more dispatch groups that the
    /// persistent chain holds ([`ChainStep`]: groups of one op, recorded as
    /// one dispatch) made one chain of `workgroups` workgroups (at most
    /// [`chain::MAX_CHAINS`]; their counters from word `sync_base` of the
    /// tokens buffer), the chains' programs appended to `meta` (the
    /// iteration's metadata words); and the number of chains.
    ///
    /// Each chain binds the two uniform windows once: the activations window
    /// at `x_base` (bytes; the iteration's layout puts every product input
    /// within one placement of it, [`ActOffsets::compact`]) and the weights
    /// window over its first norm vector; a group whose input or norm
    /// vector falls outside them starts the next chain.
    fn chained(
        self,
        win: &[xtc_vk::Window; xtc_vk::WINDOWS as usize],
        x_base: u64,
        workgroups: u32,
        sync_base: u32,
        meta: &mut Vec<u32>,
    ) -> (PlanOps, u32) {
        let Some((x_at, x_cov)) = win[1].place(x_base) else {
            return (self, 0);
        };
        let x_end = x_base + x_cov;
        // Whether `s` fits the windows (the weights window placed by the
        // first norm vector, `w`): the new weights placement if it does.
        let fits = |s: &ChainStep, w: Option<(u64, u64)>| -> Option<Option<(u64, u64)>> {
            let w = match (s.norm_bytes, w) {
                (Some((a, _)), None) => win[0].place(a).map(|(at, cov)| (at, a + cov)),
                (_, w) => w,
            };
            s.in_windows(w, Some((x_at, x_end))).then_some(w)
        };
        let mut groups: Vec<(Vec<Step>, &'static str)> = vec![];
        let mut cur = vec![];
        for s in self.steps {
            match s {
                Step::Barrier(label) => groups.push((std::mem::take(&mut cur), label)),
                s => cur.push(s),
            }
        }
        let step_of = |g: &[Step]| match g {
            [Step::Mm(o)] => ChainStep::product(o, win),
            [Step::MmRkv(o)] => ChainStep::product_rkv(o, win),
            [Step::Attend(a, true)] => ChainStep::attention(a),
            [Step::AttendSplit(a)] => ChainStep::attention_split(&a.0),
            [Step::Mm8(o)] => ChainStep::product8(o, win),
            [Step::Mm8Rkv(o)] => ChainStep::product8_rkv(o, win),
            [Step::AttendQ81(a)] => ChainStep::attention_q81(a),
            _ => None,
        };
        let chainable: Vec<Option<ChainStep>> = groups.iter().map(|(g, _)| step_of(g)).collect();
        let mut steps = vec![];
        let mut n_chains = 0;
        let mut groups = groups.into_iter().zip(chainable).peekable();
        while let Some(((g, label), cs)) = groups.next() {
            let first = cs.filter(|_| n_chains < chain::MAX_CHAINS);
            let Some((first, mut w_win)) = first.and_then(|f| Some((f, fits(&f, None)?))) else {
                steps.extend(g);
                steps.push(Step::Barrier(label));
                continue;
            };
            // The run from here, as long as its loop turns fit one chain
            // (llvmpipe's loop budget, chain::WORK_BUDGET).
            let mut run = vec![first];
            let mut work = first.cost(workgroups) + 1;
            let mut tile = first.tile;
            let family = chain::family_of(first.kind);
            let mut dispatched = vec![(g, label)];
            while let Some((_, Some(next))) = groups.peek() {
                let more = next.cost(workgroups) + 1;
                // One entry point a chain: products of one tile (the
                // attention goes with any).
                if work + more > chain::WORK_BUDGET
                    || (next.tile != 0 && tile != 0 && next.tile != tile)
                    || chain::family_of(next.kind) != family
                {
                    break;
                }
                let Some(w) = fits(next, w_win) else {
                    break;
                };
                w_win = w;
                tile = tile.max(next.tile);
                work += more;
                run.push(*next);
                let ((g, label), _) = groups.next().expect("peeked");
                dispatched.push((g, label));
            }
            if run.len() < 2 || work > chain::WORK_BUDGET {
                // One group (nothing to save) or one too long: dispatched.
                for (g, label) in dispatched {
                    steps.extend(g);
                    steps.push(Step::Barrier(label));
                }
                continue;
            }
            let prog_off = meta.len() as u32;
            let w_at = w_win.map_or(0, |(at, _)| at);
            for s in &run {
                meta.extend_from_slice(&s.words(w_at, x_at));
            }
            steps.push(Step::Chain(Chain {
                prog_off,
                n_steps: run.len() as u32,
                sync_off: sync_base + 2 * n_chains,
                spin_rounds: Chain::rounds_left(work),
                workgroups,
                tile: tile.max(1),
                w_at: w_at as u32,
                x_at: x_at as u32,
                family,
            }));
            steps.push(Step::Barrier("persistent chain"));
            n_chains += 1;
        }
        steps.extend(cur);
        (PlanOps { steps }, n_chains)
    }

    /// Barriers (timed groups) in the plan.
    fn groups(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, Step::Barrier(_)))
            .count()
    }
}
