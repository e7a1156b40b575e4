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
use super::task::Shape;

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
    /// Cores prepared but not yet published when a drain was entered (D-05: 0).
    pub unpublished_at_drain: AtomicU64,
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
    /// Cores prepared but unpublished at drain entry (D-05 requires 0).
    pub unpublished_at_drain: u64,
    /// Cross-thread first-dispatch stagger: spread of the scheduler threads'
    /// first doorbell store times, ns (D-14).
    pub first_dispatch_stagger_ns: u64,
}

/// Spread of each thread's first doorbell store time, ns (0 with < 2 threads).
pub fn first_dispatch_stagger(pops: &[PopRecord]) -> u64 {
    let mut first: HashMap<usize, u64> = HashMap::new();
    for p in pops {
        let f = first.entry(p.thread).or_insert(u64::MAX);
        *f = (*f).min(p.first_store_ns);
    }
    match (first.values().min(), first.values().max()) {
        (Some(a), Some(b)) => b - a,
        _ => 0,
    }
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
        unpublished_at_drain: c.unpublished_at_drain.load(Ordering::Relaxed),
        first_dispatch_stagger_ns: first_dispatch_stagger(pops),
    }
}

/// Chrome trace / Perfetto JSON (`{"traceEvents": [...]}`) of the core
/// swimlanes, written with the crate's one
/// [`TraceWriter`](xtc_trace::TraceWriter): process 0 named
/// `xtc dispatch (emulated NPU)`, one thread per core named `core N` (sorted
/// by core), one complete (`"X"`) event per subtask, all named `subtask` so
/// Perfetto groups them (task, block, sub-core slot and pop in `args`), times
/// in microseconds.
pub fn chrome_trace(events: &[CoreEvent]) -> String {
    use xtc_trace::TraceWriter;
    let mut w = TraceWriter::new();
    w.process_name(0, "xtc dispatch (emulated NPU)");
    let mut cores: Vec<u32> = events.iter().map(|e| e.core).collect();
    cores.sort_unstable();
    cores.dedup();
    for c in cores {
        w.thread_name(0, c, &format!("core {c}"));
        w.thread_sort_index(0, c, i64::from(c));
    }
    for e in events {
        w.complete(
            0,
            e.core,
            "subtask",
            "core",
            e.start_ns as f64 / 1000.0,
            e.end_ns.saturating_sub(e.start_ns) as f64 / 1000.0,
            serde_json::json!({"task": e.desc.task, "block": e.desc.block_idx,
                               "sub": e.desc.sub, "pop": e.desc.pop}),
        );
    }
    w.finish().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::Desc;

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
        let pop = |thread, first_store_ns| PopRecord {
            thread,
            first_store_ns,
            ..PopRecord::default()
        };
        assert_eq!(
            first_dispatch_stagger(&[pop(0, 50), pop(1, 80), pop(0, 10), pop(2, 30)]),
            70
        );
        let v: serde_json::Value = serde_json::from_str(&chrome_trace(&evs)).unwrap();
        let all = v["traceEvents"].as_array().unwrap();
        let slices: Vec<_> = all.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(slices.len(), 3);
        assert_eq!(slices[1]["tid"], 3);
        assert!(slices.iter().all(|e| e["name"] == "subtask"));
        let named = |n: &str| all.iter().filter(|e| e["name"] == n).count();
        assert_eq!((named("process_name"), named("thread_name")), (1, 3));
    }
}
