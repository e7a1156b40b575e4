//! Chrome trace / Perfetto JSON (the Trace Event Format), one writer for
//! every export of the crate (`xtc decode --trace-out`, the dispatch
//! swimlanes).
//!
//! A [`TraceWriter`] collects events and [`TraceWriter::finish`] gives the
//! JSON object `{"traceEvents": [...], "displayTimeUnit": "ms"}` that
//! `chrome://tracing` and <https://ui.perfetto.dev> open. Timestamps and
//! durations are microseconds (`f64`, so sub-microsecond spans survive).
//!
//! What each event becomes in Perfetto (its JSON importer):
//! - metadata (`ph: "M"`): [`process_name`](TraceWriter::process_name),
//!   [`thread_name`](TraceWriter::thread_name) and their sort indices name
//!   and order the tracks;
//! - complete events (`"X"`, [`complete`](TraceWriter::complete)): slices on
//!   a thread's track; slices of one name group together, so give repeated
//!   work one name and put its index in `args`;
//! - counters (`"C"`, [`counter`](TraceWriter::counter)): one counter track
//!   per name and series, in the process;
//! - instants (`"i"`, [`instant`](TraceWriter::instant)): marks on a thread;
//! - nestable async events (`"b"`/`"e"`/`"n"`, [`async_begin`](TraceWriter::async_begin),
//!   [`async_end`](TraceWriter::async_end), [`async_instant`](TraceWriter::async_instant)):
//!   slices that may overlap, paired by `id`. Perfetto keys an async track by
//!   the process, the `id` and the name of the id's *first* event, and packs
//!   the ids that share that root name into one track group (an id's track
//!   is reused once its slices ended). So hundreds of overlapping requests
//!   whose root slice has one name show as one group, a row per concurrent
//!   request, instead of a track each; nested events of the same id (other
//!   names) stack under the root slice.
#![deny(unsafe_code)]
#![warn(missing_docs)]

use serde::Serialize;
use serde_json::{Value, json};

/// The scope of an instant event (`s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// On its thread's track.
    Thread,
    /// Across its process.
    Process,
    /// Across the whole trace.
    Global,
}

impl Scope {
    fn code(self) -> &'static str {
        match self {
            Scope::Thread => "t",
            Scope::Process => "p",
            Scope::Global => "g",
        }
    }
}

/// One event (fields the phase does not use are left out of the JSON).
#[derive(Debug, Clone, PartialEq, Serialize)]
struct Event {
    name: String,
    ph: &'static str,
    pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    tid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'static str>,
    #[serde(skip_serializing_if = "Value::is_null")]
    args: Value,
}

impl Event {
    fn new(name: impl Into<String>, ph: &'static str, pid: u32) -> Self {
        Event {
            name: name.into(),
            ph,
            pid,
            tid: None,
            ts: None,
            dur: None,
            cat: None,
            id: None,
            s: None,
            args: Value::Null,
        }
    }
}

/// A trace under construction (see the module doc).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceWriter {
    events: Vec<Event>,
}

impl TraceWriter {
    /// An empty trace.
    pub fn new() -> Self {
        TraceWriter::default()
    }

    /// Events so far.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether there is no event yet.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    fn meta(&mut self, name: &'static str, pid: u32, tid: Option<u32>, args: Value) {
        let mut e = Event::new(name, "M", pid);
        e.tid = tid;
        e.args = args;
        self.events.push(e);
    }

    /// Names process `pid` (`process_name` metadata).
    pub fn process_name(&mut self, pid: u32, name: &str) {
        self.meta("process_name", pid, None, json!({ "name": name }));
    }

    /// Orders process `pid` among processes (`process_sort_index`, ascending).
    pub fn process_sort_index(&mut self, pid: u32, index: i64) {
        self.meta(
            "process_sort_index",
            pid,
            None,
            json!({ "sort_index": index }),
        );
    }

    /// Names thread `tid` of `pid` (`thread_name` metadata).
    pub fn thread_name(&mut self, pid: u32, tid: u32, name: &str) {
        self.meta("thread_name", pid, Some(tid), json!({ "name": name }));
    }

    /// Orders thread `tid` within its process (`thread_sort_index`, ascending).
    pub fn thread_sort_index(&mut self, pid: u32, tid: u32, index: i64) {
        self.meta(
            "thread_sort_index",
            pid,
            Some(tid),
            json!({ "sort_index": index }),
        );
    }

    /// A complete event (`"X"`): a slice on thread `tid` from `ts_us` for
    /// `dur_us` microseconds (a negative duration is written as 0).
    #[allow(
        clippy::too_many_arguments,
        reason = "one field each, as the format has"
    )]
    pub fn complete(
        &mut self,
        pid: u32,
        tid: u32,
        name: &str,
        cat: &str,
        ts_us: f64,
        dur_us: f64,
        args: Value,
    ) {
        let mut e = Event::new(name, "X", pid);
        e.tid = Some(tid);
        e.ts = Some(ts_us);
        e.dur = Some(dur_us.max(0.0));
        e.cat = Some(cat.to_string());
        e.args = args;
        self.events.push(e);
    }

    /// An instant event (`"i"`) at `ts_us` on thread `tid`, of `scope`.
    #[allow(
        clippy::too_many_arguments,
        reason = "one field each, as the format has"
    )]
    pub fn instant(
        &mut self,
        pid: u32,
        tid: u32,
        name: &str,
        cat: &str,
        ts_us: f64,
        scope: Scope,
        args: Value,
    ) {
        let mut e = Event::new(name, "i", pid);
        e.tid = Some(tid);
        e.ts = Some(ts_us);
        e.cat = Some(cat.to_string());
        e.s = Some(scope.code());
        e.args = args;
        self.events.push(e);
    }

    /// A counter sample (`"C"`): the track `name` of process `pid` takes
    /// each `(series, value)` at `ts_us`.
    pub fn counter(&mut self, pid: u32, name: &str, ts_us: f64, series: &[(&str, f64)]) {
        let mut e = Event::new(name, "C", pid);
        e.ts = Some(ts_us);
        e.args = Value::Object(
            series
                .iter()
                .map(|(k, v)| ((*k).to_string(), json!(v)))
                .collect(),
        );
        self.events.push(e);
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "one field each, as the format has"
    )]
    fn async_event(
        &mut self,
        ph: &'static str,
        pid: u32,
        cat: &str,
        name: &str,
        id: u64,
        ts_us: f64,
        args: Value,
    ) {
        let mut e = Event::new(name, ph, pid);
        e.tid = Some(0);
        e.ts = Some(ts_us);
        e.cat = Some(cat.to_string());
        e.id = Some(id);
        e.args = args;
        self.events.push(e);
    }

    /// Begins a nestable async slice (`"b"`) of `id` (see the module doc for
    /// how Perfetto groups them: the id's first slice names its track).
    pub fn async_begin(
        &mut self,
        pid: u32,
        cat: &str,
        name: &str,
        id: u64,
        ts_us: f64,
        args: Value,
    ) {
        self.async_event("b", pid, cat, name, id, ts_us, args);
    }

    /// Ends the innermost open async slice `name` of `id` (`"e"`).
    pub fn async_end(&mut self, pid: u32, cat: &str, name: &str, id: u64, ts_us: f64, args: Value) {
        self.async_event("e", pid, cat, name, id, ts_us, args);
    }

    /// A nestable async instant (`"n"`) on `id`'s track.
    pub fn async_instant(
        &mut self,
        pid: u32,
        cat: &str,
        name: &str,
        id: u64,
        ts_us: f64,
        args: Value,
    ) {
        self.async_event("n", pid, cat, name, id, ts_us, args);
    }

    /// The trace: `{"traceEvents": [...], "displayTimeUnit": "ms"}`.
    pub fn finish(self) -> Value {
        json!({ "traceEvents": self.events, "displayTimeUnit": "ms" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_carry_only_their_phase_fields() {
        let mut w = TraceWriter::new();
        w.process_name(1, "p");
        w.thread_name(1, 2, "t");
        w.complete(
            1,
            2,
            "iteration",
            "iteration",
            10.0,
            -1.0,
            json!({"index": 0}),
        );
        w.counter(1, "KV blocks used", 11.0, &[("blocks", 3.0)]);
        w.instant(
            1,
            2,
            "rejected",
            "request",
            12.0,
            Scope::Thread,
            Value::Null,
        );
        w.async_begin(1, "request", "request", 7, 1.0, Value::Null);
        w.async_instant(1, "request", "first token", 7, 2.0, Value::Null);
        w.async_end(1, "request", "request", 7, 3.0, Value::Null);
        assert_eq!(w.len(), 8);
        let v = w.finish();
        let ev = v["traceEvents"].as_array().unwrap();
        assert_eq!(
            ev[0],
            json!({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "p"}})
        );
        assert_eq!(ev[1]["tid"], 2);
        assert_eq!(
            (ev[2]["dur"].as_f64(), &ev[2]["args"]["index"]),
            (Some(0.0), &json!(0))
        );
        assert_eq!(ev[3]["args"]["blocks"], 3.0);
        assert!(ev[3].get("tid").is_none());
        assert_eq!(ev[4]["s"], "t");
        assert!(ev[4].get("args").is_none());
        assert_eq!((&ev[5]["ph"], &ev[5]["id"]), (&json!("b"), &json!(7)));
        assert_eq!(ev[6]["ph"], "n");
        assert_eq!(v["displayTimeUnit"], "ms");
    }
}
