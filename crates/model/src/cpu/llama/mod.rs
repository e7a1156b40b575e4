//! A llama model from a GGUF file, and the CPU reference forward pass over
//! its quantized weights.
//!
//! # Tensors (llama.cpp names; dims `ne[0]` first, so `[in, out]` is a
//! row-major `[out, in]` matrix)
//! `token_embd.weight [dim, vocab]`, `output_norm.weight [dim]`,
//! `output.weight [dim, vocab]` (absent when tied: the LM head is then
//! `token_embd.weight`), and per layer `i`: `blk.i.attn_norm.weight [dim]`,
//! `blk.i.attn_q.weight [dim, dim]`, `blk.i.attn_k.weight [dim, kv_dim]`,
//! `blk.i.attn_v.weight [dim, kv_dim]`, `blk.i.attn_output.weight [dim, dim]`,
//! `blk.i.ffn_norm.weight [dim]`, `blk.i.ffn_gate.weight [dim, hidden]`,
//! `blk.i.ffn_up.weight [dim, hidden]`, `blk.i.ffn_down.weight [hidden, dim]`.
//! Matrices may be any [`GgmlType`]; norm vectors F32 or F16. A missing
//! tensor, a shape that disagrees with the config or a norm of another type
//! is refused at load ([`ModelError`] naming the tensor).
//!
//! # The forward pass (the oracle's definition)
//! For each token row at position `pos` of its sequence, per layer:
//! `xb = rmsnorm(x) * attn_norm` (mean of squares summed in f64, then
//! `x * (1 / sqrt(mean + eps))` in f32, then `* w`); `q, k, v = Wq xb, Wk xb,
//! Wv xb` ([`qmatmul::matmul`]); RoPE on `q` and `k`: the adjacent pairs
//! `(2i, 2i+1)` of every head turn by `pos · θ_i` with `θ_i = 1 /
//! base^(2i / head_size)` (f32 `powf`, then `sin_cos` of the f32 product, as
//! llama2.c; llama.cpp's GGUF conversion permutes `Wq`/`Wk` so this is the
//! model's own rotation); K and V appended to the sequence's cache; causal
//! attention of query head `h` over KV head `h / (n_heads / n_kv_heads)`,
//! scores `q·k / sqrt(head_size)`, max-subtracted softmax; `x += Wo att`;
//! `xb = rmsnorm(x) * ffn_norm`; `x += Wdown (silu(Wgate xb) * (Wup xb))`.
//! Then `logits = Wout (rmsnorm(x) * output_norm)`.
//!
//! Every row's result depends only on its sequence's tokens: a batch of
//! sequences, a prefill split into chunks, any number of threads give the
//! same bits as running each token alone (tests `batched_chunked_and_alone_are_bit_identical`).
//!
//! # Sequences and the paged cache
//! A [`Sequence`] is one stream's KV cache: per layer, K and V of every
//! position so far (`[len, kv_dim]` f32 each), grown as tokens are run, at
//! most the context length. A [`PagedKv`] is the serving side's cache:
//! blocks of positions that a [`BatchPlan`]'s block tables assign to
//! sequences ([`Llama::forward_paged`]). Both are stores of one forward pass
//! (`run_rows`): only where K and V go differs, so a sequence gets the same
//! bits from either (test `paged_and_contiguous_passes_are_bit_identical`).

use rayon::prelude::*;

mod gguf_of;
mod kv;

pub use gguf_of::gguf_from_weights;
pub use kv::{Chunk, Logits, PagedKv, Sequence};
use kv::{KvStore, PagedStore, SeqStore};

use super::math::{dot, rmsnorm};
use super::qmatmul;
use crate::format::gguf::{GgmlType, Gguf, TensorInfo};
use crate::format::llama_config::LlamaConfig;
use crate::format::quant::{self, QMatrix};
use crate::{BatchPlan, KvGeometry, ModelError};

/// A matrix of the model: where its bytes are in the file.
#[derive(Debug, Clone)]
struct Mat {
    info: TensorInfo,
    rows: usize,
    cols: usize,
}

#[derive(Debug, Clone)]
struct Layer {
    attn_norm: Vec<f32>,
    wq: Mat,
    wk: Mat,
    wv: Mat,
    wo: Mat,
    ffn_norm: Vec<f32>,
    gate: Mat,
    up: Mat,
    down: Mat,
}

/// A llama model: the mapped GGUF file, its config, and views of its
/// quantized weights (checked against the config at load).
#[derive(Debug)]
pub struct Llama {
    gguf: Gguf,
    config: LlamaConfig,
    token_embd: Mat,
    output: Mat,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
    /// `θ_i` of each pair of a head, `[head_size / 2]`.
    rope_freq: Vec<f32>,
}

/// Why a forward pass was refused (nothing was run, no cache changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    /// A chunk without tokens.
    #[error("chunk {chunk} has no tokens")]
    Empty {
        /// Index of the chunk.
        chunk: usize,
    },
    /// A token id outside the vocabulary.
    #[error("chunk {chunk}: token id {token} is not below the vocabulary size {vocab}")]
    Token {
        /// Index of the chunk.
        chunk: usize,
        /// The id.
        token: u32,
        /// The model's vocabulary size.
        vocab: usize,
    },
    /// The sequence would grow past the context length.
    #[error("chunk {chunk}: {len} cached + {adding} new positions exceed the context length {max}")]
    ContextFull {
        /// Index of the chunk.
        chunk: usize,
        /// Positions already cached.
        len: usize,
        /// Tokens in the chunk.
        adding: usize,
        /// The model's context length.
        max: usize,
    },
    /// A sequence made for a model of another shape.
    #[error("chunk {chunk}: the sequence was made for another model shape")]
    ForeignSequence {
        /// Index of the chunk.
        chunk: usize,
    },
    /// A paged KV cache made for a model of another shape.
    #[error("the paged KV cache was made for another model shape")]
    ForeignCache,
    /// A block table too short for the positions a plan's sequence runs.
    #[error(
        "sequence {chunk}: {positions} positions need {need} blocks of {block_size}, its block table has {blocks}",
        need = positions.div_ceil(*block_size)
    )]
    BlockTable {
        /// Index of the sequence in the plan.
        chunk: usize,
        /// Positions covered after the sequence's tokens (`start_pos + tokens`).
        positions: usize,
        /// Entries in its block table.
        blocks: usize,
        /// Positions per block.
        block_size: usize,
    },
    /// A block id outside the paged KV cache.
    #[error("sequence {chunk}: block {block} is not below the cache's {n_blocks} blocks")]
    Block {
        /// Index of the sequence in the plan.
        chunk: usize,
        /// The block id.
        block: u32,
        /// Blocks in the cache.
        n_blocks: usize,
    },
}

fn shape_err(info: &TensorInfo, expected: &[u64]) -> ModelError {
    ModelError::Shape {
        tensor: info.name.clone(),
        expected: expected.to_vec(),
        found: info.dims.clone(),
    }
}

impl Llama {
    /// Maps and loads the GGUF model at `path`.
    ///
    /// # Errors
    /// [`ModelError::NotFound`] when there is no file; else as
    /// [`Gguf::open`] and [`Llama::from_gguf`].
    pub fn load(path: &std::path::Path) -> Result<Llama, ModelError> {
        if !path.is_file() {
            return Err(ModelError::NotFound {
                path: path.display().to_string(),
            });
        }
        Llama::from_gguf(Gguf::open(path)?)
    }

    /// Builds the model over a parsed file: reads the config and checks
    /// every tensor the forward pass uses.
    ///
    /// # Errors
    /// As [`LlamaConfig::from_gguf`]; [`ModelError::Gguf`] with
    /// [`crate::format::gguf::GgufError::MissingTensor`]; [`ModelError::Shape`] for a
    /// tensor whose shape disagrees with the config; [`ModelError::TensorType`]
    /// for a norm vector that is not F32 or F16.
    pub fn from_gguf(gguf: Gguf) -> Result<Llama, ModelError> {
        let config = LlamaConfig::from_gguf(&gguf)?;
        let c = config.shape;
        let (d, kv, h, v) = (
            c.dim as u64,
            c.kv_dim() as u64,
            c.hidden_dim as u64,
            c.vocab_size as u64,
        );
        let mat = |name: &str, cols: u64, rows: u64| -> Result<Mat, ModelError> {
            let info = gguf.tensor(name)?;
            if info.dims != [cols, rows] {
                return Err(shape_err(info, &[cols, rows]));
            }
            Ok(Mat {
                info: info.clone(),
                rows: rows as usize,
                cols: cols as usize,
            })
        };
        let norm = |name: &str| -> Result<Vec<f32>, ModelError> {
            let info = gguf.tensor(name)?;
            if info.dims != [d] {
                return Err(shape_err(info, &[d]));
            }
            if !matches!(info.ty, GgmlType::F32 | GgmlType::F16) {
                return Err(ModelError::TensorType {
                    tensor: name.into(),
                    ty: info.ty,
                    why: "a norm vector must be F32 or F16",
                });
            }
            let mut out = vec![0f32; c.dim];
            quant::dequantize(info.ty, gguf.tensor_data(info), &mut out);
            Ok(out)
        };
        let token_embd = mat("token_embd.weight", d, v)?;
        let output = if config.tied_output {
            token_embd.clone()
        } else {
            mat("output.weight", d, v)?
        };
        let output_norm = norm("output_norm.weight")?;
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Layer {
                attn_norm: norm(&n("attn_norm"))?,
                wq: mat(&n("attn_q"), d, d)?,
                wk: mat(&n("attn_k"), d, kv)?,
                wv: mat(&n("attn_v"), d, kv)?,
                wo: mat(&n("attn_output"), d, d)?,
                ffn_norm: norm(&n("ffn_norm"))?,
                gate: mat(&n("ffn_gate"), d, h)?,
                up: mat(&n("ffn_up"), d, h)?,
                down: mat(&n("ffn_down"), h, d)?,
            });
        }
        let hs = config.head_size();
        let rope_freq = (0..hs / 2)
            .map(|i| 1.0 / config.rope_base.powf((2 * i) as f32 / hs as f32))
            .collect();
        Ok(Llama {
            gguf,
            config,
            token_embd,
            output,
            output_norm,
            layers,
            rope_freq,
        })
    }

    /// The config.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The GGUF file (metadata for the tokenizer).
    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    /// Bytes of weights read per token (every matrix once, plus one
    /// embedding row): the memory traffic of one decode step.
    pub fn weight_bytes_per_token(&self) -> u64 {
        let per_layer: u64 = self
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down])
            .map(|m| m.info.size)
            .sum();
        per_layer + self.output.info.size + self.token_embd.info.size / self.token_embd.rows as u64
    }

    fn q(&self, m: &Mat) -> QMatrix<'_> {
        QMatrix::new(m.info.ty, m.rows, m.cols, self.gguf.tensor_data(&m.info))
            .expect("shapes checked at load")
    }

    /// An empty sequence for this model.
    pub fn new_sequence(&self) -> Sequence {
        let c = &self.config.shape;
        Sequence {
            n_layers: c.n_layers,
            kv_dim: c.kv_dim(),
            max_len: c.seq_len,
            len: 0,
            k: vec![Vec::new(); c.n_layers],
            v: vec![Vec::new(); c.n_layers],
        }
    }

    /// Runs every chunk's tokens, appending their K/V to the chunks'
    /// sequences; returns per chunk the logits it asked for (empty for
    /// [`Logits::None`], `[vocab]` for [`Logits::Last`], `[tokens, vocab]`
    /// for [`Logits::All`]).
    ///
    /// All chunks' rows go through each weight matrix together (one decode of
    /// every block for all of them), so a batch of sequences costs little
    /// more than one in weight traffic.
    ///
    /// # Errors
    /// [`ForwardError`] (then nothing ran and no sequence changed).
    pub fn forward(&self, chunks: &mut [Chunk<'_>]) -> Result<Vec<Vec<f32>>, ForwardError> {
        let c = self.config.shape;
        for (i, ch) in chunks.iter().enumerate() {
            let s = &ch.seq;
            if s.n_layers != c.n_layers || s.kv_dim != c.kv_dim() || s.max_len != c.seq_len {
                return Err(ForwardError::ForeignSequence { chunk: i });
            }
            self.check_chunk(i, ch.tokens, s.len)?;
        }
        // Row r: (chunk, position).
        let rows: Vec<(usize, usize)> = chunks
            .iter()
            .enumerate()
            .flat_map(|(i, ch)| (0..ch.tokens.len()).map(move |j| (i, ch.seq.len + j)))
            .collect();
        let tokens: Vec<u32> = chunks.iter().flat_map(|ch| ch.tokens).copied().collect();
        // Rows whose logits are wanted, in chunk order.
        let mut want = Vec::new();
        let mut r = 0;
        for ch in chunks.iter() {
            let n = ch.tokens.len();
            match ch.logits {
                Logits::None => {}
                Logits::Last => want.push(r + n - 1),
                Logits::All => want.extend(r..r + n),
            }
            r += n;
        }
        let logits = self.run_rows(&tokens, &rows, &want, &mut SeqStore { chunks })?;
        for ch in chunks.iter_mut() {
            ch.seq.len += ch.tokens.len();
        }
        let vocab = c.vocab_size;
        let mut out = Vec::with_capacity(chunks.len());
        let mut at = 0;
        for ch in chunks.iter() {
            let n = match ch.logits {
                Logits::None => 0,
                Logits::Last => 1,
                Logits::All => ch.tokens.len(),
            };
            out.push(logits[at * vocab..(at + n) * vocab].to_vec());
            at += n;
        }
        Ok(out)
    }

    /// A paged KV cache of `geometry` for this model (zeroed): the store of
    /// [`forward_paged`](Self::forward_paged).
    pub fn new_paged_kv(&self, geometry: KvGeometry) -> PagedKv {
        let c = &self.config.shape;
        let n = geometry.n_blocks * geometry.block_size * c.n_layers * c.kv_dim();
        PagedKv {
            n_layers: c.n_layers,
            kv_dim: c.kv_dim(),
            geometry,
            k: vec![0.0; n],
            v: vec![0.0; n],
        }
    }

    /// Runs one iteration's [`BatchPlan`] over a paged KV cache: each
    /// sequence's tokens at positions `start_pos..start_pos + tokens.len()`,
    /// their K and V written into the blocks its block table names (block
    /// `i` holds positions `i * block_size..(i + 1) * block_size`), attention
    /// over positions `0..=pos` read back through the same table. Returns the
    /// logits after the last token of every sequence whose `sample` flag is
    /// set (`[vocab]` each, plan order).
    ///
    /// The arithmetic is [`forward`](Self::forward)'s, row for row (the same
    /// code, only the KV store differs): a sequence run through block tables
    /// gets the same bits as in its own contiguous [`Sequence`], whatever the
    /// plan packs beside it and however its prompt is chunked. Positions
    /// before `start_pos` must have been written by earlier plans through the
    /// same table (the serving side's ledger owns the tables; the model
    /// cannot tell stale blocks from written ones).
    ///
    /// # Errors
    /// [`ForwardError`] naming the sequence (`chunk` = its index in the plan)
    /// for an empty sequence, a token outside the vocabulary, positions past
    /// the context length, a block table that does not cover the positions
    /// run or names a block outside the cache, or a cache made for another
    /// model shape. Nothing ran and no block changed then.
    pub fn forward_paged(
        &self,
        kv: &mut PagedKv,
        plan: &BatchPlan,
    ) -> Result<Vec<Vec<f32>>, ForwardError> {
        let c = self.config.shape;
        if kv.n_layers != c.n_layers || kv.kv_dim != c.kv_dim() {
            return Err(ForwardError::ForeignCache);
        }
        let bs = kv.geometry.block_size;
        for (i, s) in plan.seqs.iter().enumerate() {
            self.check_chunk(i, &s.tokens, s.start_pos)?;
            let end = s.start_pos + s.tokens.len();
            let needed = end.div_ceil(bs);
            if s.block_table.len() < needed {
                return Err(ForwardError::BlockTable {
                    chunk: i,
                    positions: end,
                    blocks: s.block_table.len(),
                    block_size: bs,
                });
            }
            if let Some(&b) = s.block_table[..needed]
                .iter()
                .find(|&&b| b as usize >= kv.geometry.n_blocks)
            {
                return Err(ForwardError::Block {
                    chunk: i,
                    block: b,
                    n_blocks: kv.geometry.n_blocks,
                });
            }
        }
        let rows: Vec<(usize, usize)> = plan
            .seqs
            .iter()
            .enumerate()
            .flat_map(|(i, s)| (0..s.tokens.len()).map(move |j| (i, s.start_pos + j)))
            .collect();
        let tokens: Vec<u32> = plan.seqs.iter().flat_map(|s| &s.tokens).copied().collect();
        let mut want = Vec::new();
        let mut r = 0;
        for s in &plan.seqs {
            r += s.tokens.len();
            if s.sample {
                want.push(r - 1);
            }
        }
        let mut store = PagedStore {
            kv,
            plan,
            rows: &rows,
        };
        let logits = self.run_rows(&tokens, &rows, &want, &mut store)?;
        let vocab = c.vocab_size;
        Ok(logits.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
    }

    /// The checks every chunk passes before anything runs: tokens present,
    /// in the vocabulary, and within the context after `len` cached
    /// positions.
    fn check_chunk(&self, i: usize, tokens: &[u32], len: usize) -> Result<(), ForwardError> {
        let c = &self.config.shape;
        if tokens.is_empty() {
            return Err(ForwardError::Empty { chunk: i });
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(ForwardError::Token {
                chunk: i,
                token: t,
                vocab: c.vocab_size,
            });
        }
        if len.saturating_add(tokens.len()) > c.seq_len {
            return Err(ForwardError::ContextFull {
                chunk: i,
                len,
                adding: tokens.len(),
                max: c.seq_len,
            });
        }
        Ok(())
    }

    /// The forward pass proper, shared by [`forward`](Self::forward) and
    /// [`forward_paged`](Self::forward_paged): token row `r` is `tokens[r]`
    /// at `rows[r] = (sequence, position)`; K and V go to `store`, attention
    /// reads them back from it; returns the logits of the rows in `want`
    /// (`[want.len(), vocab]`). Callers have checked the rows.
    fn run_rows<S: KvStore>(
        &self,
        tokens: &[u32],
        rows: &[(usize, usize)],
        want: &[usize],
        store: &mut S,
    ) -> Result<Vec<f32>, ForwardError> {
        let c = self.config.shape;
        let (d, kvd, hd) = (c.dim, c.kv_dim(), c.hidden_dim);
        let m = rows.len();
        let embd = self.q(&self.token_embd);
        let mut x = vec![0f32; m * d];
        for (xr, &t) in x.chunks_exact_mut(d).zip(tokens) {
            embd.dequantize_row(t as usize, xr);
        }
        let mut xb = vec![0f32; m * d];
        let (mut q, mut att, mut tmp) = (vec![0f32; m * d], vec![0f32; m * d], vec![0f32; m * d]);
        let (mut k, mut v) = (vec![0f32; m * kvd], vec![0f32; m * kvd]);
        let (mut g, mut u) = (vec![0f32; m * hd], vec![0f32; m * hd]);
        for (li, layer) in self.layers.iter().enumerate() {
            self.rmsnorm_rows(&mut xb, &x, &layer.attn_norm);
            qmatmul::matmul(&self.q(&layer.wq), &xb, m, &mut q);
            qmatmul::matmul(&self.q(&layer.wk), &xb, m, &mut k);
            qmatmul::matmul(&self.q(&layer.wv), &xb, m, &mut v);
            for (r, &(_, pos)) in rows.iter().enumerate() {
                self.rope(&mut q[r * d..(r + 1) * d], pos);
                self.rope(&mut k[r * kvd..(r + 1) * kvd], pos);
            }
            store.store(li, &k, &v);
            let st: &S = store;
            let attend = |(r, out): (usize, &mut [f32])| {
                let (si, pos) = rows[r];
                self.attention(out, &q[r * d..(r + 1) * d], st, si, li, pos);
            };
            if m > 1 {
                att.par_chunks_mut(d).enumerate().for_each(attend);
            } else {
                att.chunks_mut(d).enumerate().for_each(attend);
            }
            qmatmul::matmul(&self.q(&layer.wo), &att, m, &mut tmp);
            x.iter_mut().zip(&tmp).for_each(|(a, b)| *a += b);
            self.rmsnorm_rows(&mut xb, &x, &layer.ffn_norm);
            qmatmul::matmul(&self.q(&layer.gate), &xb, m, &mut g);
            qmatmul::matmul(&self.q(&layer.up), &xb, m, &mut u);
            for (a, b) in g.iter_mut().zip(&u) {
                *a = *a / (1.0 + (-*a).exp()) * b;
            }
            qmatmul::matmul(&self.q(&layer.down), &g, m, &mut tmp);
            x.iter_mut().zip(&tmp).for_each(|(a, b)| *a += b);
        }
        let mut sel = vec![0f32; want.len() * d];
        for (o, &r) in sel.chunks_exact_mut(d).zip(want) {
            rmsnorm(
                o,
                &x[r * d..(r + 1) * d],
                &self.output_norm,
                self.config.rms_eps,
            );
        }
        let vocab = c.vocab_size;
        let mut logits = vec![0f32; want.len() * vocab];
        qmatmul::matmul(&self.q(&self.output), &sel, want.len(), &mut logits);
        Ok(logits)
    }

    fn rmsnorm_rows(&self, out: &mut [f32], x: &[f32], w: &[f32]) {
        let d = w.len();
        for (o, xr) in out.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
            rmsnorm(o, xr, w, self.config.rms_eps);
        }
    }

    /// RoPE at `pos` on every head of `v` (`[n * head_size]`).
    fn rope(&self, v: &mut [f32], pos: usize) {
        let hs = self.config.head_size();
        for (i, &f) in self.rope_freq.iter().enumerate() {
            let (s, c) = (pos as f32 * f).sin_cos();
            for head in v.chunks_exact_mut(hs) {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * c - b * s;
                head[2 * i + 1] = a * s + b * c;
            }
        }
    }

    /// Causal attention of one query row at `pos` over positions `0..=pos`
    /// of sequence `seq`'s layer `layer` in `kv`; `out` and `q` are `[dim]`.
    fn attention<S: KvStore>(
        &self,
        out: &mut [f32],
        q: &[f32],
        kv: &S,
        seq: usize,
        layer: usize,
        pos: usize,
    ) {
        let c = &self.config.shape;
        let hs = c.head_size();
        let group = c.n_heads / c.n_kv_heads;
        let scale = 1.0 / (hs as f32).sqrt();
        let mut att = vec![0f32; pos + 1];
        for h in 0..c.n_heads {
            let qh = &q[h * hs..(h + 1) * hs];
            let ko = (h / group) * hs;
            for (t, a) in att.iter_mut().enumerate() {
                *a = dot(qh, &kv.k(layer, seq, t)[ko..ko + hs]) * scale;
            }
            let max = att.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let mut sum = 0f32;
            for a in att.iter_mut() {
                *a = (*a - max).exp();
                sum += *a;
            }
            let inv = 1.0 / sum;
            let oh = &mut out[h * hs..(h + 1) * hs];
            oh.fill(0.0);
            for (t, a) in att.iter().enumerate() {
                let w = a * inv;
                for (o, vv) in oh.iter_mut().zip(&kv.v(layer, seq, t)[ko..ko + hs]) {
                    *o += w * vv;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
