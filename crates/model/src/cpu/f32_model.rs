//! CPU reference forward pass (plain Rust, f32): the same model the kernels
//! compute, token by token in llama2.c (`run.c`) order, over a paged CPU KV
//! cache. The kernels are checked against it.
//!
//! Conventions shared with the kernels: RMSNorm eps `1e-5`; RoPE rotates the
//! pairs `(2i, 2i+1)` of each head by `pos / 10000^((2i mod head_size) /
//! head_size)` radians; grouped-query head `h` reads KV head
//! `h / (n_heads / n_kv_heads)`; SwiGLU `silu(w1 x) * (w3 x)`; greedy sampling
//! takes the lowest index among equal maxima.

use crate::{BatchPlan, Config, KvGeometry, Weights};

/// RMSNorm epsilon (llama2.c).
pub const EPS: f32 = 1e-5;

/// A paged KV cache in host memory: per layer, K and V of
/// `[n_blocks, block_size, kv_dim]` f32 each.
#[derive(Debug, Clone)]
pub struct CpuKvCache {
    /// Block geometry.
    pub geometry: KvGeometry,
    kv_dim: usize,
    n_layers: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl CpuKvCache {
    /// A zeroed cache for `config` with `geometry`.
    pub fn new(config: &Config, geometry: KvGeometry) -> CpuKvCache {
        let n = config.n_layers * geometry.n_blocks * geometry.block_size * config.kv_dim();
        CpuKvCache {
            geometry,
            kv_dim: config.kv_dim(),
            n_layers: config.n_layers,
            k: vec![0.0; n],
            v: vec![0.0; n],
        }
    }

    /// Element offset of (layer, position `pos` of the sequence with `block_table`).
    fn slot(&self, layer: usize, block_table: &[u32], pos: usize) -> usize {
        let bs = self.geometry.block_size;
        let block = block_table[pos / bs] as usize;
        ((layer * self.geometry.n_blocks + block) * bs + pos % bs) * self.kv_dim
    }

    /// K of (layer, pos) for the sequence with `block_table`: `[kv_dim]`.
    pub fn k_at(&self, layer: usize, block_table: &[u32], pos: usize) -> &[f32] {
        let o = self.slot(layer, block_table, pos);
        &self.k[o..o + self.kv_dim]
    }

    /// V of (layer, pos) for the sequence with `block_table`: `[kv_dim]`.
    pub fn v_at(&self, layer: usize, block_table: &[u32], pos: usize) -> &[f32] {
        let o = self.slot(layer, block_table, pos);
        &self.v[o..o + self.kv_dim]
    }

    /// Writes K and V of (layer, pos) (the KV-cache append).
    pub fn append(&mut self, layer: usize, block_table: &[u32], pos: usize, k: &[f32], v: &[f32]) {
        let o = self.slot(layer, block_table, pos);
        self.k[o..o + self.kv_dim].copy_from_slice(k);
        self.v[o..o + self.kv_dim].copy_from_slice(v);
    }

    /// The whole K and V arrays, `[n_layers, n_blocks, block_size, kv_dim]` each.
    pub fn raw(&self) -> (&[f32], &[f32]) {
        (&self.k, &self.v)
    }

    /// Number of layers.
    pub fn n_layers(&self) -> usize {
        self.n_layers
    }
}

/// `out = w * x / sqrt(mean(x^2) + EPS)`; all `[dim]`.
pub fn rmsnorm(out: &mut [f32], x: &[f32], w: &[f32]) {
    let ss = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ss + EPS).sqrt();
    for ((o, xi), wi) in out.iter_mut().zip(x).zip(w) {
        *o = wi * (inv * xi);
    }
}

/// `out[i] = sum_j w[i*n + j] * x[j]` for `W` row-major `[d, n]` (llama2.c `matmul`).
pub fn matmul(out: &mut [f32], x: &[f32], w: &[f32]) {
    let n = x.len();
    for (i, o) in out.iter_mut().enumerate() {
        *o = w[i * n..(i + 1) * n]
            .iter()
            .zip(x)
            .map(|(a, b)| a * b)
            .sum();
    }
}

/// RoPE at `pos` in place on `q` (`[dim]`) and `k` (`[kv_dim]`), run.c's loop.
pub fn rope(q: &mut [f32], k: &mut [f32], pos: usize, head_size: usize) {
    for i in (0..q.len()).step_by(2) {
        let head_dim = i % head_size;
        let freq = 1.0 / 10000f32.powf(head_dim as f32 / head_size as f32);
        let val = pos as f32 * freq;
        let (s, c) = val.sin_cos();
        let rot = |v: &mut [f32]| {
            let (v0, v1) = (v[i], v[i + 1]);
            v[i] = v0 * c - v1 * s;
            v[i + 1] = v0 * s + v1 * c;
        };
        rot(q);
        if i < k.len() {
            rot(k);
        }
    }
}

/// `h1 = silu(h1) * h3` in place.
pub fn swiglu(h1: &mut [f32], h3: &[f32]) {
    for (a, b) in h1.iter_mut().zip(h3) {
        *a = *a / (1.0 + (-*a).exp()) * b;
    }
}

/// Index of the largest value (the lowest index among equal maxima).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Whether `token` is the greedy choice of `logits` up to a near-tie: the
/// reference's [`argmax`], or a token whose logit is within `tol` of the
/// maximum (a device summing in another order may break such a tie the
/// other way). Returns the gap `max - logits[token]` as the error.
///
/// # Errors
/// The gap, when the token is neither the argmax nor within `tol` of it (or
/// is outside the vocabulary: an infinite gap).
pub fn greedy_agrees(token: u32, logits: &[f32], tol: f32) -> Result<(), f32> {
    let want = argmax(logits);
    let gap = logits
        .get(token as usize)
        .map_or(f32::INFINITY, |l| logits[want as usize] - l);
    if token == want || gap <= tol {
        Ok(())
    } else {
        Err(gap)
    }
}

/// Causal attention of one query row at `pos` over positions `0..=pos` of
/// `layer`: `out` and `q` are `[dim]`; softmax in f32 (max-subtracted).
pub fn attention(
    out: &mut [f32],
    q: &[f32],
    cache: &CpuKvCache,
    c: &Config,
    layer: usize,
    bt: &[u32],
    pos: usize,
) {
    let hs = c.head_size();
    let group = c.n_heads / c.n_kv_heads;
    let mut att = vec![0f32; pos + 1];
    for h in 0..c.n_heads {
        let qh = &q[h * hs..(h + 1) * hs];
        let kvo = (h / group) * hs;
        for (t, a) in att.iter_mut().enumerate() {
            let k = &cache.k_at(layer, bt, t)[kvo..kvo + hs];
            *a = qh.iter().zip(k).map(|(x, y)| x * y).sum::<f32>() / (hs as f32).sqrt();
        }
        let max = att.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for a in att.iter_mut() {
            *a = (*a - max).exp();
            sum += *a;
        }
        let oh = &mut out[h * hs..(h + 1) * hs];
        oh.fill(0.0);
        for (t, a) in att.iter().enumerate() {
            let v = &cache.v_at(layer, bt, t)[kvo..kvo + hs];
            for (o, vi) in oh.iter_mut().zip(v) {
                *o += a / sum * vi;
            }
        }
    }
}

/// The final hidden state → logits (`[vocab_size]`) for one token at `pos`,
/// appending its K/V to `cache` in every layer (run.c's `forward`).
pub fn forward_token(
    w: &Weights,
    cache: &mut CpuKvCache,
    bt: &[u32],
    token: u32,
    pos: usize,
) -> Vec<f32> {
    let c = &w.config;
    let (d, kvd, hd) = (c.dim, c.kv_dim(), c.hidden_dim);
    let t = token as usize;
    let mut x = w.token_embedding[t * d..(t + 1) * d].to_vec();
    let (mut xb, mut q, mut att) = (vec![0f32; d], vec![0f32; d], vec![0f32; d]);
    let (mut k, mut v, mut tmp) = (vec![0f32; kvd], vec![0f32; kvd], vec![0f32; d]);
    let (mut h1, mut h3) = (vec![0f32; hd], vec![0f32; hd]);
    for l in 0..c.n_layers {
        rmsnorm(&mut xb, &x, &w.rms_att[l * d..(l + 1) * d]);
        matmul(&mut q, &xb, &w.wq[l * d * d..(l + 1) * d * d]);
        matmul(&mut k, &xb, &w.wk[l * kvd * d..(l + 1) * kvd * d]);
        matmul(&mut v, &xb, &w.wv[l * kvd * d..(l + 1) * kvd * d]);
        rope(&mut q, &mut k, pos, c.head_size());
        cache.append(l, bt, pos, &k, &v);
        attention(&mut att, &q, cache, c, l, bt, pos);
        matmul(&mut tmp, &att, &w.wo[l * d * d..(l + 1) * d * d]);
        x.iter_mut().zip(&tmp).for_each(|(a, b)| *a += b);
        rmsnorm(&mut xb, &x, &w.rms_ffn[l * d..(l + 1) * d]);
        matmul(&mut h1, &xb, &w.w1[l * hd * d..(l + 1) * hd * d]);
        matmul(&mut h3, &xb, &w.w3[l * hd * d..(l + 1) * hd * d]);
        swiglu(&mut h1, &h3);
        matmul(&mut tmp, &h1, &w.w2[l * d * hd..(l + 1) * d * hd]);
        x.iter_mut().zip(&tmp).for_each(|(a, b)| *a += b);
    }
    rmsnorm(&mut xb, &x, &w.rms_final);
    let mut logits = vec![0f32; c.vocab_size];
    matmul(&mut logits, &xb, &w.wcls);
    logits
}

/// Runs one iteration's plan: every token of every sequence, in order,
/// appending K/V to `cache`. Returns the logits (`[vocab_size]`) after the
/// last token of each sequence whose `sample` is set, in plan order.
///
/// # Errors
/// [`xtc::Error::Inval`] when the weights fail [`Weights::validate`] or the
/// plan fails [`BatchPlan::validate`]
/// (nothing is run then).
pub fn forward(
    w: &Weights,
    cache: &mut CpuKvCache,
    plan: &BatchPlan,
) -> xtc::Result<Vec<Vec<f32>>> {
    w.validate()?;
    plan.validate(&w.config, cache.geometry)?;
    let mut out = Vec::new();
    for s in &plan.seqs {
        let mut logits = Vec::new();
        for (i, &tok) in s.tokens.iter().enumerate() {
            logits = forward_token(w, cache, &s.block_table, tok, s.start_pos + i);
        }
        if s.sample {
            out.push(logits);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SeqWork;

    #[test]
    fn argmax_takes_the_lowest_index_of_a_tie() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn rope_at_position_zero_is_identity() {
        let mut q = vec![1.0, 2.0, 3.0, 4.0];
        let mut k = vec![5.0, 6.0];
        rope(&mut q, &mut k, 0, 2);
        assert_eq!(q, [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(k, [5.0, 6.0]);
    }

    #[test]
    fn chunked_prefill_equals_token_by_token() {
        let w = Weights::synthetic(Config::tiny(), 3);
        let geo = KvGeometry {
            block_size: 4,
            n_blocks: 8,
        };
        let toks = vec![5u32, 9, 100, 7, 3, 42];
        let bt = vec![6u32, 1];
        let mut a = CpuKvCache::new(&w.config, geo);
        let plan = BatchPlan {
            seqs: vec![SeqWork {
                tokens: toks.clone(),
                start_pos: 0,
                block_table: bt.clone(),
                sample: true,
            }],
        };
        let whole = forward(&w, &mut a, &plan).unwrap();
        let mut b = CpuKvCache::new(&w.config, geo);
        let mut last = vec![];
        for (i, t) in toks.iter().enumerate() {
            let p = BatchPlan {
                seqs: vec![SeqWork {
                    tokens: vec![*t],
                    start_pos: i,
                    block_table: bt.clone(),
                    sample: true,
                }],
            };
            last = forward(&w, &mut b, &p).unwrap();
        }
        assert_eq!(whole, last);
    }

    #[test]
    fn bad_plans_are_rejected() {
        let w = Weights::synthetic(Config::tiny(), 3);
        let geo = KvGeometry {
            block_size: 4,
            n_blocks: 2,
        };
        let mut cache = CpuKvCache::new(&w.config, geo);
        let seq = |tokens: Vec<u32>, start_pos, block_table: Vec<u32>| BatchPlan {
            seqs: vec![SeqWork {
                tokens,
                start_pos,
                block_table,
                sample: true,
            }],
        };
        for plan in [
            seq(vec![], 0, vec![0]),
            seq(vec![512], 0, vec![0]),
            seq(vec![1; 5], 0, vec![0]),
            seq(vec![1], 0, vec![2]),
            seq(vec![1], 256, vec![0; 65]),
        ] {
            assert_eq!(forward(&w, &mut cache, &plan), Err(xtc::Error::Inval));
        }
    }
}
