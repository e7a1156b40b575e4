//! The figures of an `xtc decode` run: text report, JSON report, Chrome trace.
//!
//! [`Report::from_run`] reduces a [`RunOutput`] to the figures the command
//! prints: requests (done / cancelled / rejected), prompt and generated
//! tokens, wall time, tokens/s, iterations, mean ready-vector size, queue time
//! (arrival to admission), time to first token (arrival to first generated
//! token) and inter-token latency (gaps between a request's consecutive
//! tokens) at p50 and p99, the KV cache's peak use, and the rejected
//! requests counted per reason ([`summarize_rejections`]). [`chrome_trace`]
//! writes the run as Chrome trace / Perfetto JSON: one lane of iterations and
//! one lane per request (queued, then running).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use crate::decode::serve::job::{RejectReason, Rejected, RunOutput, Status};

/// p50 and p99 of a latency, in milliseconds (nearest rank; 0 when empty).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Samples.
    pub n: usize,
}

impl Percentiles {
    /// Nearest-rank percentiles of `xs`.
    pub fn of(mut xs: Vec<Duration>) -> Self {
        xs.sort_unstable();
        let at = |q: f64| {
            if xs.is_empty() {
                return 0.0;
            }
            let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
            xs[rank - 1].as_secs_f64() * 1e3
        };
        Percentiles {
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            n: xs.len(),
        }
    }
}

/// The figures of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Admission policy (`continuous`, `static`, `one-at-a-time`).
    pub mode: &'static str,
    /// Device and model.
    pub device: String,
    /// Requests in the workload.
    pub requests: usize,
    /// Requests that generated all their tokens.
    pub completed: usize,
    /// Requests cancelled.
    pub cancelled: usize,
    /// Requests failed.
    pub failed: usize,
    /// Requests rejected (could never fit).
    pub rejected: usize,
    /// Prompt tokens prefilled.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Wall time of the run, s.
    pub wall_s: f64,
    /// Generated tokens per second of wall time.
    pub tokens_per_s: f64,
    /// Prompt + generated tokens per second of wall time.
    pub total_tokens_per_s: f64,
    /// Iterations (device operations).
    pub iterations: usize,
    /// Mean members per ready vector.
    pub mean_ready: f64,
    /// Arrival to admission.
    pub queue: Percentiles,
    /// Arrival to first generated token.
    pub ttft: Percentiles,
    /// Between consecutive generated tokens of a request.
    pub itl: Percentiles,
    /// Most KV blocks allocated at once.
    pub kv_peak_blocks: usize,
    /// KV blocks in the cache.
    pub kv_blocks: usize,
    /// Blocks still allocated after the run (0 unless leaked).
    pub kv_leaked_blocks: usize,
    /// Rejected requests, one entry per reason (in [`RejectReason`] order).
    pub rejections: Vec<RejectionSummary>,
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
    /// Reduces a run over a workload of `requests` requests.
    pub fn from_run(out: &RunOutput, requests: usize) -> Self {
        let fin = &out.finished;
        let count = |st: fn(&Status) -> bool| fin.iter().filter(|f| st(&f.status)).count();
        let prompt_tokens = fin.iter().map(|f| f.seq.pos.min(f.seq.prompt.len())).sum();
        let generated_tokens: usize = fin.iter().map(|f| f.seq.generated.len()).sum();
        let since = |a: Option<std::time::Instant>, f: &crate::decode::serve::job::Finished| {
            a.map(|t| t.saturating_duration_since(f.seq.timing.arrived))
        };
        let queue = fin
            .iter()
            .filter_map(|f| since(f.seq.timing.admitted, f))
            .collect();
        let ttft = fin
            .iter()
            .filter_map(|f| since(f.seq.timing.first_token, f))
            .collect();
        let itl = fin
            .iter()
            .flat_map(|f| f.seq.timing.token_gaps.iter().copied())
            .collect();
        let wall_s = out.wall.as_secs_f64().max(1e-9);
        let iterations = out.iterations.len();
        let ready: usize = out.iterations.iter().map(|i| i.ready).sum();
        Report {
            mode: out.mode.name(),
            device: out.device.clone(),
            requests,
            completed: count(|s| *s == Status::Done),
            cancelled: count(|s| *s == Status::Cancelled),
            failed: count(|s| matches!(s, Status::Failed(_))),
            rejected: out.rejected.len(),
            prompt_tokens,
            generated_tokens,
            wall_s,
            tokens_per_s: generated_tokens as f64 / wall_s,
            total_tokens_per_s: (prompt_tokens + generated_tokens) as f64 / wall_s,
            iterations,
            mean_ready: ready as f64 / iterations.max(1) as f64,
            queue: Percentiles::of(queue),
            ttft: Percentiles::of(ttft),
            itl: Percentiles::of(itl),
            kv_peak_blocks: out.kv_peak,
            kv_blocks: out.kv_capacity,
            kv_leaked_blocks: out.kv_leaked,
            rejections: summarize_rejections(&out.rejected),
        }
    }

    /// The human-readable report.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let lat = |p: &Percentiles| format!("p50 {:>9.1} ms   p99 {:>9.1} ms", p.p50_ms, p.p99_ms);
        let _ = writeln!(s, "xtc decode: {} batching on {}", self.mode, self.device);
        let _ = writeln!(
            s,
            "  requests        {} ({} done, {} cancelled, {} failed, {} rejected)",
            self.requests, self.completed, self.cancelled, self.failed, self.rejected
        );
        let _ = writeln!(
            s,
            "  tokens          {} prompt + {} generated",
            self.prompt_tokens, self.generated_tokens
        );
        let _ = writeln!(s, "  wall time       {:.2} s", self.wall_s);
        let _ = writeln!(
            s,
            "  throughput      {:.1} generated tokens/s ({:.1} tokens/s with prompts)",
            self.tokens_per_s, self.total_tokens_per_s
        );
        let _ = writeln!(
            s,
            "  iterations      {} (mean ready vector {:.1} members)",
            self.iterations, self.mean_ready
        );
        let _ = writeln!(s, "  queue time      {}", lat(&self.queue));
        let _ = writeln!(s, "  TTFT            {}", lat(&self.ttft));
        let _ = writeln!(s, "  inter-token     {}", lat(&self.itl));
        let pct = 100.0 * self.kv_peak_blocks as f64 / self.kv_blocks.max(1) as f64;
        let _ = writeln!(
            s,
            "  KV cache peak   {} of {} blocks ({pct:.0}%)",
            self.kv_peak_blocks, self.kv_blocks
        );
        if self.kv_leaked_blocks > 0 {
            let _ = writeln!(
                s,
                "  KV cache LEAK   {} blocks still allocated",
                self.kv_leaked_blocks
            );
        }
        for r in &self.rejections {
            let _ = writeln!(s, "  {}", r.message);
        }
        s
    }
}

/// Continuous vs static vs one-at-a-time on the same workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
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
        let r = |a: &Report, b: &Report| a.tokens_per_s / b.tokens_per_s.max(1e-9);
        Comparison {
            speedup_vs_one: r(&continuous, &one_at_a_time),
            speedup_vs_static: r(&continuous, &static_),
            continuous,
            static_,
            one_at_a_time,
        }
    }

    /// The comparison table and ratios.
    pub fn render(&self) -> String {
        let mut s = String::from(
            "mode            tokens/s   wall s  iters  mean ready  TTFT p50 ms  TTFT p99 ms  ITL p99 ms\n",
        );
        for r in [&self.continuous, &self.static_, &self.one_at_a_time] {
            let _ = writeln!(
                s,
                "{:<14} {:>9.1} {:>8.2} {:>6} {:>11.1} {:>12.1} {:>12.1} {:>11.1}",
                r.mode,
                r.tokens_per_s,
                r.wall_s,
                r.iterations,
                r.mean_ready,
                r.ttft.p50_ms,
                r.ttft.p99_ms,
                r.itl.p99_ms
            );
        }
        let _ = writeln!(
            s,
            "continuous vs one-at-a-time: {:.2}x tokens/s; vs static: {:.2}x tokens/s, p99 TTFT {:.1} ms vs {:.1} ms",
            self.speedup_vs_one,
            self.speedup_vs_static,
            self.continuous.ttft.p99_ms,
            self.static_.ttft.p99_ms
        );
        s
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The run as Chrome trace JSON (`chrome://tracing`, <https://ui.perfetto.dev>):
/// thread 0 holds one complete event per iteration (args: ready vector,
/// prefill and decode rows, KV use); thread `1 + id` holds each request's
/// `queued` and `running` spans.
pub fn chrome_trace(out: &RunOutput) -> Value {
    let mut ev = vec![json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": 0,
        "args": {"name": "iterations"}})];
    for (i, it) in out.iterations.iter().enumerate() {
        ev.push(
            json!({"name": format!("iteration {i}"), "cat": "iteration", "ph": "X",
            "pid": 1, "tid": 0, "ts": us(it.start), "dur": us(it.dur),
            "args": {"ready": it.ready, "scheduled": it.scheduled,
                     "prefill_tokens": it.prefill_tokens, "decode_tokens": it.decode_tokens,
                     "kv_used": it.kv_used}}),
        );
    }
    for f in &out.finished {
        let t = &f.seq.timing;
        let tid = 1 + f.seq.id;
        let rel = |x: std::time::Instant| us(x.saturating_duration_since(out.started));
        let end = t.finished.or(t.last_token).unwrap_or(t.arrived);
        let admitted = t.admitted.unwrap_or(end);
        ev.push(
            json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid,
            "args": {"name": format!("request {}", f.seq.id)}}),
        );
        ev.push(
            json!({"name": "queued", "cat": "request", "ph": "X", "pid": 1, "tid": tid,
            "ts": rel(t.arrived), "dur": rel(admitted) - rel(t.arrived)}),
        );
        ev.push(
            json!({"name": "running", "cat": "request", "ph": "X", "pid": 1, "tid": tid,
            "ts": rel(admitted), "dur": rel(end) - rel(admitted),
            "args": {"prompt": f.seq.prompt.len(), "generated": f.seq.generated.len(),
                     "status": f.status}}),
        );
    }
    json!({"traceEvents": ev, "displayTimeUnit": "ms"})
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

    #[test]
    fn nearest_rank_percentiles() {
        let ms = |x: u64| Duration::from_millis(x);
        let p = Percentiles::of((1..=100).map(ms).collect());
        assert_eq!((p.p50_ms, p.p99_ms, p.n), (50.0, 99.0, 100));
        let p = Percentiles::of(vec![ms(7)]);
        assert_eq!((p.p50_ms, p.p99_ms), (7.0, 7.0));
        assert_eq!(Percentiles::of(Vec::new()).n, 0);
    }
}
