//! `xtc-model`: the llama-style decoder — its formats, shape
//! and weights, its CPU references, its tokenizers and sampling, the models
//! on a Vulkan device — and the models that implement [`Model`],
//! opened through ONE front door, [`open::open`] (and [`open::open_stream`] for one
//! sequence with logits).
//!
//! # One folder per concern
//! - [`format`](mod@format): the files a model is read from. GGUF ([`format::gguf`]:
//!   header, metadata, tensor table, mapped tensor bytes with no copy, and a
//!   writer for tests), its block formats ([`format::quant`]: F32, F16,
//!   Q4_0, Q4_1, Q8_0), the llama configuration in its metadata
//!   ([`format::llama_config`]), and the llama2.c checkpoint and
//!   `tokenizer.bin` ([`format::checkpoint`], [`format::tokenizer`]).
//! - [`text`]: the GPT-2 byte-level BPE of a GGUF model ([`text::bpe`]), the
//!   ChatML template ([`text::chat`]), sampling ([`text::sampling`]).
//! - [`cpu`]: the CPU references, the oracles of the Vulkan kernels and
//!   `--device cpu`: the GGUF model's quantized forward pass
//!   ([`cpu::llama`], over its quantized product [`cpu::qmatmul`]), the f32
//!   llama2.c-order one ([`cpu::f32_model`]) and the arithmetic they share
//!   ([`cpu::math`]). `cpu/` never imports `vulkan/` (`tests/layout.rs`).
//! - [`vulkan`]: what both Vulkan models share (an iteration in flight,
//!   the activation layout), the kernels' push constants ([`vulkan::ops`],
//!   [`vulkan::qops`]), the texel stream ([`vulkan::qweights`]), the f32
//!   model ([`vulkan::f32_model::GpuModel`]) and the GGUF model
//!   ([`vulkan::llama::GpuLlama`]).
//! - [`adapters`]: ONE adapter per device kind, [`adapters::CpuModel`] and
//!   [`adapters::VulkanModel`], generic over the model they drive, and the
//!   device-free [`adapters::ToyModel`].
//! - [`mod@open`]: the front door, [`open::ModelSpec`] on an
//!   [`open::Target`] within [`open::Limits`]; [`stream`]: one sequence on either device (`xtc generate`,
//!   `xtc perplexity`, and [`stream::nll`]); [`generate`]: the
//!   prefill/decode loop of one stream and its timings.
//! - [`join`]: the trait every driver speaks, [`Model`], with
//!   [`Completion`] and [`DeviceError`].
//! - This file: [`Config`], [`Weights`] (seeded synthetic weights,
//!   [`Config::tiny`]), [`BatchPlan`] / [`SeqWork`] (the plan a driver
//!   hands [`Model`]), [`KvGeometry`], [`ModelError`] and where
//!   the model file is found ([`find_model`]).
//!
//! # Two families, and why the f32 one keeps its own files
//! The f32 model (`--synthetic`, llama2.c checkpoints: [`Weights`], every
//! matrix row-major `[out, in]` f32) and the GGUF model (SmolLM2-135M-Instruct
//! in Q4_1, the default) share the folders above, not their files: the f32
//! model has its own reference ([`cpu::f32_model`]) and Vulkan model
//! ([`vulkan::f32_model`]). It could run as an F32 GGUF through the GGUF
//! code ([`cpu::llama::gguf_from_weights`] already writes one, and the tests
//! run it there), which would retire about 1.5k lines and `matmul.wgsl`.
//! It is kept because it is the independent oracle: the GGUF model's CPU
//! reference is checked against it (`cpu/llama/tests.rs`), the f32 Vulkan
//! kernels against it, and the engine's own tests and measurements
//! (`--synthetic`, `--device toy`) need no model file and no GGUF code.
//! One reference checking another written the same way would check nothing.
//!
//! # Import rule
//! `xtc_vk` and `xtc::Error` / `xtc::Result`; never `xtc::batch`,
//! `xtc::rt`, `xtc::accel` or `xtc_dispatch` (`tests/layout.rs`), and
//! the crates that drive a model (`xtc-kvbatch`, `xtc-replay`, `xtc-serve`)
//! are above it. A model knows nothing of batching: it runs the
//! plan it is handed, and its KV cache is addressed through the plan's
//! block tables, which the serving core's ledger owns. Inside, the folders
//! import downward: `format/` and `text/` nothing above them, `cpu/` not
//! `vulkan/`, and no two files import each other.
//!
//! # Invariants
//! - A plan is checked before any kernel or host loop reads through it
//!   ([`BatchPlan::validate`]: tokens in the vocabulary, positions below
//!   `seq_len`, block tables covering every position, block ids in the
//!   cache).
//! - Nothing is trusted from a GGUF file before it is bounded: every count,
//!   offset and shape is checked ([`format::gguf::GgufError`], [`ModelError`]
//!   name the key or tensor at fault) before a byte is read or allocated.
//! - The weights stay in their file format in the mapped file; no f32 copy
//!   of a matrix is ever made (only the RMSNorm vectors are decoded).
//! - The CPU references' arithmetic is defined to the bit: the same result
//!   for any thread count and any batch of sequences a row is computed in.
//! - Each Vulkan model is checked against its CPU reference on the same
//!   plans (`crates/cli/tests/vk_decode.rs`, `crates/model/tests/vk_llama.rs`),
//!   and served, against [`adapters::reference_greedy`]
//!   (`crates/replay/tests/decode_models.rs`, `decode_llama.rs`).

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod adapters;
pub mod cost;
pub mod cpu;
pub mod format;
pub mod generate;
pub mod open;
pub mod stream;
pub mod text;
pub mod vulkan;

pub mod join;
pub use join::{Completion, DeviceError, Model};

use std::path::{Path, PathBuf};

/// File name of the model the fetch script downloads.
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The script (relative to the repository root) that fetches [`MODEL_FILE`]
/// into [`default_model_path`]'s directory, checking its sha256; idempotent.
pub const FETCH_SCRIPT: &str = "scripts/fetch-model.sh";

/// Why a GGUF model could not be found or loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// No file at the path (the default one, or the one given).
    #[error(
        "model file {path} not found: run {FETCH_SCRIPT} to fetch SmolLM2-135M-Instruct (Q4_1), or pass --model PATH"
    )]
    NotFound {
        /// The path looked at.
        path: String,
    },
    /// The file is not a GGUF file xtc can read.
    #[error(transparent)]
    Gguf(format::gguf::GgufError),
    /// A metadata value the model or the kernels cannot run.
    #[error("model config: GGUF key `{field}` = {value}: {why}")]
    Config {
        /// The GGUF key.
        field: String,
        /// Its value as read.
        value: String,
        /// What is wrong.
        why: String,
    },
    /// A tensor whose shape disagrees with the config.
    #[error("GGUF tensor `{tensor}` has shape {found:?}, the config implies {expected:?}")]
    Shape {
        /// The tensor.
        tensor: String,
        /// The dimensions the config implies (`ne[0]` first).
        expected: Vec<u64>,
        /// The dimensions in the file.
        found: Vec<u64>,
    },
    /// A tensor of a type its role does not allow (a norm vector must be F32 or F16).
    #[error("GGUF tensor `{tensor}` has type {ty}: {why}")]
    TensorType {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: format::gguf::GgmlType,
        /// What the role needs.
        why: &'static str,
    },
    /// Tokenizer metadata that cannot make a tokenizer.
    #[error("tokenizer: GGUF key `{key}`: {why}")]
    Tokenizer {
        /// The key at fault (with an index for an array element).
        key: String,
        /// What is wrong.
        why: String,
    },
}

/// `${XDG_CACHE_HOME:-$HOME/.cache}/xtc`, the fetch script's directory (the
/// shell rule: an empty `XDG_CACHE_HOME` counts as unset); `None` when
/// neither variable is set.
pub fn cache_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache"),
    };
    Some(base.join("xtc"))
}

/// Where the fetch script puts the model: [`cache_dir`]`/`[`MODEL_FILE`].
pub fn default_model_path() -> Option<PathBuf> {
    cache_dir().map(|d| d.join(MODEL_FILE))
}

/// The model to load: `explicit` if given, else [`default_model_path`]; the
/// single place the model path is looked up (the CLI and the tests use it).
///
/// # Errors
/// [`ModelError::NotFound`] (naming the path and [`FETCH_SCRIPT`]) when no
/// file is there.
pub fn find_model(explicit: Option<&Path>) -> Result<PathBuf, ModelError> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => default_model_path().ok_or_else(|| ModelError::NotFound {
            path: format!(
                "$XDG_CACHE_HOME or $HOME/.cache/xtc/{MODEL_FILE} (neither variable is set)"
            ),
        })?,
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(ModelError::NotFound {
            path: path.display().to_string(),
        })
    }
}

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

impl Config {
    /// The default synthetic model: small enough that lavapipe on 2 cores runs
    /// a 32-token decode iteration in a few ms (dim 64, hidden 192, 4 layers,
    /// 4 query heads of 16 over 2 KV heads, vocab 512, 256 positions). About
    /// 0.46 MFLOP per token.
    pub fn tiny() -> Config {
        Config {
            dim: 64,
            hidden_dim: 192,
            n_layers: 4,
            n_heads: 4,
            n_kv_heads: 2,
            vocab_size: 512,
            seq_len: 256,
        }
    }

    /// The seven counts in llama2.c header order: `dim, hidden_dim,
    /// n_layers, n_heads, n_kv_heads, vocab_size, seq_len`.
    pub fn counts(&self) -> [usize; 7] {
        [
            self.dim,
            self.hidden_dim,
            self.n_layers,
            self.n_heads,
            self.n_kv_heads,
            self.vocab_size,
            self.seq_len,
        ]
    }

    /// Checks the shape: every count > 0, `n_heads` divides `dim`,
    /// `n_kv_heads` divides `n_heads`, an even `head_size` of at most 256
    /// (the attention kernel's limit), and element counts that fit `u32`.
    ///
    /// # Errors
    /// [`xtc::Error::Inval`] for any violation.
    pub fn validate(&self) -> xtc::Result<()> {
        let c = self;
        let ok = c.counts().iter().all(|&n| n > 0 && n < (1 << 24))
            && c.dim.is_multiple_of(c.n_heads)
            && c.n_heads.is_multiple_of(c.n_kv_heads)
            && c.head_size().is_multiple_of(2)
            && c.head_size() <= 256;
        if ok { Ok(()) } else { Err(xtc::Error::Inval) }
    }
}

impl Weights {
    /// Seeded synthetic weights (`fastrand`, never unseeded): matrices uniform
    /// in `±1/sqrt(in)`, the embedding uniform in `±1`, RMSNorm weights in
    /// `1 ± 0.1`; `wcls` is an independent matrix. Same seed, same weights.
    ///
    /// # Panics
    /// If `config` fails [`Config::validate`].
    pub fn synthetic(config: Config, seed: u64) -> Weights {
        config.validate().expect("valid config");
        let mut rng = fastrand::Rng::with_seed(seed);
        let c = &config;
        let (l, d, h, kv) = (c.n_layers, c.dim, c.hidden_dim, c.kv_dim());
        let mut uni = |n: usize, a: f32| -> Vec<f32> {
            (0..n).map(|_| (rng.f32() * 2.0 - 1.0) * a).collect()
        };
        let s = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
        Weights {
            token_embedding: uni(c.vocab_size * d, 1.0),
            rms_att: uni(l * d, 0.1).into_iter().map(|x| 1.0 + x).collect(),
            wq: uni(l * d * d, s(d)),
            wk: uni(l * kv * d, s(d)),
            wv: uni(l * kv * d, s(d)),
            wo: uni(l * d * d, s(d)),
            rms_ffn: uni(l * d, 0.1).into_iter().map(|x| 1.0 + x).collect(),
            w1: uni(l * h * d, s(d)),
            w2: uni(l * d * h, s(h)),
            w3: uni(l * h * d, s(d)),
            rms_final: uni(d, 0.1).into_iter().map(|x| 1.0 + x).collect(),
            wcls: uni(c.vocab_size * d, s(d) * 4.0),
            config,
        }
    }

    /// Checks the config and that every tensor has the length the config
    /// implies (a truncated or mismatched checkpoint is refused before any
    /// kernel could read past a tensor).
    ///
    /// # Errors
    /// [`xtc::Error::Inval`] for a bad config or a tensor of the wrong length.
    pub fn validate(&self) -> xtc::Result<()> {
        let c = &self.config;
        c.validate()?;
        let (l, d, kv, h, v) = (c.n_layers, c.dim, c.kv_dim(), c.hidden_dim, c.vocab_size);
        let want = [
            v * d,
            l * d,
            l * d * d,
            l * kv * d,
            l * kv * d,
            l * d * d,
            l * d,
            l * h * d,
            l * d * h,
            l * h * d,
            d,
            v * d,
        ];
        let ok = self
            .tensors()
            .iter()
            .zip(want)
            .all(|((_, t), n)| t.len() == n);
        if ok { Ok(()) } else { Err(xtc::Error::Inval) }
    }

    /// The tensors in llama2.c order with their names (for upload and checks).
    pub fn tensors(&self) -> [(&'static str, &[f32]); 12] {
        [
            ("token_embedding", &self.token_embedding),
            ("rms_att", &self.rms_att),
            ("wq", &self.wq),
            ("wk", &self.wk),
            ("wv", &self.wv),
            ("wo", &self.wo),
            ("rms_ffn", &self.rms_ffn),
            ("w1", &self.w1),
            ("w2", &self.w2),
            ("w3", &self.w3),
            ("rms_final", &self.rms_final),
            ("wcls", &self.wcls),
        ]
    }
}

/// Geometry of a paged KV cache: `n_blocks` blocks of `block_size` positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    /// Positions per block.
    pub block_size: usize,
    /// Blocks in the cache (block ids are `0..n_blocks`).
    pub n_blocks: usize,
}

impl BatchPlan {
    /// Checks the plan against the model and KV cache: every sequence has at
    /// least one token, every token `< vocab_size`, positions stay below
    /// `seq_len`, the block table covers every position run and names only
    /// blocks `< n_blocks`.
    ///
    /// # Errors
    /// [`xtc::Error::Inval`] for the first violation.
    pub fn validate(&self, config: &Config, kv: KvGeometry) -> xtc::Result<()> {
        for s in &self.seqs {
            let end = s
                .start_pos
                .checked_add(s.tokens.len())
                .ok_or(xtc::Error::Inval)?;
            let blocks_needed = end.div_ceil(kv.block_size.max(1));
            let ok = !s.tokens.is_empty()
                && kv.block_size > 0
                && end <= config.seq_len
                && s.tokens.iter().all(|&t| (t as usize) < config.vocab_size)
                && s.block_table.len() >= blocks_needed
                && s.block_table[..blocks_needed]
                    .iter()
                    .all(|&b| (b as usize) < kv.n_blocks);
            if !ok {
                return Err(xtc::Error::Inval);
            }
        }
        Ok(())
    }

    /// Number of sequences whose next token is sampled.
    pub fn n_samples(&self) -> usize {
        self.seqs.iter().filter(|s| s.sample).count()
    }
}
