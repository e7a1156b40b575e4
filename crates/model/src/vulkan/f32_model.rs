//! [`GpuModel`]: the decoder on a Vulkan device. One iteration = ONE command
//! buffer for the whole ready vector: every layer over all token rows of all
//! sequences packed together (prefill chunks and decode tokens alike), then
//! the LM head and greedy argmax for the sequences that sample. The submit
//! returns an [`InFlight`] whose fence fd the batch driver polls (B-066).
//!
//! Device buffers (offsets in elements, fixed at creation):
//! - weights `[f32]`: the llama2.c tensors back to back, each layer's
//!   `wq|wk|wv` and `w1|w3` stacked for one split-output matmul each.
//! - activations `[f32]`: `x, xb, q, att [T, dim]`, `k, v [T, kv_dim]`,
//!   `h1, h3 [T, hidden_dim]`, `sel [S, dim]`, `logits [S, vocab]` for
//!   `T = max_tokens`, `S = max_seqs`.
//! - KV cache `[f32]`: K of every layer, then V of every layer, each
//!   `[n_blocks, block_size, kv_dim]`; or, on CPU devices where the shape
//!   allows ([`GpuOptions::kv_image`]), the kernel ABI's storage image in the
//!   [`KvImage`] layout (llvmpipe reads scattered image texels several times
//!   faster than scattered storage-buffer elements).
//! - metadata `[u32]` (host-written each iteration): row records `[T][4]`
//!   (token, sequence, position, block-table offset), the block tables, the
//!   list of sampled rows.
//! - tokens `[u32]` (read back): the greedy token of each sampled sequence.

use crate::vulkan::f32_record::{Geometry, WeightOffsets, upload_weights};
use crate::vulkan::ops::{Attention, AttentionImage, KvImage, Ops, Variant, pack_metadata};
use crate::vulkan::{ActOffsets, InFlight, u32_of};
use crate::{BatchPlan, Config, KvGeometry, Weights};
use xtc::{Error, Result};
use xtc_vk::{BindingSet, Buffer, CommandPool, Device, Kernels, Location, StorageImage};

/// Sizes of a [`GpuModel`]'s KV cache and per-iteration capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuOptions {
    /// KV-cache geometry (block ids in block tables are `< n_blocks`).
    pub kv: KvGeometry,
    /// Most token rows in one plan (the packed matmul's `M`).
    pub max_tokens: usize,
    /// Most sequences in one plan.
    pub max_seqs: usize,
    /// Copy the sampled rows' logits back each iteration
    /// ([`GpuModel::finish_with_logits`]); off by default (costs a copy).
    pub keep_logits: bool,
    /// Kernel forms to use; `None`: [`super::form::choose`] (the barrier
    /// probe; this model's CPU form needs no subgroups).
    pub variant: Option<Variant>,
    /// Hold the KV cache in a storage image ([`KvImage`]) rather than a
    /// buffer: `None` (the default) does so for the [`Variant::Cpu`] forms
    /// when the shape allows; `Some(true)` asks for it (`Inval` if the shape
    /// does not allow it); `Some(false)` keeps the buffer.
    pub kv_image: Option<bool>,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            kv: KvGeometry {
                block_size: 16,
                n_blocks: 256,
            },
            max_tokens: 256,
            max_seqs: 64,
            keep_logits: false,
            variant: None,
            kv_image: None,
        }
    }
}

/// The model's weights, KV cache and kernels on one device, with its own
/// command pool (one `GpuModel` per loop). One iteration in flight at a time.
pub struct GpuModel {
    // Field order is drop order: the pool and set go before the buffers.
    pool: CommandPool,
    set: BindingSet,
    weights: Buffer,
    act: Buffer,
    /// The KV buffer (a 4-byte placeholder at binding 2 when the cache is
    /// `kv_image`).
    kv: Buffer,
    /// The KV cache as a storage image, and whether a submitted command
    /// buffer moved it to layout `GENERAL` (`Recorder::init_image`).
    kv_image: Option<(StorageImage, bool)>,
    meta: Buffer,
    tokens: Buffer,
    logits: Option<Buffer>,
    ops: Ops,
    kernels: Kernels,
    dev: Device,
    config: Config,
    opts: GpuOptions,
    w: WeightOffsets,
    a: ActOffsets,
    kv_layer: u32,
    scratch: Vec<u32>,
    iteration: u64,
}

impl std::fmt::Debug for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuModel")
            .field("config", &self.config)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl GpuModel {
    /// Uploads `weights` to `dev` and allocates a zeroed KV cache and buffers
    /// for `opts`.
    ///
    /// # Errors
    /// `Inval` for a bad config, tensors of the wrong length or zero sizes,
    /// `Range` when an offset would not fit `u32` or a buffer exceeds the
    /// device's `maxStorageBufferRange`, `Nomem` when device memory runs out,
    /// `Internal` for other Vulkan failures.
    pub fn new(dev: &Device, weights: &Weights, opts: GpuOptions) -> Result<GpuModel> {
        let c = weights.config;
        weights.validate()?;
        if opts.max_tokens == 0
            || opts.max_seqs == 0
            || opts.kv.block_size == 0
            || opts.kv.n_blocks == 0
        {
            return Err(Error::Inval);
        }
        let kernels = Kernels::new(dev)?;
        let variant = match opts.variant {
            Some(v) => v,
            // The f32 kernels use no subgroups: the probe alone decides.
            None => super::form::choose(dev, true)?,
        };
        let ops = Ops::new(&kernels, variant)?;
        let image = KvImage::new(&c, opts.kv, dev.image_limits()).filter(|_| {
            // Every position of a sequence must fit the image form's loop budget.
            let probe = Attention {
                head_size: c.head_size() as u32,
                kv_dim: c.kv_dim() as u32,
                max_pos: c.seq_len.saturating_sub(1) as u32,
                ..bytemuck::Zeroable::zeroed()
            };
            AttentionImage(probe).fits()
        });
        let image = match opts.kv_image {
            None if variant == Variant::Cpu => image,
            None | Some(false) => None,
            Some(true) => Some(image.ok_or(Error::Inval)?),
        };
        let (weights_buf, w) = upload_weights(dev, weights)?;
        let a = ActOffsets::new(&c, opts.max_tokens, opts.max_seqs)?;
        // Every size is checked: a wrapped product would size a buffer
        // smaller than what the kernels write (`Range`, never a wrap).
        let mul = |a: u64, b: u64| a.checked_mul(b).ok_or(Error::Range);
        let kv_layer = mul(
            mul(opts.kv.n_blocks as u64, opts.kv.block_size as u64)?,
            c.kv_dim() as u64,
        )?;
        let kv_len = mul(2 * c.n_layers as u64, kv_layer)?;
        u32_of(kv_len)?;
        let per_seq = c.seq_len.div_ceil(opts.kv.block_size) as u64 + 1;
        let meta_len = mul(4, opts.max_tokens as u64)?
            .checked_add(mul(opts.max_seqs as u64, per_seq)?)
            .ok_or(Error::Range)?;
        u32_of(meta_len)?;
        let tokens_len = mul(opts.max_seqs as u64, 4)?;
        let logits_len = match opts.keep_logits {
            true => Some(mul(mul(opts.max_seqs as u64, c.vocab_size as u64)?, 4)?),
            false => None,
        };
        let act = Buffer::new(dev, mul(a.len, 4)?, Location::Device, "activations")?;
        let (kv, kv_image) = match image {
            Some(img) => {
                let [w, h, l] = img.extent;
                let store = StorageImage::new(dev, w, h, l, "kv cache")?;
                (
                    Buffer::new(dev, 4, Location::Device, "kv placeholder")?,
                    Some((store, false)),
                )
            }
            None => (
                Buffer::zeroed(dev, kv_len * 4, Location::Device, "kv cache")?,
                None,
            ),
        };
        let meta = Buffer::new(dev, meta_len * 4, Location::Upload, "metadata")?;
        let tokens = Buffer::new(dev, tokens_len, Location::Readback, "tokens")?;
        let logits = match logits_len {
            Some(len) => Some(Buffer::new(dev, len, Location::Readback, "logits")?),
            None => None,
        };
        let bound = [&weights_buf, &act, &kv, &meta, &tokens];
        if bound
            .iter()
            .any(|b| b.size() > dev.max_storage_buffer_range())
        {
            return Err(Error::Range); // a binding must fit maxStorageBufferRange
        }
        let set = BindingSet::with_image(&kernels, &bound, kv_image.as_ref().map(|(i, _)| i))?;
        Ok(GpuModel {
            pool: CommandPool::new(dev)?,
            set,
            weights: weights_buf,
            act,
            kv,
            kv_image,
            meta,
            tokens,
            logits,
            ops,
            kernels,
            dev: dev.clone(),
            config: c,
            opts,
            w,
            a,
            kv_layer: u32_of(kv_layer)?,
            scratch: Vec::with_capacity(meta_len as usize),
            iteration: 0,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The options it was created with.
    pub fn options(&self) -> &GpuOptions {
        &self.opts
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Bytes of device memory held by the weights and by the KV cache.
    pub fn memory_bytes(&self) -> (u64, u64) {
        let kv = match &self.kv_image {
            Some((img, _)) => img.extent().iter().map(|&n| u64::from(n)).product::<u64>() * 16,
            None => self.kv.size(),
        };
        (self.weights.size(), kv)
    }

    /// Whether the KV cache is held in a storage image ([`GpuOptions::kv_image`]).
    pub fn kv_in_image(&self) -> bool {
        self.kv_image.is_some()
    }

    /// Records ONE command buffer for the whole `plan` (all layers, all token
    /// rows of all sequences), submits it, and returns the iteration in flight.
    /// Waits first for the previous iteration's command buffer (one in flight).
    ///
    /// # Errors
    /// `Inval` for a plan that fails [`BatchPlan::validate`] or is empty,
    /// `Range` for more tokens or sequences than [`GpuOptions`] allow,
    /// `Internal`/`Nomem` for Vulkan failures. Nothing is submitted on error.
    pub fn submit(&mut self, plan: &BatchPlan) -> Result<InFlight> {
        plan.validate(&self.config, self.opts.kv)?;
        let n_rows = plan.n_tokens();
        if n_rows == 0 {
            return Err(Error::Inval);
        }
        if n_rows > self.opts.max_tokens || plan.seqs.len() > self.opts.max_seqs {
            return Err(Error::Range);
        }
        self.pool.reset()?;
        let sample_list = self.write_meta(plan)?;
        let n_samples = plan.n_samples();
        let mut rec = self.pool.record(&self.kernels, &self.set)?;
        // The layout transition counts as done only once a command buffer
        // holding it was submitted: a recording that fails below is dropped
        // unsubmitted, and the next one must transition the image again.
        let init = match &self.kv_image {
            Some((img, false)) => {
                rec.init_image(img);
                true
            }
            _ => false,
        };
        let max_pos = plan
            .seqs
            .iter()
            .map(|s| s.start_pos + s.tokens.len() - 1)
            .max();
        let geo = Geometry {
            c: self.config,
            block_size: self.opts.kv.block_size as u32,
            w: self.w,
            a: self.a,
            kv_layer: self.kv_layer,
            max_pos: max_pos.unwrap_or(0) as u32,
            kv_image: self.kv_image.is_some(),
        };
        geo.record(
            &self.ops,
            &mut rec,
            n_rows as u32,
            n_samples as u32,
            sample_list,
        )?;
        if let Some(l) = &self.logits {
            let bytes = (n_samples * self.config.vocab_size * 4) as u64;
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
        Ok(InFlight::new(sub, n_samples, self.iteration))
    }

    /// Writes this iteration's metadata ([`pack_metadata`]); returns the
    /// offset of the sampled-row list.
    fn write_meta(&mut self, plan: &BatchPlan) -> Result<u32> {
        let samples = pack_metadata(plan, self.opts.kv.block_size, &mut self.scratch);
        if (self.scratch.len() * 4) as u64 > self.meta.size() {
            return Err(Error::Range);
        }
        self.meta.write(0, &self.scratch)?;
        Ok(samples)
    }

    /// Waits for `f` and returns the greedy next token of each sequence of its
    /// plan with `sample` set, in plan order.
    ///
    /// # Errors
    /// `Inval` for an `InFlight` that is not this model's latest iteration,
    /// `Internal` for a lost device.
    pub fn finish(&mut self, f: InFlight) -> Result<Vec<u32>> {
        f.read_tokens(self.iteration, &self.tokens)
    }

    /// As [`finish`](Self::finish), also returning each sampled sequence's
    /// logits (`[vocab_size]`, in plan order).
    ///
    /// # Errors
    /// As [`finish`](Self::finish); `Inval` if `keep_logits` is off.
    pub fn finish_with_logits(&mut self, f: InFlight) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
        let vocab = self.config.vocab_size;
        f.read_tokens_and_logits(self.iteration, &self.tokens, self.logits.as_ref(), vocab)
    }

    /// Runs `plan` and waits: `finish(submit(plan))`.
    ///
    /// # Errors
    /// As [`submit`](Self::submit) and [`finish`](Self::finish).
    pub fn step(&mut self, plan: &BatchPlan) -> Result<Vec<u32>> {
        let f = self.submit(plan)?;
        self.finish(f)
    }
}
