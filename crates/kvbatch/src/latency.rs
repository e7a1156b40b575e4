//! One request's latencies (queue, TTFT, TPOT, end-to-end) from its
//! sequence's timestamps, and the SLO it meets or misses: what `xtc serve`
//! records per completion and `xtc decode`'s report distributes
//! (`xtc_replay::latency`).
//!
//! For a request that arrived at `a`, was first in a ready vector at `s`,
//! received its first generated token at `f` and its last at `l`, with `n`
//! generated tokens: queue `s - a`, TTFT `f - a`, TPOT `(l - f) / (n - 1)`
//! (only for `n >= 2`), e2e `l - a`. An [`Slo`] classifies a request: it is
//! *good* when it completed with TTFT and TPOT within the bounds (a request
//! of one output token has TPOT 0, as in vLLM's benchmark).

use std::time::Duration;

use serde::Serialize;

use crate::seq::Timing;

/// One request's latencies (see the module doc), `None` where the request
/// never reached that point.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RequestLatency {
    /// Arrival to admission.
    pub queue: Option<Duration>,
    /// Arrival to the first generated token.
    pub ttft: Option<Duration>,
    /// `(last - first token) / (n - 1)`, for `n >= 2` generated tokens.
    pub tpot: Option<Duration>,
    /// Arrival to the last generated token.
    pub e2e: Option<Duration>,
    /// Tokens generated.
    pub output_tokens: usize,
}

impl RequestLatency {
    /// The latencies of a request with these timestamps and `generated`
    /// tokens.
    pub fn of(t: &Timing, generated: usize) -> Self {
        let since =
            |x: Option<std::time::Instant>| x.map(|x| x.saturating_duration_since(t.arrived));
        let tpot = match (t.first_token, t.last_token) {
            (Some(f), Some(l)) if generated >= 2 => {
                Some(l.saturating_duration_since(f) / (generated as u32 - 1).max(1))
            }
            _ => None,
        };
        RequestLatency {
            queue: since(t.admitted),
            ttft: since(t.first_token),
            tpot,
            e2e: since(t.last_token),
            output_tokens: generated,
        }
    }

    /// Whether the request meets `slo`: TTFT and TPOT within their bounds
    /// (no first token: not met; fewer than 2 tokens: TPOT counts as 0).
    pub fn meets(&self, slo: &Slo) -> bool {
        let within =
            |x: Duration, bound: Option<f64>| bound.is_none_or(|ms| x.as_secs_f64() * 1e3 <= ms);
        match self.ttft {
            None => false,
            Some(ttft) => {
                within(ttft, slo.ttft_ms)
                    && within(self.tpot.unwrap_or(Duration::ZERO), slo.tpot_ms)
            }
        }
    }
}

/// A latency service-level objective: bounds on TTFT and TPOT, in ms (`None`:
/// unbounded).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Slo {
    /// Largest acceptable time to first token, ms.
    pub ttft_ms: Option<f64>,
    /// Largest acceptable time per output token, ms.
    pub tpot_ms: Option<f64>,
}

impl Slo {
    /// Whether any bound is set.
    pub fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some()
    }
}
