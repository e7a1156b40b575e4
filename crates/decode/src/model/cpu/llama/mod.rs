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

use super::math::{dot, rmsnorm};
use super::qmatmul;
use crate::model::format::gguf::{GgmlType, Gguf, GgufWriter, TensorInfo, Value};
use crate::model::format::llama_config::LlamaConfig;
use crate::model::format::quant::{self, QMatrix};
use crate::model::{BatchPlan, KvGeometry, ModelError, Weights};

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

/// Which logits a [`Chunk`] wants back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None (a prefill chunk that does not end the prompt).
    None,
    /// After the chunk's last token (`[vocab]`).
    Last,
    /// After every token (`[tokens, vocab]`: scoring text).
    All,
}

/// One sequence's share of a [`Llama::forward`] call: tokens appended at
/// positions `seq.len()..seq.len() + tokens.len()`.
#[derive(Debug)]
pub struct Chunk<'a> {
    /// The sequence (its KV cache grows by `tokens.len()`).
    pub seq: &'a mut Sequence,
    /// Token ids, each `< vocab_size`, at least one.
    pub tokens: &'a [u32],
    /// The logits wanted back.
    pub logits: Logits,
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

/// One stream's KV cache (see the module documentation).
#[derive(Debug, Clone)]
pub struct Sequence {
    n_layers: usize,
    kv_dim: usize,
    max_len: usize,
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl Sequence {
    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Forgets positions `n..` (keeps a prefix to reuse; `n >= len` keeps all).
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
        for l in 0..self.n_layers {
            self.k[l].truncate(self.len * self.kv_dim);
            self.v[l].truncate(self.len * self.kv_dim);
        }
    }
    /// K of layer `layer` at position `pos`: `[kv_dim]`.
    ///
    /// # Panics
    /// If `layer` or `pos` is out of range.
    pub fn k_at(&self, layer: usize, pos: usize) -> &[f32] {
        assert!(pos < self.len);
        &self.k[layer][pos * self.kv_dim..(pos + 1) * self.kv_dim]
    }
    /// V of layer `layer` at position `pos`: `[kv_dim]`.
    ///
    /// # Panics
    /// If `layer` or `pos` is out of range.
    pub fn v_at(&self, layer: usize, pos: usize) -> &[f32] {
        assert!(pos < self.len);
        &self.v[layer][pos * self.kv_dim..(pos + 1) * self.kv_dim]
    }
}

/// A paged KV cache: per layer, K and V of `n_blocks * block_size`
/// positions (`[n_layers][n_blocks][block_size][kv_dim]` f32 each),
/// addressed through a plan's block tables ([`Llama::forward_paged`]); the
/// CPU counterpart of the Vulkan model's KV cache.
#[derive(Debug, Clone)]
pub struct PagedKv {
    n_layers: usize,
    kv_dim: usize,
    geometry: KvGeometry,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl PagedKv {
    /// The cache's geometry.
    pub fn geometry(&self) -> KvGeometry {
        self.geometry
    }

    /// Bytes of K and V held.
    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 4
    }

    /// Element offset of `(layer, block, slot within the block)`.
    fn at(&self, layer: usize, block: u32, slot: usize) -> usize {
        let positions = self.geometry.n_blocks * self.geometry.block_size;
        (layer * positions + block as usize * self.geometry.block_size + slot) * self.kv_dim
    }
}

/// Where a forward pass's K and V rows go and are read back from: the
/// contiguous per-sequence caches of [`Llama::forward`] or the paged cache
/// of [`Llama::forward_paged`]. Everything else of the pass is shared.
trait KvStore: Sync {
    /// Stores layer `layer`'s K and V of every row of the pass (`[rows,
    /// kv_dim]` each, rows in pass order).
    fn store(&mut self, layer: usize, k: &[f32], v: &[f32]);
    /// K of sequence `seq` (its index in the pass) at `pos` in `layer`: `[kv_dim]`.
    fn k(&self, layer: usize, seq: usize, pos: usize) -> &[f32];
    /// V, as [`KvStore::k`].
    fn v(&self, layer: usize, seq: usize, pos: usize) -> &[f32];
}

/// [`KvStore`] over the chunks' own sequences (appended in chunk order).
struct SeqStore<'s, 'c> {
    chunks: &'s mut [Chunk<'c>],
}

impl KvStore for SeqStore<'_, '_> {
    fn store(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let mut r = 0;
        for ch in self.chunks.iter_mut() {
            let kvd = ch.seq.kv_dim;
            let n = ch.tokens.len();
            ch.seq.k[layer].extend_from_slice(&k[r * kvd..(r + n) * kvd]);
            ch.seq.v[layer].extend_from_slice(&v[r * kvd..(r + n) * kvd]);
            r += n;
        }
    }
    fn k(&self, layer: usize, seq: usize, pos: usize) -> &[f32] {
        let s = &self.chunks[seq].seq;
        &s.k[layer][pos * s.kv_dim..(pos + 1) * s.kv_dim]
    }
    fn v(&self, layer: usize, seq: usize, pos: usize) -> &[f32] {
        let s = &self.chunks[seq].seq;
        &s.v[layer][pos * s.kv_dim..(pos + 1) * s.kv_dim]
    }
}

/// [`KvStore`] over a [`PagedKv`] through a plan's block tables.
struct PagedStore<'a> {
    kv: &'a mut PagedKv,
    plan: &'a BatchPlan,
    rows: &'a [(usize, usize)],
}

impl PagedStore<'_> {
    fn offset(&self, layer: usize, seq: usize, pos: usize) -> usize {
        let bs = self.kv.geometry.block_size;
        let block = self.plan.seqs[seq].block_table[pos / bs];
        self.kv.at(layer, block, pos % bs)
    }
}

impl KvStore for PagedStore<'_> {
    fn store(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let kvd = self.kv.kv_dim;
        for (r, &(seq, pos)) in self.rows.iter().enumerate() {
            let at = self.offset(layer, seq, pos);
            self.kv.k[at..at + kvd].copy_from_slice(&k[r * kvd..(r + 1) * kvd]);
            self.kv.v[at..at + kvd].copy_from_slice(&v[r * kvd..(r + 1) * kvd]);
        }
    }
    fn k(&self, layer: usize, seq: usize, pos: usize) -> &[f32] {
        let at = self.offset(layer, seq, pos);
        &self.kv.k[at..at + self.kv.kv_dim]
    }
    fn v(&self, layer: usize, seq: usize, pos: usize) -> &[f32] {
        let at = self.offset(layer, seq, pos);
        &self.kv.v[at..at + self.kv.kv_dim]
    }
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
    /// [`crate::model::format::gguf::GgufError::MissingTensor`]; [`ModelError::Shape`] for a
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

/// A GGUF llama file holding `w` (llama2.c-order f32 weights) with its
/// matrices in `ty`, RoPE base `rope_base`, epsilon 1e-5; untied
/// (`output.weight` is `w.wcls`) unless `tied`, which writes no
/// `output.weight` (the LM head is then the embedding table). No tokenizer
/// keys. For tests and tools: a small model without the real file.
///
/// # Panics
/// If `w`'s dims are not multiples of 32 (the block formats need it for
/// quantized types).
pub fn gguf_from_weights(w: &Weights, ty: GgmlType, rope_base: f32, tied: bool) -> GgufWriter {
    let c = &w.config;
    let (l, d, kv, h, v) = (c.n_layers, c.dim, c.kv_dim(), c.hidden_dim, c.vocab_size);
    let u = |x: usize| Value::U32(x as u32);
    let mut g = GgufWriter::new();
    g.kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", u(l))
        .kv("llama.context_length", u(c.seq_len))
        .kv("llama.embedding_length", u(d))
        .kv("llama.feed_forward_length", u(h))
        .kv("llama.attention.head_count", u(c.n_heads))
        .kv("llama.attention.head_count_kv", u(c.n_kv_heads))
        .kv("llama.rope.freq_base", Value::F32(rope_base))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .kv("llama.vocab_size", u(v));
    let f32s = |x: &[f32]| quant::quantize(GgmlType::F32, x);
    let mat = |g: &mut GgufWriter, name: &str, x: &[f32], rows: usize, cols: usize| {
        g.tensor(
            name,
            &[cols as u64, rows as u64],
            ty,
            quant::quantize(ty, x),
        );
    };
    mat(&mut g, "token_embd.weight", &w.token_embedding, v, d);
    for i in 0..l {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        g.tensor(
            &n("attn_norm"),
            &[d as u64],
            GgmlType::F32,
            f32s(&w.rms_att[i * d..(i + 1) * d]),
        );
        mat(
            &mut g,
            &n("attn_q"),
            &w.wq[i * d * d..(i + 1) * d * d],
            d,
            d,
        );
        mat(
            &mut g,
            &n("attn_k"),
            &w.wk[i * kv * d..(i + 1) * kv * d],
            kv,
            d,
        );
        mat(
            &mut g,
            &n("attn_v"),
            &w.wv[i * kv * d..(i + 1) * kv * d],
            kv,
            d,
        );
        mat(
            &mut g,
            &n("attn_output"),
            &w.wo[i * d * d..(i + 1) * d * d],
            d,
            d,
        );
        g.tensor(
            &n("ffn_norm"),
            &[d as u64],
            GgmlType::F32,
            f32s(&w.rms_ffn[i * d..(i + 1) * d]),
        );
        mat(
            &mut g,
            &n("ffn_gate"),
            &w.w1[i * h * d..(i + 1) * h * d],
            h,
            d,
        );
        mat(
            &mut g,
            &n("ffn_up"),
            &w.w3[i * h * d..(i + 1) * h * d],
            h,
            d,
        );
        mat(
            &mut g,
            &n("ffn_down"),
            &w.w2[i * d * h..(i + 1) * d * h],
            d,
            h,
        );
    }
    g.tensor(
        "output_norm.weight",
        &[d as u64],
        GgmlType::F32,
        f32s(&w.rms_final),
    );
    if !tied {
        mat(&mut g, "output.weight", &w.wcls, v, d);
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::f32_model::{self, CpuKvCache};
    use crate::model::{Config, SeqWork};

    fn tiny(ty: GgmlType, tied: bool) -> (Weights, Llama) {
        let w = Weights::synthetic(Config::tiny(), 7);
        let g = gguf_from_weights(&w, ty, 10000.0, tied);
        (
            w,
            Llama::from_gguf(Gguf::from_bytes(g.to_bytes()).unwrap()).unwrap(),
        )
    }

    /// The GGUF model in F32 against the independent llama2.c-order
    /// reference (`decode::model::cpu::f32_model`, rope base 10000) on the same weights.
    #[test]
    fn f32_model_matches_the_llama2c_reference() {
        let (w, model) = tiny(GgmlType::F32, false);
        assert!(!model.config().tied_output);
        let geo = KvGeometry {
            block_size: 8,
            n_blocks: 4,
        };
        let mut cache = CpuKvCache::new(&w.config, geo);
        let bt = [0u32, 1, 2, 3];
        let mut seq = model.new_sequence();
        for (pos, &t) in [3u32, 77, 500, 9, 9, 140].iter().enumerate() {
            let want = f32_model::forward_token(&w, &mut cache, &bt, t, pos);
            let got = model
                .forward(&mut [Chunk {
                    seq: &mut seq,
                    tokens: &[t],
                    logits: Logits::Last,
                }])
                .unwrap()
                .remove(0);
            let err = want
                .iter()
                .zip(&got)
                .fold(0f32, |a, (p, q)| a.max((p - q).abs()));
            let scale = want.iter().fold(0f32, |a, p| a.max(p.abs()));
            assert!(
                err <= 1e-4 * scale.max(1.0),
                "pos {pos}: max error {err} (logit scale {scale})"
            );
        }
    }

    #[test]
    fn batched_chunked_and_alone_are_bit_identical() {
        let (_, model) = tiny(GgmlType::Q4_1, true);
        let prompts: [&[u32]; 3] = [&[1, 2, 3, 4, 5], &[9, 8], &[400, 401, 402]];
        // Alone, token by token.
        let mut alone = vec![];
        for p in prompts {
            let mut seq = model.new_sequence();
            let mut last = vec![];
            for t in p {
                last = model
                    .forward(&mut [Chunk {
                        seq: &mut seq,
                        tokens: &[*t],
                        logits: Logits::Last,
                    }])
                    .unwrap()
                    .remove(0);
            }
            alone.push(last);
        }
        // Together, each prompt as one chunk.
        let mut seqs: Vec<Sequence> = prompts.iter().map(|_| model.new_sequence()).collect();
        let mut chunks: Vec<Chunk> = seqs
            .iter_mut()
            .zip(prompts)
            .map(|(seq, tokens)| Chunk {
                seq,
                tokens,
                logits: Logits::Last,
            })
            .collect();
        let together = model.forward(&mut chunks).unwrap();
        let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (a, b) in alone.iter().zip(&together) {
            assert_eq!(bits(a), bits(b));
        }
        assert!(seqs.iter().zip(prompts).all(|(s, p)| s.len() == p.len()));
    }

    /// The paged pass over a mixed schedule (members joining and leaving,
    /// prompts in chunks of 3 beside decode rows, scattered block tables
    /// interleaved in the cache) gives every sequence the bits of the
    /// contiguous pass, and the same greedy tokens.
    #[test]
    fn paged_and_contiguous_passes_are_bit_identical() {
        let (_, model) = tiny(GgmlType::Q4_1, true);
        let geo = KvGeometry {
            block_size: 4,
            n_blocks: 40,
        };
        let mut paged = model.new_paged_kv(geo);
        let prompts: [&[u32]; 4] = [
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            &[9, 8],
            &[400, 401, 402, 403, 404],
            &[7],
        ];
        let join = [0, 0, 2, 3];
        let n_gen = [6, 9, 4, 5];
        let tables: Vec<Vec<u32>> = (0..4)
            .map(|i| (0..10).rev().map(|j| (j * 4 + i) as u32).collect())
            .collect();
        let mut seqs: Vec<Sequence> = (0..4).map(|_| model.new_sequence()).collect();
        let mut fed = [0usize; 4];
        let mut out: Vec<Vec<u32>> = vec![vec![]; 4];
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut it = 0;
        let mut mixed = false;
        while (0..4).any(|i| out[i].len() < n_gen[i]) {
            let active: Vec<usize> = (0..4)
                .filter(|&i| join[i] <= it && out[i].len() < n_gen[i])
                .collect();
            let work: Vec<(usize, Vec<u32>, bool)> = active
                .iter()
                .map(|&i| {
                    if fed[i] < prompts[i].len() {
                        let end = (fed[i] + 3).min(prompts[i].len());
                        (i, prompts[i][fed[i]..end].to_vec(), end == prompts[i].len())
                    } else {
                        (i, vec![*out[i].last().unwrap()], true)
                    }
                })
                .collect();
            mixed |= work.iter().any(|w| w.1.len() > 1) && work.iter().any(|w| w.1.len() == 1);
            let plan = BatchPlan {
                seqs: work
                    .iter()
                    .map(|(i, t, sample)| SeqWork {
                        tokens: t.clone(),
                        start_pos: seqs[*i].len(),
                        block_table: tables[*i].clone(),
                        sample: *sample,
                    })
                    .collect(),
            };
            let got = model.forward_paged(&mut paged, &plan).unwrap();
            let mut k = 0;
            for (i, t, sample) in &work {
                let want = model
                    .forward(&mut [Chunk {
                        seq: &mut seqs[*i],
                        tokens: t,
                        logits: if *sample { Logits::Last } else { Logits::None },
                    }])
                    .unwrap()
                    .remove(0);
                if *sample {
                    assert_eq!(bits(&got[k]), bits(&want), "iteration {it}, sequence {i}");
                    out[*i].push(crate::model::text::sampling::argmax(&want));
                    k += 1;
                }
                if fed[*i] < prompts[*i].len() {
                    fed[*i] += t.len();
                }
            }
            assert_eq!(k, got.len());
            it += 1;
        }
        assert!(mixed, "the schedule mixes prefill chunks and decode rows");
    }

    #[test]
    fn bad_plans_are_refused_by_the_paged_pass_and_change_nothing() {
        let (_, model) = tiny(GgmlType::Q8_0, false);
        let geo = KvGeometry {
            block_size: 4,
            n_blocks: 3,
        };
        let mut kv = model.new_paged_kv(geo);
        let plan = |tokens: Vec<u32>, start_pos, block_table: Vec<u32>| BatchPlan {
            seqs: vec![
                SeqWork {
                    tokens: vec![1],
                    start_pos: 0,
                    block_table: vec![0],
                    sample: true,
                },
                SeqWork {
                    tokens,
                    start_pos,
                    block_table,
                    sample: true,
                },
            ],
        };
        let mut run = |p: BatchPlan| model.forward_paged(&mut kv, &p).map(|_| ());
        assert_eq!(
            run(plan(vec![], 0, vec![1])),
            Err(ForwardError::Empty { chunk: 1 })
        );
        assert_eq!(
            run(plan(vec![600], 0, vec![1])),
            Err(ForwardError::Token {
                chunk: 1,
                token: 600,
                vocab: 512
            })
        );
        assert!(matches!(
            run(plan(vec![1, 2], 255, vec![1; 64])),
            Err(ForwardError::ContextFull {
                chunk: 1,
                len: 255,
                adding: 2,
                max: 256
            })
        ));
        let e = run(plan(vec![1, 2, 3], 3, vec![1])).unwrap_err();
        assert_eq!(
            e,
            ForwardError::BlockTable {
                chunk: 1,
                positions: 6,
                blocks: 1,
                block_size: 4
            }
        );
        assert!(e.to_string().contains("need 2 blocks"), "{e}");
        assert_eq!(
            run(plan(vec![1], 4, vec![1, 3])),
            Err(ForwardError::Block {
                chunk: 1,
                block: 3,
                n_blocks: 3
            })
        );
        assert!(
            kv.k.iter().chain(&kv.v).all(|&x| x == 0.0),
            "nothing written"
        );
        let mut foreign = model.new_paged_kv(geo);
        foreign.kv_dim = 1;
        assert_eq!(
            model.forward_paged(&mut foreign, &plan(vec![1], 0, vec![1])),
            Err(ForwardError::ForeignCache)
        );
    }

    /// A quantized model against the F32 model of its own dequantized
    /// weights: the same function, so only rounding order may differ.
    #[test]
    fn quantized_kernels_compute_the_dequantized_model() {
        let w = Weights::synthetic(Config::tiny(), 7);
        for ty in [
            GgmlType::F16,
            GgmlType::Q8_0,
            GgmlType::Q4_1,
            GgmlType::Q4_0,
        ] {
            let deq = |x: &[f32]| {
                let mut out = vec![0f32; x.len()];
                quant::dequantize(ty, &quant::quantize(ty, x), &mut out);
                out
            };
            let wd = Weights {
                token_embedding: deq(&w.token_embedding),
                wq: deq(&w.wq),
                wk: deq(&w.wk),
                wv: deq(&w.wv),
                wo: deq(&w.wo),
                w1: deq(&w.w1),
                w2: deq(&w.w2),
                w3: deq(&w.w3),
                wcls: deq(&w.wcls),
                ..w.clone()
            };
            let load = |w: &Weights, ty| {
                let g = gguf_from_weights(w, ty, 10000.0, false);
                Llama::from_gguf(Gguf::from_bytes(g.to_bytes()).unwrap()).unwrap()
            };
            let run = |m: &Llama| {
                let mut seq = m.new_sequence();
                m.forward(&mut [Chunk {
                    seq: &mut seq,
                    tokens: &[5, 6, 7, 300],
                    logits: Logits::All,
                }])
                .unwrap()
                .remove(0)
            };
            let (a, b) = (run(&load(&wd, GgmlType::F32)), run(&load(&w, ty)));
            let err = a
                .iter()
                .zip(&b)
                .map(|(p, q)| (p - q).abs())
                .fold(0f32, f32::max);
            let scale = a.iter().fold(0f32, |m, p| m.max(p.abs()));
            assert!(
                err <= 1e-4 * scale.max(1.0),
                "{ty}: max logit difference {err} (scale {scale})"
            );
        }
    }

    #[test]
    fn bad_chunks_are_refused_and_change_nothing() {
        let (_, model) = tiny(GgmlType::Q8_0, true);
        let mut seq = model.new_sequence();
        let run = |tokens: &[u32], seq: &mut Sequence| {
            model
                .forward(&mut [Chunk {
                    seq,
                    tokens,
                    logits: Logits::Last,
                }])
                .map(|_| ())
        };
        assert_eq!(run(&[], &mut seq), Err(ForwardError::Empty { chunk: 0 }));
        assert_eq!(
            run(&[1, 512], &mut seq),
            Err(ForwardError::Token {
                chunk: 0,
                token: 512,
                vocab: 512
            })
        );
        let long = vec![1u32; 257];
        assert!(matches!(
            run(&long, &mut seq),
            Err(ForwardError::ContextFull { max: 256, .. })
        ));
        assert_eq!(seq.len(), 0);
        let mut other = Sequence {
            kv_dim: 1,
            ..model.new_sequence()
        };
        assert_eq!(
            run(&[1], &mut other),
            Err(ForwardError::ForeignSequence { chunk: 0 })
        );
    }
}
