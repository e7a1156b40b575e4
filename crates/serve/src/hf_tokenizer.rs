//! The GGUF model's tokenizer as a Hugging Face tokenizer directory
//! (`tokenizer.json` + `tokenizer_config.json`), for clients that count or
//! synthesize tokens themselves (aiperf's `--tokenizer DIR`, the
//! `tokenizers` and `transformers` packages), offline.
//!
//! Written from the GGUF metadata the server's own tokenizer reads
//! (`tokenizer.ggml.tokens` in GPT-2's byte alphabet, `.merges` in rank
//! order, `.token_type`, `.pre`, `.bos_token_id`, `.eos_token_id`): a
//! byte-level BPE whose pre-tokenizer is `smollm`'s (digits one by one,
//! then the GPT-2 split) or GPT-2's, control and user-defined tokens as
//! added special tokens. `xtc tokenizer export DIR` writes it.

use std::path::Path;

use serde_json::{Value, json};

use xtc_model::format::gguf::{Gguf, GgufError};

/// A tokenizer the export cannot write, or a file it cannot write.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A metadata key is missing or of the wrong type.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// Not a byte-level BPE (`tokenizer.ggml.model` other than `gpt2`), or
    /// an unknown pre-tokenizer.
    #[error("{key}: {why}")]
    Unsupported {
        /// The metadata key.
        key: &'static str,
        /// What it holds.
        why: String,
    },
    /// Writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// `(tokenizer.json, tokenizer_config.json)` for the GGUF file `g`.
///
/// # Errors
/// [`ExportError`] for a tokenizer that is not a byte-level BPE.
pub fn export_json(g: &Gguf) -> Result<(Value, Value), ExportError> {
    let model = g.str("tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(ExportError::Unsupported {
            key: "tokenizer.ggml.model",
            why: format!("{model:?}: only gpt2 (byte-level BPE) can be exported"),
        });
    }
    let digits = match g.get("tokenizer.ggml.pre") {
        None => false,
        Some(_) => match g.str("tokenizer.ggml.pre")? {
            "smollm" => true,
            "gpt-2" | "default" => false,
            other => {
                return Err(ExportError::Unsupported {
                    key: "tokenizer.ggml.pre",
                    why: format!("{other:?}: only smollm, gpt-2 and default can be exported"),
                });
            }
        },
    };
    let tokens = g.str_array("tokenizer.ggml.tokens")?;
    let merges = g.str_array("tokenizer.ggml.merges")?;
    let types = match g.get("tokenizer.ggml.token_type") {
        Some(_) => g.int_array("tokenizer.ggml.token_type")?,
        None => vec![1; tokens.len()],
    };
    let id = |key: &str| {
        g.get(key)
            .and_then(|v| v.as_i128())
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| tokens.get(i).map(|t| t.to_string()))
    };
    let (bos, eos) = (
        id("tokenizer.ggml.bos_token_id"),
        id("tokenizer.ggml.eos_token_id"),
    );
    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (i, (t, ty)) in tokens.iter().zip(&types).enumerate() {
        vocab.insert(t.to_string(), json!(i));
        if matches!(ty, 3 | 4) {
            added.push(json!({
                "id": i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": *ty == 3,
            }));
        }
    }
    let byte_level = json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true,
    });
    let pre = if digits {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level,
        ]})
    } else {
        byte_level.clone()
    };
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre,
        "post_processor": byte_level,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges,
        },
    });
    let specials: Vec<&str> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, ty)| **ty == 3)
        .map(|(t, _)| *t)
        .collect();
    let config = json!({
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": false,
        "add_eos_token": false,
        "add_prefix_space": false,
        "clean_up_tokenization_spaces": false,
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": eos,
        "pad_token": null,
        "model_max_length": g.get("llama.context_length").and_then(|v| v.as_i128()).unwrap_or(8192),
        "additional_special_tokens": specials,
        "chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
    });
    Ok((tokenizer, config))
}

/// Writes `tokenizer.json` and `tokenizer_config.json` for `g` into `dir`
/// (created if missing).
///
/// # Errors
/// [`ExportError`]: an unsupported tokenizer, a file that cannot be written.
pub fn export(g: &Gguf, dir: &Path) -> Result<(), ExportError> {
    let (t, c) = export_json(g)?;
    let io = |p: &Path| {
        let path = p.display().to_string();
        move |source| ExportError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    for (name, v) in [("tokenizer.json", t), ("tokenizer_config.json", c)] {
        let p = dir.join(name);
        let text = serde_json::to_string(&v).expect("JSON values serialize");
        std::fs::write(&p, text).map_err(io(&p))?;
    }
    Ok(())
}
