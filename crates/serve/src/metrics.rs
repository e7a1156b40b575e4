//! Metrics of the HTTP front end, beside the engine's decode metrics (the
//! registry `xtc decode` has, `xtc:` names): `GET /metrics` serves both.
//!
//! | name | type | what |
//! | --- | --- | --- |
//! | `xtc:request_cancelled_by_phase_total{phase}` | counter | requests cancelled (client gone), by where they were: `queued` (on the ring, held or waiting: never ran), `prefill`, `decode` |
//! | `xtc:client_disconnects_total` | counter | responses dropped before their outcome (the cancel went out through `cancel_mt`) |
//! | `xtc:stream_stalled_total` | counter | streams cancelled because their client stopped reading (every buffer to it full; also counted by phase) |
//! | `xtc:http_refused_total{reason}` | counter | requests refused before any work: `busy` (429), `closed` (503), `context_length_exceeded` (400) |
//! | `xtc:kv_blocks_used` | gauge | KV blocks allocated now |
//! | `xtc:serve_queue_seconds` | histogram | submit to admission |
//! | `xtc:engine_errors_total` | counter | model or ledger failures |

use std::sync::atomic::AtomicBool;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use xtc_kvbatch::metrics::{REQUEST_LATENCY_BUCKETS_S, encode};

/// Label set: one `(name, value)` pair.
pub type Labels = Vec<(String, String)>;

/// Where a request was when it was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not admitted: on the admission ring, held for a slot, or waiting.
    Queued,
    /// Admitted, prompt not fully prefilled.
    Prefill,
    /// Generating.
    Decode,
}

impl Phase {
    /// The label value (`queued`, `prefill`, `decode`).
    pub fn name(self) -> &'static str {
        match self {
            Phase::Queued => "queued",
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        }
    }

    /// `{phase="..."}`.
    pub fn label(self) -> Labels {
        vec![("phase".into(), self.name().into())]
    }
}

/// The front end's metrics (see the module doc); every field is atomic.
#[derive(Debug)]
pub struct ServeMetrics {
    /// Its registry.
    pub registry: Registry,
    /// Cancellations by phase.
    pub cancelled: Family<Labels, Counter>,
    /// Responses dropped before their outcome.
    pub disconnects: Counter,
    /// Streams cancelled because their client stopped reading.
    pub stalled: Counter,
    /// Refusals by reason.
    pub refused: Family<Labels, Counter>,
    /// KV blocks allocated.
    pub kv_blocks_used: Gauge,
    /// Submit to admission.
    pub queue_seconds: Histogram,
    /// Model or ledger failures.
    pub engine_errors: Counter,
    /// Set once the engine was closed (draining): refusals are 503 then.
    pub closing: AtomicBool,
}

impl Default for ServeMetrics {
    fn default() -> Self {
        ServeMetrics::new()
    }
}

impl ServeMetrics {
    /// Fresh metrics, registered.
    pub fn new() -> ServeMetrics {
        let m = ServeMetrics {
            registry: Registry::default(),
            cancelled: Family::default(),
            disconnects: Counter::default(),
            stalled: Counter::default(),
            refused: Family::default(),
            kv_blocks_used: Gauge::default(),
            queue_seconds: Histogram::new(REQUEST_LATENCY_BUCKETS_S),
            engine_errors: Counter::default(),
            closing: AtomicBool::new(false),
        };
        let mut r = Registry::default();
        for p in [Phase::Queued, Phase::Prefill, Phase::Decode] {
            let _ = m.cancelled.get_or_create(&p.label()); // every phase shows, 0 or not
        }
        r.register(
            "xtc:request_cancelled_by_phase",
            "Requests cancelled because their client went away, by phase",
            m.cancelled.clone(),
        );
        r.register(
            "xtc:client_disconnects",
            "Responses dropped before their outcome (cancelled through cancel_mt)",
            m.disconnects.clone(),
        );
        r.register(
            "xtc:stream_stalled",
            "Streams cancelled because their client stopped reading",
            m.stalled.clone(),
        );
        r.register(
            "xtc:http_refused",
            "Requests refused before any work, by reason",
            m.refused.clone(),
        );
        r.register(
            "xtc:kv_blocks_used",
            "KV-cache blocks allocated",
            m.kv_blocks_used.clone(),
        );
        r.register(
            "xtc:serve_queue_seconds",
            "Time from submit to admission",
            m.queue_seconds.clone(),
        );
        r.register(
            "xtc:engine_errors",
            "Model or KV-ledger failures",
            m.engine_errors.clone(),
        );
        ServeMetrics { registry: r, ..m }
    }

    /// Counts a refusal with `reason`.
    pub fn refuse(&self, reason: &str) {
        self.refused
            .get_or_create(&vec![("reason".into(), reason.into())])
            .inc();
    }

    /// The OpenMetrics text of `decode` (the engine's registry, if it runs)
    /// followed by this one's, one `# EOF` at the end.
    pub fn exposition(&self, decode: Option<&Registry>) -> String {
        let mut s = String::new();
        if let Some(d) = decode {
            s += strip_eof(&encode(d));
        }
        s += &encode(&self.registry);
        s
    }
}

fn strip_eof(s: &str) -> &str {
    s.strip_suffix("# EOF\n").unwrap_or(s)
}
