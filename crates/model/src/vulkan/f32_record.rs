//! How [`crate::vulkan::f32_model::GpuModel`] lays its buffers out and records one
//! iteration's command buffer.
//!
//! Weights on the device (f32, element offsets): the llama2.c tensors, except
//! that each layer's `wq|wk|wv` and `w1|w3` are stacked so one split-output
//! matmul computes q, k and v (and the two FFN projections) in one dispatch.

use crate::cpu::f32_model::EPS;
use crate::vulkan::ops::{
    Argmax, Attention, AttentionImage, Embed, KvAppend, KvAppendImage, Matmul, Ops, RmsNorm, Rope,
    SwiGlu,
};
use crate::vulkan::{ActOffsets, u32_of};
use crate::{Config, Weights};
use xtc::Result;
use xtc_vk::{Buffer, Device, Location, Recorder, VkResult};

/// Element offsets of the weight tensors in the device buffer.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WeightOffsets {
    emb: u32,
    rms_att: u32,
    wqkv: u32,
    wo: u32,
    rms_ffn: u32,
    w13: u32,
    w2: u32,
    rms_final: u32,
    wcls: u32,
}

/// Uploads `weights` (stacking q|k|v and w1|w3 per layer).
pub(crate) fn upload_weights(dev: &Device, weights: &Weights) -> Result<(Buffer, WeightOffsets)> {
    let c = &weights.config;
    let (l, d, kv, h) = (c.n_layers, c.dim, c.kv_dim(), c.hidden_dim);
    let per_layer = |v: &[f32], n: usize| v.chunks(n).map(<[f32]>::to_vec).collect::<Vec<_>>();
    let (q, k, v) = (
        per_layer(&weights.wq, d * d),
        per_layer(&weights.wk, kv * d),
        per_layer(&weights.wv, kv * d),
    );
    let (w1, w3) = (per_layer(&weights.w1, h * d), per_layer(&weights.w3, h * d));
    let qkv: Vec<f32> = (0..l)
        .flat_map(|i| [&q[i], &k[i], &v[i]])
        .flatten()
        .copied()
        .collect();
    let w13: Vec<f32> = (0..l)
        .flat_map(|i| [&w1[i], &w3[i]])
        .flatten()
        .copied()
        .collect();
    let tensors: [&[f32]; 9] = [
        &weights.token_embedding,
        &weights.rms_att,
        &qkv,
        &weights.wo,
        &weights.rms_ffn,
        &w13,
        &weights.w2,
        &weights.rms_final,
        &weights.wcls,
    ];
    let total: u64 = tensors.iter().map(|t| t.len() as u64).sum();
    u32_of(total)?;
    let mut buf = Buffer::new(dev, total * 4, Location::Device, "weights")?;
    let mut offs = [0u32; 9];
    let mut at = 0u64;
    for (o, t) in offs.iter_mut().zip(tensors) {
        *o = at as u32;
        if !t.is_empty() {
            buf.upload(at * 4, t)?;
        }
        at += t.len() as u64;
    }
    let [emb, rms_att, wqkv, wo, rms_ffn, w13, w2, rms_final, wcls] = offs;
    Ok((
        buf,
        WeightOffsets {
            emb,
            rms_att,
            wqkv,
            wo,
            rms_ffn,
            w13,
            w2,
            rms_final,
            wcls,
        },
    ))
}

/// Everything one recording needs, copied out of the model (so the recorder
/// can borrow the model's command pool mutably).
pub(crate) struct Geometry {
    pub(crate) c: Config,
    pub(crate) block_size: u32,
    pub(crate) w: WeightOffsets,
    pub(crate) a: ActOffsets,
    /// Elements of one layer's K (or V) cache.
    pub(crate) kv_layer: u32,
    /// Largest position in the plan (picks the attention form).
    pub(crate) max_pos: u32,
    /// The KV cache is the kernel ABI's storage image ([`KvImage`] layout)
    /// rather than the KV buffer.
    pub(crate) kv_image: bool,
}

impl Geometry {
    /// Records the whole forward pass for `t` token rows and `s` sampled rows
    /// (their row list at metadata offset `sample_list`), with a barrier
    /// between dependent dispatches.
    pub(crate) fn record(
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
            row_base: 0,
        };
        ops.run(rec, &norm)?;
        rec.barrier();
        let v = c.vocab_size as u32;
        ops.run(rec, &Matmul::plain(s, v, d, a.sel, w.wcls, a.logits, false))?;
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
            row_base: 0,
        };
        ops.run(rec, &norm)?;
        rec.barrier();
        let qkv_off = w.wqkv + l * (d + 2 * kvd) * d;
        ops.run(
            rec,
            &Matmul::split(t, d, [d, kvd, kvd], qkv_off, a.xb, [a.q, a.k, a.v]),
        )?;
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
        // KV buffer: element offsets of this layer's caches; KV image: layers.
        let (kc_off, vc_off) = match self.kv_image {
            true => (l, c.n_layers as u32 + l),
            false => (l * self.kv_layer, (c.n_layers as u32 + l) * self.kv_layer),
        };
        let bs = self.block_size;
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
        match self.kv_image {
            true => ops.run(rec, &KvAppendImage(app))?,
            false => ops.run(rec, &app)?,
        }
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
            max_pos: self.max_pos,
        };
        match self.kv_image {
            true => ops.run(rec, &AttentionImage(att))?,
            false => ops.run(rec, &att)?,
        }
        rec.barrier();
        ops.run(
            rec,
            &Matmul::plain(t, d, d, a.att, w.wo + l * d * d, a.x, true),
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
            row_base: 0,
        };
        ops.run(rec, &norm)?;
        rec.barrier();
        ops.run(
            rec,
            &Matmul::split(
                t,
                d,
                [h, h, 0],
                w.w13 + l * 2 * h * d,
                a.xb,
                [a.h1, a.h3, 0],
            ),
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
            &Matmul::plain(t, d, h, a.h1, w.w2 + l * d * h, a.x, true),
        )?;
        rec.barrier();
        Ok(())
    }
}
