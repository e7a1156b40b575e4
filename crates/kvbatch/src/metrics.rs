//! Prometheus metrics of a decode run, with the names and buckets users know
//! from vLLM (`vllm:` becomes `xtc:`), through the official client crate
//! (`prometheus-client`, OpenMetrics text exposition).
//!
//! [`DecodeMetrics`] owns a [`Registry`] and is updated by the group driver
//! (`xtc_replay::run_with_metrics`) as the run goes: after every
//! iteration (the batch group's statistics, running and waiting requests,
//! KV-cache use, tokens per iteration, each new first token and token gap)
//! and at every completion or rejection. [`encode`] renders a registry as
//! text (`xtc decode --metrics-out`; `--metrics-addr` serves it from another
//! thread while the run lasts, so every metric is an atomic).
//!
//! | name | type | what |
//! | --- | --- | --- |
//! | `xtc:num_requests_running` | gauge | members of the ready vector |
//! | `xtc:num_requests_waiting` | gauge | arrived, not yet admitted |
//! | `xtc:kv_cache_usage_perc` | gauge | KV blocks allocated / blocks (1 = 100%) |
//! | `xtc:prompt_tokens_total` | counter | prompt tokens prefilled |
//! | `xtc:generation_tokens_total` | counter | tokens generated |
//! | `xtc:request_success_total{finished_reason}` | counter | requests done: `length` or `stop` |
//! | `xtc:request_cancelled_total` | counter | requests cancelled by their client |
//! | `xtc:request_failed_total` | counter | requests failed |
//! | `xtc:request_rejected_total{reason}` | counter | requests rejected: `kv-blocks`, `seq-len`, `submit` |
//! | `xtc:iteration_tokens_total` | histogram | token rows per iteration |
//! | `xtc:time_to_first_token_seconds` | histogram | TTFT, observed at the first token |
//! | `xtc:inter_token_latency_seconds` | histogram | every token gap, observed as it happens |
//! | `xtc:request_time_per_output_token_seconds` | histogram | TPOT of each completed request |
//! | `xtc:e2e_request_latency_seconds` | histogram | arrival to last token of each completed request |
//! | `xtc:request_queue_time_seconds` | histogram | arrival to admission |
//! | `xtc:request_inference_time_seconds` | histogram | admission to the last token |
//! | `xtc:request_prompt_tokens`, `xtc:request_generation_tokens` | histogram | tokens per completed request |
//! | `xtc:batch_queued`, `_ready`, `_blocked`, `_reserved_units` | gauge | `Group::stats` gauges (B-172) |
//! | `xtc:batch_iterations_total`, `_completed_total`, `_cancelled_total`, `_failed_total`, `_rejections_total` | counter | `Group::stats` counters |
//! | `xtc:batch_mean_ready_vector`, `xtc:batch_max_ready_vector` | gauge | `total_members / iterations`, `max_vector` |
//! | `xtc:batch_offloads_total`, `_offload_timeouts_total`, `_offload_errors_total`, `_mt_queued_total`, `_mt_rejections_total` | counter | `Group::async_stats` (B-104, B-105, B-177) |
//!
//! The group's cumulative statistics become counters by adding what they
//! grew by since the last sample.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::reject::RejectReason;
use xtc::batch::{AsyncStats, Stats};

/// TTFT buckets, s (vLLM's).
pub const TTFT_BUCKETS_S: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// Inter-token latency and TPOT buckets, s (vLLM's).
pub const ITL_BUCKETS_S: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// Request latency buckets (e2e, queue, inference), s (vLLM's).
pub const REQUEST_LATENCY_BUCKETS_S: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// Tokens-per-iteration buckets (vLLM's).
pub const ITERATION_TOKENS_BUCKETS: [f64; 13] = [
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

/// `1, 2, 5, 10, 20, 50, ...` up to `max` (vLLM's `build_1_2_5_buckets`).
pub fn buckets_1_2_5(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1usize;
    'outer: loop {
        for m in [1, 2, 5] {
            let v = m * scale;
            if v > max {
                break 'outer;
            }
            out.push(v as f64);
        }
        scale = match scale.checked_mul(10) {
            Some(s) => s,
            None => break,
        };
    }
    out
}

type Labels = Vec<(&'static str, &'static str)>;
type FGauge = Gauge<f64, AtomicU64>;

/// The metrics of one decode run (see the module doc). Updated on the run's
/// loop; its [`registry`](DecodeMetrics::registry) may be encoded from any
/// thread.
#[derive(Debug)]
pub struct DecodeMetrics {
    registry: Arc<Registry>,
    running: Gauge,
    waiting: Gauge,
    kv_usage: FGauge,
    prompt_tokens: Counter,
    generation_tokens: Counter,
    success: Family<Labels, Counter>,
    cancelled: Counter,
    failed: Counter,
    rejected: Family<Labels, Counter>,
    iteration_tokens: Histogram,
    ttft: Histogram,
    itl: Histogram,
    tpot: Histogram,
    e2e: Histogram,
    queue: Histogram,
    inference: Histogram,
    prompt_len: Histogram,
    generation_len: Histogram,
    group: GroupMetrics,
}

/// `Group::stats` and `Group::async_stats` as metrics.
#[derive(Debug, Default)]
struct GroupMetrics {
    queued: Gauge,
    ready: Gauge,
    blocked: Gauge,
    reserved_units: Gauge,
    iterations: Counter,
    completed: Counter,
    cancelled: Counter,
    failed: Counter,
    rejections: Counter,
    mean_ready: FGauge,
    max_ready: Gauge,
    offloads: Counter,
    offload_timeouts: Counter,
    offload_errors: Counter,
    mt_queued: Counter,
    mt_rejections: Counter,
    last: Cell<(Stats, AsyncStats)>,
}

fn gauge(g: &Gauge, v: u64) {
    g.set(i64::try_from(v).unwrap_or(i64::MAX));
}

/// Adds to `c` what a cumulative statistic grew by since `old`.
fn grow(c: &Counter, old: u64, new: u64) {
    c.inc_by(new.saturating_sub(old));
}

impl DecodeMetrics {
    /// Fresh metrics, registered, for sequences of at most `max_len` tokens
    /// (the token-count histograms' largest bucket).
    pub fn new(max_len: usize) -> Self {
        let mut r = Registry::default();
        let m = DecodeMetrics {
            registry: Arc::new(Registry::default()),
            running: Gauge::default(),
            waiting: Gauge::default(),
            kv_usage: FGauge::default(),
            prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            success: Family::default(),
            cancelled: Counter::default(),
            failed: Counter::default(),
            rejected: Family::default(),
            iteration_tokens: Histogram::new(ITERATION_TOKENS_BUCKETS),
            ttft: Histogram::new(TTFT_BUCKETS_S),
            itl: Histogram::new(ITL_BUCKETS_S),
            tpot: Histogram::new(ITL_BUCKETS_S),
            e2e: Histogram::new(REQUEST_LATENCY_BUCKETS_S),
            queue: Histogram::new(REQUEST_LATENCY_BUCKETS_S),
            inference: Histogram::new(REQUEST_LATENCY_BUCKETS_S),
            prompt_len: Histogram::new(buckets_1_2_5(max_len.max(1))),
            generation_len: Histogram::new(buckets_1_2_5(max_len.max(1))),
            group: GroupMetrics::default(),
        };
        // prometheus-client appends `_total` to counters and ends help with '.'.
        r.register(
            "xtc:num_requests_running",
            "Number of requests in the ready vector",
            m.running.clone(),
        );
        r.register(
            "xtc:num_requests_waiting",
            "Number of requests waiting to be admitted",
            m.waiting.clone(),
        );
        r.register(
            "xtc:kv_cache_usage_perc",
            "KV-cache usage; 1 means 100 percent usage",
            m.kv_usage.clone(),
        );
        r.register(
            "xtc:prompt_tokens",
            "Number of prefill tokens processed",
            m.prompt_tokens.clone(),
        );
        r.register(
            "xtc:generation_tokens",
            "Number of generation tokens processed",
            m.generation_tokens.clone(),
        );
        r.register(
            "xtc:request_success",
            "Count of successfully processed requests",
            m.success.clone(),
        );
        r.register(
            "xtc:request_cancelled",
            "Count of requests cancelled by their client",
            m.cancelled.clone(),
        );
        r.register(
            "xtc:request_failed",
            "Count of requests that failed",
            m.failed.clone(),
        );
        r.register(
            "xtc:request_rejected",
            "Count of requests rejected before admission, by reason",
            m.rejected.clone(),
        );
        r.register(
            "xtc:iteration_tokens_total",
            "Histogram of number of tokens per engine step",
            m.iteration_tokens.clone(),
        );
        r.register(
            "xtc:time_to_first_token_seconds",
            "Histogram of time to first token in seconds",
            m.ttft.clone(),
        );
        r.register(
            "xtc:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds",
            m.itl.clone(),
        );
        r.register(
            "xtc:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request",
            m.tpot.clone(),
        );
        r.register(
            "xtc:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds",
            m.e2e.clone(),
        );
        r.register(
            "xtc:request_queue_time_seconds",
            "Histogram of time spent waiting for admission",
            m.queue.clone(),
        );
        r.register(
            "xtc:request_inference_time_seconds",
            "Histogram of time from admission to the last token",
            m.inference.clone(),
        );
        r.register(
            "xtc:request_prompt_tokens",
            "Number of prefill tokens per request",
            m.prompt_len.clone(),
        );
        r.register(
            "xtc:request_generation_tokens",
            "Number of generation tokens per request",
            m.generation_len.clone(),
        );
        let g = &m.group;
        r.register(
            "xtc:batch_queued",
            "Batch group members waiting for admission",
            g.queued.clone(),
        );
        r.register(
            "xtc:batch_ready",
            "Batch group active members that are READY",
            g.ready.clone(),
        );
        r.register(
            "xtc:batch_blocked",
            "Batch group active members that are BLOCKED",
            g.blocked.clone(),
        );
        r.register(
            "xtc:batch_reserved_units",
            "Resource units (KV blocks) reserved by active members",
            g.reserved_units.clone(),
        );
        r.register(
            "xtc:batch_iterations",
            "Batch group iterations (submits of the async step)",
            g.iterations.clone(),
        );
        r.register(
            "xtc:batch_completed",
            "Batch group completions delivered with Ok",
            g.completed.clone(),
        );
        r.register(
            "xtc:batch_cancelled",
            "Batch group completions delivered with Aborted",
            g.cancelled.clone(),
        );
        r.register(
            "xtc:batch_failed",
            "Batch group completions delivered with another error",
            g.failed.clone(),
        );
        r.register(
            "xtc:batch_rejections",
            "Batch group submits that failed",
            g.rejections.clone(),
        );
        r.register(
            "xtc:batch_mean_ready_vector",
            "Mean ready-vector length over iterations",
            g.mean_ready.clone(),
        );
        r.register(
            "xtc:batch_max_ready_vector",
            "Largest ready vector so far",
            g.max_ready.clone(),
        );
        r.register(
            "xtc:batch_offloads",
            "Operations launched by the async step",
            g.offloads.clone(),
        );
        r.register(
            "xtc:batch_offload_timeouts",
            "Operations whose wait ended at exec_timeout",
            g.offload_timeouts.clone(),
        );
        r.register(
            "xtc:batch_offload_errors",
            "Operations that could not be awaited",
            g.offload_errors.clone(),
        );
        r.register(
            "xtc:batch_mt_queued",
            "Cross-loop submit hand-ins drained",
            g.mt_queued.clone(),
        );
        r.register(
            "xtc:batch_mt_rejections",
            "Cross-loop calls refused",
            g.mt_rejections.clone(),
        );
        for reason in RejectReason::ALL {
            // Every reason shows, at 0 until a request is rejected for it.
            let _ = m.rejected.get_or_create(&vec![("reason", reason.name())]);
        }
        for why in ["length", "stop"] {
            let _ = m.success.get_or_create(&vec![("finished_reason", why)]);
        }
        DecodeMetrics {
            registry: Arc::new(r),
            ..m
        }
    }

    /// The registry, to encode (from any thread).
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// The batch group's statistics (`Group::stats`, `Group::async_stats`).
    pub fn record_group(&self, s: &Stats, a: &AsyncStats) {
        let g = &self.group;
        let (old, olda) = g.last.get();
        gauge(&g.queued, s.queued);
        gauge(&g.ready, s.ready);
        gauge(&g.blocked, s.blocked);
        gauge(&g.reserved_units, s.reserved_units);
        grow(&g.iterations, old.iterations, s.iterations);
        grow(&g.completed, old.completed, s.completed);
        grow(&g.cancelled, old.cancelled, s.cancelled);
        grow(&g.failed, old.failed, s.failed);
        grow(&g.rejections, old.rejections, s.rejections);
        g.mean_ready
            .set(s.total_members as f64 / s.iterations.max(1) as f64);
        gauge(&g.max_ready, s.max_vector);
        grow(&g.offloads, olda.offloads, a.offloads);
        grow(
            &g.offload_timeouts,
            olda.offload_timeouts,
            a.offload_timeouts,
        );
        grow(&g.offload_errors, olda.offload_errors, a.offload_errors);
        grow(&g.mt_queued, olda.mt_queued, a.mt_queued);
        grow(&g.mt_rejections, olda.mt_rejections, a.mt_rejections);
        g.last.set((*s, *a));
    }

    /// The serving gauges: `running` members, `waiting` requests, `kv_used`
    /// of `kv_blocks` KV blocks.
    pub fn record_state(&self, running: usize, waiting: usize, kv_used: usize, kv_blocks: usize) {
        gauge(&self.running, running as u64);
        gauge(&self.waiting, waiting as u64);
        self.kv_usage.set(kv_used as f64 / kv_blocks.max(1) as f64);
    }

    /// One iteration of `prefill` prompt rows and `decode` decode rows that
    /// generated `generated` tokens.
    pub fn record_iteration(&self, prefill: usize, decode: usize, generated: usize) {
        self.prompt_tokens.inc_by(prefill as u64);
        self.generation_tokens.inc_by(generated as u64);
        self.iteration_tokens.observe((prefill + decode) as f64);
    }

    /// A request's first token, `ttft` after its arrival.
    pub fn record_first_token(&self, ttft: Duration) {
        self.ttft.observe(ttft.as_secs_f64());
    }

    /// A gap between two consecutive tokens of a request.
    pub fn record_token_gap(&self, gap: Duration) {
        self.itl.observe(gap.as_secs_f64());
    }

    /// A completed request.
    pub fn record_completed(&self, c: &Completed) {
        let observe = |h: &Histogram, d: Option<Duration>| {
            if let Some(d) = d {
                h.observe(d.as_secs_f64());
            }
        };
        observe(&self.queue, c.queue);
        observe(&self.inference, c.inference);
        observe(&self.e2e, c.e2e);
        observe(&self.tpot, c.tpot);
        self.prompt_len.observe(c.prompt_tokens as f64);
        self.generation_len.observe(c.generated as f64);
        let why = if c.stopped { "stop" } else { "length" };
        self.success
            .get_or_create(&vec![("finished_reason", why)])
            .inc();
    }

    /// A request cancelled by its client.
    pub fn record_cancelled(&self) {
        self.cancelled.inc();
    }

    /// A request that failed.
    pub fn record_failed(&self) {
        self.failed.inc();
    }

    /// A request rejected before admission.
    pub fn record_rejected(&self, reason: RejectReason) {
        self.rejected
            .get_or_create(&vec![("reason", reason.name())])
            .inc();
    }
}

/// What a completed request observed (see
/// [`crate::latency`] for the definitions).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Completed {
    /// Arrival to admission.
    pub queue: Option<Duration>,
    /// Admission to the last token.
    pub inference: Option<Duration>,
    /// Arrival to the last token.
    pub e2e: Option<Duration>,
    /// Time per output token (2 or more tokens).
    pub tpot: Option<Duration>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub generated: usize,
    /// Ended by its stop token (`finished_reason="stop"`), else by its length.
    pub stopped: bool,
}

/// The registry as OpenMetrics text (`# TYPE`, `# HELP`, samples, `# EOF`),
/// which Prometheus scrapes as `application/openmetrics-text`.
pub fn encode(registry: &Registry) -> String {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, registry)
        .expect("writing to a String cannot fail");
    s
}

/// The content type of [`encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_two_five_buckets() {
        assert_eq!(buckets_1_2_5(100), [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        assert_eq!(buckets_1_2_5(1), [1.0]);
    }

    #[test]
    fn group_counters_grow_by_the_statistics_deltas() {
        let m = DecodeMetrics::new(64);
        let s = |iterations, completed| Stats {
            iterations,
            completed,
            total_members: 3 * iterations,
            queued: 4,
            ..Stats::default()
        };
        m.record_group(&s(5, 1), &AsyncStats::default());
        m.record_group(&s(9, 3), &AsyncStats::default());
        assert_eq!(m.group.iterations.get(), 9);
        assert_eq!(m.group.completed.get(), 3);
        assert_eq!(m.group.queued.get(), 4);
        assert_eq!(m.group.mean_ready.get(), 3.0);
        let text = encode(&m.registry());
        assert!(text.contains("xtc:batch_iterations_total 9\n"), "{text}");
        assert!(
            text.contains("xtc:request_rejected_total{reason=\"seq-len\"} 0\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
