//! Where the CPU reference keeps K and V: one stream's contiguous cache
//! ([`Sequence`], fed by [`Chunk`]s) or a paged cache addressed through a
//! plan's block tables ([`PagedKv`]), both behind [`KvStore`] so the rest of
//! the pass is shared.

use crate::{BatchPlan, KvGeometry};

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

/// One sequence's share of a [`Llama::forward`](super::Llama::forward) call: tokens appended at
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

/// One stream's KV cache (see the module documentation).
#[derive(Debug, Clone)]
pub struct Sequence {
    pub(super) n_layers: usize,
    pub(super) kv_dim: usize,
    pub(super) max_len: usize,
    pub(super) len: usize,
    pub(super) k: Vec<Vec<f32>>,
    pub(super) v: Vec<Vec<f32>>,
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
/// addressed through a plan's block tables ([`Llama::forward_paged`](super::Llama::forward_paged)); the
/// CPU counterpart of the Vulkan model's KV cache.
#[derive(Debug, Clone)]
pub struct PagedKv {
    pub(super) n_layers: usize,
    pub(super) kv_dim: usize,
    pub(super) geometry: KvGeometry,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
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
    pub(super) fn at(&self, layer: usize, block: u32, slot: usize) -> usize {
        let positions = self.geometry.n_blocks * self.geometry.block_size;
        (layer * positions + block as usize * self.geometry.block_size + slot) * self.kv_dim
    }
}

/// Where a forward pass's K and V rows go and are read back from: the
/// contiguous per-sequence caches of [`Llama::forward`] or the paged cache
/// of [`Llama::forward_paged`]. Everything else of the pass is shared.
pub(super) trait KvStore: Sync {
    /// Stores layer `layer`'s K and V of every row of the pass (`[rows,
    /// kv_dim]` each, rows in pass order).
    fn store(&mut self, layer: usize, k: &[f32], v: &[f32]);
    /// K of sequence `seq` (its index in the pass) at `pos` in `layer`: `[kv_dim]`.
    fn k(&self, layer: usize, seq: usize, pos: usize) -> &[f32];
    /// V, as [`KvStore::k`].
    fn v(&self, layer: usize, seq: usize, pos: usize) -> &[f32];
}

/// [`KvStore`] over the chunks' own sequences (appended in chunk order).
pub(super) struct SeqStore<'s, 'c> {
    pub(super) chunks: &'s mut [Chunk<'c>],
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
pub(super) struct PagedStore<'a> {
    pub(super) kv: &'a mut PagedKv,
    pub(super) plan: &'a BatchPlan,
    pub(super) rows: &'a [(usize, usize)],
}

impl PagedStore<'_> {
    pub(super) fn offset(&self, layer: usize, seq: usize, pos: usize) -> usize {
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
