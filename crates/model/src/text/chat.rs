//! The ChatML chat template (SmolLM2's `tokenizer.chat_template`), rendered
//! straight to token ids.
//!
//! Each message is `<|im_start|>{role}\n{content}<|im_end|>\n`; a generation
//! prompt appends `<|im_start|>assistant\n`. The special tokens are inserted
//! by id and the text between them is encoded with [`Bpe::encode`], so
//! special-token strings inside a message stay plain text (user text cannot
//! close a turn).
//!
//! The model's own template also inserts a default system message ("You are
//! a helpful AI assistant named SmolLM, trained by Hugging Face") when the
//! first message is not a system one; [`chatml`] does not (a caller adds a
//! system message when it wants one), so the prompt of one user message is
//! exactly the test vector.

use crate::ModelError;
use crate::text::bpe::Bpe;

/// Start of a turn.
pub const IM_START: &str = "<|im_start|>";
/// End of a turn (SmolLM2's EOS).
pub const IM_END: &str = "<|im_end|>";

/// One chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    /// `system`, `user` or `assistant`.
    pub role: &'a str,
    /// The text.
    pub content: &'a str,
}

/// Token ids of `messages` in ChatML, plus the assistant's opening when
/// `add_generation_prompt`.
///
/// # Errors
/// [`ModelError::Tokenizer`] when the vocabulary lacks `<|im_start|>` or
/// `<|im_end|>` as special tokens.
pub fn chatml(
    tok: &Bpe,
    messages: &[Message<'_>],
    add_generation_prompt: bool,
) -> Result<Vec<u32>, ModelError> {
    let special = |s: &str| {
        tok.special(s).ok_or_else(|| ModelError::Tokenizer {
            key: "tokenizer.ggml.tokens".into(),
            why: format!("no special token {s} for the ChatML template"),
        })
    };
    let (start, end) = (special(IM_START)?, special(IM_END)?);
    let mut ids = Vec::new();
    for m in messages {
        ids.push(start);
        ids.extend(tok.encode(&format!("{}\n{}", m.role, m.content)));
        ids.push(end);
        ids.extend(tok.encode("\n"));
    }
    if add_generation_prompt {
        ids.push(start);
        ids.extend(tok.encode("assistant\n"));
    }
    Ok(ids)
}

/// The ChatML prompt of one user message (no system message), ready for the
/// assistant's answer.
///
/// # Errors
/// As [`chatml`].
pub fn user_prompt(tok: &Bpe, content: &str) -> Result<Vec<u32>, ModelError> {
    chatml(
        tok,
        &[Message {
            role: "user",
            content,
        }],
        true,
    )
}
