//! The CPU references: the oracles the Vulkan kernels are checked against
//! and `--device cpu`. [`llama`] is the GGUF model's quantized forward pass;
//! [`f32_model`] the f32 llama2.c-order one of the synthetic model and
//! llama2.c checkpoints; [`math`] the arithmetic both and the kernels'
//! references share. Nothing here imports [`super::vulkan`]
//! (`tests/layout.rs`).

pub mod f32_model;
pub mod llama;
pub mod math;
pub mod qmatmul;
