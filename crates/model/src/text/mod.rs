//! Text in and out of a model: the GPT-2 byte-level BPE tokenizer of a GGUF
//! model ([`bpe`]), the ChatML template ([`chat`]) and sampling from logits
//! ([`sampling`]).

pub mod bpe;
pub mod chat;
pub mod sampling;
