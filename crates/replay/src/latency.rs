//! Per-request latencies of a decode run and their distributions, as the
//! serving benchmarks report them (vLLM's `benchmark_serving`, DistServe).
//!
//! For a request that arrived at `a` (its trace time), was first in a ready
//! vector at `s`, received its first generated token at `f` and its last at
//! `l`, with `n` generated tokens:
//!
//! | figure | definition |
//! | --- | --- |
//! | queue time | `s - a` |
//! | TTFT (time to first token) | `f - a` |
//! | TPOT (time per output token) | `(l - f) / (n - 1)`, i.e. `(e2e - TTFT) / (n - 1)`; only for `n >= 2` |
//! | ITL (inter-token latency) | each gap between two consecutive tokens of a request |
//! | e2e (end-to-end latency) | `l - a` |
//! | normalized latency | `e2e / n`, averaged over requests (vLLM's paper, Orca) |
//!
//! Distributions are [`LatencyStats`]: count, mean, p50, p90, p95, p99 and
//! max in milliseconds. Percentiles come from an HdrHistogram (the
//! `hdrhistogram` crate) of microsecond values with 3 significant digits:
//! nearest rank (`ceil(q * count)`-th smallest value), reported as the
//! highest value equivalent to it at that precision (exact below 2,048 µs,
//! within 0.1% above). The mean is the exact mean of the recorded values.
//!
//! An [`Slo`] (`--slo-ttft`, `--slo-tpot`) classifies each request: it is
//! *good* when it completed with TTFT and TPOT within the bounds (a request
//! of one output token has TPOT 0, as in vLLM's benchmark). SLO attainment is
//! the share of good requests, and goodput the good requests per second
//! ([`SloReport`]; DistServe's and vLLM's definitions).

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use xtc_kvbatch::latency::Slo;

/// Significant digits of the latency histograms (0.1% relative precision).
pub const SIGNIFICANT_DIGITS: u8 = 3;

/// The distribution of one latency over a run's requests, in milliseconds.
/// All fields are 0 when `count` is 0.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct LatencyStats {
    /// Samples (requests, or token gaps for the inter-token latency).
    pub count: u64,
    /// Exact mean, ms.
    pub mean_ms: f64,
    /// Median, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 95th percentile, ms.
    pub p95_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Largest sample (at the histogram's precision), ms.
    pub max_ms: f64,
}

impl LatencyStats {
    /// The distribution of `samples` (see the module doc for the percentile
    /// definition). Values are recorded in whole microseconds, rounded to the
    /// nearest; a value beyond the histogram's range (about 2^63 µs) is
    /// clamped.
    pub fn of(samples: impl IntoIterator<Item = Duration>) -> Self {
        let mut h =
            Histogram::<u64>::new(SIGNIFICANT_DIGITS).expect("3 significant digits is valid");
        let mut sum_us = 0u128;
        for d in samples {
            let us = (d.as_nanos() + 500) / 1000;
            let us = u64::try_from(us).unwrap_or(u64::MAX / 2);
            // The histogram resizes itself; only a value past its whole
            // range is refused, and clamped.
            if h.record(us).is_err() {
                h.saturating_record(us);
            }
            sum_us += u128::from(us);
        }
        let count = h.len();
        if count == 0 {
            return LatencyStats::default();
        }
        let ms = |us: u64| us as f64 / 1e3;
        LatencyStats {
            count,
            mean_ms: sum_us as f64 / count as f64 / 1e3,
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p95_ms: ms(h.value_at_quantile(0.95)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
        }
    }
}

/// SLO attainment and goodput of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SloReport {
    /// Bound on TTFT, ms (`null`: unbounded).
    pub ttft_ms: Option<f64>,
    /// Bound on TPOT, ms (`null`: unbounded).
    pub tpot_ms: Option<f64>,
    /// Requests that completed within both bounds.
    pub good_requests: u64,
    /// Requests the attainment is over: every request of the workload but
    /// the ones their clients cancelled (rejected and failed requests count,
    /// as missed).
    pub eligible_requests: u64,
    /// `good_requests / eligible_requests` (0 to 1; 1 when none is eligible).
    pub attainment: f64,
    /// Good requests per second of the run's duration.
    pub goodput_requests_per_s: f64,
}

impl SloReport {
    /// Attainment and goodput of `good` out of `eligible` requests over `duration_s`.
    pub fn new(slo: &Slo, good: u64, eligible: u64, duration_s: f64) -> Self {
        SloReport {
            ttft_ms: slo.ttft_ms,
            tpot_ms: slo.tpot_ms,
            good_requests: good,
            eligible_requests: eligible,
            attainment: if eligible == 0 {
                1.0
            } else {
                good as f64 / eligible as f64
            },
            goodput_requests_per_s: good as f64 / duration_s.max(1e-9),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use xtc_kvbatch::latency::RequestLatency;
    use xtc_kvbatch::seq::Timing;

    fn us(x: u64) -> Duration {
        Duration::from_micros(x)
    }

    /// The percentiles of a set whose nearest ranks are known by hand.
    #[test]
    fn percentiles_match_the_nearest_rank_of_a_hand_computed_set() {
        // 1..=200 µs: p50 = 100th value, p90 = 180th, p95 = 190th, p99 = 198th.
        let s = LatencyStats::of((1..=200).rev().map(us));
        assert_eq!(s.count, 200);
        assert_eq!(s.p50_ms, 0.100);
        assert_eq!(s.p90_ms, 0.180);
        assert_eq!(s.p95_ms, 0.190);
        assert_eq!(s.p99_ms, 0.198);
        assert_eq!(s.max_ms, 0.200);
        assert!((s.mean_ms - 0.1005).abs() < 1e-12, "{s:?}");
        // Ten values: p50 is the 5th, p90 the 9th, p95 and p99 the 10th.
        let v = [7, 3, 9, 1, 5, 2, 8, 10, 4, 6].map(|x| us(x * 100));
        let s = LatencyStats::of(v);
        assert_eq!(
            (s.p50_ms, s.p90_ms, s.p95_ms, s.p99_ms),
            (0.5, 0.9, 1.0, 1.0)
        );
        assert_eq!(s.mean_ms, 0.55);
        // Beyond 2,048 µs the histogram keeps 3 significant digits.
        let big: Vec<Duration> = (1..=100).map(|i| Duration::from_millis(i * 37)).collect();
        let s = LatencyStats::of(big);
        let near = |got: f64, want: f64| (got - want).abs() <= want * 1e-3;
        assert!(near(s.p50_ms, 50.0 * 37.0), "{s:?}");
        assert!(near(s.p99_ms, 99.0 * 37.0), "{s:?}");
        assert!(near(s.max_ms, 3700.0), "{s:?}");
        assert!((s.mean_ms - 50.5 * 37.0).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn empty_and_zero_samples() {
        assert_eq!(LatencyStats::of([]), LatencyStats::default());
        let s = LatencyStats::of([Duration::ZERO, Duration::from_nanos(400)]);
        assert_eq!((s.count, s.p99_ms, s.max_ms), (2, 0.0, 0.0));
    }

    fn timing(first_ms: Option<u64>, last_ms: Option<u64>) -> Timing {
        let a = Instant::now();
        let at = |ms: u64| a + Duration::from_millis(ms);
        Timing {
            arrived: a,
            admitted: Some(at(2)),
            first_token: first_ms.map(at),
            last_token: last_ms.map(at),
            finished: last_ms.map(at),
            token_gaps: Vec::new(),
        }
    }

    #[test]
    fn tpot_is_e2e_minus_ttft_over_the_later_tokens() {
        let r = RequestLatency::of(&timing(Some(10), Some(100)), 10);
        assert_eq!(r.queue, Some(Duration::from_millis(2)));
        assert_eq!(r.ttft, Some(Duration::from_millis(10)));
        assert_eq!(r.e2e, Some(Duration::from_millis(100)));
        assert_eq!(r.tpot, Some(Duration::from_millis(10))); // (100 - 10) / 9
        let one = RequestLatency::of(&timing(Some(10), Some(10)), 1);
        assert_eq!(one.tpot, None);
        let slo = |ttft, tpot| Slo {
            ttft_ms: ttft,
            tpot_ms: tpot,
        };
        assert!(r.meets(&slo(Some(10.0), Some(10.0))));
        assert!(!r.meets(&slo(Some(9.9), None)));
        assert!(!r.meets(&slo(None, Some(9.9))));
        assert!(one.meets(&slo(Some(10.0), Some(0.0))), "1 token: TPOT 0");
        let none = RequestLatency::of(&timing(None, None), 0);
        assert!(!none.meets(&slo(None, None)), "no first token: not good");
        let rep = SloReport::new(&slo(Some(1.0), None), 3, 4, 2.0);
        assert_eq!((rep.attainment, rep.goodput_requests_per_s), (0.75, 1.5));
    }
}
