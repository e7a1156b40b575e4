//! What `xtc decode` prints besides the report: the banner on stderr
//! (`banner`) and the sample completions, as text ([`render_samples`]) or
//! in the JSON report (`with_samples`).

use std::time::Duration;

use xtc_replay::job::{JobOpts, Workload};
use xtc_replay::run_config::RunConfig;
use xtc_replay::trace::Trace;

use super::args::DecodeArgs;
use super::config;
use super::source::Sample;

/// The banner printed on stderr before a run: the workload, the model, the
/// lengths and the sizes.
pub(crate) fn banner(
    args: &DecodeArgs,
    trace: &Trace,
    wl: &Workload,
    o: &JobOpts,
    c: &RunConfig,
) -> String {
    let span = wl.requests.last().map_or(Duration::ZERO, |r| r.arrival);
    let arrivals = match &args.sweep {
        Some(r) => {
            let rates: Vec<String> = r.0.iter().map(|x| format!("{x}x")).collect();
            format!(
                "arrivals over {:.2} s at 1x, swept at {}",
                span.as_secs_f64() * args.time_scale,
                rates.join(", ")
            )
        }
        None => format!(
            "arrivals over {:.2} s at {}x",
            span.as_secs_f64(),
            args.time_scale
        ),
    };
    let slo = if c.slo.is_set() {
        format!(
            ", SLO {}",
            xtc_replay::report::slo_bounds(c.slo.ttft_ms, c.slo.tpot_ms)
        )
    } else {
        String::new()
    };
    format!(
        "xtc decode: {} of {} requests from {} ({arrivals}), {}\n\
         model: {}; lengths: {}\n\
         max-active {}, KV cache {} blocks x {} positions, token budget {}{slo}\n\
         host: {} ({} logical CPUs), load average {} at the start",
        wl.requests.len(),
        trace.requests.len(),
        c.trace.source,
        c.model.description,
        config::model_size(&c.model),
        config::scaling_text(&c.length_scaling),
        o.max_active,
        o.kv_blocks,
        o.block_size,
        o.token_budget,
        c.host.cpu.as_deref().unwrap_or("unknown CPU"),
        c.host.logical_cpus,
        c.host
            .load_average_1m
            .map_or("unknown".to_string(), |l| format!("{l:.2}"))
    )
}

/// `value` as pretty JSON with a `samples` field added (the sample
/// completions as text; an empty list when the model has no tokenizer).
pub(crate) fn with_samples(
    value: &impl serde::Serialize,
    samples: &[Sample],
) -> Result<String, String> {
    let mut v = serde_json::to_value(value).map_err(|e| e.to_string())?;
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "samples".into(),
            serde_json::to_value(samples).map_err(|e| e.to_string())?,
        );
    }
    serde_json::to_string_pretty(&v).map_err(|e| e.to_string())
}

/// The samples as the text report's last lines (nothing when there are none).
pub fn render_samples(samples: &[Sample], eos_ignored: bool) -> String {
    if samples.is_empty() {
        return String::new();
    }
    let how = if eos_ignored {
        "greedy; EOS ignored, each runs to its trace output length"
    } else {
        "greedy"
    };
    let mut s = format!("sample completions ({how}):\n");
    for x in samples {
        s += &format!(
            "  request {} ({} prompt + {} generated tokens): ...{:?}\n    -> {:?}\n",
            x.id, x.prompt_tokens, x.generated_tokens, x.prompt_tail, x.completion
        );
    }
    s
}
