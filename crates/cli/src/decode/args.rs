//! `xtc decode`'s arguments: [`DecodeArgs`], their clap value parsers, the
//! defaults (`DEFAULT_*`) and the exit statuses `--help` documents.

use std::path::PathBuf;
use std::time::Duration;

use crate::device::DeviceArg;
use crate::generate::KernelForm;
use xtc_decode::model::adapters::IterationCost;
use xtc_decode::serve::trace::Scaling;

/// Default speed-up of the trace's arrival clock.
pub const DEFAULT_TIME_SCALE: f64 = 8.0;

/// Largest `--max-active`: a ready vector of more members than this is refused
/// up front (the group's and the device's per-member storage would not fit).
pub const MAX_ACTIVE_LIMIT: usize = 1 << 20;

/// Default number of requests replayed (a GGUF model on a CPU device:
/// [`source::CPU_MODEL_REQUESTS`]).
pub const DEFAULT_REQUESTS: usize = 512;

/// Length scaling on CPU devices: prompt / 32 (the trace's median prompt of
/// ~1,000 tokens becomes ~32), output / 4 (median ~240 becomes ~60), each
/// capped at 128 tokens (half the synthetic model's 256 positions,
/// [`Config::tiny`]; the GGUF model on a CPU device gets the same caps).
pub const CPU_SCALING: Scaling = Scaling {
    time_scale: DEFAULT_TIME_SCALE,
    prompt_div: 32,
    output_div: 4,
    max_prompt: 128,
    max_output: 128,
};

/// Exit status: the run finished and every request was done or cancelled.
pub const EXIT_OK: i32 = 0;
/// Exit status: the run could not start or complete (a bad trace or model
/// file, no device, too little memory, a `--trace-out` that cannot be
/// written, an engine or device failure). Comes before the codes below.
pub const EXIT_ERROR: i32 = 1;
/// Exit status: usage error (an unknown option, a value out of its range);
/// nothing ran.
pub const EXIT_USAGE: i32 = 2;
/// Exit status: the run finished, but some requests were rejected (they could
/// never fit the KV cache or the model's `seq_len`).
pub const EXIT_REJECTED: i32 = 3;
/// Exit status: the run finished, but some requests failed.
pub const EXIT_FAILED: i32 = 4;
/// Exit status: KV-cache blocks were still allocated after the run (a leak:
/// a bug in xtc).
pub const EXIT_LEAK: i32 = 5;

/// The exit-status section of `xtc decode --help` (also in the README).
pub const EXIT_STATUS_HELP: &str = "\
Exit status:
  0  every request was done or cancelled
  1  error: the run could not start or complete (bad trace or model file, no
     device, too little memory, --trace-out not writable, device failure)
  2  usage error: unknown option or a value out of range (nothing ran)
  3  the run finished but some requests were rejected (never fit the KV cache
     or the model's seq_len; the report counts them per reason)
  4  the run finished but some requests failed
  5  KV-cache blocks were still allocated after the run (a leak: a bug)
1 comes first; otherwise the largest of 3-5 that applies (with --compare,
over the three runs).";

/// Longest replay (last arrival after the first) run without
/// `--allow-long-replay`: one day.
pub const MAX_REPLAY: Duration = Duration::from_secs(24 * 3600);

/// Arguments of `xtc decode`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = EXIT_STATUS_HELP)]
pub struct DecodeArgs {
    /// Model file: a GGUF model (default: the SmolLM2-135M-Instruct Q4_1 that
    /// scripts/fetch-model.sh puts in $XDG_CACHE_HOME/xtc/, ~/.cache/xtc/), or a
    /// llama2.c checkpoint (a file without the GGUF magic; greedy decode then
    /// stops at its EOS).
    #[arg(long, value_name = "PATH", conflicts_with = "synthetic")]
    pub model: Option<PathBuf>,
    /// llama2.c tokenizer.bin: print sample outputs of a llama2.c checkpoint as
    /// text (needs --model; a GGUF model carries its own tokenizer).
    #[arg(long, value_name = "PATH", requires = "model")]
    pub tokenizer: Option<PathBuf>,
    /// Run the seeded synthetic model (dim 64, 4 layers, vocabulary 512) with
    /// random prompt ids instead of the GGUF model: measures the engine without
    /// the model file (the default of --device toy).
    #[arg(long)]
    pub synthetic: bool,
    /// Trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens) instead of the embedded Azure slice.
    /// TIMESTAMP is `YYYY-MM-DD HH:MM:SS[.f]` (optionally with a `+00:00`/`Z`
    /// suffix) or plain seconds; rows must be in time order (an earlier row is
    /// an error naming its line).
    #[arg(long, value_name = "PATH")]
    pub trace: Option<PathBuf>,
    /// Requests to replay: the trace's first N rows, N >= 1 (default: 512, 128 for
    /// the GGUF model on a CPU device, or every row of a shorter trace; a
    /// warning if N is more than the trace has).
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        value_parser = count(1, usize::MAX),
    )]
    pub requests: Option<usize>,
    /// Speed-up of the arrival clock, a finite number > 0 (2 replays twice as
    /// fast; replays longer than a day need --allow-long-replay).
    #[arg(
        long,
        value_name = "X",
        default_value_t = DEFAULT_TIME_SCALE,
        allow_negative_numbers = true,
        value_parser = time_scale,
    )]
    pub time_scale: f64,
    /// Run a replay whose arrivals span more than a day (a small --time-scale
    /// on a long trace); refused otherwise, as it is almost always a typo.
    #[arg(long)]
    pub allow_long_replay: bool,
    /// Members in the ready vector at most (1 to 1048576).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 32,
        allow_negative_numbers = true,
        value_parser = count(1, MAX_ACTIVE_LIMIT),
    )]
    pub max_active: usize,
    /// Blocks in the KV cache, 1 to 4294967295 (default: enough for max-active
    /// requests of the longest scaled length). The run is refused up front if
    /// the cache and its bookkeeping do not fit in the memory available.
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        value_parser = count(1, u32::MAX as usize),
    )]
    pub kv_blocks: Option<usize>,
    /// Positions per KV block (>= 1).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 16,
        allow_negative_numbers = true,
        value_parser = count(1, usize::MAX),
    )]
    pub block_size: usize,
    /// Token rows per iteration (prefill chunks + one per decoding member; >= 1).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 64,
        allow_negative_numbers = true,
        value_parser = count(1, usize::MAX),
    )]
    pub token_budget: usize,
    /// Device: `auto` (the default: the first Vulkan device, a GPU if present, else lavapipe;
    /// the CPU reference when no Vulkan device opens), `cpu` (the CPU reference, no Vulkan),
    /// `toy` (no model: measures the batching alone), or a Vulkan device index, part of its name
    /// or its render node (`xtc probe` lists them).
    #[arg(long, value_name = "DEV", default_value = "auto", value_parser = crate::device::parse)]
    pub device: DeviceArg,
    /// Kernel form on a Vulkan device: `auto` (by what the device supports and a
    /// measured barrier probe), `gpu` (workgroup memory and barriers; needs no subgroups)
    /// or `cpu` (barrier-free, subgroups of at least 8 lanes); forcing one tests it on any
    /// device that can run it. Ignored by `cpu` and `toy`.
    #[arg(long, value_name = "FORM", value_enum, default_value_t = KernelForm::Auto)]
    pub kernels: KernelForm,
    /// Seed of the synthetic weights, the prompts (their windows of the text for
    /// the GGUF model) and the cancellations.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Write a Chrome trace / Perfetto JSON of iterations and requests (with
    /// `--compare`: of the continuous run only). A bad path fails before the
    /// run; the trace is written to a temporary file beside FILE and renamed
    /// over it after a successful run, so a failed or interrupted run leaves
    /// FILE as it was (or absent).
    #[arg(long, value_name = "FILE")]
    pub trace_out: Option<PathBuf>,
    /// Fraction of requests whose client cancels after a random number of tokens (0 to 1).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0.0,
        allow_negative_numbers = true,
        value_parser = fraction,
    )]
    pub cancel_rate: f64,
    /// Run continuous, static and one-at-a-time batching on the same workload and print ratios
    /// (`--trace-out` then traces the continuous run only).
    #[arg(long)]
    pub compare: bool,
    /// Divide prompt lengths by this (>= 1; default: 32 on CPU devices, 1 on GPUs).
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        value_parser = count(1, usize::MAX),
    )]
    pub prompt_div: Option<usize>,
    /// Divide output lengths by this (>= 1; default: 4 on CPU devices, 1 on GPUs).
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        value_parser = count(1, usize::MAX),
    )]
    pub output_div: Option<usize>,
    /// SLO on the time to first token, in ms (> 0): the report adds SLO
    /// attainment (the share of requests that completed within every SLO
    /// given) and goodput (such requests per second), as vLLM's benchmark and
    /// DistServe define them.
    #[arg(long, value_name = "MS", allow_negative_numbers = true, value_parser = positive_ms)]
    pub slo_ttft: Option<f64>,
    /// SLO on the time per output token, in ms (> 0): (end-to-end - TTFT) /
    /// (output tokens - 1) of each request (0 for a one-token output).
    #[arg(long, value_name = "MS", allow_negative_numbers = true, value_parser = positive_ms)]
    pub slo_tpot: Option<f64>,
    /// Write one JSON object per request, one per line: id, outcome (done,
    /// cancelled, failed, rejected) and reason, arrival, admission, first and
    /// last token and finish times (s since the run started), prompt and
    /// output tokens, queue / TTFT / TPOT / end-to-end latencies (ms), SLO
    /// met (with --compare: the continuous run). Written like --trace-out.
    #[arg(long, value_name = "FILE")]
    pub requests_out: Option<PathBuf>,
    /// Write the run's Prometheus metrics at its end (OpenMetrics text: vLLM's
    /// names with the `xtc:` prefix, e.g. xtc:time_to_first_token_seconds,
    /// and the batch group's statistics; with --compare: the continuous run).
    /// Written like --trace-out.
    #[arg(long, value_name = "FILE")]
    pub metrics_out: Option<PathBuf>,
    /// Serve the metrics at http://ADDR/metrics while the run lasts (e.g.
    /// 127.0.0.1:9100; port 0 picks a free port; the address is printed on
    /// stderr).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Sweep the request rate: run continuous, static and one-at-a-time
    /// batching at each of these --time-scale values (comma-separated; alone:
    /// 1,2,4,...,256) in one process, and report per rate the throughput,
    /// normalized latency (mean end-to-end / output tokens), TTFT and TPOT
    /// p99 and SLO attainment, then each policy's capacity (the highest rate
    /// up to which at least 90% of requests meet the SLO) and the capacity
    /// ratios. The SLO defaults to --slo-ttft 1000 --slo-tpot 100; --requests
    /// to 128 (on --device toy the default sweep takes about 6 minutes). A
    /// table, or JSON with --json; see --csv-out and --plot-out.
    #[arg(
        long,
        value_name = "RATES",
        num_args = 0..=1,
        default_missing_value = DEFAULT_SWEEP_RATES,
        value_parser = rates,
        conflicts_with_all = ["compare", "time_scale", "trace_out", "requests_out", "metrics_out"],
    )]
    pub sweep: Option<Rates>,
    /// With --sweep: write the per-rate figures as CSV (one row per policy
    /// and rate).
    #[arg(long, value_name = "FILE", requires = "sweep")]
    pub csv_out: Option<PathBuf>,
    /// With --sweep: draw normalized latency and SLO attainment against the
    /// request rate, one line per policy, as an SVG file.
    #[arg(long, value_name = "FILE", requires = "sweep")]
    pub plot_out: Option<PathBuf>,
    /// With --device toy: make each iteration take FIXED + PER_ROW x token
    /// rows microseconds (the toy model sleeps on the blocking pool, like a
    /// device, without using the CPU), e.g. 1800,90 (lavapipe's cost for the
    /// synthetic model). Default: 0,0, or 1800,90 with --sweep.
    #[arg(long, value_name = "FIXED_US,PER_ROW_US", value_parser = toy_cost)]
    pub toy_cost: Option<IterationCost>,
}

/// `--sweep` without a value.
pub const DEFAULT_SWEEP_RATES: &str = "1,2,4,8,16,32,64,128,256";

/// Requests replayed by `--sweep` unless `--requests` says otherwise.
pub const DEFAULT_SWEEP_REQUESTS: usize = 128;

/// The SLO `--sweep` measures attainment against unless `--slo-ttft` /
/// `--slo-tpot` say otherwise, ms: (TTFT, TPOT).
pub const DEFAULT_SWEEP_SLO_MS: (f64, f64) = (1000.0, 100.0);

/// The rates of `--sweep`: time scales, ascending, without repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct Rates(pub Vec<f64>);

/// The clap value parser of `--sweep`: positive finite numbers, comma
/// separated, sorted and without repeats.
pub(crate) fn rates(s: &str) -> Result<Rates, String> {
    let mut v = Vec::new();
    for part in s.split(',') {
        match time_scale(part) {
            Ok(x) => v.push(x),
            Err(e) => return Err(format!("{:?} {e}", part.trim())),
        }
    }
    v.sort_by(f64::total_cmp);
    v.dedup();
    Ok(Rates(v))
}

/// The clap value parser of `--toy-cost`: `FIXED_US,PER_ROW_US`, whole
/// microseconds up to an hour.
fn toy_cost(s: &str) -> Result<IterationCost, String> {
    let bad = || {
        "must be FIXED_US,PER_ROW_US: two whole numbers of microseconds (e.g. 1800,90)".to_string()
    };
    let (a, b) = s.split_once(',').ok_or_else(bad)?;
    let us = |x: &str| match x.trim().parse::<u64>() {
        Ok(n) if n <= 3_600_000_000 => Ok(Duration::from_micros(n)),
        _ => Err(bad()),
    };
    Ok(IterationCost {
        fixed: us(a)?,
        per_row: us(b)?,
    })
}

/// A clap value parser of a whole number in `lo..=hi`; its messages read
/// "must be a whole number from 1 to 1048576" (or "..., at least 1").
pub(crate) fn count(
    lo: usize,
    hi: usize,
) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync {
    move |s: &str| {
        let range = if hi == usize::MAX {
            format!("at least {lo}")
        } else {
            format!("from {lo} to {hi}")
        };
        match s.trim().parse::<u128>() {
            Ok(n) if (lo as u128..=hi as u128).contains(&n) => Ok(n as usize),
            Ok(n) if n > hi as u128 && hi == usize::MAX => Err(format!("must be at most {hi}")),
            Ok(_) => Err(format!("must be {range}")),
            Err(_) => Err(format!("must be a whole number, {range}")),
        }
    }
}

/// The clap value parser of `--time-scale`: a finite number > 0.
pub(crate) fn time_scale(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        Ok(x) if x.is_infinite() && x > 0.0 => Err(
            "must be a finite number greater than 0 (to send every request at once, \
             use a large one such as 1e9)"
                .into(),
        ),
        _ => Err("must be a finite number greater than 0".into()),
    }
}

/// The clap value parser of `--slo-ttft` / `--slo-tpot`: a finite number of
/// milliseconds > 0.
fn positive_ms(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err("must be a finite number of milliseconds greater than 0".into()),
    }
}

/// The clap value parser of `--cancel-rate`: a number from 0 to 1.
fn fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err("must be a number from 0 to 1".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_parser_messages() {
        let p = count(1, 8);
        assert_eq!(p("3"), Ok(3));
        assert_eq!(p("9"), Err("must be from 1 to 8".into()));
        assert_eq!(p("x"), Err("must be a whole number, from 1 to 8".into()));
        let q = count(1, usize::MAX);
        assert_eq!(q("0"), Err("must be at least 1".into()));
        assert_eq!(q("-1"), Err("must be a whole number, at least 1".into()));
        assert_eq!(
            q("99999999999999999999999"),
            Err(format!("must be at most {}", usize::MAX))
        );
    }
}
