//! `decode` layer: the KV-cache continuous-batching decode workload.
//!
//! - [`model`]: the llama-style model's shape ([`model::Config`]), its weights
//!   ([`model::Weights`], llama2.c tensor order) and one iteration's packed work
//!   ([`model::BatchPlan`]).
//! - [`reference`]: the CPU f32 forward pass the kernels are checked against.
//! - [`ops`]: the kernels' push constants and how each is dispatched.
//! - [`gpu`]: [`gpu::GpuModel`], the model on a Vulkan device: ONE command
//!   buffer per iteration for the whole ready vector.
pub mod gpu;
pub mod model;
pub mod ops;
pub mod reference;
