//! Reclaim watermark: batched publication of the last-task-alive head with a
//! pressure handshake (D-08..D-13).
//!
//! # Fields, and who may touch them
//!
//! - `local` (scheduler-local last-task-alive head): written only by the
//!   holder of `lock` (a try-lock); read by anyone (backstop, probes).
//! - `published` (the shared watermark, the orchestrator's allocation credit):
//!   release-stored only by the holder of `lock`; acquire-loaded by consumers.
//! - `request` / `ack`: the pressure handshake. The consumer clears `ack`,
//!   then sets `request`; scheduler thread 0 (only) clears `request`,
//!   force-publishes, then sets `ack` (D-10).
//! - `deferred`: its own cache line. A thread that could not take `lock` sets
//!   it; only idle loops clear it, and they publish with force (D-11). It
//!   never sets `ack`, so contention cannot pose as an acknowledged head.
//!
//! One ring is modelled (the orchestrator's task window).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// Local advances between two non-forced publications (D-08).
pub const PUBLISH_INTERVAL_K: u64 = 16;
/// Consumer wait without reclaim progress before it requests a publication (D-09).
pub const REQUEST_AFTER_NS: u64 = 10_000_000;

/// Result of an advance attempt.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// The lock was taken; `moved` local advances, `published` if the shared
    /// head was stored.
    Done {
        /// Slots the local head moved.
        moved: u64,
        /// The shared watermark was stored.
        published: bool,
    },
    /// The try-lock was contended; the deferred mask was set (D-11).
    Deferred,
}

/// The watermark of one ring.
#[derive(Debug)]
pub struct Watermark {
    k: u64,
    local: AtomicU64,
    published: CachePadded<AtomicU64>,
    lock: AtomicBool,
    request: CachePadded<AtomicBool>,
    ack: AtomicBool,
    deferred: CachePadded<AtomicBool>,
    publications: AtomicU64,
    advances: AtomicU64,
}

impl Watermark {
    /// A watermark at 0 publishing every `k` local advances (`k >= 1`; use
    /// [`PUBLISH_INTERVAL_K`]; `k = 1` publishes every advance).
    pub fn new(k: u64) -> Watermark {
        Watermark {
            k: k.max(1),
            local: AtomicU64::new(0),
            published: CachePadded::new(AtomicU64::new(0)),
            lock: AtomicBool::new(false),
            request: CachePadded::new(AtomicBool::new(false)),
            ack: AtomicBool::new(false),
            deferred: CachePadded::new(AtomicBool::new(false)),
            publications: AtomicU64::new(0),
            advances: AtomicU64::new(0),
        }
    }

    /// The shared (published) head: allocation credit for consumers.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }

    /// The scheduler-local head (may run ahead of `published` by < K).
    pub fn local(&self) -> u64 {
        self.local.load(Ordering::Acquire)
    }

    /// (publications, local advances) so far: their ratio is ≈ 1/K on the
    /// non-blocking path.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.publications.load(Ordering::Relaxed),
            self.advances.load(Ordering::Relaxed),
        )
    }

    fn try_lock(&self) -> bool {
        self.lock
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    fn unlock(&self) {
        self.lock.store(false, Ordering::Release);
    }

    /// Test hook: holds the try-lock as a contending peer would.
    pub fn hold_lock_for_test(&self) -> bool {
        self.try_lock()
    }

    /// Test hook: releases a lock taken by [`hold_lock_for_test`](Self::hold_lock_for_test).
    pub fn release_lock_for_test(&self) {
        self.unlock();
    }

    /// Advances the local head over consumed slots (`consumed(i)`), up to
    /// `limit` (tasks submitted), then publishes when forced, when the local
    /// head is K ahead of the shared one (D-08), or when the ring drained
    /// (`local == limit`). Contention defers (D-11).
    pub fn advance(&self, consumed: impl Fn(u64) -> bool, limit: u64, force: bool) -> Advance {
        if !self.try_lock() {
            self.deferred.store(true, Ordering::Release);
            return Advance::Deferred;
        }
        let start = self.local.load(Ordering::Relaxed);
        let mut head = start;
        while head < limit && consumed(head) {
            head += 1;
        }
        self.local.store(head, Ordering::Release);
        self.advances.fetch_add(head - start, Ordering::Relaxed);
        let shared = self.published.load(Ordering::Relaxed);
        let publish =
            head != shared && (force || head - shared >= self.k || (head == limit && head > start));
        if publish {
            self.published.store(head, Ordering::Release);
            self.publications.fetch_add(1, Ordering::Relaxed);
        }
        self.unlock();
        Advance::Done {
            moved: head - start,
            published: publish,
        }
    }

    /// Consumer side (D-09): asks for a forced publication; clears `ack`
    /// first so only a fresh acknowledgement counts.
    pub fn request(&self) {
        self.ack.store(false, Ordering::Release);
        self.request.store(true, Ordering::Release);
    }

    /// Consumer side: takes an acknowledgement (true once per ack).
    pub fn take_ack(&self) -> bool {
        self.ack.swap(false, Ordering::AcqRel)
    }

    /// Scheduler thread 0, from productive and idle iterations (D-10): when a
    /// request is pending and the lock is free, clears the request,
    /// force-publishes and acknowledges. Returns true when it acknowledged.
    pub fn service_request(&self, consumed: impl Fn(u64) -> bool, limit: u64) -> bool {
        if !self.request.load(Ordering::Acquire) {
            return false;
        }
        if !self.try_lock() {
            return false; // retried next iteration; no ack, no deferred bit
        }
        self.unlock();
        self.request.store(false, Ordering::Relaxed);
        match self.advance(consumed, limit, true) {
            Advance::Done { .. } => {
                self.ack.store(true, Ordering::Release);
                true
            }
            Advance::Deferred => {
                self.request.store(true, Ordering::Relaxed);
                false
            }
        }
    }

    /// Marks a possible head move that nobody advanced (contention, or a scope
    /// that closed over already completed tasks); an idle loop will advance.
    pub fn defer(&self) {
        self.deferred.store(true, Ordering::Release);
    }

    /// True while the deferred mask is set.
    pub fn deferred_pending(&self) -> bool {
        self.deferred.load(Ordering::Acquire)
    }

    /// Idle loops only (D-11): drains the deferred mask, advancing with force.
    pub fn drain_deferred(&self, consumed: impl Fn(u64) -> bool, limit: u64) -> bool {
        if !self.deferred.swap(false, Ordering::AcqRel) {
            return false;
        }
        matches!(
            self.advance(consumed, limit, true),
            Advance::Done {
                published: true,
                ..
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publishes_every_k_and_on_drained_ring() {
        let w = Watermark::new(PUBLISH_INTERVAL_K);
        let adv = |n| w.advance(|i| i < n, 100, false);
        assert_eq!(
            adv(15),
            Advance::Done {
                moved: 15,
                published: false
            }
        );
        assert_eq!(w.published(), 0);
        assert_eq!(
            adv(16),
            Advance::Done {
                moved: 1,
                published: true
            }
        );
        assert_eq!(w.published(), 16);
        // Ring drained (local == limit): published although < K ahead.
        let _ = w.advance(|_| true, 20, false);
        assert_eq!(w.published(), 20);
        assert_eq!(w.counts(), (2, 20));
    }

    #[test]
    fn request_is_acked_with_forced_publication() {
        let w = Watermark::new(16);
        let _ = w.advance(|i| i < 6, 8, false);
        assert_eq!(w.published(), 0);
        assert!(!w.service_request(|i| i < 6, 8)); // no request yet
        w.request();
        assert!(w.service_request(|i| i < 6, 8));
        assert_eq!(w.published(), 6);
        assert!(w.take_ack());
        assert!(!w.take_ack());
    }

    #[test]
    fn contention_defers_without_ack_or_eager_publication() {
        let w = Watermark::new(16);
        assert!(w.hold_lock_for_test());
        assert_eq!(w.advance(|i| i < 3, 8, false), Advance::Deferred);
        assert!(w.deferred_pending());
        w.release_lock_for_test();
        // The productive path (service_request without a request) does not
        // drain the deferred mask and never acks.
        assert!(!w.service_request(|i| i < 3, 8));
        assert!(w.deferred_pending() && !w.take_ack());
        assert_eq!(w.published(), 0);
        // Only the idle drain publishes it (with force).
        assert!(w.drain_deferred(|i| i < 3, 8));
        assert_eq!(w.published(), 3);
        assert!(!w.deferred_pending() && !w.take_ack());
    }
}
