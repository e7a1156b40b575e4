//! `decode` layer: the KV-cache continuous-batching decode workload.
//!
//! - [`model`]: the llama-style model's shape ([`model::Config`]), its weights
//!   ([`model::Weights`], llama2.c tensor order) and one iteration's packed work
//!   ([`model::BatchPlan`]).
//! - [`mod@reference`]: the CPU f32 forward pass the kernels are checked against.
//! - [`ops`]: the kernels' push constants and how each is dispatched.
//! - [`qweights`]: quantized weights repacked into the kernels' texel stream;
//!   [`qops`]: the quantized products, embedding lookup and table RoPE.
//! - [`gpu`]: [`gpu::GpuModel`], the model on a Vulkan device: ONE command
//!   buffer per iteration for the whole ready vector.
//! - [`trace`]: request traces in the Azure LLM inference trace schema (an
//!   embedded CC-BY-4.0 slice is the default workload).
//! - [`checkpoint`], [`tokenizer`]: llama2.c checkpoints and tokenizers.
//! - [`kv_cache`]: the paged KV cache's block allocator (the group's resource).
//! - [`seq`]: a member's sequence state and the packing of one iteration.
//! - [`backend`]: the device model seen by the job (one launch per iteration).
//! - [`job`]: the `xtc decode` run; [`report`]: its figures.
pub mod backend;
pub mod checkpoint;
pub mod gpu;
pub mod grouped;
pub mod job;
pub mod kv_cache;
pub mod local;
pub mod model;
pub mod ops;
pub mod qops;
pub mod qweights;
mod record;
pub mod reference;
pub mod report;
pub mod seq;
pub mod tokenizer;
pub mod trace;
