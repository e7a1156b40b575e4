//! What a [`super::GpuLlama`] is opened with ([`GpuLlamaOptions`]) and why
//! it could not be ([`GpuLlamaError`]).

use crate::vulkan::ops::Variant;
use crate::vulkan::qweights::RepackError;
use crate::{KvGeometry, ModelError};
use xtc_vk::VkError;

/// Sizes of a [`GpuLlama`](super::GpuLlama)'s KV cache and per-iteration capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuLlamaOptions {
    /// KV-cache geometry (block ids in block tables are `< n_blocks`).
    pub kv: KvGeometry,
    /// Most token rows in one plan.
    pub max_tokens: usize,
    /// Most sequences in one plan.
    pub max_seqs: usize,
    /// Positions per sequence (at most the model's context length; on CPU
    /// devices also at most what `attention_img`'s loop budget allows,
    /// 1817 at head size 64).
    pub max_context: usize,
    /// Copy the sampled rows' logits back each iteration
    /// ([`GpuLlama::finish_with_logits`](super::GpuLlama::finish_with_logits)); off by default (costs a copy).
    pub keep_logits: bool,
    /// Kernel forms; `None`: by capability and the barrier probe
    /// ([`crate::vulkan::form`]): `Gpu` where the device lacks what
    /// the CPU form needs (subgroups of at least 8 lanes with basic, ballot
    /// and arithmetic operations, [`xtc_vk::Device::subgroup_size`]; llvmpipe on a
    /// CPU without AVX has 4; `XTC_VK_MASK=subgroups` hides them) or the
    /// options exceed its limits (`max_context`), else the form the probe
    /// favours. Asking for `Cpu` without the subgroups is an
    /// [`GpuLlamaError::Options`] error.
    pub variant: Option<Variant>,
}

impl Default for GpuLlamaOptions {
    fn default() -> Self {
        GpuLlamaOptions {
            kv: KvGeometry {
                block_size: 16,
                n_blocks: 256,
            },
            max_tokens: 256,
            max_seqs: 64,
            max_context: 1024,
            keep_logits: false,
            variant: None,
        }
    }
}

/// Why a [`GpuLlama`](super::GpuLlama) could not be made.
#[derive(Debug, thiserror::Error)]
pub enum GpuLlamaError {
    /// The file lacks a tensor or metadata the model needs.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A tensor the kernels cannot read in its shape.
    #[error("tensor {tensor}: {err}")]
    Repack {
        /// The tensor (or stacked tensors).
        tensor: String,
        /// What is wrong.
        err: RepackError,
    },
    /// Options the model cannot honour.
    #[error("option {option}: {why}")]
    Options {
        /// The option.
        option: &'static str,
        /// What is wrong.
        why: String,
    },
    /// The device refused (out of memory, limits, a lost device).
    #[error(transparent)]
    Vk(#[from] VkError),
    /// A buffer the kernels bind is larger than the device's
    /// `maxStorageBufferRange` (in the GPU form the KV cache is one storage
    /// buffer: fewer KV blocks fit).
    #[error(
        "the {buffer} buffer is {bytes} bytes, above this device's maxStorageBufferRange of {max} bytes (fewer KV blocks, or a shorter context)"
    )]
    StorageRange {
        /// Which buffer (`weights`, `activations`, `KV cache`, ...).
        buffer: &'static str,
        /// Its size in bytes.
        bytes: u64,
        /// `maxStorageBufferRange` in bytes.
        max: u64,
    },
    /// Sizes that do not fit the kernels' 32-bit offsets.
    #[error("buffer sizes overflow the kernels' 32-bit offsets")]
    Range,
}
