//! Cross-loop admission on the group's side: the driver's view of the ring
//! ([`MtState`]: drain at the iteration boundary, held hand-ins, controls
//! applied wherever the request is) (B-106..B-123, B-140..B-143).
//!
//! The group's core offers [`Members`] (free slot? admit; cancel; resume);
//! everything specific to hand-ins lives here, so the group and driver only
//! call [`MtState::boundary`] at each iteration boundary, complete what
//! [`MtState::take_aborted`] hands back, and consult [`MtState::any_held`]
//! (owner submit `Again`), [`MtState::owner_cancel`] (a live mt handle not
//! admitted yet), [`MtState::may_finish`] (close ordering) and
//! [`MtState::arm`] (park).
//!
//! # Held hand-ins (B-111, B-118)
//!
//! A drained submit joins `held` (arrival = ring order). At each boundary the
//! head of `held` is admitted while the group has a free slot, so a held
//! hand-in takes the next freed slot before any later submission: the owner
//! loop's submit answers `Again` while anything is held. Its SUBMIT record is
//! returned to the pool when it is admitted or ends, so `held` never grows
//! past `mt_queue_cap` (its storage is preallocated at create). A hand-in is
//! never rejected once its handle was issued: it is admitted, or it ends
//! `Aborted` (cancelled while held, or by `close(CANCEL)`), exactly once.
#![deny(unsafe_code)]

use std::collections::VecDeque;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::task::Waker;

use super::ring::Pop;
use super::ring::admission::{Admission, ControlOp, HandIn, HandleSpace, Inbox};
use crate::{Error, Result};

/// What the group's core offers the cross-loop glue (all on the owner loop).
pub(crate) trait Members<R> {
    /// Whether a new waiting slot can be created now (capacity).
    fn has_free_slot(&self) -> bool;
    /// Creates the waiting slot of a drained hand-in at the FCFS tail. Called
    /// only when [`has_free_slot`](Members::has_free_slot) said so; never
    /// refused (close does not apply: the handle was issued before close).
    fn admit(&mut self, handle: NonZeroU64, request: R, charge: u64);
    /// Records a cancel for a live request; `false` if `handle` is not live
    /// (it completed: the control is discarded, B-123).
    fn cancel(&mut self, handle: NonZeroU64) -> bool;
    /// Resumes a live BLOCKED request (a no-op for other live states);
    /// `false` if `handle` is not live.
    fn resume(&mut self, handle: NonZeroU64) -> bool;
}

/// A hand-in drained from the ring and not yet admitted.
#[derive(Debug)]
struct Held<R> {
    handle: NonZeroU64,
    request: R,
    charge: u64,
    cancelled: bool,
}

/// How the last drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainEnd {
    /// Nothing more on the ring.
    Empty,
    /// The next position is reserved but its producer is still writing.
    Busy,
}

/// The driver's side of cross-loop admission (owned by the group core).
#[derive(Debug)]
pub(crate) struct MtState<R> {
    inbox: Inbox<R>,
    held: VecDeque<Held<R>>,
    /// After `close(CANCEL)`: every hand-in drained from now on ends `Aborted`.
    cancel_all: bool,
}

impl<R> MtState<R> {
    /// Bytes charged for a `cap`-record admission: the ring, the two pools
    /// and the preallocated `held` queue (B-109).
    ///
    /// # Errors
    /// `Range` on arithmetic overflow.
    pub(crate) fn bytes_for(cap: usize) -> Result<u64> {
        let held = (cap as u64)
            .checked_mul(std::mem::size_of::<Held<R>>() as u64)
            .ok_or(Error::Range)?;
        Admission::<R>::bytes_for(cap)?
            .checked_add(held)
            .ok_or(Error::Range)
    }

    /// Cross-loop admission with `cap` records per pool, stamping handles from
    /// the group's `handles`. The caller charges [`bytes_for`](Self::bytes_for)
    /// first.
    ///
    /// # Errors
    /// `Inval` for `cap == 0`; `Range` on size overflow.
    pub(crate) fn new(cap: usize, handles: Arc<HandleSpace>) -> Result<MtState<R>> {
        let (_, inbox) = Admission::new(cap, handles)?;
        Ok(MtState {
            inbox,
            held: VecDeque::with_capacity(cap),
            cancel_all: false,
        })
    }

    /// The shared half, for [`Remote`](super::Remote) handles.
    pub(crate) fn shared(&self) -> &Arc<Admission<R>> {
        self.inbox.shared()
    }

    /// Drains the ring in reservation order (submits join `held`, controls
    /// apply wherever their request is), then admits held hand-ins in arrival
    /// order while `m` has free slots (B-117, B-118, B-122).
    pub(crate) fn boundary(&mut self, m: &mut impl Members<R>) -> DrainEnd {
        self.inbox.disarm();
        let end = self.drain(m);
        while m.has_free_slot() {
            // Cancelled ones need no slot: take_aborted completes them.
            let Some(pos) = self.held.iter().position(|h| !h.cancelled) else {
                break;
            };
            let h = self.held.remove(pos).expect("position found");
            self.inbox.release_submit();
            m.admit(h.handle, h.request, h.charge);
        }
        end
    }

    /// Pops everything on the ring into `held` / onto the members.
    fn drain(&mut self, m: &mut impl Members<R>) -> DrainEnd {
        loop {
            match self.inbox.pop() {
                Pop::Item(HandIn::Submit {
                    handle,
                    request,
                    charge,
                }) => self.held.push_back(Held {
                    handle,
                    request,
                    charge,
                    cancelled: self.cancel_all,
                }),
                Pop::Item(HandIn::Control { op, handle }) => self.apply(op, handle, m),
                Pop::Empty => return DrainEnd::Empty,
                Pop::Busy => return DrainEnd::Busy,
            }
        }
    }

    /// Applies a control: to a held hand-in (cancel marks it; resume of a
    /// not-yet-admitted request changes nothing), else to the live member,
    /// else it is discarded (the request completed; B-123).
    fn apply(&mut self, op: ControlOp, handle: NonZeroU64, m: &mut impl Members<R>) {
        if let Some(h) = self.held.iter_mut().find(|h| h.handle == handle) {
            h.cancelled |= op == ControlOp::Cancel;
            return;
        }
        let _live = match op {
            ControlOp::Cancel => m.cancel(handle),
            ControlOp::Resume => m.resume(handle),
        };
    }

    /// The next held hand-in that must complete `Aborted` (never ran), with
    /// its SUBMIT record already returned; the driver calls complete for it.
    /// Cancelled hand-ins come back in arrival order.
    pub(crate) fn take_aborted(&mut self) -> Option<(NonZeroU64, R)> {
        let pos = self.held.iter().position(|h| h.cancelled)?;
        let h = self.held.remove(pos).expect("position found");
        self.inbox.release_submit();
        Some((h.handle, h.request))
    }

    /// Whether any hand-in waits for a slot (owner submit answers `Again`).
    pub(crate) fn any_held(&self) -> bool {
        !self.held.is_empty()
    }

    /// Hand-ins held for a slot (counted in `queued`).
    pub(crate) fn held_len(&self) -> usize {
        self.held.len()
    }

    /// Submit hand-ins drained so far (`mt_queued`).
    pub(crate) fn mt_queued(&self) -> u64 {
        self.inbox.submits_popped()
    }

    /// Refused mt calls so far (`mt_rejections`).
    pub(crate) fn mt_rejections(&self) -> u64 {
        self.inbox.shared().rejections()
    }

    /// Owner-loop cancel of `handle` that the group's table does not know:
    /// drains the ring and cancels the hand-in if it is held (B-076).
    ///
    /// # Errors
    /// `Again` when the handle was not found and an earlier position is still
    /// being written by its producer (retry); `Inval` when it is not a live
    /// hand-in (never issued, or completed).
    pub(crate) fn owner_cancel(
        &mut self,
        handle: NonZeroU64,
        m: &mut impl Members<R>,
    ) -> Result<()> {
        if !self.inbox.shared().handles().is_issued(handle) {
            return Err(Error::Inval);
        }
        let end = self.drain(m);
        if let Some(h) = self.held.iter_mut().find(|h| h.handle == handle) {
            h.cancelled = true;
            return Ok(());
        }
        match end {
            DrainEnd::Busy => Err(Error::Again),
            DrainEnd::Empty => Err(Error::Inval),
        }
    }

    /// `close`: refuses later submits (B-141); `cancel` also ends every held
    /// and later-drained hand-in `Aborted` (B-142).
    pub(crate) fn close(&mut self, cancel: bool) {
        self.inbox.close();
        if cancel {
            self.cancel_all = true;
            for h in &mut self.held {
                h.cancelled = true;
            }
        }
    }

    /// Whether the driver may finish as far as hand-ins go: closed, every
    /// submit that raced close drained, nothing held (B-143).
    pub(crate) fn may_finish(&self) -> bool {
        self.inbox.submits_drained() && self.held.is_empty()
    }

    /// The driver has finished: later `cancel_mt`/`resume_mt` get `Inval`.
    pub(crate) fn finish(&mut self) {
        self.inbox.finish();
    }

    /// Arms the doorbell before the driver parks; `true` when a hand-in is
    /// already ready (do not park).
    pub(crate) fn arm(&self, waker: &Waker) -> bool {
        self.inbox.arm(waker)
    }
}

#[cfg(test)]
mod tests;
