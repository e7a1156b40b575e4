//! Dispatch metrics (D-14) and the Chrome trace / Perfetto swimlane export.
//!
//! Counts are exact properties of the algorithm (fences, doorbell stores and
//! handles per flush). Spans are timestamps of the run's clock: meaningful
//! relative to each other in real-thread runs, zero-width under the stepper.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use serde::Serialize;

use super::emu::CoreEvent;
use super::scheduler::Shape;

/// What one pop (one `pop_ready_tasks_batch` call, or one thread's drain
/// staging) published.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PopRecord {
    /// Pop id (also written into every descriptor it published).
    pub id: u32,
    /// Scheduler thread.
    pub thread: usize,
    /// Shape popped (`None` for drain staging).
    pub shape: Option<Shape>,
    /// The pop carried a sync_start task (D-04: per-task flushes).
    pub sync: bool,
    /// Drain staging rather than a normal pop.
    pub drain: bool,
    /// Tasks that prepared at least one core in this pop.
    pub tasks: u32,
    /// Store (release) fences issued.
    pub fences: u32,
    /// Doorbell stores issued.
    pub doorbells: u32,
    /// Largest handle count of one flush (D-03 bound: clusters x 3).
    pub max_flush: u32,
    /// Clock just before the first doorbell store, ns.
    pub first_store_ns: u64,
    /// Clock just after the last doorbell store, ns.
    pub last_store_ns: u64,
}

impl PopRecord {
    /// Publish span: first to last doorbell store, ns.
    pub fn publish_span_ns(&self) -> u64 {
        self.last_store_ns.saturating_sub(self.first_store_ns)
    }
}

/// Counters shared by every thread of a run.
#[derive(Debug, Default)]
pub struct Counters {
    /// Drains entered.
    pub drains: AtomicU64,
    /// Drain attempts abandoned for lack of capacity.
    pub drain_retries: AtomicU64,
    /// Total stop-the-world time (drain entry to drain end), ns.
    pub stw_ns: AtomicU64,
    /// Drains abandoned because the run completed (D-06/D-07).
    pub drains_abandoned: AtomicU64,
    /// Next pop id.
    pub next_pop: AtomicU32,
}

/// All metrics of one run.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Counters.
    pub c: Counters,
    /// Every pop's record.
    pub pops: Mutex<Vec<PopRecord>>,
    /// Every finished subtask.
    pub events: Mutex<Vec<CoreEvent>>,
}

impl Metrics {
    /// A fresh pop id.
    pub fn next_pop(&self) -> u32 {
        self.c.next_pop.fetch_add(1, Ordering::Relaxed)
    }

    /// Stores a finished pop (pops that published nothing are dropped).
    pub fn record(&self, rec: PopRecord) {
        if rec.doorbells > 0 {
            self.pops.lock().unwrap().push(rec);
        }
    }
}

/// Summary figures of a run (the numbers the report quotes).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Pops that published something.
    pub pops: usize,
    /// Non-sync pops with several tasks.
    pub multi_task_pops: usize,
    /// Mean fences per non-sync pop.
    pub fences_per_pop: f64,
    /// Mean fences per sync pop.
    pub fences_per_sync_pop: f64,
    /// Mean doorbell stores per pop.
    pub doorbells_per_pop: f64,
    /// Median publish span of multi-task non-sync pops, ns.
    pub median_publish_span_ns: u64,
    /// Median first-to-last core start span of multi-task non-sync pops, ns.
    pub median_start_span_ns: u64,
    /// Largest handle count of any flush.
    pub max_flush: u32,
    /// Drains, retries, stop-the-world ns.
    pub drains: u64,
    /// Drain retries.
    pub drain_retries: u64,
    /// Stop-the-world time, ns.
    pub stw_ns: u64,
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Per pop id: max start minus min start of the cores it published.
pub fn start_spans(events: &[CoreEvent]) -> HashMap<u32, u64> {
    let mut mm: HashMap<u32, (u64, u64)> = HashMap::new();
    for e in events {
        let m = mm.entry(e.desc.pop).or_insert((u64::MAX, 0));
        m.0 = m.0.min(e.start_ns);
        m.1 = m.1.max(e.start_ns);
    }
    mm.into_iter().map(|(k, (a, b))| (k, b - a)).collect()
}

/// Computes the [`Summary`] of a run's records.
pub fn summarize(pops: &[PopRecord], events: &[CoreEvent], c: &Counters) -> Summary {
    let normal: Vec<&PopRecord> = pops.iter().filter(|p| !p.sync && !p.drain).collect();
    let sync: Vec<&PopRecord> = pops.iter().filter(|p| p.sync).collect();
    let mean = |v: &[&PopRecord], f: fn(&PopRecord) -> u32| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().map(|p| f(p) as f64).sum::<f64>() / v.len() as f64
        }
    };
    let multi: Vec<&PopRecord> = normal.iter().copied().filter(|p| p.tasks > 1).collect();
    let spans = start_spans(events);
    Summary {
        pops: pops.len(),
        multi_task_pops: multi.len(),
        fences_per_pop: mean(&normal, |p| p.fences),
        fences_per_sync_pop: mean(&sync, |p| p.fences),
        doorbells_per_pop: mean(&pops.iter().collect::<Vec<_>>(), |p| p.doorbells),
        median_publish_span_ns: median(multi.iter().map(|p| p.publish_span_ns()).collect()),
        median_start_span_ns: median(
            multi
                .iter()
                .filter_map(|p| spans.get(&p.id).copied())
                .collect(),
        ),
        max_flush: pops.iter().map(|p| p.max_flush).max().unwrap_or(0),
        drains: c.drains.load(Ordering::Relaxed),
        drain_retries: c.drain_retries.load(Ordering::Relaxed),
        stw_ns: c.stw_ns.load(Ordering::Relaxed),
    }
}

#[derive(Serialize)]
struct TraceEvent {
    name: String,
    cat: &'static str,
    ph: &'static str,
    ts: f64,
    dur: f64,
    pid: u32,
    tid: u32,
    args: serde_json::Value,
}

/// Chrome trace / Perfetto JSON (`{"traceEvents": [...]}`) of the core
/// swimlanes: one complete (`"X"`) event per subtask, `pid` 0, `tid` = core,
/// times in microseconds.
pub fn chrome_trace(events: &[CoreEvent]) -> String {
    let evs: Vec<TraceEvent> = events
        .iter()
        .map(|e| TraceEvent {
            name: format!("task{}.b{}", e.desc.task, e.desc.block_idx),
            cat: "core",
            ph: "X",
            ts: e.start_ns as f64 / 1000.0,
            dur: e.end_ns.saturating_sub(e.start_ns) as f64 / 1000.0,
            pid: 0,
            tid: e.core,
            args: serde_json::json!({"pop": e.desc.pop, "sub": e.desc.sub}),
        })
        .collect();
    serde_json::json!({ "traceEvents": evs, "displayTimeUnit": "ns" }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::emu::Desc;

    #[test]
    fn spans_and_trace() {
        let ev = |core, pop, s| CoreEvent {
            core,
            desc: Desc {
                pop,
                ..Desc::default()
            },
            start_ns: s,
            end_ns: s + 1000,
        };
        let evs = [ev(0, 1, 100), ev(3, 1, 160), ev(6, 2, 5)];
        let sp = start_spans(&evs);
        assert_eq!((sp[&1], sp[&2]), (60, 0));
        let v: serde_json::Value = serde_json::from_str(&chrome_trace(&evs)).unwrap();
        assert_eq!(v["traceEvents"].as_array().unwrap().len(), 3);
        assert_eq!(v["traceEvents"][1]["tid"], 3);
    }
}
