//! The models on a Vulkan device: the kernels' push constants and grids
//! ([`ops`], and the quantized ones in [`qops`]), the texel stream quantized
//! matrices are repacked into ([`qweights`]), the f32 model
//! ([`f32_model::GpuModel`], its buffers and recording in `f32_record`) and
//! the GGUF model ([`llama::GpuLlama`]), and which kernel form a device
//! runs ([`form`]: by capability and a measured barrier probe) and whether
//! its products take int8 activations ([`act_probe`], for
//! `XTC_ACTIVATIONS=auto`).
//!
//! What both models share lives here: an iteration in flight
//! ([`InFlight`]: its submission, what it samples, and the reading back of
//! its tokens and logits), the activation layout (`ActOffsets`) and
//! `u32_of`.

pub mod act_probe;
pub mod chain;
pub mod f32_model;
mod f32_record;
pub mod form;
pub mod llama;
pub mod ops;
pub mod peak;
pub mod qops;
pub mod qops8;
pub mod qweights;

use std::os::fd::{AsFd, BorrowedFd};
use std::rc::Rc;
use std::sync::Arc;

use xtc::{Error, Result};
use xtc_vk::{Buffer, Submission};

use crate::Config;

/// `n` as a `u32` element offset or count.
///
/// # Errors
/// `Range` above `u32::MAX`.
pub(crate) fn u32_of(n: u64) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::Range)
}

/// Element offsets of the activation regions: `x, xb, q, att [T, dim]`,
/// `k, v [T, kv_dim]`, `h1, h3 [T, hidden]`, `sel [S, dim]`, `logits [S, vocab]`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ActOffsets {
    pub(crate) x: u32,
    pub(crate) xb: u32,
    pub(crate) q: u32,
    pub(crate) k: u32,
    pub(crate) v: u32,
    pub(crate) att: u32,
    pub(crate) h1: u32,
    pub(crate) h3: u32,
    pub(crate) sel: u32,
    pub(crate) logits: u32,
    pub(crate) len: u64,
}

impl ActOffsets {
    pub(crate) fn new(c: &Config, t: usize, s: usize) -> Result<ActOffsets> {
        let (t, s) = (t as u64, s as u64);
        let (d, kv, h, v) = (
            c.dim as u64,
            c.kv_dim() as u64,
            c.hidden_dim as u64,
            c.vocab_size as u64,
        );
        // Checked: a wrapped `rows * width` (a token budget of 2^62 rows)
        // would alias every activation at offset 0.
        let mul = |a: u64, b: u64| a.checked_mul(b).ok_or(Error::Range);
        let sizes = [
            mul(t, d)?,
            mul(t, d)?,
            mul(t, d)?,
            mul(t, kv)?,
            mul(t, kv)?,
            mul(t, d)?,
            mul(t, h)?,
            mul(t, h)?,
            mul(s, d)?,
            mul(s, v)?,
        ];
        let mut offs = [0u32; 10];
        let mut at = 0u64;
        for (o, n) in offs.iter_mut().zip(sizes) {
            *o = u32_of(at)?;
            at = at.checked_add(n).ok_or(Error::Range)?;
        }
        // The last offset must be addressable too (u32 element offsets).
        u32_of(at)?;
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

impl ActOffsets {
    /// As [`new`](Self::new) with the regions in another order: x, att
    /// (the attention output) and h1 first, then xb, q, k, v, h3, sel and
    /// logits, so a small iteration's product inputs (x, att, h1: `t *
    /// (2 dim + hidden)` elements, 43 KB at 4 rows of SmolLM2) lie in one
    /// placement of a 64 KiB uniform window, which a persistent chain needs
    /// (`chain`).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub(crate) fn compact(c: &Config, t: usize, s: usize) -> Result<ActOffsets> {
        let n = ActOffsets::new(c, t, s)?;
        let (t, s) = (t as u64, s as u64);
        let (d, kv, h) = (c.dim as u64, c.kv_dim() as u64, c.hidden_dim as u64);
        let sizes = [t * d, t * h, t * d, t * d, t * kv, t * kv, t * h, s * d];
        let mut at = t * d;
        let mut offs = [0u32; 8];
        for (o, n) in offs.iter_mut().zip(sizes) {
            *o = u32_of(at)?;
            at += n;
        }
        let [att, h1, xb, q, k, v, h3, sel] = offs;
        Ok(ActOffsets {
            x: 0,
            att,
            h1,
            xb,
            q,
            k,
            v,
            h3,
            sel,
            logits: u32_of(at)?,
            len: n.len,
        })
    }
}

/// One submitted iteration. Poll [`fence_fd`](Self::fence_fd) (readable when
/// done), then hand it to [`GpuModel::finish`](f32_model::GpuModel::finish).
#[derive(Debug)]
pub struct InFlight {
    /// Shared with the batch engine's FENCE wait ([`InFlight::fence`]);
    /// `Arc` so `InFlight` stays `Send`. Dropping the last clone waits for
    /// the work (as [`Submission`] does).
    sub: Arc<Submission>,
    n_samples: usize,
    iteration: u64,
}

impl InFlight {
    /// An iteration in flight: `sub` completes it, `n_samples` sequences
    /// sample, `iteration` is its model's iteration count (checked by finish).
    pub(crate) fn new(sub: Submission, n_samples: usize, iteration: u64) -> InFlight {
        InFlight {
            sub: Arc::new(sub),
            n_samples,
            iteration,
        }
    }

    /// Waits for the iteration and reads its sampled tokens (`n_samples`
    /// `u32`s at the start of `tokens`): the `finish` of both Vulkan models.
    ///
    /// # Errors
    /// `Inval` when `self` is not the model's `latest` iteration, `Internal`
    /// for a lost device.
    pub(crate) fn read_tokens(self, latest: u64, tokens: &Buffer) -> Result<Vec<u32>> {
        if self.iteration != latest {
            return Err(Error::Inval);
        }
        if !self.sub.wait(None)? {
            return Err(Error::Internal);
        }
        let mut out = vec![0u32; self.n_samples];
        tokens.read(0, &mut out)?;
        Ok(out)
    }

    /// [`read_tokens`](Self::read_tokens), then each sampled sequence's
    /// logits (`[vocab]`, in plan order) from `logits`.
    ///
    /// # Errors
    /// As [`read_tokens`](Self::read_tokens); `Inval` without a logits
    /// buffer (`keep_logits` off).
    pub(crate) fn read_tokens_and_logits(
        self,
        latest: u64,
        tokens: &Buffer,
        logits: Option<&Buffer>,
        vocab: usize,
    ) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
        let n = self.n_samples;
        let toks = self.read_tokens(latest, tokens)?;
        let buf = logits.ok_or(Error::Inval)?;
        let mut flat = vec![0f32; n * vocab];
        buf.read(0, &mut flat)?;
        Ok((
            toks,
            flat.chunks(vocab.max(1)).map(<[f32]>::to_vec).collect(),
        ))
    }

    /// The completion fd: an eventfd or sync_file, POLLIN once the
    /// iteration's command buffer has executed (B-066). Valid while `self` lives.
    pub fn fence_fd(&self) -> BorrowedFd<'_> {
        self.sub.fence_fd()
    }

    /// The completion fence as a shared owner, for `batch::Exec::Fence`
    /// (B-066, B-067): the engine keeps this clone until its `collect`
    /// returned, so the fd stays open for the whole wait even once
    /// [`GpuModel::finish`](f32_model::GpuModel::finish) consumed `self`.
    pub fn fence(&self) -> Rc<dyn AsFd> {
        Rc::new(self.sub.clone()) // `Arc<T: AsFd>` is `AsFd`
    }

    /// Sequences of the plan that sample.
    pub fn n_samples(&self) -> usize {
        self.n_samples
    }
}
