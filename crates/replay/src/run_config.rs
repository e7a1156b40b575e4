//! What produced a report: the whole configuration of an `xtc decode` run
//! (trace and rows, arrival speed-up, length scaling, seed, model, KV cache,
//! batching limits, device, SLO), written into every JSON report
//! (`config`, documented field by field in `docs/decode-report.md`).
//!
//! The serving side defines these plain values; the composition root (the
//! command) fills them, since only it knows the model file and the device.

use serde::Serialize;

use crate::trace::Scaling;
use xtc_kvbatch::latency::Slo;
use xtc_model::Config;

/// The configuration of a run (see the module doc).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunConfig {
    /// Where the requests came from.
    pub trace: TraceConfig,
    /// Requests replayed (the trace rows `row_start..row_end`).
    pub requests: usize,
    /// Speed-up of the trace's arrival clock (2 = twice as fast).
    pub time_scale: f64,
    /// How the trace's lengths were scaled for the device.
    pub length_scaling: LengthScaling,
    /// Seed of the synthetic weights, prompt tokens and cancellations.
    pub seed: u64,
    /// Fraction of requests whose client cancels (0 to 1).
    pub cancel_rate: f64,
    /// The model.
    pub model: ModelConfig,
    /// The paged KV cache.
    pub kv_cache: KvConfig,
    /// Token rows per iteration (prefill chunks + decode tokens).
    pub token_budget_tokens: usize,
    /// Members in the ready vector at most (as given; one-at-a-time runs
    /// use 1).
    pub max_active: usize,
    /// The device the model ran on.
    pub device: DeviceConfig,
    /// The machine the run ran on.
    pub host: HostConfig,
    /// The latency SLO the report's attainment is measured against.
    pub slo: Slo,
}

/// The trace a run replayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceConfig {
    /// Its name (the file, or the embedded slice's name).
    pub source: String,
    /// The file's path as given (`null`: the embedded slice).
    pub path: Option<String>,
    /// Rows in the trace.
    pub rows: usize,
    /// First row replayed (0-based, header excluded).
    pub row_start: usize,
    /// One past the last row replayed.
    pub row_end: usize,
}

/// The length scaling of a run ([`Scaling`] without the time scale).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LengthScaling {
    /// Prompt lengths divided by this (rounded up).
    pub prompt_div: usize,
    /// Output lengths divided by this (rounded up).
    pub output_div: usize,
    /// Scaled prompts capped at this many tokens (`null`: no cap).
    pub max_prompt_tokens: Option<usize>,
    /// Scaled outputs capped at this many tokens (`null`: no cap).
    pub max_output_tokens: Option<usize>,
}

impl From<&Scaling> for LengthScaling {
    fn from(s: &Scaling) -> Self {
        let cap = |n: usize| (n != usize::MAX).then_some(n);
        LengthScaling {
            prompt_div: s.prompt_div,
            output_div: s.output_div,
            max_prompt_tokens: cap(s.max_prompt),
            max_output_tokens: cap(s.max_output),
        }
    }
}

/// The model of a run: what it is and its shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelConfig {
    /// One line naming the model and device (`Model::describe`).
    pub description: String,
    /// The model file (`null`: synthetic weights or the toy model).
    pub path: Option<String>,
    /// Weight elements (parameters); 0 for the toy model.
    pub parameters: u64,
    /// Bytes of the weights as stored (`f32` for llama2.c checkpoints and
    /// synthetic weights).
    pub weight_bytes: u64,
    /// Model width.
    pub dim: usize,
    /// Feed-forward width.
    pub hidden_dim: usize,
    /// Transformer layers.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_heads`).
    pub n_kv_heads: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Positions a sequence may use.
    pub seq_len: usize,
}

impl ModelConfig {
    /// A model of shape `c` described by `description`.
    pub fn of(
        c: &Config,
        description: String,
        path: Option<String>,
        parameters: u64,
        weight_bytes: u64,
    ) -> Self {
        ModelConfig {
            description,
            path,
            parameters,
            weight_bytes,
            dim: c.dim,
            hidden_dim: c.hidden_dim,
            n_layers: c.n_layers,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            vocab_size: c.vocab_size,
            seq_len: c.seq_len,
        }
    }
}

/// The shape of the paged KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvConfig {
    /// Blocks in the cache (the batch group's resource capacity).
    pub blocks: usize,
    /// Positions (tokens) per block.
    pub block_size_tokens: usize,
    /// `blocks * block_size_tokens`.
    pub positions: usize,
    /// Bytes of K and V for all layers, when the model keeps them (`null`:
    /// the toy model keeps one token id per position).
    pub bytes: Option<u64>,
}

/// The machine a run ran on: what a reader of its figures needs to compare
/// them (a CPU device's speed is the host's, and shared machines vary).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostConfig {
    /// The CPU's model name (`/proc/cpuinfo`; `null` if unknown).
    pub cpu: Option<String>,
    /// Logical CPUs the process may run on.
    pub logical_cpus: usize,
    /// The 1-minute load average when the run started (`null` if unknown).
    pub load_average_1m: Option<f64>,
}

/// The device a run used, as a structure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceConfig {
    /// `--device` as given (`auto`, an index, a name, `cpu`, `toy`).
    pub selector: String,
    /// The device's name (Vulkan `deviceName`, the CPU's model name, or `toy`).
    pub name: String,
    /// `discrete`, `integrated`, `virtual`, `cpu` (a CPU Vulkan device or the
    /// CPU reference), `other`, or `none` (the toy model).
    pub kind: String,
    /// Vendor name (from the PCI vendor id, or the CPU's vendor string).
    pub vendor: Option<String>,
    /// PCI vendor id (Vulkan `vendorID`).
    pub vendor_id: Option<u32>,
    /// PCI device id (Vulkan `deviceID`).
    pub device_id: Option<u32>,
    /// The driver: `driverName` and `driverInfo` of
    /// `VkPhysicalDeviceDriverProperties` (e.g. `llvmpipe Mesa 22.3.6 (LLVM
    /// 15.0.6)`).
    pub driver: Option<String>,
    /// `driverVersion` decoded by the vendor's convention.
    pub driver_version: Option<String>,
    /// Vulkan API version of the device (`major.minor.patch`).
    pub api_version: Option<String>,
}

impl DeviceConfig {
    /// A device known by name and kind only.
    pub fn named(selector: &str, name: &str, kind: &str) -> Self {
        DeviceConfig {
            selector: selector.to_string(),
            name: name.to_string(),
            kind: kind.to_string(),
            vendor: None,
            vendor_id: None,
            device_id: None,
            driver: None,
            driver_version: None,
            api_version: None,
        }
    }
}
