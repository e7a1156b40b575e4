//! Batched doorbell publication (D-01..D-05).
//!
//! # Protocol
//!
//! A scheduler thread pops a batch of ready tasks of one shape (at most as
//! many as it has dispatchable units), claims blocks, and *prepares* every
//! claimed core: descriptor into the core's parity buffer, tracker updated
//! (so a core is never double-booked while its publication is in flight).
//! Prepared cores accumulate as [`PublishHandle`]s in one array of
//! `clusters * 3` entries (D-03: a pop claims at most one unit per owned core,
//! a MIX block has 3 subtasks). A *flush* is ONE release fence, then every
//! doorbell store (relaxed), then the array is cleared:
//! - cross-task mode: one flush ends the pop (D-02), so a pop of N distinct
//!   tasks costs one fence;
//! - per-task mode (and any pop carrying a sync_start task, the exclusion of
//!   D-04): one flush after each task (D-01: still one fence per claim);
//! - before entering drain mode the pending handles are flushed (D-05), a
//!   no-op when the pop already flushed per task.

use std::sync::atomic::{Ordering, fence};

use super::metrics::PopRecord;
use super::state::{PublishHandle, RunState, Tracker};
use super::task::{PublishMode, Shape};

/// The handle array of one pop (capacity `clusters * 3`, D-03).
pub(crate) struct PublishBatch {
    handles: Vec<PublishHandle>,
    cap: usize,
}

impl PublishBatch {
    pub fn new(clusters: usize) -> PublishBatch {
        let cap = clusters * 3;
        PublishBatch {
            handles: Vec::with_capacity(cap),
            cap,
        }
    }

    pub fn push(&mut self, h: PublishHandle) {
        assert!(self.handles.len() < self.cap, "D-03: handle array overflow");
        self.handles.push(h);
    }

    /// One release fence, then every doorbell store; records counts and the
    /// first/last store times in `rec`.
    pub fn flush(&mut self, sh: &RunState, rec: &mut PopRecord) {
        if self.handles.is_empty() {
            return;
        }
        fence(Ordering::Release);
        sh.cost(sh.prof.fence_ns);
        rec.fences += 1;
        let t0 = sh.now();
        for h in &self.handles {
            sh.regs.ring(h.core, h.token);
            sh.cost(sh.prof.store_ns);
        }
        let t1 = sh.now();
        if rec.doorbells == 0 {
            rec.first_store_ns = t0;
        }
        rec.last_store_ns = t1;
        rec.doorbells += self.handles.len() as u32;
        rec.max_flush = rec.max_flush.max(self.handles.len() as u32);
        self.handles.clear();
    }
}

/// Phase 4: dispatches MIX, then AIC and AIV (order flipped by thread parity).
/// Returns (progress, entered_drain).
pub(crate) fn dispatch_ready(sh: &RunState, t: usize) -> (bool, bool) {
    let order = if t.is_multiple_of(2) {
        [Shape::Mix, Shape::Aic, Shape::Aiv]
    } else {
        [Shape::Mix, Shape::Aiv, Shape::Aic]
    };
    let mut progress = false;
    for shape in order {
        let (p, drained) = dispatch_shape(sh, t, shape);
        progress |= p;
        if drained {
            return (progress, true);
        }
    }
    (progress, false)
}

/// Dispatches ready tasks of one shape on thread `t`'s idle units.
pub(crate) fn dispatch_shape(sh: &RunState, t: usize, shape: Shape) -> (bool, bool) {
    let mut tr = sh.trackers[t].lock().unwrap();
    let mut units = tr.idle_units(shape);
    let mut pb = PublishBatch::new(sh.prof.clusters);
    let mut progress = false;
    while !units.is_empty() {
        let batch = sh.pop_batch(shape, units.len());
        if batch.is_empty() {
            break;
        }
        let mut rec = PopRecord {
            id: sh.m.next_pop(),
            thread: t,
            shape: Some(shape),
            ..PopRecord::default()
        };
        // D-04: one mask-bit test per popped task.
        rec.sync = sh.opts.sync_exclusion && batch.iter().any(|&i| sh.tasks[i].spec.sync_start);
        let per_task = rec.sync || sh.opts.publish == PublishMode::PerTask;
        let mut drained = false;
        for (i, &task) in batch.iter().enumerate() {
            let spec = &sh.tasks[task].spec;
            if spec.sync_start && units.len() < spec.block_num as usize {
                pb.flush(sh, &mut rec); // D-05
                sh.check_published(&tr);
                if !sh.drain.enter(sh, t, task, spec.block_num) {
                    sh.push_ready(task);
                }
                batch[i + 1..].iter().for_each(|&r| sh.push_ready(r));
                drained = true;
                break;
            }
            if units.is_empty() {
                pb.flush(sh, &mut rec);
                batch[i..].iter().for_each(|&r| sh.push_ready(r));
                break;
            }
            if prepare_task(sh, &mut tr, &mut units, &mut pb, task, rec.id) {
                rec.tasks += 1;
            }
            if per_task {
                pb.flush(sh, &mut rec);
            }
        }
        pb.flush(sh, &mut rec);
        progress |= rec.doorbells > 0;
        sh.m.record(rec);
        if drained {
            return (progress, true);
        }
    }
    (progress, false)
}

/// Claims blocks of `task` for as many units as it can and prepares each
/// claimed block's cores. Re-pushes the task when blocks remain (peers may
/// claim them). Returns true when it prepared anything.
fn prepare_task(
    sh: &RunState,
    tr: &mut Tracker,
    units: &mut Vec<(usize, usize)>,
    pb: &mut PublishBatch,
    task: usize,
    pop: u32,
) -> bool {
    let bn = sh.tasks[task].spec.block_num;
    let (start, n) = sh.claim(task, units.len() as u32);
    if n == 0 {
        return false;
    }
    if start + n < bn {
        sh.push_ready(task);
    }
    for b in start..start + n {
        let (first, count) = units.pop().expect("claimed at most |units| blocks");
        for core in first..first + count {
            pb.push(sh.prepare(tr, core, task, b, pop));
        }
    }
    true
}

/// Drain staging: thread `t` claims what its idle units allow of the held
/// cohort `task`, prepares, and publishes with one fence. Returns the blocks staged.
pub(crate) fn stage_own(sh: &RunState, t: usize, task: usize) -> u32 {
    let shape = sh.tasks[task].spec.shape;
    let mut tr = sh.trackers[t].lock().unwrap();
    let mut units = tr.idle_units(shape);
    let mut pb = PublishBatch::new(sh.prof.clusters);
    let mut rec = PopRecord {
        id: sh.m.next_pop(),
        thread: t,
        drain: true,
        ..PopRecord::default()
    };
    let (start, n) = sh.claim(task, units.len() as u32);
    for b in start..start + n {
        let (first, count) = units.pop().expect("claimed at most |units| blocks");
        for core in first..first + count {
            pb.push(sh.prepare(&mut tr, core, task, b, rec.id));
        }
    }
    rec.tasks = u32::from(n > 0);
    pb.flush(sh, &mut rec);
    sh.m.record(rec);
    n
}
