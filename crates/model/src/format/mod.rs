//! The file formats a model is read from (and, for tests, written to): the
//! GGUF container ([`gguf`]), its tensors' block formats ([`quant`]), the
//! llama configuration in its metadata ([`llama_config`]), and the llama2.c
//! formats of the f32 family ([`checkpoint`], [`tokenizer`]).

pub mod checkpoint;
pub mod gguf;
pub mod llama_config;
pub mod quant;
pub mod tokenizer;
