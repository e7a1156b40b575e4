//! The llama-style decoder's configuration, weights and per-iteration work plan.
//!
//! Tensor layout follows llama2.c (Karpathy's `run.c`) so a user's own
//! checkpoint loads as-is: every matrix is row-major `[out, in]` f32 and a
//! matmul is `y[o] = sum_i W[o*in + i] * x[i]`.

/// Model shape: the seven header fields of a llama2.c checkpoint.
///
/// Units: counts of f32 elements / tokens. `head_size = dim / n_heads`,
/// `kv_dim = n_kv_heads * head_size`, grouped-query attention maps query head
/// `h` to KV head `h / (n_heads / n_kv_heads)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Config {
    /// Transformer width (`d_model`).
    pub dim: usize,
    /// Width of the SwiGLU hidden layer.
    pub hidden_dim: usize,
    /// Number of decoder layers.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (divides `n_heads`).
    pub n_kv_heads: usize,
    /// Vocabulary size (rows of the embedding table and the LM head).
    pub vocab_size: usize,
    /// Maximum sequence length (positions per sequence).
    pub seq_len: usize,
}

impl Config {
    /// `dim / n_heads`.
    pub fn head_size(&self) -> usize {
        self.dim / self.n_heads
    }
    /// `n_kv_heads * head_size`: width of one position's K (or V) in one layer.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_size()
    }
}

/// All weights, f32, in llama2.c order. Per-layer tensors are concatenated
/// over layers (`[n_layers, ...]`).
#[derive(Debug, Clone)]
pub struct Weights {
    /// The shape these tensors have.
    pub config: Config,
    /// `[vocab_size, dim]` token embedding table.
    pub token_embedding: Vec<f32>,
    /// `[n_layers, dim]` attention RMSNorm weights.
    pub rms_att: Vec<f32>,
    /// `[n_layers, dim (out), dim (in)]` query projection.
    pub wq: Vec<f32>,
    /// `[n_layers, kv_dim (out), dim (in)]` key projection.
    pub wk: Vec<f32>,
    /// `[n_layers, kv_dim (out), dim (in)]` value projection.
    pub wv: Vec<f32>,
    /// `[n_layers, dim (out), dim (in)]` attention output projection.
    pub wo: Vec<f32>,
    /// `[n_layers, dim]` FFN RMSNorm weights.
    pub rms_ffn: Vec<f32>,
    /// `[n_layers, hidden_dim (out), dim (in)]` gate projection (SwiGLU `w1`).
    pub w1: Vec<f32>,
    /// `[n_layers, dim (out), hidden_dim (in)]` down projection (`w2`).
    pub w2: Vec<f32>,
    /// `[n_layers, hidden_dim (out), dim (in)]` up projection (`w3`).
    pub w3: Vec<f32>,
    /// `[dim]` final RMSNorm weights.
    pub rms_final: Vec<f32>,
    /// `[vocab_size, dim]` LM head (a copy of `token_embedding` when shared).
    pub wcls: Vec<f32>,
}

/// One sequence's share of an iteration: a prefill chunk (several tokens) or a
/// single decode token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqWork {
    /// Token ids to run, at positions `start_pos..start_pos + tokens.len()`.
    pub tokens: Vec<u32>,
    /// Position of `tokens[0]` in the sequence (tokens before it are in the KV cache).
    pub start_pos: usize,
    /// KV-cache block ids of this sequence, in position order (block `i` holds
    /// positions `i*block_size..(i+1)*block_size`).
    pub block_table: Vec<u32>,
    /// Whether the next token after the last of `tokens` is to be sampled
    /// (false for a prefill chunk that does not end the prompt).
    pub sample: bool,
}

/// One iteration's packed work: the token rows of the whole ready vector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchPlan {
    /// Work per sequence, in ready-vector order.
    pub seqs: Vec<SeqWork>,
}

impl BatchPlan {
    /// Total token rows in the plan (the packed matmul's `M`).
    pub fn n_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }
}
