//! The models on a Vulkan device: the kernels' push constants and grids
//! ([`ops`], and the quantized ones in [`qops`]), the texel stream quantized
//! matrices are repacked into ([`qweights`]), the f32 model
//! ([`f32_model::GpuModel`], its buffers and recording in `f32_record`) and
//! the GGUF model ([`llama::GpuLlama`]).

pub mod f32_model;
mod f32_record;
pub mod llama;
pub mod ops;
pub mod qops;
pub mod qweights;
