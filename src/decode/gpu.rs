//! [`GpuModel`]: the decoder on a Vulkan device. One iteration = ONE command
//! buffer for the whole ready vector: every layer over all token rows of all
//! sequences packed together (prefill chunks and decode tokens alike), then
//! the LM head and greedy argmax for the sequences that sample. The submit
//! returns an [`InFlight`] whose fence fd the batch driver polls (B-066).
//!
//! Device buffers (offsets in elements, fixed at creation):
//! - weights `[f32]`: the llama2.c tensors back to back ([`Weights::tensors`]).
//! - activations `[f32]`: `x, xb, q, att [T, dim]`, `k, v [T, kv_dim]`,
//!   `h1, h3 [T, hidden_dim]`, `sel [S, dim]`, `logits [S, vocab]` for
//!   `T = max_tokens`, `S = max_seqs`.
//! - KV cache `[f32]`: K of every layer, then V of every layer, each
//!   `[n_blocks, block_size, kv_dim]`.
//! - metadata `[u32]` (host-written each iteration): row records `[T][4]`
//!   (token, sequence, position, block-table offset), the block tables, the
//!   list of sampled rows.
//! - tokens `[u32]` (read back): the greedy token of each sampled sequence.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use super::model::{BatchPlan, Config, KvGeometry, Weights};
use super::ops::{
    Argmax, Attention, Embed, KvAppend, Matmul, Ops, RmsNorm, Rope, SwiGlu, pack_metadata,
};
use super::reference::EPS;
use crate::vk::{
    BindingSet, Buffer, CommandPool, Device, Kernels, Location, Recorder, Submission, VkResult,
};
use crate::{Error, Result};

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
        }
    }
}

/// Element offsets of the weight tensors (llama2.c order).
#[derive(Debug, Clone, Copy, Default)]
struct WeightOffsets {
    emb: u32,
    rms_att: u32,
    wq: u32,
    wk: u32,
    wv: u32,
    wo: u32,
    rms_ffn: u32,
    w1: u32,
    w2: u32,
    w3: u32,
    rms_final: u32,
    wcls: u32,
}

/// Element offsets of the activation regions.
#[derive(Debug, Clone, Copy, Default)]
struct ActOffsets {
    x: u32,
    xb: u32,
    q: u32,
    k: u32,
    v: u32,
    att: u32,
    h1: u32,
    h3: u32,
    sel: u32,
    logits: u32,
    len: u64,
}

fn u32_of(n: u64) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::Range)
}

impl ActOffsets {
    fn new(c: &Config, t: usize, s: usize) -> Result<ActOffsets> {
        let (t, s) = (t as u64, s as u64);
        let (d, kv, h, v) = (
            c.dim as u64,
            c.kv_dim() as u64,
            c.hidden_dim as u64,
            c.vocab_size as u64,
        );
        let sizes = [
            t * d,
            t * d,
            t * d,
            t * kv,
            t * kv,
            t * d,
            t * h,
            t * h,
            s * d,
            s * v,
        ];
        let mut offs = [0u32; 10];
        let mut at = 0u64;
        for (o, n) in offs.iter_mut().zip(sizes) {
            *o = u32_of(at)?;
            at += n;
        }
        let [x, xb, q, k, v, att, h1, h3, sel, logits] = offs;
        Ok(ActOffsets {
            x,
            xb,
            q,
            k,
            v,
            att,
            h1,
            h3,
            sel,
            logits,
            len: at,
        })
    }
}

/// One submitted iteration. Poll [`fence_fd`](Self::fence_fd) (readable when
/// done), then hand it to [`GpuModel::finish`].
#[derive(Debug)]
pub struct InFlight {
    sub: Submission,
    n_samples: usize,
    iteration: u64,
}

impl InFlight {
    /// The completion fd: an eventfd or sync_file, POLLIN once the
    /// iteration's command buffer has executed (B-066). Valid while `self` lives.
    pub fn fence_fd(&self) -> BorrowedFd<'_> {
        self.sub.fence_fd()
    }

    /// Raw form of [`fence_fd`](Self::fence_fd) (for `batch::Exec::Fence`).
    pub fn as_raw_fd(&self) -> RawFd {
        self.sub.fence_fd().as_raw_fd()
    }

    /// Sequences of the plan that sample.
    pub fn n_samples(&self) -> usize {
        self.n_samples
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
    kv: Buffer,
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
    /// `Inval` for a bad config or zero sizes, `Range` when an offset would not
    /// fit `u32`, `Nomem` when device memory runs out, `Internal` for other
    /// Vulkan failures.
    pub fn new(dev: &Device, weights: &Weights, opts: GpuOptions) -> Result<GpuModel> {
        let c = weights.config;
        c.validate()?;
        if opts.max_tokens == 0
            || opts.max_seqs == 0
            || opts.kv.block_size == 0
            || opts.kv.n_blocks == 0
        {
            return Err(Error::Inval);
        }
        let kernels = Kernels::new(dev)?;
        let ops = Ops::new(&kernels)?;
        let (weights_buf, w) = upload_weights(dev, weights)?;
        let a = ActOffsets::new(&c, opts.max_tokens, opts.max_seqs)?;
        let kv_layer = opts.kv.n_blocks as u64 * opts.kv.block_size as u64 * c.kv_dim() as u64;
        let kv_len = 2 * c.n_layers as u64 * kv_layer;
        u32_of(kv_len)?;
        let meta_len =
            4 * opts.max_tokens + opts.max_seqs * (c.seq_len.div_ceil(opts.kv.block_size) + 1);
        let act = Buffer::new(dev, a.len * 4, Location::Device, "activations")?;
        let kv = zeroed(dev, kv_len * 4, "kv cache")?;
        let meta = Buffer::new(dev, meta_len as u64 * 4, Location::Upload, "metadata")?;
        let tokens = Buffer::new(dev, opts.max_seqs as u64 * 4, Location::Readback, "tokens")?;
        let logits = match opts.keep_logits {
            true => Some(Buffer::new(
                dev,
                (opts.max_seqs * c.vocab_size * 4) as u64,
                Location::Readback,
                "logits",
            )?),
            false => None,
        };
        let set = BindingSet::new(&kernels, &[&weights_buf, &act, &kv, &meta, &tokens])?;
        Ok(GpuModel {
            pool: CommandPool::new(dev)?,
            set,
            weights: weights_buf,
            act,
            kv,
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
            scratch: Vec::with_capacity(meta_len),
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
        (self.weights.size(), self.kv.size())
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
        let geo = Geometry {
            c: self.config,
            opts: self.opts,
            w: self.w,
            a: self.a,
            kv_layer: self.kv_layer,
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
                rec.copy(&self.act, u64::from(self.a.logits) * 4, l, 0, bytes);
            }
        }
        rec.host_barrier();
        let cmd = rec.finish()?;
        let sub = self.pool.submit(vec![cmd])?;
        self.iteration += 1;
        Ok(InFlight {
            sub,
            n_samples,
            iteration: self.iteration,
        })
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
        if f.iteration != self.iteration {
            return Err(Error::Inval);
        }
        if !f.sub.wait(None)? {
            return Err(Error::Internal);
        }
        let mut out = vec![0u32; f.n_samples];
        self.tokens.read(0, &mut out)?;
        Ok(out)
    }

    /// As [`finish`](Self::finish), also returning each sampled sequence's
    /// logits (`[vocab_size]`, in plan order).
    ///
    /// # Errors
    /// As [`finish`](Self::finish); `Inval` if `keep_logits` is off.
    pub fn finish_with_logits(&mut self, f: InFlight) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
        let n = f.n_samples;
        let toks = self.finish(f)?;
        let buf = self.logits.as_ref().ok_or(Error::Inval)?;
        let v = self.config.vocab_size;
        let mut flat = vec![0f32; n * v];
        buf.read(0, &mut flat)?;
        Ok((toks, flat.chunks(v.max(1)).map(<[f32]>::to_vec).collect()))
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

fn zeroed(dev: &Device, bytes: u64, name: &str) -> VkResult<Buffer> {
    let mut b = Buffer::new(dev, bytes, Location::Device, name)?;
    b.upload(0, &vec![0u8; bytes as usize])?;
    Ok(b)
}

fn upload_weights(dev: &Device, weights: &Weights) -> Result<(Buffer, WeightOffsets)> {
    let tensors = weights.tensors();
    let total: u64 = tensors.iter().map(|(_, t)| t.len() as u64).sum();
    u32_of(total)?;
    let mut buf = Buffer::new(dev, total * 4, Location::Device, "weights")?;
    let mut offs = [0u32; 12];
    let mut at = 0u64;
    for (o, (_, t)) in offs.iter_mut().zip(tensors) {
        *o = at as u32;
        if !t.is_empty() {
            buf.upload(at * 4, t)?;
        }
        at += t.len() as u64;
    }
    let [
        emb,
        rms_att,
        wq,
        wk,
        wv,
        wo,
        rms_ffn,
        w1,
        w2,
        w3,
        rms_final,
        wcls,
    ] = offs;
    let w = WeightOffsets {
        emb,
        rms_att,
        wq,
        wk,
        wv,
        wo,
        rms_ffn,
        w1,
        w2,
        w3,
        rms_final,
        wcls,
    };
    Ok((buf, w))
}

/// Everything the recording needs, copied out of the model (so the recorder
/// can borrow the pool mutably).
struct Geometry {
    c: Config,
    opts: GpuOptions,
    w: WeightOffsets,
    a: ActOffsets,
    kv_layer: u32,
}

impl Geometry {
    fn record(
        &self,
        ops: &Ops,
        rec: &mut Recorder<'_>,
        t: u32,
        s: u32,
        sample_list: u32,
    ) -> VkResult<()> {
        let (c, a, w) = (&self.c, &self.a, &self.w);
        let d = c.dim as u32;
        ops.run(
            rec,
            &Embed {
                n_rows: t,
                dim: d,
                rows_off: 0,
                emb_off: w.emb,
                x_off: a.x,
            },
        )?;
        rec.barrier();
        for l in 0..c.n_layers as u32 {
            self.attention_block(ops, rec, t, l)?;
            self.ffn_block(ops, rec, t, l)?;
        }
        if s == 0 {
            return Ok(());
        }
        let norm = RmsNorm {
            n_rows: s,
            dim: d,
            in_off: a.x,
            out_off: a.sel,
            w_off: w.rms_final,
            row_list: sample_list,
            eps: EPS,
        };
        ops.run(rec, &norm)?;
        rec.barrier();
        let v = c.vocab_size as u32;
        ops.run(
            rec,
            &Matmul {
                m: s,
                n: v,
                k: d,
                x_off: a.sel,
                w_off: w.wcls,
                y_off: a.logits,
                accumulate: 0,
            },
        )?;
        rec.barrier();
        ops.run(
            rec,
            &Argmax {
                n_rows: s,
                vocab: v,
                logits_off: a.logits,
                out_off: 0,
            },
        )
    }

    fn attention_block(&self, ops: &Ops, rec: &mut Recorder<'_>, t: u32, l: u32) -> VkResult<()> {
        let (c, a, w) = (&self.c, &self.a, &self.w);
        let (d, kvd, hs) = (c.dim as u32, c.kv_dim() as u32, c.head_size() as u32);
        let norm = RmsNorm {
            n_rows: t,
            dim: d,
            in_off: a.x,
            out_off: a.xb,
            w_off: w.rms_att + l * d,
            row_list: u32::MAX,
            eps: EPS,
        };
        ops.run(rec, &norm)?;
        rec.barrier();
        let mm = |n: u32, w_off: u32, y_off: u32| Matmul {
            m: t,
            n,
            k: d,
            x_off: a.xb,
            w_off,
            y_off,
            accumulate: 0,
        };
        ops.run(rec, &mm(d, w.wq + l * d * d, a.q))?;
        ops.run(rec, &mm(kvd, w.wk + l * kvd * d, a.k))?;
        ops.run(rec, &mm(kvd, w.wv + l * kvd * d, a.v))?;
        rec.barrier();
        ops.run(
            rec,
            &Rope {
                n_rows: t,
                dim: d,
                kv_dim: kvd,
                head_size: hs,
                rows_off: 0,
                q_off: a.q,
                k_off: a.k,
            },
        )?;
        rec.barrier();
        let kc_off = l * self.kv_layer;
        let vc_off = (c.n_layers as u32 + l) * self.kv_layer;
        let bs = self.opts.kv.block_size as u32;
        let app = KvAppend {
            n_rows: t,
            kv_dim: kvd,
            block_size: bs,
            rows_off: 0,
            k_off: a.k,
            v_off: a.v,
            kc_off,
            vc_off,
        };
        ops.run(rec, &app)?;
        rec.barrier();
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
        };
        ops.run(rec, &att)?;
        rec.barrier();
        ops.run(
            rec,
            &Matmul {
                m: t,
                n: d,
                k: d,
                x_off: a.att,
                w_off: w.wo + l * d * d,
                y_off: a.x,
                accumulate: 1,
            },
        )?;
        rec.barrier();
        Ok(())
    }

    fn ffn_block(&self, ops: &Ops, rec: &mut Recorder<'_>, t: u32, l: u32) -> VkResult<()> {
        let (c, a, w) = (&self.c, &self.a, &self.w);
        let (d, h) = (c.dim as u32, c.hidden_dim as u32);
        let norm = RmsNorm {
            n_rows: t,
            dim: d,
            in_off: a.x,
            out_off: a.xb,
            w_off: w.rms_ffn + l * d,
            row_list: u32::MAX,
            eps: EPS,
        };
        ops.run(rec, &norm)?;
        rec.barrier();
        ops.run(
            rec,
            &Matmul {
                m: t,
                n: h,
                k: d,
                x_off: a.xb,
                w_off: w.w1 + l * h * d,
                y_off: a.h1,
                accumulate: 0,
            },
        )?;
        ops.run(
            rec,
            &Matmul {
                m: t,
                n: h,
                k: d,
                x_off: a.xb,
                w_off: w.w3 + l * h * d,
                y_off: a.h3,
                accumulate: 0,
            },
        )?;
        rec.barrier();
        ops.run(
            rec,
            &SwiGlu {
                n_rows: t,
                hidden_dim: h,
                h1_off: a.h1,
                h3_off: a.h3,
            },
        )?;
        rec.barrier();
        ops.run(
            rec,
            &Matmul {
                m: t,
                n: d,
                k: h,
                x_off: a.h1,
                w_off: w.w2 + l * d * h,
                y_off: a.x,
                accumulate: 1,
            },
        )?;
        rec.barrier();
        Ok(())
    }
}
