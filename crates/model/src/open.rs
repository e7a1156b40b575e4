//! The front door: a model ([`ModelSpec`]) opened on a device ([`Target`])
//! within the run's sizes ([`Limits`]). Every command that runs a model
//! comes through here: [`open`] for the serving side's batched
//! [`Model`] (`xtc decode`, the CI suites), [`open_stream`] for one
//! sequence with logits (`xtc generate`, `xtc perplexity`). What a device
//! can hold is decided here too: the positions per sequence on a CPU-kind
//! Vulkan device ([`CPU_DEVICE_CONTEXT`], [`Target::context`]) and the host
//! memory the model's part of a run takes ([`model_memory`]).
//!
//! Which adapter runs what:
//!
//! | target | [`ModelSpec::F32`] | [`ModelSpec::Gguf`] |
//! |---|---|---|
//! | [`Target::Toy`] | [`ToyModel`] (shape only) | [`ToyModel`] (shape only) |
//! | [`Target::Cpu`] | [`CpuModel::new`] | [`CpuModel::llama`] |
//! | [`Target::Vulkan`] | [`VulkanModel::new`] | [`VulkanModel::llama`] |

use std::sync::Arc;

use super::adapters::{CpuModel, IterationCost, ToyModel, VulkanModel};
use super::cpu::llama::Llama;
use super::stream::{CpuStream, Stream, VulkanStream};
use super::vulkan::f32_model::GpuOptions;
use super::vulkan::llama::{GpuLlamaError, GpuLlamaOptions};
use super::vulkan::ops::Variant;
use super::{Config, KvGeometry, Weights};
use crate::Model;

/// Positions per sequence at most of a GGUF model on a CPU-kind Vulkan
/// device (lavapipe): its attention kernel runs up to 1817 at head size 64.
pub const CPU_DEVICE_CONTEXT: usize = 1536;

/// The model to open.
#[derive(Clone)]
pub enum ModelSpec {
    /// f32 weights in llama2.c order: the seeded synthetic model
    /// ([`Weights::synthetic`]) or a llama2.c checkpoint.
    F32(Box<Weights>),
    /// A GGUF model, loaded (shared with the CPU reference's pool work);
    /// `name` is what [`Model::describe`] calls it (the file name).
    Gguf {
        /// The model.
        model: Arc<Llama>,
        /// Its name in reports.
        name: String,
    },
}

impl std::fmt::Debug for ModelSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelSpec::F32(w) => write!(f, "F32({:?})", w.config),
            ModelSpec::Gguf { name, .. } => write!(f, "Gguf({name})"),
        }
    }
}

impl ModelSpec {
    /// The model's own shape (before a target caps its positions).
    pub fn shape(&self) -> Config {
        match self {
            ModelSpec::F32(w) => w.config,
            ModelSpec::Gguf { model, .. } => model.config().shape,
        }
    }
}

/// Where a model runs.
#[derive(Debug)]
pub enum Target {
    /// No model: the device-free toy model of the spec's shape (measures
    /// the batching alone), taking `IterationCost` per iteration.
    Toy(IterationCost),
    /// The CPU reference (no Vulkan).
    Cpu,
    /// A Vulkan device.
    Vulkan(xtc_vk::Device),
}

impl Target {
    /// Whether the target computes on the host's cores: everything but a
    /// GPU (a CPU-kind Vulkan device such as lavapipe included).
    pub fn on_host(&self) -> bool {
        match self {
            Target::Vulkan(d) => d.info().kind == xtc_vk::DeviceKind::Cpu,
            _ => true,
        }
    }

    /// Whether the target is a CPU-kind Vulkan device (lavapipe).
    pub fn is_cpu_device(&self) -> bool {
        matches!(self, Target::Vulkan(d) if d.info().kind == xtc_vk::DeviceKind::Cpu)
    }

    /// Positions per sequence a GGUF model of `seq_len` positions may hold
    /// here: at most [`CPU_DEVICE_CONTEXT`] on a CPU-kind Vulkan device.
    pub fn context(&self, seq_len: usize) -> usize {
        if self.is_cpu_device() {
            seq_len.min(CPU_DEVICE_CONTEXT)
        } else {
            seq_len
        }
    }

    /// Where the host memory of a run on this target goes.
    pub fn memory_kind(&self) -> MemoryKind {
        match self {
            Target::Toy(_) => MemoryKind::Toy,
            Target::Cpu => MemoryKind::Cpu,
            Target::Vulkan(_) if self.on_host() => MemoryKind::VulkanHost,
            Target::Vulkan(_) => MemoryKind::VulkanDevice,
        }
    }
}

/// The sizes a batched model is opened for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The KV cache's geometry (block ids in plans are `< n_blocks`).
    pub kv: KvGeometry,
    /// Most token rows in one plan (`--token-budget`).
    pub max_tokens: usize,
    /// Most sequences in one plan (`--max-active`; at least 1).
    pub max_seqs: usize,
    /// Positions per sequence (a GGUF model on a Vulkan device: at most the
    /// model's, and [`Target::context`]'s).
    pub max_context: usize,
    /// The kernel form on a Vulkan device (`None`: by capability and the
    /// barrier probe, [`crate::vulkan::form`]; a forced form tests
    /// it on any device, and the CPU form on a device without subgroups is
    /// an [`OpenError::Llama`]).
    pub kernels: Option<Variant>,
}

/// The sizes a one-sequence [`Stream`] is opened for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Positions of the sequence (capped at the model's, and at
    /// [`Target::context`]).
    pub context: usize,
    /// Most token rows per plan on a Vulkan device.
    pub max_rows: usize,
    /// Most rows whose logits one plan returns on a Vulkan device.
    pub logit_rows: usize,
    /// The kernel form on a Vulkan device (`None`: the device's own; a
    /// forced form tests it on any device).
    pub kernels: Option<Variant>,
}

/// Why a model could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The f32 model could not be put on the Vulkan device (out of device
    /// memory, a limit, a lost device).
    #[error("cannot load the model on the device: {0}")]
    F32(xtc::Error),
    /// The GGUF model could not be put on the Vulkan device (bad options,
    /// out of device memory, a tensor the kernels cannot read).
    #[error("cannot load the model on the device: {0}")]
    Llama(#[from] GpuLlamaError),
    /// A stream was asked of a model without logits on that target: the
    /// toy target, or an f32 model.
    #[error("{0} runs no stream: use the GGUF model on the CPU reference or a Vulkan device")]
    NoStream(&'static str),
}

/// Opens `spec` on `target` for plans within `limits`, as the serving side
/// drives it (see the module doc for which adapter runs what).
///
/// # Errors
/// [`OpenError::F32`] or [`OpenError::Llama`] when the device cannot take
/// the model.
pub fn open(
    spec: &ModelSpec,
    target: &Target,
    limits: Limits,
) -> Result<Box<dyn Model>, OpenError> {
    let kv = limits.kv;
    let max_seqs = limits.max_seqs.max(1);
    Ok(match (target, spec) {
        (Target::Toy(cost), _) => {
            let c = spec.shape();
            Box::new(ToyModel::new(c.vocab_size, kv.n_blocks, kv.block_size).with_cost(*cost))
        }
        (Target::Cpu, ModelSpec::F32(w)) => Box::new(CpuModel::new((**w).clone(), kv)),
        (Target::Cpu, ModelSpec::Gguf { model, name }) => {
            Box::new(CpuModel::llama(model.clone(), kv, name))
        }
        (Target::Vulkan(dev), ModelSpec::F32(w)) => {
            let o = GpuOptions {
                kv,
                max_tokens: limits.max_tokens,
                max_seqs,
                variant: limits.kernels,
                ..GpuOptions::default()
            };
            Box::new(VulkanModel::with_options(dev, w, o).map_err(OpenError::F32)?)
        }
        (Target::Vulkan(dev), ModelSpec::Gguf { model, name }) => {
            let o = GpuLlamaOptions {
                kv,
                max_tokens: limits.max_tokens,
                max_seqs,
                max_context: limits.max_context,
                keep_logits: false,
                variant: limits.kernels,
            };
            Box::new(VulkanModel::llama(dev, model, o, name)?)
        }
    })
}

/// One sequence of the GGUF model `spec` on `target`, for `xtc generate`
/// and `xtc perplexity`: [`CpuStream`] on the CPU reference,
/// [`VulkanStream`] on a Vulkan device (`limits.context` capped at the
/// model's positions and [`Target::context`]).
///
/// # Errors
/// [`OpenError::NoStream`] for the toy target or an f32 model;
/// [`OpenError::Llama`] when the device cannot take the model.
pub fn open_stream<'m>(
    spec: &'m ModelSpec,
    target: &Target,
    limits: StreamLimits,
) -> Result<Box<dyn Stream + Send + 'm>, OpenError> {
    let ModelSpec::Gguf { model, .. } = spec else {
        return Err(OpenError::NoStream("an f32 model"));
    };
    match target {
        Target::Toy(_) => Err(OpenError::NoStream("the toy device")),
        Target::Cpu => Ok(Box::new(CpuStream::new(model))),
        Target::Vulkan(dev) => {
            let seq_len = model.config().shape.seq_len;
            let ctx = target.context(limits.context.clamp(1, seq_len));
            let s = VulkanStream::new(
                dev,
                model,
                ctx,
                limits.max_rows,
                limits.logit_rows,
                limits.kernels,
            )?;
            Ok(Box::new(s))
        }
    }
}

/// Where the model's part of a run's host memory lives ([`model_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// The toy model: one `u32` slot per KV position.
    Toy,
    /// The CPU reference: K and V `f32` of every layer per position.
    Cpu,
    /// A Vulkan device whose memory is host memory (lavapipe): weights, KV
    /// cache, activations and metadata buffers.
    VulkanHost,
    /// A Vulkan device with its own memory (a GPU): only the metadata
    /// staging copy lives on the host.
    VulkanDevice,
}

/// Host memory the model of shape `config` with `weight_elems` `f32`
/// weights takes on `kind` within `limits`, part by part, in bytes: the KV
/// cache, and on a host-memory Vulkan device the weights, the activations
/// (`max_tokens` rows, `max_seqs` sequences) and the metadata. An estimate
/// from above of the big parts, as [`VulkanModel::new`] sizes them.
pub fn model_memory(
    config: &Config,
    weight_elems: u128,
    limits: &Limits,
    kind: MemoryKind,
) -> Vec<(&'static str, u128)> {
    let n = |x: usize| x as u128;
    let positions = n(limits.kv.n_blocks) * n(limits.kv.block_size);
    let f32s = |elems: u128| elems.saturating_mul(4);
    let kv_f32 = f32s(positions.saturating_mul(2 * n(config.n_layers) * n(config.kv_dim())));
    let (t, sq) = (n(limits.max_tokens), n(limits.max_seqs.max(1)));
    let (d, kvd, h, v) = (
        n(config.dim),
        n(config.kv_dim()),
        n(config.hidden_dim),
        n(config.vocab_size),
    );
    // As GpuModel::new sizes them: x, xb, q, att [T, dim]; k, v [T, kv_dim];
    // h1, h3 [T, hidden]; sel [S, dim]; logits [S, vocab]; metadata
    // 4 per row + a block table per sequence.
    let act = f32s(t * (4 * d + 2 * kvd + 2 * h) + sq * (d + v));
    let blocks_per_seq = n(config.seq_len.div_ceil(limits.kv.block_size.max(1)));
    let meta = f32s(4 * t + sq * (blocks_per_seq + 1));
    match kind {
        MemoryKind::Toy => vec![("KV cache", positions.saturating_mul(4))],
        MemoryKind::Cpu => vec![("KV cache", kv_f32)],
        MemoryKind::VulkanHost => vec![
            ("KV cache", kv_f32),
            ("weights on the device", f32s(weight_elems)),
            ("activations", act),
            ("metadata", meta.saturating_mul(2)),
        ],
        MemoryKind::VulkanDevice => vec![("metadata", meta)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_device_caps_the_context_and_others_do_not() {
        assert_eq!(Target::Cpu.context(8192), 8192);
        assert_eq!(Target::Toy(IterationCost::NONE).context(100), 100);
        assert!(Target::Cpu.on_host() && !Target::Cpu.is_cpu_device());
    }

    #[test]
    fn the_door_opens_the_f32_model_on_the_host_targets() {
        let w = Weights::synthetic(Config::tiny(), 1);
        let spec = ModelSpec::F32(Box::new(w));
        let limits = Limits {
            kv: KvGeometry {
                block_size: 4,
                n_blocks: 8,
            },
            max_tokens: 16,
            max_seqs: 2,
            max_context: 32,
            kernels: None,
        };
        let cpu = open(&spec, &Target::Cpu, limits).unwrap();
        assert_eq!(cpu.config(), Config::tiny());
        assert!(
            cpu.describe().contains("CPU reference"),
            "{}",
            cpu.describe()
        );
        let toy = open(&spec, &Target::Toy(IterationCost::NONE), limits).unwrap();
        assert!(toy.describe().contains("toy"), "{}", toy.describe());
        let e = open_stream(
            &spec,
            &Target::Cpu,
            StreamLimits {
                context: 8,
                max_rows: 1,
                logit_rows: 1,
                kernels: None,
            },
        );
        assert!(matches!(e, Err(OpenError::NoStream(_))));
    }
}
