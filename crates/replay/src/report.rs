//! The figures of an `xtc decode` run: text report, JSON report, per-request
//! records, Chrome trace.
//!
//! [`Report::new`] reduces a [`RunOutput`] to what serving benchmarks report
//! (vLLM's `benchmark_serving`, DistServe): request counts with the rejected
//! ones per reason, tokens, duration, request and token throughput,
//! iterations and the mean ready vector, the latency distributions of queue
//! time, TTFT, TPOT, inter-token latency and end-to-end latency
//! ([`LatencyStats`]: mean, p50, p90, p95, p99, max), the normalized latency,
//! SLO attainment and goodput when an [`Slo`] is set, and the KV cache's use.
//! The JSON form carries [`SCHEMA_VERSION`], the xtc version and the run's
//! whole [`RunConfig`]; `docs/decode-report.md` documents every field, with
//! its unit in its name. [`request_records`] gives one record per request
//! (`--requests-out`, JSON lines). [`chrome_trace`] writes the run as Chrome
//! trace / Perfetto JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use crate::job::{Finished, RunOutput, Status, Workload};
use crate::latency::{LatencyStats, SloReport};
use crate::run_config::RunConfig;
use xtc_kvbatch::latency::{RequestLatency, Slo};
use xtc_kvbatch::reject::{RejectReason, Rejected};

/// Version of the JSON report's layout (`schema_version`): bumped when a
/// field is renamed, removed or changes meaning (added fields keep it).
pub const SCHEMA_VERSION: u32 = 1;

/// The xtc version that wrote a report (`xtc_version`).
pub const XTC_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The figures of one run (the JSON report; see `docs/decode-report.md`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// [`XTC_VERSION`].
    pub xtc_version: &'static str,
    /// Admission policy (`continuous`, `static`, `one-at-a-time`).
    pub mode: &'static str,
    /// One line naming the device and model.
    pub device: String,
    /// What produced the run (`null` when the caller gave none).
    pub config: Option<RunConfig>,
    /// Requests by outcome.
    pub requests: RequestCounts,
    /// Tokens processed.
    pub tokens: TokenCounts,
    /// Wall time of the run (first arrival to last completion), s.
    pub duration_s: f64,
    /// Rates over the run's duration.
    pub throughput: Throughput,
    /// Iterations (device operations) and their ready vectors.
    pub iterations: IterationSummary,
    /// Latency distributions over completed requests.
    pub latency: Latencies,
    /// Mean over completed requests of end-to-end latency / output tokens, ms.
    pub normalized_latency_ms_per_token: f64,
    /// SLO attainment and goodput (`null` without `--slo-ttft`/`--slo-tpot`).
    pub slo: Option<SloReport>,
    /// The KV cache's use.
    pub kv_cache: KvSummary,
    /// Rejected requests, one entry per reason (in [`RejectReason`] order).
    pub rejections: Vec<RejectionSummary>,
}

/// Requests of a run by outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestCounts {
    /// Requests in the workload.
    pub total: usize,
    /// Generated all their tokens (or the stop token).
    pub completed: usize,
    /// Cancelled by their client (`--cancel-rate`).
    pub cancelled: usize,
    /// Failed (device or engine error).
    pub failed: usize,
    /// Rejected before admission (could never fit).
    pub rejected: usize,
    /// Rejected requests per reason; every reason is present (0 when none).
    pub rejected_by_reason: BTreeMap<&'static str, usize>,
}

/// Tokens of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TokenCounts {
    /// Prompt tokens prefilled.
    pub prompt: usize,
    /// Tokens generated.
    pub generated: usize,
}

/// Rates over a run's duration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Throughput {
    /// Completed requests per second.
    pub requests_per_s: f64,
    /// Generated tokens per second.
    pub output_tokens_per_s: f64,
    /// Prompt + generated tokens per second.
    pub total_tokens_per_s: f64,
}

/// Iterations of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct IterationSummary {
    /// Iterations (device operations).
    pub count: usize,
    /// Mean members per ready vector.
    pub mean_ready_members: f64,
    /// Largest ready vector.
    pub max_ready_members: usize,
    /// Mean token rows (prefill + decode) per iteration.
    pub mean_tokens: f64,
}

/// The latency distributions of a run (see [`crate::latency`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Latencies {
    /// Arrival to admission.
    pub queue: LatencyStats,
    /// Time to first token: arrival to the first generated token.
    pub ttft: LatencyStats,
    /// Time per output token: `(e2e - TTFT) / (output tokens - 1)`.
    pub tpot: LatencyStats,
    /// Inter-token latency: every gap between consecutive tokens.
    pub itl: LatencyStats,
    /// End-to-end: arrival to the last generated token.
    pub e2e: LatencyStats,
}

/// The KV cache's use over a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct KvSummary {
    /// Blocks in the cache.
    pub blocks: usize,
    /// Most blocks allocated at once.
    pub peak_blocks: usize,
    /// `peak_blocks / blocks` (0 to 1).
    pub peak_usage_fraction: f64,
    /// Blocks still allocated after the run (0 unless leaked).
    pub leaked_blocks: usize,
}

/// The requests rejected for one reason: a count and one line, instead of
/// one line per request (a small cache can reject thousands).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RejectionSummary {
    /// The reason (`kv-blocks`, `seq-len`, `submit`).
    pub reason: RejectReason,
    /// Requests rejected for it.
    pub count: usize,
    /// The most any of them needs: KV blocks or positions (0 for `submit`).
    pub max_need: u64,
    /// What there is: the cache's blocks or the model's `seq_len` (0 for `submit`).
    pub limit: u64,
    /// Their request ids, ascending.
    pub ids: Vec<usize>,
    /// The summary line (for a single request: its own message).
    pub message: String,
}

/// Request ids shown in a summary line before "and N more".
const SHOWN_IDS: usize = 5;

/// Groups `rejected` by reason, in [`RejectReason`] order.
pub fn summarize_rejections(rejected: &[Rejected]) -> Vec<RejectionSummary> {
    let mut by: BTreeMap<RejectReason, Vec<&Rejected>> = BTreeMap::new();
    for r in rejected {
        by.entry(r.kind).or_default().push(r);
    }
    by.into_iter()
        .map(|(reason, rs)| {
            let mut ids: Vec<usize> = rs.iter().map(|r| r.id).collect();
            ids.sort_unstable();
            let max_need = rs.iter().map(|r| r.need).max().unwrap_or(0);
            let limit = rs.iter().map(|r| r.limit).max().unwrap_or(0);
            let message = match rs.as_slice() {
                [one] => one.reason.clone(),
                _ => {
                    let shown: Vec<String> =
                        ids.iter().take(SHOWN_IDS).map(|i| i.to_string()).collect();
                    let more = match ids.len().saturating_sub(SHOWN_IDS) {
                        0 => String::new(),
                        n => format!(" and {n} more"),
                    };
                    let (what, hint) = match reason {
                        RejectReason::KvBlocks => (
                            format!("need up to {max_need} KV blocks but the cache has {limit}"),
                            "; raise --kv-blocks or shorten the requests \
                             (--prompt-div, --output-div)",
                        ),
                        RejectReason::SeqLen => (
                            format!(
                                "need up to {max_need} positions but the model's seq_len is {limit}"
                            ),
                            "; shorten the requests (--prompt-div, --output-div)",
                        ),
                        RejectReason::Submit => {
                            ("were refused by the group's submit".to_string(), "")
                        }
                    };
                    format!(
                        "{} requests rejected: {what} (requests {}{more}){hint}",
                        ids.len(),
                        shown.join(", ")
                    )
                }
            };
            RejectionSummary {
                reason,
                count: ids.len(),
                max_need,
                limit,
                ids,
                message,
            }
        })
        .collect()
}

impl Report {
    /// Reduces a run over a workload of `requests` requests, without a
    /// configuration or SLO.
    pub fn from_run(out: &RunOutput, requests: usize) -> Self {
        Self::build(out, requests, None, &Slo::default())
    }

    /// Reduces a run produced by `config` (its request count and SLO).
    pub fn new(out: &RunOutput, config: RunConfig) -> Self {
        let slo = config.slo;
        Self::build(out, config.requests, Some(config), &slo)
    }

    fn build(out: &RunOutput, requests: usize, config: Option<RunConfig>, slo: &Slo) -> Self {
        let fin = &out.finished;
        let count = |st: fn(&Status) -> bool| fin.iter().filter(|f| st(&f.status)).count();
        let done: Vec<&Finished> = fin.iter().filter(|f| f.status == Status::Done).collect();
        let lat: Vec<RequestLatency> = done
            .iter()
            .map(|f| RequestLatency::of(&f.seq.timing, f.seq.generated.len()))
            .collect();
        let prompt: usize = fin.iter().map(|f| f.seq.pos.min(f.seq.prompt.len())).sum();
        let generated: usize = fin.iter().map(|f| f.seq.generated.len()).sum();
        let duration_s = out.wall.as_secs_f64().max(1e-9);
        let its = &out.iterations;
        let ready: usize = its.iter().map(|i| i.ready).sum();
        let rows: usize = its.iter().map(|i| i.prefill_tokens + i.decode_tokens).sum();
        let per_it = |x: usize| x as f64 / its.len().max(1) as f64;
        let normalized: Vec<f64> = lat
            .iter()
            .filter_map(|l| Some(l.e2e?.as_secs_f64() * 1e3 / l.output_tokens.max(1) as f64))
            .collect();
        let cancelled = count(|s| *s == Status::Cancelled);
        let mut by_reason: BTreeMap<&'static str, usize> =
            RejectReason::ALL.iter().map(|r| (r.name(), 0)).collect();
        for r in &out.rejected {
            *by_reason.entry(r.kind.name()).or_default() += 1;
        }
        let slo_report = slo.is_set().then(|| {
            let good = lat.iter().filter(|l| l.meets(slo)).count() as u64;
            let eligible = requests.saturating_sub(cancelled) as u64;
            SloReport::new(slo, good, eligible, duration_s)
        });
        Report {
            schema_version: SCHEMA_VERSION,
            xtc_version: XTC_VERSION,
            mode: out.mode.name(),
            device: out.device.clone(),
            config,
            requests: RequestCounts {
                total: requests,
                completed: done.len(),
                cancelled,
                failed: count(|s| matches!(s, Status::Failed(_))),
                rejected: out.rejected.len(),
                rejected_by_reason: by_reason,
            },
            tokens: TokenCounts { prompt, generated },
            duration_s,
            throughput: Throughput {
                requests_per_s: done.len() as f64 / duration_s,
                output_tokens_per_s: generated as f64 / duration_s,
                total_tokens_per_s: (prompt + generated) as f64 / duration_s,
            },
            iterations: IterationSummary {
                count: its.len(),
                mean_ready_members: per_it(ready),
                max_ready_members: its.iter().map(|i| i.ready).max().unwrap_or(0),
                mean_tokens: per_it(rows),
            },
            latency: Latencies {
                queue: LatencyStats::of(lat.iter().filter_map(|l| l.queue)),
                ttft: LatencyStats::of(lat.iter().filter_map(|l| l.ttft)),
                tpot: LatencyStats::of(lat.iter().filter_map(|l| l.tpot)),
                itl: LatencyStats::of(
                    done.iter()
                        .flat_map(|f| f.seq.timing.token_gaps.iter().copied()),
                ),
                e2e: LatencyStats::of(lat.iter().filter_map(|l| l.e2e)),
            },
            normalized_latency_ms_per_token: if normalized.is_empty() {
                0.0
            } else {
                normalized.iter().sum::<f64>() / normalized.len() as f64
            },
            slo: slo_report,
            kv_cache: KvSummary {
                blocks: out.kv_capacity,
                peak_blocks: out.kv_peak,
                peak_usage_fraction: out.kv_peak as f64 / out.kv_capacity.max(1) as f64,
                leaked_blocks: out.kv_leaked,
            },
            rejections: summarize_rejections(&out.rejected),
        }
    }

    /// The human-readable report.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let r = &self.requests;
        let _ = writeln!(s, "xtc decode: {} batching on {}", self.mode, self.device);
        let _ = writeln!(
            s,
            "  requests        {} ({} done, {} cancelled, {} failed, {} rejected)",
            r.total, r.completed, r.cancelled, r.failed, r.rejected
        );
        let _ = writeln!(
            s,
            "  tokens          {} prompt + {} generated",
            self.tokens.prompt, self.tokens.generated
        );
        let _ = writeln!(s, "  duration        {:.2} s", self.duration_s);
        let t = &self.throughput;
        let _ = writeln!(
            s,
            "  throughput      {:.2} requests/s, {:.1} generated tokens/s ({:.1} tokens/s with prompts)",
            t.requests_per_s, t.output_tokens_per_s, t.total_tokens_per_s
        );
        let it = &self.iterations;
        let _ = writeln!(
            s,
            "  iterations      {} (ready vector mean {:.1}, max {} members; {:.1} token rows each)",
            it.count, it.mean_ready_members, it.max_ready_members, it.mean_tokens
        );
        let _ = writeln!(
            s,
            "  latency, ms          mean       p50       p90       p95       p99       max"
        );
        let l = &self.latency;
        for (name, x) in [
            ("queue", &l.queue),
            ("TTFT", &l.ttft),
            ("TPOT", &l.tpot),
            ("inter-token", &l.itl),
            ("end-to-end", &l.e2e),
        ] {
            let _ = writeln!(
                s,
                "    {name:<13}{:>10.1}{:>10.1}{:>10.1}{:>10.1}{:>10.1}{:>10.1}",
                x.mean_ms, x.p50_ms, x.p90_ms, x.p95_ms, x.p99_ms, x.max_ms
            );
        }
        let _ = writeln!(
            s,
            "  normalized      {:.2} ms per output token (mean end-to-end / output tokens)",
            self.normalized_latency_ms_per_token
        );
        if let Some(slo) = &self.slo {
            let _ = writeln!(
                s,
                "  SLO             {}: {:.1}% attained ({} of {} requests), goodput {:.2} requests/s",
                slo_bounds(slo.ttft_ms, slo.tpot_ms),
                slo.attainment * 100.0,
                slo.good_requests,
                slo.eligible_requests,
                slo.goodput_requests_per_s
            );
        }
        let kv = &self.kv_cache;
        let _ = writeln!(
            s,
            "  KV cache peak   {} of {} blocks ({:.0}%)",
            kv.peak_blocks,
            kv.blocks,
            kv.peak_usage_fraction * 100.0
        );
        if kv.leaked_blocks > 0 {
            let _ = writeln!(
                s,
                "  KV cache LEAK   {} blocks still allocated",
                kv.leaked_blocks
            );
        }
        for r in &self.rejections {
            let _ = writeln!(s, "  {}", r.message);
        }
        s
    }
}

/// `TTFT <= 500 ms, TPOT <= 50 ms` (an unbounded one is left out).
pub fn slo_bounds(ttft_ms: Option<f64>, tpot_ms: Option<f64>) -> String {
    let mut parts = Vec::new();
    if let Some(t) = ttft_ms {
        parts.push(format!("TTFT <= {t} ms"));
    }
    if let Some(t) = tpot_ms {
        parts.push(format!("TPOT <= {t} ms"));
    }
    if parts.is_empty() {
        "no bounds".to_string()
    } else {
        parts.join(", ")
    }
}

/// Continuous vs static vs one-at-a-time on the same workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// [`XTC_VERSION`].
    pub xtc_version: &'static str,
    /// Continuous batching.
    pub continuous: Report,
    /// Static batching.
    #[serde(rename = "static")]
    pub static_: Report,
    /// One request at a time.
    pub one_at_a_time: Report,
    /// Generated tokens/s, continuous / one-at-a-time.
    pub speedup_vs_one: f64,
    /// Generated tokens/s, continuous / static.
    pub speedup_vs_static: f64,
}

impl Comparison {
    /// Puts three reports side by side.
    pub fn new(continuous: Report, static_: Report, one_at_a_time: Report) -> Self {
        let r = |a: &Report, b: &Report| {
            a.throughput.output_tokens_per_s / b.throughput.output_tokens_per_s.max(1e-9)
        };
        Comparison {
            schema_version: SCHEMA_VERSION,
            xtc_version: XTC_VERSION,
            speedup_vs_one: r(&continuous, &one_at_a_time),
            speedup_vs_static: r(&continuous, &static_),
            continuous,
            static_,
            one_at_a_time,
        }
    }

    /// The comparison table and ratios.
    pub fn render(&self) -> String {
        let slo = self.continuous.slo.is_some();
        let mut s = String::from(
            "mode            tokens/s   wall s  iters  mean ready  TTFT p50 ms  TTFT p99 ms  TPOT p99 ms",
        );
        s += if slo { "  SLO met\n" } else { "\n" };
        for r in [&self.continuous, &self.static_, &self.one_at_a_time] {
            let _ = write!(
                s,
                "{:<14} {:>9.1} {:>8.2} {:>6} {:>11.1} {:>12.1} {:>12.1} {:>12.1}",
                r.mode,
                r.throughput.output_tokens_per_s,
                r.duration_s,
                r.iterations.count,
                r.iterations.mean_ready_members,
                r.latency.ttft.p50_ms,
                r.latency.ttft.p99_ms,
                r.latency.tpot.p99_ms
            );
            match &r.slo {
                Some(x) => {
                    let _ = writeln!(s, " {:>7.1}%", x.attainment * 100.0);
                }
                None => s.push('\n'),
            }
        }
        let _ = writeln!(
            s,
            "continuous vs one-at-a-time: {:.2}x tokens/s; vs static: {:.2}x tokens/s, p99 TTFT {:.1} ms vs {:.1} ms",
            self.speedup_vs_one,
            self.speedup_vs_static,
            self.continuous.latency.ttft.p99_ms,
            self.static_.latency.ttft.p99_ms
        );
        if !slo {
            s += "(throughput at one arrival rate is bound by the arrivals: compare capacities with --sweep)\n";
        }
        s
    }
}

/// One request of a run, as `--requests-out` writes it (one JSON object per
/// line). Times are seconds since the run started; latencies are ms.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestRecord {
    /// Request id (trace row order).
    pub id: usize,
    /// `done`, `cancelled`, `failed` or `rejected`.
    pub outcome: &'static str,
    /// Why it was rejected or failed (`null` otherwise).
    pub reason: Option<String>,
    /// Scheduled arrival (the trace time, scaled), s.
    pub arrival_s: f64,
    /// First in a ready vector, s.
    pub admitted_s: Option<f64>,
    /// First generated token collected, s.
    pub first_token_s: Option<f64>,
    /// Last generated token collected, s.
    pub last_token_s: Option<f64>,
    /// Left the group (done, cancelled or failed), s.
    pub finish_s: Option<f64>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub output_tokens: usize,
    /// Tokens it asked for (the trace's output length, scaled).
    pub max_output_tokens: usize,
    /// Queue time, ms.
    pub queue_ms: Option<f64>,
    /// Time to first token, ms.
    pub ttft_ms: Option<f64>,
    /// Time per output token, ms (2 or more tokens).
    pub tpot_ms: Option<f64>,
    /// End-to-end latency, ms.
    pub e2e_ms: Option<f64>,
    /// Whether it met the SLO (`null` without one).
    pub slo_met: Option<bool>,
}

/// One [`RequestRecord`] per request of `wl` in `out`, by id.
pub fn request_records(out: &RunOutput, wl: &Workload, slo: &Slo) -> Vec<RequestRecord> {
    let rel = |t: Instant| t.saturating_duration_since(out.started).as_secs_f64();
    let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
    let mut recs: Vec<RequestRecord> = out
        .finished
        .iter()
        .map(|f| {
            let t = &f.seq.timing;
            let l = RequestLatency::of(t, f.seq.generated.len());
            let (outcome, reason) = match &f.status {
                Status::Done => ("done", None),
                Status::Cancelled => ("cancelled", None),
                Status::Failed(m) => ("failed", Some(m.clone())),
            };
            RequestRecord {
                id: f.seq.id,
                outcome,
                reason,
                arrival_s: rel(t.arrived),
                admitted_s: t.admitted.map(rel),
                first_token_s: t.first_token.map(rel),
                last_token_s: t.last_token.map(rel),
                finish_s: t.finished.map(rel),
                prompt_tokens: f.seq.prompt.len(),
                output_tokens: f.seq.generated.len(),
                max_output_tokens: f.seq.max_output,
                queue_ms: ms(l.queue),
                ttft_ms: ms(l.ttft),
                tpot_ms: ms(l.tpot),
                e2e_ms: ms(l.e2e),
                slo_met: slo
                    .is_set()
                    .then(|| f.status == Status::Done && l.meets(slo)),
            }
        })
        .collect();
    let specs: BTreeMap<usize, _> = wl.requests.iter().map(|r| (r.id, r)).collect();
    for r in &out.rejected {
        let spec = specs.get(&r.id);
        recs.push(RequestRecord {
            id: r.id,
            outcome: "rejected",
            reason: Some(r.reason.clone()),
            arrival_s: spec.map_or(0.0, |s| s.arrival.as_secs_f64()),
            admitted_s: None,
            first_token_s: None,
            last_token_s: None,
            finish_s: None,
            prompt_tokens: spec.map_or(0, |s| s.prompt.len()),
            output_tokens: 0,
            max_output_tokens: spec.map_or(0, |s| s.output_tokens),
            queue_ms: None,
            ttft_ms: None,
            tpot_ms: None,
            e2e_ms: None,
            slo_met: slo.is_set().then_some(false),
        });
    }
    recs.sort_by_key(|r| r.id);
    recs
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The decode process's tracks in a [`chrome_trace`].
pub mod tracks {
    /// The process of a decode run.
    pub const PID: u32 = 1;
    /// The thread holding one `iteration` slice per iteration.
    pub const ITERATIONS: u32 = 1;
    /// The thread holding one `rejected` instant per rejected request.
    pub const REJECTIONS: u32 = 2;
    /// Counter track: KV blocks allocated (series `blocks`).
    pub const KV_BLOCKS: &str = "KV blocks used";
    /// Counter track: members of the ready vector (series `members`).
    pub const READY: &str = "ready vector";
    /// Counter track: requests arrived but not yet admitted (series `requests`).
    pub const WAITING: &str = "waiting requests";
    /// Category and root slice name of every request's async slices.
    pub const REQUEST: &str = "request";
}

/// The run as Chrome trace / Perfetto JSON (`chrome://tracing`,
/// <https://ui.perfetto.dev>), written with the crate's one
/// [`TraceWriter`](xtc_trace::TraceWriter):
/// - process `xtc decode (MODE)` ([`tracks::PID`]) with `process_name` and
///   `thread_name` metadata;
/// - thread `iterations`: one slice per iteration, all named `iteration`
///   (so Perfetto groups them), its index, ready vector, scheduled members,
///   prefill and decode rows and KV use in `args`;
/// - counter tracks `KV blocks used`, `ready vector` and `waiting requests`
///   (arrived, not yet admitted), sampled at every change;
/// - every request as nestable async slices of id = request id, all rooted
///   at a slice named `request` (arrival to finish; args: prompt and
///   generated tokens, status), so Perfetto shows them in ONE track group
///   (a row per concurrent request) instead of a track each: `queued`
///   (arrival to admission) and `running` (admission to finish) nested in it,
///   and a `first token` instant;
/// - thread `rejections`: a `rejected` instant per rejected request at its
///   arrival (args: id, reason kind, message).
///
/// Times are µs since the run started; `wl` gives rejected requests' arrivals.
pub fn chrome_trace(out: &RunOutput, wl: &Workload) -> Value {
    use tracks::*;
    use xtc_trace::{Scope, TraceWriter};
    let mut w = TraceWriter::new();
    w.process_name(PID, &format!("xtc decode ({})", out.mode.name()));
    w.thread_name(PID, ITERATIONS, "iterations");
    w.thread_sort_index(PID, ITERATIONS, 0);
    w.thread_name(PID, REJECTIONS, "rejections");
    w.thread_sort_index(PID, REJECTIONS, 1);
    let rel = |x: Instant| us(x.saturating_duration_since(out.started));
    for (i, it) in out.iterations.iter().enumerate() {
        let t0 = us(it.start);
        w.complete(
            PID,
            ITERATIONS,
            "iteration",
            "iteration",
            t0,
            us(it.dur),
            json!({"index": i, "ready": it.ready, "scheduled": it.scheduled,
                   "prefill_tokens": it.prefill_tokens, "decode_tokens": it.decode_tokens,
                   "kv_used": it.kv_used}),
        );
        w.counter(PID, READY, t0, &[("members", it.ready as f64)]);
        w.counter(
            PID,
            KV_BLOCKS,
            us(it.start + it.dur),
            &[("blocks", it.kv_used as f64)],
        );
    }
    // Waiting requests: +1 at arrival, -1 at admission (or at finish for a
    // request never admitted), sampled at every change.
    let mut waiting: Vec<(f64, i64)> = Vec::new();
    for f in &out.finished {
        let t = &f.seq.timing;
        let left = t.admitted.or(t.finished).unwrap_or(t.arrived);
        waiting.push((rel(t.arrived), 1));
        waiting.push((rel(left), -1));
    }
    waiting.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut n = 0i64;
    for (ts, d) in waiting {
        n += d;
        w.counter(PID, WAITING, ts, &[("requests", n as f64)]);
    }
    for f in &out.finished {
        let t = &f.seq.timing;
        let id = f.seq.id as u64;
        let end = rel(t.finished.or(t.last_token).unwrap_or(t.arrived));
        let arrived = rel(t.arrived);
        let admitted = t.admitted.map(rel);
        w.async_begin(
            PID,
            REQUEST,
            REQUEST,
            id,
            arrived,
            json!({"id": id, "prompt_tokens": f.seq.prompt.len(),
                   "generated_tokens": f.seq.generated.len(), "status": f.status}),
        );
        let queued_end = admitted.unwrap_or(end);
        w.async_begin(PID, REQUEST, "queued", id, arrived, Value::Null);
        w.async_end(PID, REQUEST, "queued", id, queued_end, Value::Null);
        if let Some(a) = admitted {
            w.async_begin(PID, REQUEST, "running", id, a, Value::Null);
            if let Some(ft) = t.first_token {
                w.async_instant(PID, REQUEST, "first token", id, rel(ft), Value::Null);
            }
            w.async_end(PID, REQUEST, "running", id, end, Value::Null);
        }
        w.async_end(PID, REQUEST, REQUEST, id, end, Value::Null);
    }
    let arrivals: BTreeMap<usize, Duration> =
        wl.requests.iter().map(|r| (r.id, r.arrival)).collect();
    for r in &out.rejected {
        let at = arrivals.get(&r.id).copied().unwrap_or_default();
        w.instant(
            PID,
            REJECTIONS,
            "rejected",
            REQUEST,
            us(at),
            Scope::Thread,
            json!({"id": r.id, "reason": r.kind, "message": r.reason}),
        );
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(id: usize, kind: RejectReason, need: u64, limit: u64) -> Rejected {
        Rejected {
            id,
            kind,
            need,
            limit,
            reason: format!("request {id} rejected: needs {need}"),
        }
    }

    /// Issue 12: one line per rejected request (1,383 in one run); now one
    /// per reason, with the count, the largest need and the first ids.
    #[test]
    fn rejections_are_summarised_per_reason() {
        let mut rs: Vec<Rejected> = (0..1383)
            .map(|i| rejected(1383 - i, RejectReason::KvBlocks, 3 + (i % 7) as u64, 4))
            .collect();
        rs.push(rejected(2000, RejectReason::SeqLen, 300, 256));
        let s = summarize_rejections(&rs);
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].reason, s[0].count, s[0].max_need),
            (RejectReason::KvBlocks, 1383, 9)
        );
        assert_eq!(s[0].ids[..3], [1, 2, 3], "ascending");
        assert!(
            s[0].message.starts_with("1383 requests rejected: need up to 9 KV blocks but the cache has 4 (requests 1, 2, 3, 4, 5 and 1378 more)"),
            "{}",
            s[0].message
        );
        // A reason with one request keeps that request's own message.
        assert_eq!(s[1].message, "request 2000 rejected: needs 300");
        assert!(summarize_rejections(&[]).is_empty());
    }
}
