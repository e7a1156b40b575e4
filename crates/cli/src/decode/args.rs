//! `xtc decode`'s arguments: [`DecodeArgs`], their clap value parsers, the
//! defaults (`DEFAULT_*`) and the exit statuses `--help` documents.

use std::path::PathBuf;
use std::time::Duration;

use crate::device::DeviceArg;
use crate::generate::KernelForm;
use xtc_model::adapters::IterationCost;
use xtc_replay::trace::Scaling;

/// Default speed-up of the trace's arrival clock.
pub const DEFAULT_TIME_SCALE: f64 = 8.0;

/// Largest `--max-active`: a ready vector of more members than this is refused
/// up front (the group's and the device's per-member storage would not fit).
pub const MAX_ACTIVE_LIMIT: usize = 1 << 20;

/// Default number of requests replayed (a GGUF model on a CPU device:
/// [`super::source::CPU_MODEL_REQUESTS`]).
pub const DEFAULT_REQUESTS: usize = 512;

/// Length scaling on CPU devices: prompt / 32 (the trace's median prompt of
/// ~1,000 tokens becomes ~32), output / 4 (median ~240 becomes ~60), each
/// capped at 128 tokens (half the synthetic model's 256 positions,
/// [`xtc_model::Config::tiny`]; the GGUF model on a CPU device gets the same caps).
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

/// The exit-status section of `xtc decode --help` (also in docs/decode.md).
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
    /// Token rows per iteration (prefill chunks + one per decoding member; >= 1;
    /// default 64, 16 for --sweep of the GGUF model on a CPU device).
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        value_parser = count(1, usize::MAX),
    )]
    pub token_budget: Option<usize>,
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
    /// batching at each of these --time-scale values (comma-separated) in one
    /// process, and report per rate the throughput, normalized latency (mean
    /// end-to-end / output tokens), TTFT and TPOT p99 and SLO attainment, then
    /// each policy's capacity (the highest rate up to which at least 90% of
    /// requests meet the SLO), the capacity ratios and a ready-to-paste
    /// markdown table. Alone, the defaults fit the model: the GGUF model on a
    /// CPU device (lavapipe, the CPU reference, or the toy replaying its
    /// calibrated cost) sweeps 0.25,0.5,1,2,4,8,16 with 24 requests under
    /// TTFT <= 10 s and TPOT <= 500 ms, 48 token rows per iteration (about 8
    /// minutes on 2 quiet cores); the synthetic
    /// model sweeps 1,2,4,...,256 with 128 requests under TTFT <= 1000 ms and
    /// TPOT <= 100 ms (--device toy: about 6 minutes). --requests, --slo-ttft
    /// and --slo-tpot override them. A table, or JSON with --json; see
    /// --csv-out and --plot-out.
    #[arg(
        long,
        value_name = "RATES",
        num_args = 0..=1,
        default_missing_value = "default",
        value_parser = rates,
        conflicts_with_all = ["compare", "time_scale", "trace_out", "requests_out", "metrics_out"],
    )]
    pub sweep: Option<Rates>,
    /// With --sweep: after the grid of rates, refine each policy's knee N
    /// times: run that policy alone at the geometric mean of the last rate
    /// it sustained and the first it missed (rounded to 3 significant
    /// digits), and keep the half that holds the knee. On a grid of
    /// doublings a capacity is otherwise only known to a factor of 2 (and a
    /// capacity ratio reads as a power of 2); 2 steps bring that to 1.19x, 3
    /// to 1.09x. Each step is one run of one policy (3 policies x N runs at
    /// most). A policy that met every rate, or missed the lowest, has no
    /// knee inside the grid and is not refined. Refinement rows are marked
    /// in the tables (`refined` in JSON and CSV). N is 0 to 8 (default 0:
    /// the grid alone).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "sweep",
          value_parser = clap::value_parser!(u32).range(0..=8))]
    pub refine: u32,
    /// With --sweep: write the per-rate figures as CSV (one row per policy
    /// and rate).
    #[arg(long, value_name = "FILE", requires = "sweep")]
    pub csv_out: Option<PathBuf>,
    /// With --sweep: draw normalized latency and SLO attainment against the
    /// request rate, one line per policy, as an SVG file.
    #[arg(long, value_name = "FILE", requires = "sweep")]
    pub plot_out: Option<PathBuf>,
    /// With --device toy: how long each iteration takes (the toy model sleeps
    /// on the blocking pool, like a device, without using the CPU). Either a
    /// cost file written by `xtc calibrate --output FILE` (the model's
    /// measured fit: fixed + per token row + per KV position read), or
    /// FIXED_US,PER_ROW_US or FIXED_US,PER_ROW_US,PER_POSITION_US in
    /// microseconds (e.g. 1800,90).
    /// Default: 0,0, or with --sweep 1800,90, a labelled default model
    /// (lavapipe's two-point fit for the synthetic model, not a calibration).
    #[arg(long, value_name = "FILE|FIXED_US,PER_ROW_US", value_parser = toy_cost)]
    pub toy_cost: Option<ToyCost>,
}

/// A parsed `--toy-cost`.
#[derive(Debug, Clone, PartialEq)]
pub enum ToyCost {
    /// Coefficients given inline.
    Inline(IterationCost),
    /// A cost file of `xtc calibrate` (read when the run starts).
    File(PathBuf),
}

/// Default `--token-budget`.
pub const DEFAULT_TOKEN_BUDGET: usize = 64;

/// What `--sweep` runs unless told otherwise: rates, requests, SLO and
/// token budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweepDefaults {
    /// Time scales swept (`--sweep` alone).
    pub rates: &'static [f64],
    /// Requests replayed (without `--requests`).
    pub requests: usize,
    /// The SLO, ms: (TTFT, TPOT) (without `--slo-ttft` / `--slo-tpot`).
    pub slo_ms: (f64, f64),
    /// Token rows per iteration (without `--token-budget`).
    pub token_budget: usize,
}

/// `--sweep` defaults of the synthetic model (and `--device toy` without
/// `--model`): its iterations cost milliseconds, so the knees lie at 16-256x.
pub const SYNTHETIC_SWEEP: SweepDefaults = SweepDefaults {
    rates: &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
    requests: 128,
    slo_ms: (1000.0, 100.0),
    token_budget: DEFAULT_TOKEN_BUDGET,
};

/// `--sweep` defaults of the GGUF model on a CPU device (lavapipe, the CPU
/// reference, or the toy replaying its calibrated cost). The SLO is what a
/// chat user of such a machine would accept: the first token within 10 s
/// (a queue of a few requests ahead), then at least 2 tokens/s (TPOT <=
/// 500 ms: about speaking pace, so a streamed answer reads as it is
/// written). The token budget is the largest that keeps a full iteration
/// well within that TPOT: `xtc calibrate` on lavapipe (2-core "AMD EPYC"
/// guest, 2026-12-04) fits 14.2 ms + 6.2 ms per token row and measures
/// 0.33 s for 48 decode rows, 0.27-0.28 s for a 48-row prefill chunk
/// (chunked prefill bounded by the TPOT SLO, as Sarathi-Serve sizes its
/// chunks). With 64 requests, against the 16 rows chosen when a row cost
/// 19-21 ms, 48 rows raised continuous batching's capacity from 2.83x to
/// 3.36x and static batching's from 1.68x to 2.83x, one at a time unchanged
/// at 0.595x, with TPOT p99 at most 0.49 s at the knees
/// (`benches/peers/2026-12-04-epyc-real-model-sweep-budget48.txt`): 16 rows
/// starved prefill once 16 members were decoding. The rates bracket one at
/// a time's knee for the default 24 requests (1.68 requests/s at 1x; 4x on
/// the quiet EPYC guest with 48 rows, 21 runs in 446 s); all 24 fit one
/// ready vector, so continuous and static batching meet every rate (more
/// requests than `--max-active` separate them).
pub const MODEL_CPU_SWEEP: SweepDefaults = SweepDefaults {
    rates: &[0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0],
    requests: 24,
    slo_ms: (10_000.0, 500.0),
    token_budget: 48,
};

impl SweepDefaults {
    /// `args` with the defaults filled in: `--sweep` alone gets
    /// [`SweepDefaults::rates`]; without `--slo-ttft` and `--slo-tpot`, the
    /// SLO (one given alone is the only bound); without `--token-budget`,
    /// [`SweepDefaults::token_budget`].
    pub fn apply(&self, args: &DecodeArgs) -> DecodeArgs {
        let mut a = args.clone();
        a.token_budget.get_or_insert(self.token_budget);
        if let Some(r) = &mut a.sweep
            && r.0.is_empty()
        {
            r.0 = self.rates.to_vec();
        }
        if a.slo_ttft.is_none() && a.slo_tpot.is_none() {
            a.slo_ttft = Some(self.slo_ms.0);
            a.slo_tpot = Some(self.slo_ms.1);
        }
        a
    }
}

/// The rates of `--sweep`: time scales, ascending, without repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct Rates(pub Vec<f64>);

/// The clap value parser of `--sweep`: positive finite numbers, comma
/// separated, sorted and without repeats; `default` (what `--sweep` alone
/// gives) is the empty list, filled by [`SweepDefaults::apply`].
pub(crate) fn rates(s: &str) -> Result<Rates, String> {
    if s.trim() == "default" {
        return Ok(Rates(Vec::new()));
    }
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

/// The clap value parser of `--toy-cost`: `FIXED_US,PER_ROW_US` (whole
/// microseconds up to an hour) with an optional `,PER_POSITION_US` (a
/// decimal number of microseconds), or else a file name.
fn toy_cost(s: &str) -> Result<ToyCost, String> {
    let numeric = |c: char| c.is_ascii_digit() || ",. +-eE".contains(c);
    if s.trim().is_empty() {
        return Err(
            "must name a cost file (xtc calibrate --output FILE) or be FIXED_US,PER_ROW_US".into(),
        );
    }
    if !s.chars().all(numeric) {
        return Ok(ToyCost::File(PathBuf::from(s)));
    }
    let bad = || {
        "must be FIXED_US,PER_ROW_US[,PER_POSITION_US]: whole numbers of microseconds \
         (e.g. 1800,90), the third a decimal one, or a cost file of xtc calibrate"
            .to_string()
    };
    let parts: Vec<&str> = s.split(',').collect();
    if !(2..=3).contains(&parts.len()) {
        return Err(bad());
    }
    let us = |x: &str| match x.trim().parse::<u64>() {
        Ok(n) if n <= 3_600_000_000 => Ok(Duration::from_micros(n)),
        _ => Err(bad()),
    };
    let per_position = match parts.get(2) {
        Some(x) => match x.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && (0.0..=3.6e9).contains(&v) => {
                Duration::from_secs_f64(v / 1e6)
            }
            _ => return Err(bad()),
        },
        None => Duration::ZERO,
    };
    Ok(ToyCost::Inline(IterationCost {
        fixed: us(parts[0])?,
        per_row: us(parts[1])?,
        per_position,
    }))
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
