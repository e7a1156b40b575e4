//! The [`RunConfig`] of an `xtc decode` run: what the command knows about the
//! trace, the model file, the weights and the device, put into the report's
//! `config` (the serving side defines the values, the command fills them).

use std::path::Path;

use xtc_kvbatch::latency::Slo;
use xtc_model::Weights;
use xtc_replay::job::{JobOpts, Workload};
use xtc_replay::run_config::{
    DeviceConfig, HostConfig, KvConfig, LengthScaling, ModelConfig, RunConfig, TraceConfig,
};
use xtc_replay::trace::{self, Scaling, Trace};

use super::args::DecodeArgs;
use xtc_model::open::Target;

/// What a run's model is: its description, its shape (`Model::config`) and
/// the weights it was built from.
pub struct ModelFacts {
    /// `Model::describe`.
    pub description: String,
    /// `Model::config` (the toy model's own shape for the toy).
    pub shape: xtc_model::Config,
    /// Weight elements of the loaded weights (synthetic or from `--model`).
    pub parameters: u64,
    /// Bytes of those weights (4 per element for f32 weights; the file's
    /// tensor bytes for a quantized GGUF model).
    pub weight_bytes: u64,
    /// The model file (`--model`, or the GGUF model found at the default
    /// path); `None` for the synthetic model.
    pub path: Option<String>,
}

/// Weight elements of `w`.
pub fn parameters(w: &Weights) -> u64 {
    w.tensors().iter().map(|(_, t)| t.len() as u64).sum()
}

/// The configuration of a run of `wl` (the first rows of `trace`) under
/// `opts`, with the model of `facts` on `device`.
pub fn run_config(
    args: &DecodeArgs,
    trace: &Trace,
    wl: &Workload,
    scaling: &Scaling,
    facts: ModelFacts,
    opts: &JobOpts,
    device: &Target,
) -> RunConfig {
    let (params, description, model_shape) = (facts.parameters, facts.description, facts.shape);
    let (weight_bytes, model_path) = (facts.weight_bytes, facts.path);
    let toy = matches!(device, Target::Toy(_));
    let positions = opts.kv_blocks.saturating_mul(opts.block_size);
    // K and V, f32, every layer (the CPU reference and the Vulkan model).
    let kv_bytes = (positions as u64)
        .saturating_mul(2 * model_shape.n_layers as u64 * model_shape.kv_dim() as u64)
        .saturating_mul(4);
    let model_config = if toy {
        // The toy model computes no weights: its shape is its own.
        ModelConfig::of(&model_shape, description, None, 0, 0)
    } else {
        ModelConfig::of(&model_shape, description, model_path, params, weight_bytes)
    };
    RunConfig {
        trace: TraceConfig {
            source: args
                .trace
                .as_deref()
                .map_or(trace::EMBEDDED_NAME.to_string(), path_text),
            path: args.trace.as_deref().map(path_text),
            rows: trace.requests.len(),
            row_start: 0,
            row_end: wl.requests.len(),
        },
        requests: wl.requests.len(),
        time_scale: scaling.time_scale,
        length_scaling: LengthScaling::from(scaling),
        seed: args.seed,
        cancel_rate: args.cancel_rate,
        model: model_config,
        kv_cache: KvConfig {
            blocks: opts.kv_blocks,
            block_size_tokens: opts.block_size,
            positions,
            bytes: (!toy).then_some(kv_bytes),
        },
        token_budget_tokens: opts.token_budget,
        max_active: opts.max_active,
        device: device_config(&args.device.to_string(), device),
        host: host_config(),
        slo: Slo {
            ttft_ms: args.slo_ttft,
            tpot_ms: args.slo_tpot,
        },
    }
}

fn path_text(p: &Path) -> String {
    p.display().to_string()
}

/// The device as a structure: Vulkan's properties, the CPU's model name for
/// the CPU reference, `toy` for the toy model.
pub fn device_config(selector: &str, device: &Target) -> DeviceConfig {
    match device {
        Target::Toy(_) => DeviceConfig::named(selector, "toy", "none"),
        Target::Cpu => {
            let (name, vendor) = cpu_model();
            DeviceConfig {
                vendor,
                ..DeviceConfig::named(selector, &name, "cpu")
            }
        }
        Target::Vulkan(d) => {
            let i = d.info();
            let kind = match i.kind {
                xtc_vk::DeviceKind::Discrete => "discrete",
                xtc_vk::DeviceKind::Integrated => "integrated",
                xtc_vk::DeviceKind::Virtual => "virtual",
                xtc_vk::DeviceKind::Cpu => "cpu",
                xtc_vk::DeviceKind::Other => "other",
            };
            let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
            let (ma, mi, pa) = i.api_version;
            DeviceConfig {
                selector: selector.to_string(),
                name: i.name.clone(),
                kind: kind.to_string(),
                vendor: i.vendor_name().map(str::to_string),
                vendor_id: Some(i.vendor_id),
                device_id: Some(i.device_id),
                driver: text(&i.driver),
                driver_version: Some(i.driver_version_string()),
                api_version: Some(format!("{ma}.{mi}.{pa}")),
            }
        }
    }
}

/// This machine: its CPU, logical CPUs and load average now.
pub fn host_config() -> HostConfig {
    let (cpu, _) = cpu_model();
    HostConfig {
        cpu: (cpu != "cpu").then_some(cpu),
        logical_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        load_average_1m: load_average(),
    }
}

/// The 1-minute load average (`/proc/loadavg`), if readable.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The CPU's `model name` and `vendor_id` from `/proc/cpuinfo` (`cpu` and
/// `None` when unreadable).
pub(crate) fn cpu_model() -> (String, Option<String>) {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    (
        field("model name").unwrap_or_else(|| "cpu".to_string()),
        field("vendor_id"),
    )
}

/// The model's size for the banner: `1.2M parameters, 4.8 MiB` (or `no
/// weights` for the toy model).
pub fn model_size(m: &ModelConfig) -> String {
    if m.parameters == 0 {
        return "no weights".to_string();
    }
    let p = m.parameters as f64;
    let params = if p >= 1e9 {
        format!("{:.2}B", p / 1e9)
    } else if p >= 1e6 {
        format!("{:.2}M", p / 1e6)
    } else {
        format!("{:.1}k", p / 1e3)
    };
    format!(
        "{params} parameters, {:.1} MiB of weights, {} layers, dim {}",
        m.weight_bytes as f64 / (1u64 << 20) as f64,
        m.n_layers,
        m.dim
    )
}

/// The length scaling for the banner: `prompts /32 (at most 128 tokens),
/// outputs /4 (at most 128)`.
pub fn scaling_text(s: &LengthScaling) -> String {
    let cap = |c: Option<usize>| c.map_or(String::new(), |c| format!(" (at most {c} tokens)"));
    format!(
        "prompts /{}{}, outputs /{}{}",
        s.prompt_div,
        cap(s.max_prompt_tokens),
        s.output_div,
        cap(s.max_output_tokens)
    )
}
