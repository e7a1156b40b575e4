//! The admission front end over the ring: the group's shared handle space, the
//! two preallocated record pools, the hand-in record, and the consumer side
//! (`Inbox`) the driver drains (B-109..B-112, B-116, B-120, B-121, B-141..B-143).
//!
//! # Records and pools
//!
//! A record is one ring slot's payload, a [`HandIn`]. The SUBMIT pool and the
//! control pool are counters of free records (`mt_queue_cap` each), claimed by
//! a producer before it reserves a ring slot. The ring has at least
//! `2 * mt_queue_cap` slots, so a producer holding a record always finds a
//! free slot: records bound the ring, and the ring never allocates. A control
//! record returns to its pool as soon as the consumer pops it; a SUBMIT record
//! is returned by the driver ([`Inbox::release_submit`]) only when its hand-in
//! is admitted or ends before admission, so `mt_queue_cap` also bounds the
//! hand-ins the driver holds for a slot (B-111), and held hand-ins never use a
//! control record (B-112).
//!
//! # Close
//!
//! [`Inbox::close`] sets the ring's CLOSED flag; its return value bounds the
//! positions of all submits that reserved before it, so the driver knows when
//! every racing hand-in has been drained ([`Inbox::submits_drained`], B-143).
//! [`Inbox::finish`] refuses everything afterwards: controls then get `Inval`.
//!
//! # Doorbell (driver wake on push)
//!
//! The driver parks between iterations when it has nothing to do. Before it
//! parks it calls [`Inbox::arm`] with its waker: store `armed`, SeqCst fence,
//! look at the ring. A producer, after publishing its slot (Release stamp),
//! issues a SeqCst fence and reads `armed`. By the fences' total order either
//! the driver sees the slot (and does not park) or the producer sees `armed`
//! and wakes it (a cross-thread wake of the rt loop, through its eventfd).
//! While the driver is not armed a push costs a fence and a load, no wake.
#![deny(unsafe_code)]

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering as StdOrdering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Waker;

use crossbeam_utils::CachePadded;

use super::{Class, ConsumerKey, Pop, Refusal, Ring};
use crate::batch::sync_facade::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use crate::{Error, Result};

/// The group's single monotonic handle space, shared by owner-loop submits and
/// every producer thread (B-120).
///
/// Handles are the range `first..=last` (the group's own part of the 64-bit
/// space, disjoint from every other group's, B-029), issued in increasing
/// order, never reused; a checked CAS makes exhaustion (`last` issued) return
/// `Range` to every caller without ever wrapping or leaving the range, however
/// many threads race on it (B-028).
#[derive(Debug)]
pub(crate) struct HandleSpace {
    /// The next handle to issue; past `last` (0 after `u64::MAX`) once exhausted.
    next: AtomicU64,
    /// First and last handle of the range. Fixed at creation except by the
    /// test hook [`HandleSpace::rebase`], so plain std atomics (not modelled
    /// by loom).
    first: StdAtomicU64,
    last: StdAtomicU64,
}

impl Default for HandleSpace {
    fn default() -> Self {
        HandleSpace::starting_at(NonZeroU64::MIN)
    }
}

impl HandleSpace {
    /// A space `first..=u64::MAX` (tests start near `u64::MAX`).
    pub(crate) fn starting_at(first: NonZeroU64) -> HandleSpace {
        HandleSpace::within(first, NonZeroU64::MAX)
    }

    /// The space `first..=last` (`last >= first`).
    pub(crate) fn within(first: NonZeroU64, last: NonZeroU64) -> HandleSpace {
        debug_assert!(first <= last);
        HandleSpace {
            next: AtomicU64::new(first.get()),
            first: StdAtomicU64::new(first.get()),
            last: StdAtomicU64::new(last.get()),
        }
    }

    /// Issues the next handle.
    ///
    /// # Errors
    /// `Range` once every handle has been issued (B-028, B-120).
    pub(crate) fn issue(&self) -> Result<NonZeroU64> {
        let mut cur = self.next.load(Ordering::Relaxed);
        let last = self.last.load(StdOrdering::Relaxed);
        loop {
            let Some(handle) = NonZeroU64::new(cur).filter(|h| h.get() <= last) else {
                return Err(Error::Range);
            };
            // Only `cur <= last` advances: `next` stops at `last + 1`, or
            // wraps to 0 (the "exhausted" mark) after `u64::MAX`.
            match self.next.compare_exchange_weak(
                cur,
                cur.wrapping_add(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(handle),
                Err(now) => cur = now,
            }
        }
    }

    /// Test hook: the next handle issued is `last + 1`, clamped into the
    /// range (`first` at least; exhausted once `last` reaches the range's end).
    pub(crate) fn set_last(&self, last: u64) {
        let first = self.first.load(StdOrdering::Relaxed);
        let end = self.last.load(StdOrdering::Relaxed);
        let next = if last >= end {
            end.wrapping_add(1)
        } else {
            last.wrapping_add(1).max(first)
        };
        self.next.store(next, Ordering::Relaxed);
    }

    /// Test hook: moves the space to `first..=last`, nothing issued yet. Only
    /// before any handle of the space is in use.
    pub(crate) fn rebase(&self, first: NonZeroU64, last: NonZeroU64) {
        debug_assert!(first <= last);
        self.first.store(first.get(), StdOrdering::Relaxed);
        self.last.store(last.get(), StdOrdering::Relaxed);
        self.next.store(first.get(), Ordering::Relaxed);
    }

    /// Whether `handle` has been issued from this space (it may since have
    /// completed); false for a handle of another range (another group's).
    pub(crate) fn is_issued(&self, handle: NonZeroU64) -> bool {
        let first = self.first.load(StdOrdering::Relaxed);
        let last = self.last.load(StdOrdering::Relaxed);
        let next = self.next.load(Ordering::Relaxed);
        let h = handle.get();
        (first..=last).contains(&h) && (next == 0 || h < next)
    }
}

/// A counter of free preallocated records.
#[derive(Debug)]
pub(crate) struct Pool {
    free: CachePadded<AtomicUsize>,
    cap: usize,
}

impl Pool {
    /// A pool of `cap` free records.
    pub(crate) fn new(cap: usize) -> Pool {
        Pool {
            free: CachePadded::new(AtomicUsize::new(cap)),
            cap,
        }
    }

    /// Claims one record; `false` when the pool is exhausted.
    pub(crate) fn claim(&self) -> bool {
        let mut cur = self.free.load(Ordering::Relaxed);
        loop {
            if cur == 0 {
                return false;
            }
            match self.free.compare_exchange_weak(
                cur,
                cur - 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Returns one claimed record.
    pub(crate) fn release(&self) {
        self.release_n(1);
    }

    /// Returns `n` claimed records at once (one atomic operation).
    pub(crate) fn release_n(&self, n: usize) {
        let before = self.free.fetch_add(n, Ordering::Release);
        debug_assert!(
            before.checked_add(n).is_some_and(|free| free <= self.cap),
            "record released twice"
        );
    }

    /// Records currently free.
    #[cfg(test)]
    pub(crate) fn free(&self) -> usize {
        self.free.load(Ordering::Relaxed)
    }
}

/// What a control hand-in asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ControlOp {
    /// `cancel_mt`.
    Cancel,
    /// `resume_mt`.
    Resume,
}

/// One admission record, as it travels on the ring.
#[derive(Debug)]
pub(crate) enum HandIn<R> {
    /// `submit_mt`: holds a SUBMIT record until [`Inbox::release_submit`].
    Submit {
        /// The handle returned to the producer.
        handle: NonZeroU64,
        /// The request, owned by the group from here on.
        request: R,
        /// Its fixed resource charge.
        charge: u64,
    },
    /// `cancel_mt` / `resume_mt`: its control record is back in the pool by the
    /// time the driver sees it.
    Control {
        /// Cancel or resume.
        op: ControlOp,
        /// The handle it targets.
        handle: NonZeroU64,
    },
}

/// A refused submit hand-in: the error and the request, handed back.
pub(crate) type SubmitRefused<R> = (Error, R);

/// Wakes the parked driver when a hand-in lands (see the module memo).
#[derive(Debug, Default)]
struct Doorbell {
    armed: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Doorbell {
    /// Producer side, after a successful push.
    fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.armed.load(Ordering::Relaxed) && self.armed.swap(false, Ordering::AcqRel) {
            // Clone, not take: the driver may already have re-armed with the
            // same waker, and a later producer must still find it.
            let waker = self
                .waker
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if let Some(w) = waker {
                w.wake();
            }
        }
    }

    /// Consumer side: stores `waker` and arms; the caller must look at the
    /// ring afterwards.
    fn arm(&self, waker: &Waker) {
        let mut slot = self.waker.lock().unwrap_or_else(PoisonError::into_inner);
        if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *slot = Some(waker.clone());
        }
        drop(slot);
        self.armed.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }
}

/// State shared by every producer and the consumer.
#[derive(Debug)]
pub(crate) struct Admission<R> {
    ring: Ring<HandIn<R>>,
    submits: Pool,
    controls: Pool,
    handles: Arc<HandleSpace>,
    rejections: CachePadded<AtomicU64>,
    doorbell: Doorbell,
}

impl<R> Admission<R> {
    /// Bytes the ring and both pools of a `cap`-record admission occupy.
    ///
    /// # Errors
    /// `Range` on arithmetic overflow.
    pub(crate) fn bytes_for(cap: usize) -> Result<u64> {
        let slots = cap.checked_mul(2).ok_or(Error::Range)?;
        Ring::<HandIn<R>>::bytes_for(slots)?
            .checked_add(std::mem::size_of::<Self>() as u64)
            .ok_or(Error::Range)
    }

    /// Admission with `cap` SUBMIT and `cap` control records stamping handles
    /// from `handles`; returns the shared half and the consumer's inbox.
    ///
    /// # Errors
    /// `Inval` for `cap == 0`; `Range` on size overflow.
    pub(crate) fn new(cap: usize, handles: Arc<HandleSpace>) -> Result<(Arc<Self>, Inbox<R>)> {
        if cap == 0 {
            return Err(Error::Inval);
        }
        let (ring, key) = Ring::with_capacity(cap.checked_mul(2).ok_or(Error::Range)?)?;
        let shared = Arc::new(Admission {
            ring,
            submits: Pool::new(cap),
            controls: Pool::new(cap),
            handles,
            rejections: CachePadded::new(AtomicU64::new(0)),
            doorbell: Doorbell::default(),
        });
        let inbox = Inbox {
            shared: Arc::clone(&shared),
            key,
            close_pos: None,
        };
        Ok((shared, inbox))
    }

    /// The handle space this admission stamps from.
    pub(crate) fn handles(&self) -> &Arc<HandleSpace> {
        &self.handles
    }

    /// Refused calls so far (`mt_rejections`, saturating).
    pub(crate) fn rejections(&self) -> u64 {
        self.rejections.load(Ordering::Relaxed)
    }

    fn reject(&self) -> Error {
        self.count_rejection();
        Error::Again
    }

    /// Counts one refused mt call in `mt_rejections` (saturating): every
    /// refused submit_mt (`Again`, or `Range` for its charge or an exhausted
    /// handle space) and every `Again` control, as the owner path counts its
    /// refused submits in `rejections` (B-110, B-177).
    pub(crate) fn count_rejection(&self) {
        let _ = self
            .rejections
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1));
    }

    /// Hands in a submit: claims a SUBMIT record, stamps a handle, pushes.
    /// Returns the handle only once the record is on the ring (B-121).
    ///
    /// A call that starts after close returned sees the CLOSED flag before
    /// claiming anything, so no handle is issued (B-141). A call that races
    /// close may stamp a handle and then lose the reservation: that number is
    /// never returned nor reused (a gap in the monotonic space).
    ///
    /// # Errors
    /// `Again` when the pool is exhausted or the ring closed; `Range` when the
    /// handle space is exhausted. Both count in `mt_rejections` (B-177). The
    /// request comes back.
    pub(crate) fn submit(&self, request: R, charge: u64) -> Result<NonZeroU64, SubmitRefused<R>> {
        if self.ring.is_closed() || !self.submits.claim() {
            return Err((self.reject(), request));
        }
        let handle = match self.handles.issue() {
            Ok(h) => h,
            Err(e) => {
                self.submits.release();
                self.count_rejection(); // a refused mt call (B-177)
                return Err((e, request));
            }
        };
        let record = HandIn::Submit {
            handle,
            request,
            charge,
        };
        match self.ring.push(record, Class::Submit) {
            Ok(_) => {
                self.doorbell.ring();
                Ok(handle)
            }
            Err(refused) => {
                self.submits.release();
                let HandIn::Submit { request, .. } = refused.value else {
                    unreachable!("the ring hands back the record it was given")
                };
                Err((self.reject(), request))
            }
        }
    }

    /// Hands in a cancel or resume for `handle`.
    ///
    /// # Errors
    /// `Inval` for a handle never issued or once the consumer finished;
    /// `Again` (counted) when every control record is in use.
    pub(crate) fn control(&self, op: ControlOp, handle: NonZeroU64) -> Result<()> {
        if !self.handles.is_issued(handle) || self.ring.is_finished() {
            return Err(Error::Inval);
        }
        if !self.controls.claim() {
            return Err(self.reject());
        }
        match self
            .ring
            .push(HandIn::Control { op, handle }, Class::Control)
        {
            Ok(_) => {
                self.doorbell.ring();
                Ok(())
            }
            Err(refused) => {
                self.controls.release();
                match refused.refusal {
                    Refusal::Finished => Err(Error::Inval),
                    Refusal::Full | Refusal::Closed => Err(self.reject()),
                }
            }
        }
    }

    /// Free SUBMIT records (tests).
    #[cfg(test)]
    pub(crate) fn free_submit_records(&self) -> usize {
        self.submits.free()
    }

    /// Free control records (tests).
    #[cfg(test)]
    pub(crate) fn free_control_records(&self) -> usize {
        self.controls.free()
    }
}

/// A submit paused between reserving its slot and writing it (tests only:
/// the ring's "producer still writing" state, on demand).
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct PausedSubmit<'a, R> {
    shared: &'a Admission<R>,
    reservation: super::Reservation,
    record: HandIn<R>,
}

#[cfg(test)]
impl<R> PausedSubmit<'_, R> {
    /// Writes the record and rings the doorbell.
    pub(crate) fn commit(self) {
        self.shared.ring.commit(self.reservation, self.record);
        self.shared.doorbell.ring();
    }
}

#[cfg(test)]
impl<R> Admission<R> {
    /// Claims, stamps and reserves like [`submit`](Admission::submit), but
    /// leaves the write to [`PausedSubmit::commit`].
    pub(crate) fn submit_paused(&self, request: R, charge: u64) -> PausedSubmit<'_, R> {
        assert!(self.submits.claim(), "no SUBMIT record");
        let handle = self.handles.issue().expect("handle");
        let reservation = self.ring.reserve(Class::Submit).expect("slot");
        PausedSubmit {
            shared: self,
            reservation,
            record: HandIn::Submit {
                handle,
                request,
                charge,
            },
        }
    }
}

/// The consumer side, owned by the group on its owner loop (one per ring).
#[derive(Debug)]
pub(crate) struct Inbox<R> {
    shared: Arc<Admission<R>>,
    key: ConsumerKey,
    close_pos: Option<u64>,
}

impl<R> Inbox<R> {
    /// The shared half (to make producers from).
    pub(crate) fn shared(&self) -> &Arc<Admission<R>> {
        &self.shared
    }

    /// The next hand-in in reservation order. A control's record is back in
    /// its pool on return; a submit keeps its record until
    /// [`release_submit`](Inbox::release_submit).
    pub(crate) fn pop(&mut self) -> Pop<HandIn<R>> {
        let popped = self.shared.ring.pop(&mut self.key);
        if let Pop::Item(HandIn::Control { .. }) = &popped {
            self.shared.controls.release();
        }
        popped
    }

    /// Arms the doorbell with the driver's `waker` before it parks; returns
    /// `true` when a hand-in is already ready (then the driver must not park:
    /// no wake would come for it).
    pub(crate) fn arm(&self, waker: &Waker) -> bool {
        self.shared.doorbell.arm(waker);
        let ready = self.shared.ring.has_ready(&self.key);
        if ready {
            self.disarm();
        }
        ready
    }

    /// Disarms the doorbell (the driver is running; pushes need not wake it).
    pub(crate) fn disarm(&self) {
        self.shared.doorbell.armed.store(false, Ordering::Relaxed);
    }

    /// Returns the SUBMIT record of a drained hand-in that was admitted (or
    /// ended before admission).
    #[cfg(test)]
    pub(crate) fn release_submit(&self) {
        self.shared.submits.release();
    }

    /// Returns `n` SUBMIT records at once.
    pub(crate) fn release_submits(&self, n: usize) {
        if n > 0 {
            self.shared.submits.release_n(n);
        }
    }

    /// Where the submit hand-in for `handle` is, if it is written on the
    /// ring and not drained yet: `Some(false)` when every position before it
    /// is written too (the next drain reaches it), `Some(true)` when one
    /// before it is still being written. A read-only look: nothing is popped
    /// and the doorbell is not touched, so any process of the owner loop may
    /// call it without disturbing the parked driver (issue 12).
    pub(crate) fn find_submit(&self, handle: NonZeroU64) -> Option<bool> {
        self.shared.ring.find_written(
            &self.key,
            |r| matches!(r, HandIn::Submit { handle: h, .. } if *h == handle),
        )
    }

    /// Whether a cancel of one of `handles` is written on the ring but not
    /// drained yet: a read-only look past a position still being written.
    pub(crate) fn holds_cancel_of(&self, mut handles: impl FnMut(NonZeroU64) -> bool) -> bool {
        self.shared
            .ring
            .find_written(&self.key, |r| {
                matches!(r, HandIn::Control { op: ControlOp::Cancel, handle } if handles(*handle))
            })
            .is_some()
    }

    /// Refuses later submits (B-141). Idempotent.
    pub(crate) fn close(&mut self) {
        if self.close_pos.is_none() {
            self.close_pos = Some(self.shared.ring.close());
        }
    }

    /// Whether close ran and every submit that reserved before it has been
    /// popped (B-143: the driver may finish only then).
    pub(crate) fn submits_drained(&self) -> bool {
        self.close_pos.is_some_and(|pos| self.key.head() >= pos)
    }

    /// Refuses every later hand-in: controls answer `Inval` (B-143).
    pub(crate) fn finish(&mut self) {
        self.close();
        self.shared.ring.finish();
    }
}
