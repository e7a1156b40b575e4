//! The reclaim consumer (orchestrator side of the watermark) and the
//! scheduler-side duties around it (D-09, D-10, D-12, D-13).
//!
//! The orchestrator needs a free slot of its task window to submit task `id`:
//! credit is `id < published + window`, where `published` is the shared
//! last-task-alive head ([`Watermark`](super::watermark::Watermark)). The
//! scheduler publishes that head only every K advances, so a blocked
//! orchestrator needs a receiver-visible escape (D-13): after
//! `request_after_ns` without reclaim progress it requests a publication;
//! scheduler thread 0 force-publishes and acknowledges. A structural deadlock
//! verdict ("the head is the oldest task of the open scope, so the window can
//! never free") is drawn only from an acknowledged head (D-12); an
//! unacknowledged value is just a lower bound. A backstop ends any stall.

use std::sync::atomic::Ordering;

use super::state::RunState;
use super::step::{Point, Yielder};
use super::task::{Stall, StallEnd};
use xtc::Error;

impl RunState {
    /// Scheduler thread 0, every iteration (D-10): serves a pending request.
    pub(crate) fn service_requests(&self) -> bool {
        self.wm
            .service_request(|i| self.consumed(i), self.submitted_u64())
    }

    /// Whether the loop watchdog may latch for thread `t`: it runs a task
    /// itself, or no thread runs one while submitted tasks remain.
    pub(crate) fn watchdog_should_fire(&self, t: usize) -> bool {
        if self.trackers[t].lock().unwrap().any_running() {
            return true;
        }
        let anyone = self
            .trackers
            .iter()
            .any(|tr| tr.lock().unwrap().any_running());
        !anyone && self.done_tasks.load(Ordering::Acquire) < self.submitted.load(Ordering::Acquire)
    }

    /// Orchestrator: waits until task `id` has a window slot. `scope_start`
    /// is the oldest task of the open scope, if any. Returns false when the
    /// run completed (or failed) meanwhile.
    pub(crate) async fn wait_credit(
        &self,
        id: usize,
        scope_start: Option<usize>,
        y: &Yielder,
    ) -> bool {
        let Some(window) = self.opts.window else {
            return !self.is_completed();
        };
        let credit = |head: u64| (id as u64) < head + window as u64;
        if credit(self.wm.published()) {
            return true;
        }
        let start = self.now();
        let (mut since, mut last_head) = (start, self.wm.published());
        let (mut requested, mut acked) = (false, false);
        loop {
            if self.is_completed() {
                return false;
            }
            let now = self.now();
            if requested && self.wm.take_ack() {
                acked = true;
                requested = false;
            }
            let head = self.wm.published();
            if credit(head) {
                let how = if acked {
                    StallEnd::Acked
                } else {
                    StallEnd::Published
                };
                self.record_stall(id, start, how);
                return true;
            }
            if acked {
                // D-12: a structural verdict only from an acknowledged head.
                if scope_start == Some(head as usize) {
                    self.verdicts.fetch_add(1, Ordering::Relaxed);
                    self.latch_fatal(Error::Range);
                    return false;
                }
                acked = false;
                since = now;
            }
            if head != last_head {
                (last_head, since) = (head, now);
            }
            if self.opts.handshake && !requested && now - since >= self.opts.request_after_ns {
                self.wm.request();
                requested = true;
            }
            if now - start >= self.opts.backstop_ns {
                if credit(self.wm.local()) {
                    self.record_stall(id, start, StallEnd::Backstop);
                    return true;
                }
                self.latch_fatal(Error::Range);
                return false;
            }
            y.pause(Point::OrchBlocked).await;
        }
    }

    fn record_stall(&self, task: usize, start_ns: u64, how: StallEnd) {
        self.stalls.lock().unwrap().push(Stall {
            task,
            start_ns,
            end_ns: self.now(),
            how,
        });
    }
}
