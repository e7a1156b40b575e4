//! `decode` layer: the KV-cache continuous-batching decode workload.
//!
//! - [`model`]: the llama-style model's shape ([`model::Config`]), its weights
//!   ([`model::Weights`], llama2.c tensor order) and one iteration's packed work
//!   ([`model::BatchPlan`]).
pub mod model;
