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
//! - The texel stream ([`TexelStream`]): every layer's `q|k|v` and
//!   `gate|up` stacked (one dispatch each) plus `attn_output`, `ffn_down`,
//!   and the token embedding table, which is also the LM head when the model
//!   ties them. Q4_1 blocks stay 20 bytes per 32 weights, Q8_0 34 bytes:
//!   SmolLM2-135M-Instruct takes about 96 MB. On CPU devices
//!   ([`Variant::Cpu`]) it is the weight image (kernel ABI binding 8), on GPUs
//!   the start of the weights buffer.
//! - The weights buffer (f32): the RMSNorm vectors and the RoPE table
//!   ([`rope_table`]: `[max_context][head_size / 2][cos, sin]`).
//! - Activations, metadata, tokens: as [`crate::model::vulkan::f32_model::GpuModel`]
//!   (`x, xb, q, att [T, dim]`, `k, v [T, kv_dim]`, `h1, h3 [T, hidden]`,
//!   `sel [S, dim]`, `logits [S, vocab]`).
//! - The KV cache: the storage image in the [`KvImage`] layout on CPU
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

use std::os::fd::BorrowedFd;

use crate::model::cpu::llama::Llama;
use crate::model::format::gguf::Gguf;
use crate::model::format::quant::{self, QMatrix};
use crate::model::vulkan::{ActOffsets, InFlight, u32_of};

use crate::model::vulkan::ops::{
    Attention, AttentionImage, KvImage, Ops, RmsNorm, Rope, SwiGlu, Variant, pack_metadata,
};
use crate::model::vulkan::qops::{
    ArgmaxPart, QEmbed, QMatmul, RopeKv, RopeTable, argmax_groups, rope_table,
};
use crate::model::vulkan::qweights::{QTensor, RepackError, TexelStream};
use crate::model::{BatchPlan, Config, KvGeometry, ModelError};
use xtc::{Error, Result};
use xtc_vk::{
    BindingSet, Buffer, CommandPool, Device, Kernels, Location, Recorder, StorageImage,
    TexelFormat, Timestamps, VkError, VkResult,
};

/// Width of the weight image in texels (a power of two: the kernels address
/// texel `i` at `(i & 4095, (i >> 12) & 16383, i >> 26)`).
const IMAGE_WIDTH: u32 = 4096;
/// Rows of the weight image per layer (the kernels' `(i >> 12) & 16383`).
const IMAGE_ROWS: u32 = 16384;

/// Device time of each group of dispatches of one iteration, in order:
/// `(label, nanoseconds)` ([`GpuLlama::profile`]).
pub type GroupTimes = Vec<(&'static str, f64)>;

/// Sizes of a [`GpuLlama`]'s KV cache and per-iteration capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuLlamaOptions {
    /// KV-cache geometry (block ids in block tables are `< n_blocks`).
    pub kv: KvGeometry,
    /// Most token rows in one plan.
    pub max_tokens: usize,
    /// Most sequences in one plan.
    pub max_seqs: usize,
    /// Positions per sequence (at most the model's context length; on CPU
    /// devices also at most what `attention_img`'s loop budget allows,
    /// 1817 at head size 64).
    pub max_context: usize,
    /// Copy the sampled rows' logits back each iteration
    /// ([`GpuLlama::finish_with_logits`]); off by default (costs a copy).
    pub keep_logits: bool,
    /// Kernel forms; `None`: [`Variant::for_device`], or `Gpu` where the
    /// device lacks what the CPU form needs: subgroups of at least 8 lanes
    /// with ballot and arithmetic operations ([`Device::subgroup_size`];
    /// llvmpipe on a CPU without AVX has 4). Asking for `Cpu` there is an
    /// [`GpuLlamaError::Options`] error.
    pub variant: Option<Variant>,
}

impl Default for GpuLlamaOptions {
    fn default() -> Self {
        GpuLlamaOptions {
            kv: KvGeometry {
                block_size: 16,
                n_blocks: 256,
            },
            max_tokens: 256,
            max_seqs: 64,
            max_context: 1024,
            keep_logits: false,
            variant: None,
        }
    }
}

/// Why a [`GpuLlama`] could not be made.
#[derive(Debug, thiserror::Error)]
pub enum GpuLlamaError {
    /// The file lacks a tensor or metadata the model needs.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A tensor the kernels cannot read in its shape.
    #[error("tensor {tensor}: {err}")]
    Repack {
        /// The tensor (or stacked tensors).
        tensor: String,
        /// What is wrong.
        err: RepackError,
    },
    /// Options the model cannot honour.
    #[error("option {option}: {why}")]
    Options {
        /// The option.
        option: &'static str,
        /// What is wrong.
        why: String,
    },
    /// The device refused (out of memory, limits, a lost device).
    #[error(transparent)]
    Vk(#[from] VkError),
    /// Sizes that do not fit the kernels' 32-bit offsets.
    #[error("buffer sizes overflow the kernels' 32-bit offsets")]
    Range,
}

/// A projection: one stacked tensor (one dispatch, split outputs; for
/// gate|up the rows interleaved for the fused SwiGLU), or its parts when
/// their formats differ (one dispatch each; gate and up then go through the
/// `swiglu` kernel).
#[derive(Debug, Clone)]
enum Proj {
    Stacked(QTensor),
    Parts(Vec<QTensor>),
}

#[derive(Debug, Clone)]
struct LayerW {
    attn_norm: u32,
    ffn_norm: u32,
    qkv: Proj,
    wo: QTensor,
    w13: Proj,
    w2: QTensor,
}

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
    kv_layer: u32,
    weight_bytes: u64,
    scratch: Vec<u32>,
    iteration: u64,
}

impl std::fmt::Debug for GpuLlama {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuLlama")
            .field("shape", &self.shape)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

fn matrix<'a>(g: &'a Gguf, name: &str) -> std::result::Result<QMatrix<'a>, GpuLlamaError> {
    let info = g.tensor(name).map_err(ModelError::Gguf)?;
    let (cols, rows) = (
        info.dims[0] as usize,
        info.dims.get(1).copied().unwrap_or(1) as usize,
    );
    QMatrix::new(info.ty, rows, cols, g.tensor_data(info)).map_err(|e| GpuLlamaError::Options {
        option: "model",
        why: format!("tensor {name}: {e}"),
    })
}

fn norm(g: &Gguf, name: &str, out: &mut Vec<f32>) -> std::result::Result<u32, GpuLlamaError> {
    let info = g.tensor(name).map_err(ModelError::Gguf)?;
    let at = out.len();
    out.resize(at + info.n_elements() as usize, 0.0);
    quant::dequantize(info.ty, g.tensor_data(info), &mut out[at..]);
    u32::try_from(at).map_err(|_| GpuLlamaError::Range)
}

fn stack(
    s: &mut TexelStream,
    names: &[String],
    parts: &[QMatrix<'_>],
) -> std::result::Result<Proj, GpuLlamaError> {
    let repack = |tensor: &str, err| GpuLlamaError::Repack {
        tensor: tensor.into(),
        err,
    };
    if parts.iter().all(|p| p.ty() == parts[0].ty()) {
        return s
            .push_stacked(parts)
            .map(Proj::Stacked)
            .map_err(|e| repack(&names.join("|"), e));
    }
    let mut out = vec![];
    for (n, p) in names.iter().zip(parts) {
        out.push(s.push(p).map_err(|e| repack(n, e))?);
    }
    Ok(Proj::Parts(out))
}

impl GpuLlama {
    /// Uploads `model` to `dev` (its matrices in their block formats, see the
    /// module documentation) and allocates a KV cache and buffers for `opts`.
    ///
    /// # Errors
    /// [`GpuLlamaError::Options`] for zero sizes or a `max_context` above the
    /// model's context length (or, on CPU devices, the attention kernel's
    /// loop budget); [`GpuLlamaError::Repack`] for a matrix whose rows are not
    /// a multiple of 4; [`GpuLlamaError::Range`] when offsets overflow 32
    /// bits; [`GpuLlamaError::Vk`] for device errors (out of memory, limits).
    pub fn new(
        dev: &Device,
        model: &Llama,
        opts: GpuLlamaOptions,
    ) -> std::result::Result<GpuLlama, GpuLlamaError> {
        let lc = *model.config();
        let bad = |option, why: &str| GpuLlamaError::Options {
            option,
            why: why.into(),
        };
        if opts.max_tokens == 0 || opts.max_seqs == 0 {
            return Err(bad("max_tokens/max_seqs", "must be at least 1"));
        }
        if opts.kv.block_size == 0 || opts.kv.n_blocks == 0 {
            return Err(bad("kv", "block size and block count must be at least 1"));
        }
        if opts.max_context == 0 || opts.max_context > lc.shape.seq_len {
            return Err(bad(
                "max_context",
                &format!("{} is not in 1..={}", opts.max_context, lc.shape.seq_len),
            ));
        }
        let shape = Config {
            seq_len: opts.max_context,
            ..lc.shape
        };
        // The CPU form hands x around subgroups of at least 8 lanes
        // (`subgroupBroadcast` from lanes 0..7) and reduces with
        // `subgroupAdd` / `Max` / `Min`; without them the GPU form runs.
        let subgroups = dev.subgroup_size().is_some_and(|s| s >= 8);
        let variant = match opts.variant {
            Some(v) => v,
            None if subgroups => Variant::for_device(dev),
            None => Variant::Gpu,
        };
        if variant == Variant::Cpu && !subgroups {
            return Err(bad(
                "variant",
                &format!(
                    "the CPU-device kernels need subgroups of at least 8 lanes with ballot and arithmetic operations; this device has {:?} (use the GPU form)",
                    dev.subgroup_size()
                ),
            ));
        }
        let kernels = Kernels::new(dev)?;
        let ops = Ops::new(&kernels, variant)?;
        let g = model.gguf();
        let hs = shape.head_size();

        // The texel stream and the f32 weights.
        let mut s = TexelStream::new();
        let mut f32s: Vec<f32> = vec![];
        let mut layers = Vec::with_capacity(shape.n_layers);
        for i in 0..shape.n_layers {
            let n = |t: &str| format!("blk.{i}.{t}.weight");
            let qkv_names = [n("attn_q"), n("attn_k"), n("attn_v")];
            let qkv: Vec<QMatrix> = qkv_names
                .iter()
                .map(|t| matrix(g, t))
                .collect::<std::result::Result<_, _>>()?;
            let w13_names = [n("ffn_gate"), n("ffn_up")];
            let w13: Vec<QMatrix> = w13_names
                .iter()
                .map(|t| matrix(g, t))
                .collect::<std::result::Result<_, _>>()?;
            let single = |s: &mut TexelStream, t: &str| {
                s.push(&matrix(g, t)?).map_err(|err| GpuLlamaError::Repack {
                    tensor: t.into(),
                    err,
                })
            };
            let qkv = stack(&mut s, &qkv_names, &qkv)?;
            let wo = single(&mut s, &n("attn_output"))?;
            let w13 = match w13[0].ty() == w13[1].ty() {
                true => Proj::Stacked(s.push_interleaved(&w13[0], &w13[1]).map_err(|err| {
                    GpuLlamaError::Repack {
                        tensor: w13_names.join("|"),
                        err,
                    }
                })?),
                false => stack(&mut s, &w13_names, &w13)?,
            };
            let w2 = single(&mut s, &n("ffn_down"))?;
            layers.push(LayerW {
                attn_norm: norm(g, &n("attn_norm"), &mut f32s)?,
                ffn_norm: norm(g, &n("ffn_norm"), &mut f32s)?,
                qkv,
                wo,
                w13,
                w2,
            });
        }
        let embed_m = matrix(g, "token_embd.weight")?;
        let embed = s.push(&embed_m).map_err(|err| GpuLlamaError::Repack {
            tensor: "token_embd.weight".into(),
            err,
        })?;
        let head = if lc.tied_output {
            embed
        } else {
            s.push(&matrix(g, "output.weight")?)
                .map_err(|err| GpuLlamaError::Repack {
                    tensor: "output.weight".into(),
                    err,
                })?
        };
        let out_norm = norm(g, "output_norm.weight", &mut f32s)?;
        let rope_tab = u32::try_from(f32s.len()).map_err(|_| GpuLlamaError::Range)?;
        f32s.extend(rope_table(lc.rope_base, hs, opts.max_context));

        // Where the stream goes: the image (CPU devices) or the start of the
        // weights buffer (GPUs; the f32 weights then follow it).
        let stream_bytes = s.bytes().len() as u64;
        let (wbuf, wimg, f32_base) = match variant {
            Variant::Cpu => {
                let texels = s.texels().max(1) as u64;
                let per_layer = u64::from(IMAGE_WIDTH) * u64::from(IMAGE_ROWS);
                let layers =
                    u32::try_from(texels.div_ceil(per_layer)).map_err(|_| GpuLlamaError::Range)?;
                let rows = if layers > 1 {
                    IMAGE_ROWS
                } else {
                    texels.div_ceil(u64::from(IMAGE_WIDTH)) as u32
                };
                let mut img = StorageImage::with_format(
                    dev,
                    TexelFormat::Rgba32U,
                    [IMAGE_WIDTH, rows, layers],
                    "weights (texel stream)",
                )?;
                img.upload(s.bytes())?;
                let mut buf = Buffer::new(
                    dev,
                    (f32s.len() * 4) as u64,
                    Location::Device,
                    "weights f32",
                )?;
                buf.upload(0, &f32s)?;
                (buf, Some(img), 0u32)
            }
            Variant::Gpu => {
                let base = u32::try_from(stream_bytes / 4).map_err(|_| GpuLlamaError::Range)?;
                let total = stream_bytes + (f32s.len() * 4) as u64;
                let mut buf = Buffer::new(dev, total, Location::Device, "weights")?;
                buf.upload(0, s.bytes())?;
                buf.upload(stream_bytes, &f32s)?;
                (buf, None, base)
            }
        };
        let shift = |o: u32| o.checked_add(f32_base).ok_or(GpuLlamaError::Range);
        for l in &mut layers {
            l.attn_norm = shift(l.attn_norm)?;
            l.ffn_norm = shift(l.ffn_norm)?;
        }
        let out_norm = shift(out_norm)?;
        let rope_tab = shift(rope_tab)?;

        // KV cache: the image where the attention form's loop budget allows.
        let image = KvImage::new(&shape, opts.kv, dev.image_limits()).filter(|_| {
            let probe = Attention {
                head_size: hs as u32,
                kv_dim: shape.kv_dim() as u32,
                max_pos: opts.max_context as u32 - 1,
                ..bytemuck::Zeroable::zeroed()
            };
            AttentionImage(probe).fits()
        });
        if variant == Variant::Cpu && image.is_none() {
            return Err(bad(
                "max_context",
                &format!(
                    "{} positions at head size {hs} exceed what the CPU-device attention runs (or the KV image limits)",
                    opts.max_context
                ),
            ));
        }
        let image = image.filter(|_| variant == Variant::Cpu);
        let a = ActOffsets::new(&shape, opts.max_tokens, opts.max_seqs)
            .map_err(|_| GpuLlamaError::Range)?;
        let mul = |a: u64, b: u64| a.checked_mul(b).ok_or(GpuLlamaError::Range);
        let kv_layer = mul(
            mul(opts.kv.n_blocks as u64, opts.kv.block_size as u64)?,
            shape.kv_dim() as u64,
        )?;
        let kv_len = mul(2 * shape.n_layers as u64, kv_layer)?;
        u32_of(kv_len).map_err(|_| GpuLlamaError::Range)?;
        let per_seq = shape.seq_len.div_ceil(opts.kv.block_size) as u64 + 1;
        let meta_len = mul(4, opts.max_tokens as u64)?
            .checked_add(mul(opts.max_seqs as u64, per_seq)?)
            .ok_or(GpuLlamaError::Range)?;
        let part_off = u32::try_from(a.len).map_err(|_| GpuLlamaError::Range)?;
        let parts = mul(
            mul(
                opts.max_seqs as u64,
                u64::from(argmax_groups(shape.vocab_size as u32, variant)),
            )?,
            2,
        )?;
        let act_len = a.len.checked_add(parts).ok_or(GpuLlamaError::Range)?;
        u32::try_from(act_len).map_err(|_| GpuLlamaError::Range)?;
        let act = Buffer::new(dev, mul(act_len, 4)?, Location::Device, "activations")?;
        let (kv, kv_image) = match image {
            Some(img) => {
                let [w, h, l] = img.extent;
                let store = StorageImage::new(dev, w, h, l, "kv cache")?;
                (
                    Buffer::new(dev, 4, Location::Device, "kv placeholder")?,
                    Some((store, false)),
                )
            }
            None => {
                let mut b = Buffer::new(dev, kv_len * 4, Location::Device, "kv cache")?;
                b.upload(0, &vec![0u8; (kv_len * 4) as usize])?;
                (b, None)
            }
        };
        let meta = Buffer::new(dev, meta_len * 4, Location::Upload, "metadata")?;
        let tokens = Buffer::new(
            dev,
            mul(opts.max_seqs as u64, 4)?,
            Location::Readback,
            "tokens",
        )?;
        let logits = match opts.keep_logits {
            true => Some(Buffer::new(
                dev,
                mul(mul(opts.max_seqs as u64, shape.vocab_size as u64)?, 4)?,
                Location::Readback,
                "logits",
            )?),
            false => None,
        };
        let bound = [&wbuf, &act, &kv, &meta, &tokens];
        if bound
            .iter()
            .any(|b| b.size() > dev.max_storage_buffer_range())
        {
            return Err(GpuLlamaError::Range);
        }
        let set = BindingSet::with_images(
            &kernels,
            &bound,
            kv_image.as_ref().map(|(i, _)| i),
            wimg.as_ref(),
        )?;
        Ok(GpuLlama {
            pool: CommandPool::new(dev)?,
            set,
            wbuf,
            wimg,
            act,
            kv,
            kv_image,
            meta,
            tokens,
            logits,
            ops,
            kernels,
            dev: dev.clone(),
            shape,
            rms_eps: lc.rms_eps,
            opts,
            layers,
            embed,
            head,
            out_norm,
            rope_tab,
            a,
            part_off,
            kv_layer: u32_of(kv_layer).map_err(|_| GpuLlamaError::Range)?,
            weight_bytes: stream_bytes,
            scratch: Vec::with_capacity(meta_len as usize),
            iteration: 0,
        })
    }

    /// The model's shape (`seq_len` is [`GpuLlamaOptions::max_context`]).
    pub fn config(&self) -> &Config {
        &self.shape
    }

    /// The options it was made with.
    pub fn options(&self) -> &GpuLlamaOptions {
        &self.opts
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
        if (self.scratch.len() * 4) as u64 > self.meta.size() {
            return Err(Error::Range);
        }
        self.meta.write(0, &self.scratch)?;
        let n_samples = plan.n_samples();
        let max_pos = plan
            .seqs
            .iter()
            .map(|s| s.start_pos + s.tokens.len() - 1)
            .max()
            .unwrap_or(0) as u32;
        let rec_ctx = Recording {
            m: self,
            t: n_rows as u32,
            s: n_samples as u32,
            sample_list,
            max_pos,
        };
        let plan_rec = rec_ctx.plan();
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
        let labels = plan_rec.record(&self.ops, &mut rec, ts.as_ref())?;
        if let Some(l) = &self.logits {
            let bytes = (n_samples * self.shape.vocab_size * 4) as u64;
            if bytes > 0 {
                rec.copy(&self.act, u64::from(self.a.logits) * 4, l, 0, bytes)?;
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
        f.read_tokens(self.iteration, &self.tokens)
    }

    /// As [`finish`](Self::finish), also returning each sampling sequence's
    /// logits (`[vocab_size]`, plan order).
    ///
    /// # Errors
    /// As [`finish`](Self::finish); `Inval` if `keep_logits` is off.
    pub fn finish_with_logits(&mut self, f: InFlight) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
        let vocab = self.shape.vocab_size;
        f.read_tokens_and_logits(self.iteration, &self.tokens, self.logits.as_ref(), vocab)
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
    RopeKv(RopeKv),
    Attend(Attention, bool),
    Glu(SwiGlu),
    Argmax(ArgmaxPart),
    /// A barrier after the group of dispatches named by the label.
    Barrier(&'static str),
}

impl Recording<'_> {
    fn plan(&self) -> PlanOps {
        let m = self.m;
        let (c, a, t) = (&m.shape, &m.a, self.t);
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
        for (l, lw) in m.layers.iter().enumerate() {
            let l = l as u32;
            let eps = m.rms_eps;
            match &lw.qkv {
                Proj::Stacked(q) => p.push(Step::Mm(
                    QMatmul::split(q, t, a.x, [d, kvd, kvd], [a.q, a.k, a.v])
                        .with_norm(lw.attn_norm, eps),
                )),
                Proj::Parts(parts) => {
                    for (q, y) in parts.iter().zip([a.q, a.k, a.v]) {
                        p.push(Step::Mm(
                            QMatmul::plain(q, t, a.x, y, false).with_norm(lw.attn_norm, eps),
                        ));
                    }
                }
            }
            p.push(Step::Barrier("qmm norm.q|k|v"));
            let (kc_off, vc_off) = match img {
                true => (l, c.n_layers as u32 + l),
                false => (l * m.kv_layer, (c.n_layers as u32 + l) * m.kv_layer),
            };
            let bs = m.opts.kv.block_size as u32;
            p.push(Step::RopeKv(RopeKv {
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
            }));
            p.push(Step::Barrier("rope_kv"));
            p.push(Step::Attend(
                Attention {
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
                },
                img,
            ));
            p.push(Step::Barrier("attention"));
            p.push(Step::Mm(QMatmul::plain(&lw.wo, t, a.att, a.x, true)));
            p.push(Step::Barrier("qmm o (+x)"));
            match &lw.w13 {
                Proj::Stacked(w) => {
                    p.push(Step::Mm(
                        QMatmul::glu(w, t, a.x, a.h1).with_norm(lw.ffn_norm, eps),
                    ));
                    p.push(Step::Barrier("qmm norm.gate|up, swiglu"));
                }
                Proj::Parts(parts) => {
                    for (w, y) in parts.iter().zip([a.h1, a.h3]) {
                        p.push(Step::Mm(
                            QMatmul::plain(w, t, a.x, y, false).with_norm(lw.ffn_norm, eps),
                        ));
                    }
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
            p.push(Step::Mm(QMatmul::plain(&lw.w2, t, a.h1, a.x, true)));
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
            p.push(Step::Mm(QMatmul::logits_argmax(
                &m.head, self.s, a.sel, a.logits, m.part_off,
            )));
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
}

impl PlanOps {
    /// Records the steps; with `ts`, timestamp 0 first and one after each
    /// barrier (the labels of the groups timed, in order, are returned).
    fn record(
        &self,
        ops: &Ops,
        rec: &mut Recorder<'_>,
        ts: Option<&Timestamps>,
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
                Step::RopeKv(o) => ops.run(rec, o)?,
                Step::Attend(o, true) => ops.run(rec, &AttentionImage(*o))?,
                Step::Attend(o, false) => ops.run(rec, o)?,
                Step::Glu(o) => ops.run(rec, o)?,
                Step::Argmax(o) => ops.run(rec, o)?,
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

    /// Barriers (timed groups) in the plan.
    fn groups(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, Step::Barrier(_)))
            .count()
    }
}
