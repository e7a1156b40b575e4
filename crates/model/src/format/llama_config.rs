//! The llama model's configuration read from GGUF metadata
//! (`general.architecture = llama`, keys `llama.*`).
//!
//! Keys read, with their meaning and defaults (llama.cpp's):
//!
//! | key | field | default |
//! |---|---|---|
//! | `llama.block_count` | `n_layers` | required |
//! | `llama.embedding_length` | `dim` | required |
//! | `llama.feed_forward_length` | `hidden_dim` | required |
//! | `llama.attention.head_count` | `n_heads` | required |
//! | `llama.attention.head_count_kv` | `n_kv_heads` (grouped-query attention) | `n_heads` |
//! | `llama.context_length` | `seq_len` | required |
//! | `llama.vocab_size` | `vocab_size` | length of `tokenizer.ggml.tokens`, else rows of `token_embd.weight` |
//! | `llama.rope.freq_base` | [`LlamaConfig::rope_base`] | 10000 |
//! | `llama.attention.layer_norm_rms_epsilon` | [`LlamaConfig::rms_eps`] | required |
//!
//! The output head is tied ([`LlamaConfig::tied_output`]) when the file has
//! no `output.weight` tensor: the LM head is then `token_embd.weight`.
//!
//! A configuration the CPU reference and the kernels cannot run is refused
//! with [`ModelError::Config`] naming the key: another architecture; a
//! `dim` or `hidden_dim` that is not a multiple of 32 (the quantization
//! block); heads that do not divide `dim`, KV heads that do not divide the
//! heads; a head size that is odd or above 256; any count that is 0 or at
//! least 2^24; a RoPE base or epsilon that is not a finite positive number;
//! partial rotary embeddings (`llama.rope.dimension_count` other than the
//! head size), key/value lengths other than the head size, experts
//! (`llama.expert_count > 0`) and RoPE scaling other than `none`.

use crate::format::gguf::{Gguf, GgufError};
use crate::{Config, ModelError};

/// RoPE base when `llama.rope.freq_base` is absent.
pub const DEFAULT_ROPE_BASE: f32 = 10000.0;

/// Largest head size the kernels take (the attention kernel's limit).
pub const MAX_HEAD_SIZE: usize = 256;

/// A llama model's shape and constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaConfig {
    /// Counts: `dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
    /// seq_len` (the context length, positions per sequence).
    pub shape: Config,
    /// RoPE base θ: pair `i` of a head of size `hs` turns by
    /// `pos · θ^(−2i / hs)` radians.
    pub rope_base: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// The LM head is the token embedding table (no `output.weight`).
    pub tied_output: bool,
}

fn bad(field: &str, value: impl ToString, why: &str) -> ModelError {
    ModelError::Config {
        field: field.into(),
        value: value.to_string(),
        why: why.into(),
    }
}

impl LlamaConfig {
    /// Reads and checks the configuration of `g`.
    ///
    /// # Errors
    /// [`ModelError::Gguf`] with [`GgufError::MissingKey`] /
    /// [`GgufError::KeyType`] for a required key that is absent or of the
    /// wrong type; [`ModelError::Config`] naming the key of a value the
    /// kernels cannot run (module documentation).
    pub fn from_gguf(g: &Gguf) -> Result<LlamaConfig, ModelError> {
        let arch = g.str("general.architecture")?;
        if arch != "llama" {
            return Err(bad(
                "general.architecture",
                arch,
                "only the llama architecture is supported",
            ));
        }
        let key = |k: &str| format!("llama.{k}");
        let count = |k: &str| -> Result<usize, ModelError> {
            let v = g.u32(&key(k))? as usize;
            if v == 0 || v >= 1 << 24 {
                return Err(bad(&key(k), v, "must be between 1 and 2^24 - 1"));
            }
            Ok(v)
        };
        let optional = |k: &str| -> Result<Option<usize>, ModelError> {
            match g.get(&key(k)) {
                None => Ok(None),
                Some(_) => count(k).map(Some),
            }
        };
        let n_layers = count("block_count")?;
        let dim = count("embedding_length")?;
        let hidden_dim = count("feed_forward_length")?;
        let n_heads = count("attention.head_count")?;
        let n_kv_heads = optional("attention.head_count_kv")?.unwrap_or(n_heads);
        let seq_len = count("context_length")?;
        let vocab_size = match optional("vocab_size")? {
            Some(v) => v,
            None => match g.str_array("tokenizer.ggml.tokens") {
                Ok(t) => t.len(),
                Err(_) => g
                    .tensor("token_embd.weight")?
                    .dims
                    .get(1)
                    .copied()
                    .unwrap_or(0) as usize,
            },
        };
        if vocab_size == 0 || vocab_size >= 1 << 24 {
            return Err(bad(
                &key("vocab_size"),
                vocab_size,
                "must be between 1 and 2^24 - 1",
            ));
        }
        if !dim.is_multiple_of(32) {
            return Err(bad(
                &key("embedding_length"),
                dim,
                "must be a multiple of 32 (the quantization block)",
            ));
        }
        if !hidden_dim.is_multiple_of(32) {
            return Err(bad(
                &key("feed_forward_length"),
                hidden_dim,
                "must be a multiple of 32 (the quantization block)",
            ));
        }
        if !dim.is_multiple_of(n_heads) {
            return Err(bad(
                &key("attention.head_count"),
                n_heads,
                "must divide llama.embedding_length",
            ));
        }
        if !n_heads.is_multiple_of(n_kv_heads) {
            return Err(bad(
                &key("attention.head_count_kv"),
                n_kv_heads,
                "must divide llama.attention.head_count",
            ));
        }
        let head_size = dim / n_heads;
        if !head_size.is_multiple_of(2) || head_size > MAX_HEAD_SIZE {
            return Err(bad(
                &key("attention.head_count"),
                n_heads,
                &format!(
                    "gives a head size of {head_size}; it must be even and at most {MAX_HEAD_SIZE}"
                ),
            ));
        }
        for k in [
            "rope.dimension_count",
            "attention.key_length",
            "attention.value_length",
        ] {
            if let Some(v) = optional(k)?
                && v != head_size
            {
                return Err(bad(
                    &key(k),
                    v,
                    &format!("must equal the head size {head_size}"),
                ));
            }
        }
        if let Some(v) = g.get(&key("expert_count"))
            && v.as_i128() != Some(0)
        {
            return Err(bad(
                &key("expert_count"),
                v.describe(),
                "mixture-of-experts models are not supported",
            ));
        }
        match g.get(&key("rope.scaling.type")) {
            None => {}
            Some(_) => {
                let t = g.str(&key("rope.scaling.type"))?;
                if t != "none" {
                    return Err(bad(
                        &key("rope.scaling.type"),
                        t,
                        "RoPE scaling is not supported",
                    ));
                }
            }
        }
        let rope_base = match g.get(&key("rope.freq_base")) {
            None => DEFAULT_ROPE_BASE,
            Some(_) => g.f32(&key("rope.freq_base"))?,
        };
        if !(rope_base.is_finite() && rope_base > 0.0) {
            return Err(bad(
                &key("rope.freq_base"),
                rope_base,
                "must be a finite positive number",
            ));
        }
        let rms_eps = g.f32(&key("attention.layer_norm_rms_epsilon"))?;
        if !(rms_eps.is_finite() && rms_eps > 0.0 && rms_eps < 1.0) {
            return Err(bad(
                &key("attention.layer_norm_rms_epsilon"),
                rms_eps,
                "must be in (0, 1)",
            ));
        }
        let shape = Config {
            dim,
            hidden_dim,
            n_layers,
            n_heads,
            n_kv_heads,
            vocab_size,
            seq_len,
        };
        shape.validate().map_err(|_| {
            bad(
                "llama.*",
                format!("{shape:?}"),
                "the shape fails Config::validate",
            )
        })?;
        Ok(LlamaConfig {
            shape,
            rope_base,
            rms_eps,
            tied_output: g.find_tensor("output.weight").is_none(),
        })
    }

    /// `dim / n_heads`.
    pub fn head_size(&self) -> usize {
        self.shape.head_size()
    }
}

impl From<GgufError> for ModelError {
    fn from(e: GgufError) -> Self {
        ModelError::Gguf(e)
    }
}
