//! Cross-loop admission: [`Remote`] (`xtc_batch_submit_mt`, `_cancel_mt`,
//! `_resume_mt`) and the driver's side of the ring, [`MtState`]
//! (B-106..B-127, B-140..B-146).
//!
//! # Path of a hand-in
//!
//! 1. Any thread: [`Remote::submit`] claims a SUBMIT record, stamps a handle
//!    from the group's one handle space, pushes the record on the lock-free
//!    ring and returns the handle (B-116, B-121); the push rings the doorbell
//!    if the driver is parked (a cross-thread wake of the owner loop).
//! 2. Driver, at its next iteration boundary: [`MtState::drain`] pops the
//!    ring in reservation order. A submit goes to the core's `hand_in`: it
//!    gets a waiting slot if one is free and nothing is held, else it is held
//!    in arrival order and takes the next freed slot before any later
//!    submission; meanwhile an owner-loop submit answers `Again` (B-117,
//!    B-118). A cancel or resume goes to the core wherever the request is
//!    (held, waiting, active; a cancel of an in-flight member is recorded and
//!    consumed at the completion boundary, B-122); for a completed handle the
//!    core says `Inval` and the control is dropped: nothing is kept (B-123).
//!    The driver also drains during an operation wait (so a hint fires) and
//!    at the operation's completion boundary, before collect
//!    ([`drain_at_completion`]): a cancel accepted while the operation was
//!    outstanding is never lost to the operation finishing first. A submit
//!    popped there is set aside ([`MtState::drain_deferring`]) and handed in
//!    first at the next boundary: until then it is, for everyone else, still
//!    on the ring (no slot, not `queued`, not `mt_queued`; an owner cancel
//!    finds it), as B-117 says of every hand-in.
//!
//! Only the driver (and, after it, the finalizer) drains: a drain disarms
//! the doorbell the parked driver armed, so an owner-loop cancel of a handle
//! still on the ring is a read-only look plus a note for the drain
//! ([`MtState::owner_cancel`]), never a drain.
//! 3. [`MtState::settle`] returns the SUBMIT record of every drained hand-in
//!    that is no longer held (admitted, or ended `Aborted`), so
//!    `mt_queue_cap` bounds accepted-but-unadmitted hand-ins (B-111) and held
//!    hand-ins never take control records (B-112).
//!
//! # Close and teardown (B-140..B-146)
//!
//! `close` closes the ring to submits at once ([`MtState::close`]); hand-ins
//! that reserved before it are drained and then run (DRAIN) or end `Aborted`
//! (CANCEL). An unexpected driver exit closes it too, in the driver's exit
//! hook ([`close`]): the exit closes the group (B-039), so a submit_mt after
//! it answers `Again` as an owner-loop submit does, even while the finalizer
//! is still tearing down the in-flight vector. The driver finishes only when [`MtState::may_finish`] (every
//! racing hand-in drained), then [`MtState::finish`] makes `cancel_mt` and
//! `resume_mt` answer `Inval`. The ring's memory is reference-counted: a
//! [`Remote`] used after destroy gets `Again`/`Inval`, never a freed-memory
//! access (stronger than B-144's caller obligation, which still describes
//! when calls are meaningful).
#![deny(unsafe_code)]

use std::collections::VecDeque;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::task::Waker;

use std::cell::RefCell;

use super::api::GroupState;
use super::group::{Core, Limits};
use super::ring::Pop;
use super::ring::admission::{Admission, ControlOp, HandIn, HandleSpace, Inbox};
use super::{AsyncStats, CloseMode, Handle, HandleAlloc, Item, SubmitError};
use crate::{Error, Result};

/// What the driver's side needs from the group's core (all on the owner loop).
pub(crate) trait Members<R> {
    /// A drained submit: waiting slot or held (never refused, B-118).
    fn hand_in(&mut self, handle: NonZeroU64, request: R, charge: u64);
    /// Records a cancel; `false` if `handle` is not live (completed).
    fn cancel(&mut self, handle: NonZeroU64) -> bool;
    /// Resumes a BLOCKED member; `false` if not live or not resumable.
    fn resume(&mut self, handle: NonZeroU64) -> bool;
    /// Hand-ins currently held for a slot.
    fn held_len(&self) -> usize;
    /// Whether the group was closed with CANCEL.
    fn cancelling(&self) -> bool;
}

fn handle_of(h: NonZeroU64) -> Handle {
    Handle::new(h.get()).expect("nonzero")
}

impl<R> Members<R> for Core<R> {
    fn hand_in(&mut self, handle: NonZeroU64, request: R, charge: u64) {
        Core::hand_in(self, handle_of(handle), charge, request);
    }
    fn cancel(&mut self, handle: NonZeroU64) -> bool {
        Core::cancel(self, handle_of(handle)).is_ok()
    }
    fn resume(&mut self, handle: NonZeroU64) -> bool {
        Core::resume(self, handle_of(handle)).is_ok()
    }
    fn held_len(&self) -> usize {
        Core::held_len(self)
    }
    fn cancelling(&self) -> bool {
        self.closed == Some(CloseMode::Cancel)
    }
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainEnd {
    /// Nothing more on the ring.
    Empty,
    /// The next position is reserved but its producer is still writing.
    Busy,
}

/// The driver's side of cross-loop admission (in the group's shared state).
#[derive(Debug)]
pub(crate) struct MtState<R> {
    inbox: Inbox<R>,
    /// Drained submits whose SUBMIT record is still claimed.
    unreleased: usize,
    resource_capacity: u64,
    /// Hand-ins an owner-loop cancel reached while they were still on the
    /// ring (B-052): the drain cancels each as it hands it in. Every entry
    /// is a distinct undrained SUBMIT record, so at most `mt_queue_cap`
    /// (allocated at create, never grown).
    precancelled: Vec<NonZeroU64>,
    /// Submits popped during an operation wait, in ring order, handed in at
    /// the next boundary (B-117). Each holds a SUBMIT record, so at most
    /// `mt_queue_cap` (allocated at create, never grown).
    deferred: VecDeque<Deferred<R>>,
    /// Submit hand-ins handed into the group so far (`mt_queued`).
    handed_in: u64,
}

/// A submit popped from the ring during an operation wait, not handed in yet.
#[derive(Debug)]
struct Deferred<R> {
    handle: NonZeroU64,
    request: R,
    charge: u64,
}

impl<R> MtState<R> {
    /// Bytes charged for the ring, both record pools, the owner-cancel list
    /// and the deferred submits (B-109); the held queue is part of the
    /// core's storage.
    ///
    /// # Errors
    /// `Range` on arithmetic overflow.
    pub(crate) fn bytes_for(cap: usize) -> Result<u64> {
        let per_record = size_of::<NonZeroU64>() as u64 + size_of::<Deferred<R>>() as u64;
        let lists = (cap as u64).checked_mul(per_record).ok_or(Error::Range)?;
        Admission::<R>::bytes_for(cap)?
            .checked_add(lists)
            .ok_or(Error::Range)
    }

    /// Admission with `cap` records per pool, stamping from `handles`.
    ///
    /// # Errors
    /// `Inval` for `cap == 0`; `Range` on size overflow.
    pub(crate) fn new(
        cap: usize,
        handles: Arc<HandleSpace>,
        resource_capacity: u64,
    ) -> Result<Self> {
        let (_, inbox) = Admission::new(cap, handles)?;
        let mut precancelled = Vec::new();
        precancelled
            .try_reserve_exact(cap)
            .map_err(|_| Error::Nomem)?;
        let mut deferred = VecDeque::new();
        deferred.try_reserve_exact(cap).map_err(|_| Error::Nomem)?;
        Ok(MtState {
            inbox,
            unreleased: 0,
            resource_capacity,
            precancelled,
            deferred,
            handed_in: 0,
        })
    }

    /// A producer handle onto this ring.
    pub(crate) fn remote(&self) -> Remote<R> {
        Remote {
            shared: self.inbox.shared().clone(),
            resource_capacity: self.resource_capacity,
        }
    }

    /// The boundary's drain: hands in the submits set aside during the
    /// operation wait, then pops everything ready, in reservation order, into
    /// `m` (B-117, B-122).
    ///
    /// The driver's alone (its boundary) and the finalizer's after the driver
    /// ended: it disarms the doorbell, which only the process that parks on
    /// it may do (issue 12).
    pub(crate) fn drain(&mut self, m: &mut impl Members<R>) -> DrainEnd {
        while let Some(d) = self.deferred.pop_front() {
            self.hand_in(m, d.handle, d.request, d.charge);
        }
        self.pop_ring(m, false)
    }

    /// The drain of an operation wait and of its completion boundary: pops
    /// everything ready so that cancels and resumes reach the core (a cancel
    /// of an in-flight member is recorded, so its hint fires, B-094), but
    /// sets every submit aside for the next boundary's [`drain`]: a waiting
    /// slot is made only at an iteration boundary (B-117), so an owner
    /// submit meanwhile sees the slots as if the hand-in were still on the
    /// ring. A control for a set-aside submit applies to it as the boundary
    /// would: a cancel is noted (it ends `Aborted` and never runs), a resume
    /// is dropped (a waiting request is not resumable).
    ///
    /// The driver's alone, as [`drain`].
    ///
    /// [`drain`]: MtState::drain
    pub(crate) fn drain_deferring(&mut self, m: &mut impl Members<R>) -> DrainEnd {
        self.pop_ring(m, true)
    }

    fn pop_ring(&mut self, m: &mut impl Members<R>, defer: bool) -> DrainEnd {
        self.inbox.disarm();
        loop {
            match self.inbox.pop() {
                Pop::Item(HandIn::Submit {
                    handle,
                    request,
                    charge,
                }) => {
                    self.unreleased += 1;
                    if defer {
                        debug_assert!(self.deferred.len() < self.deferred.capacity());
                        self.deferred.push_back(Deferred {
                            handle,
                            request,
                            charge,
                        });
                    } else {
                        self.hand_in(m, handle, request, charge);
                    }
                }
                Pop::Item(HandIn::Control { op, handle }) if self.is_deferred(handle) => {
                    if op == ControlOp::Cancel {
                        self.note_precancel(handle);
                    }
                }
                Pop::Item(HandIn::Control { op, handle }) => {
                    // `false`: completed (or not resumable): dropped (B-123).
                    let _live = match op {
                        ControlOp::Cancel => m.cancel(handle),
                        ControlOp::Resume => m.resume(handle),
                    };
                }
                Pop::Empty => return DrainEnd::Empty,
                Pop::Busy => return DrainEnd::Busy,
            }
        }
    }

    /// A drained submit enters the group: a waiting slot or held (B-118).
    fn hand_in(&mut self, m: &mut impl Members<R>, handle: NonZeroU64, request: R, charge: u64) {
        self.handed_in = self.handed_in.saturating_add(1);
        m.hand_in(handle, request, charge);
        let owner_cancelled = self.take_precancel(handle);
        if owner_cancelled || m.cancelling() {
            // An owner cancel or a cancel_mt while it was on the ring (or set
            // aside, B-052, B-122), or close(CANCEL) (B-142): it ends
            // Aborted, never runs.
            m.cancel(handle);
        }
    }

    /// Whether `handle` is a submit set aside during an operation wait.
    fn is_deferred(&self, handle: NonZeroU64) -> bool {
        self.deferred.iter().any(|d| d.handle == handle)
    }

    /// Notes a cancel for a hand-in not handed in yet (on the ring or set
    /// aside); harmless twice.
    fn note_precancel(&mut self, handle: NonZeroU64) {
        if !self.precancelled.contains(&handle) {
            debug_assert!(self.precancelled.len() < self.precancelled.capacity());
            self.precancelled.push(handle);
        }
    }

    /// Returns the SUBMIT records of drained hand-ins no longer held.
    pub(crate) fn settle(&mut self, m: &impl Members<R>) {
        // Held and set-aside hand-ins keep their records (B-111).
        let kept = m.held_len() + self.deferred.len();
        let gone = self.unreleased.saturating_sub(kept);
        self.inbox.release_submits(gone);
        self.unreleased -= gone;
    }

    /// Whether an owner cancel reached `handle` on the ring; forgets it.
    fn take_precancel(&mut self, handle: NonZeroU64) -> bool {
        match self.precancelled.iter().position(|h| *h == handle) {
            Some(i) => {
                self.precancelled.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Owner-loop cancel of a handle the core does not know (B-052, B-053):
    /// if it is an mt hand-in still on the ring, records the cancel for the
    /// drain that hands it in (it then ends `Aborted` and never runs).
    ///
    /// A read-only look at the ring: it drains nothing, so no waiting slot is
    /// made outside the driver's boundary (B-117: a later owner submit sees
    /// the slots as without the cancel), and it never touches the doorbell
    /// the parked driver armed (a stale handle must not wedge later
    /// hand-ins, issue 12).
    ///
    /// # Errors
    /// `Again` when its hand-in is written on the ring behind a position still
    /// being written (retry); `Inval` when it is not live (never issued,
    /// completed), even while some other hand-in is being written.
    pub(crate) fn owner_cancel(&mut self, handle: NonZeroU64) -> Result<()> {
        if !self.inbox.shared().handles().is_issued(handle) {
            return Err(Error::Inval);
        }
        if self.is_deferred(handle) {
            self.note_precancel(handle); // set aside during a wait: as on the ring
            return Ok(());
        }
        match self.inbox.find_submit(handle) {
            // Behind a hand-in still being written: retry (B-053).
            Some(true) => Err(Error::Again),
            Some(false) => {
                self.note_precancel(handle);
                Ok(())
            }
            // Completed (or an issued number whose push lost a close race):
            // stale, even while a later hand-in is being written (B-050).
            None => Err(Error::Inval),
        }
    }

    /// Whether a cancel of one of `handles` is written on the ring behind a
    /// position still being written (the drain stopped before it).
    fn cancel_stuck(&self, handles: impl FnMut(NonZeroU64) -> bool) -> bool {
        self.inbox.holds_cancel_of(handles)
    }

    /// Refuses later submits (B-141). Idempotent.
    pub(crate) fn close(&mut self) {
        self.inbox.close();
    }

    /// Whether every submit that raced close has been drained and handed in
    /// (B-143).
    pub(crate) fn may_finish(&self) -> bool {
        self.deferred.is_empty() && self.inbox.submits_drained()
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

    /// Submit hand-ins handed into the group so far (`mt_queued`): one set
    /// aside during an operation wait counts at the boundary that hands it in.
    pub(crate) fn mt_queued(&self) -> u64 {
        self.handed_in
    }

    /// Refused mt calls so far (`mt_rejections`).
    pub(crate) fn mt_rejections(&self) -> u64 {
        self.inbox.shared().rejections()
    }
}

/// Cross-loop admission to a [`Group`](super::Group): `xtc_batch_submit_mt`,
/// `xtc_batch_cancel_mt`, `xtc_batch_resume_mt` (B-106..B-127).
///
/// Made by [`Group::remote`](super::Group::remote) on an asynchronous group
/// created with `mt_queue_cap > 0`. `Send + Sync + Clone` when `R: Send`:
/// callable from any loop or plain OS thread. The calls never block and
/// allocate nothing: each claims a preallocated record, stamps, and pushes on
/// a lock-free ring (B-110, B-113).
///
/// # Retrying on `Again`
///
/// There is no blocking submit (B-113). On `Again` back off and retry: a
/// process of a loop yields ([`rt::yield_now`](crate::rt::yield_now)) or
/// sleeps ([`rt::sleep`](crate::rt::sleep)); a plain thread yields its CPU
/// ([`std::thread::yield_now`]) or sleeps. The ring empties at the driver's
/// next iteration boundary and records return as hand-ins are admitted, so
/// sleeps that start at tens of microseconds and grow (e.g. 20 µs doubling
/// to 1 ms) avoid burning a core (B-114, B-115).
///
/// # Results on the submitter's loop
///
/// Completion still runs the group's `complete` callback on the driver loop
/// (B-125). A submitter that wants the result on its own loop puts the
/// [`rt::Promise`](crate::rt::Promise) half of an
/// [`rt::future_pair`](crate::rt::future_pair) in the request; `complete`
/// sets it and the submitter awaits the future (B-126; see
/// `examples/cross_loop.rs`).
///
/// # Examples
///
/// ```
/// use xtc::batch::{AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Item, StepResult};
/// use xtc::rt::Loop;
///
/// struct Done;
/// impl AsyncStep<u64> for Done {
///     async fn submit(&mut self, _: &mut [Item<'_, u64>]) -> xtc::Result<Exec> {
///         Ok(Exec::Inline)
///     }
///     async fn collect(
///         &mut self,
///         _: &mut [Item<'_, u64>],
///         results: &mut [StepResult],
///         _: ExecStatus,
///     ) -> xtc::Result<()> {
///         results.fill(StepResult::Done);
///         Ok(())
///     }
/// }
///
/// let lp = Loop::new()?;
/// let opts = AsyncOpts { capacity: 4, max_active: 4, resource_capacity: 4, mt_queue_cap: 8, ..Default::default() };
/// let group = Group::create_async(&lp, opts, Done, |_h, _r: u64, out: xtc::Result<()>| assert!(out.is_ok()))?;
/// let remote = group.remote()?;
/// // From a plain thread: the handle comes back before admission.
/// let h = std::thread::spawn(move || remote.submit(42, 1).map_err(|e| e.error)).join().unwrap()?;
/// group.close(CloseMode::Drain)?; // the hand-in raced nothing: it still runs
/// lp.run()?;
/// assert_eq!(group.stats().completed, 1);
/// assert!(h.get() > 0);
/// group.destroy()?;
/// # Ok::<(), xtc::Error>(())
/// ```
pub struct Remote<R> {
    shared: Arc<Admission<R>>,
    resource_capacity: u64,
}

impl<R> Clone for Remote<R> {
    fn clone(&self) -> Self {
        Remote {
            shared: self.shared.clone(),
            resource_capacity: self.resource_capacity,
        }
    }
}

impl<R> std::fmt::Debug for Remote<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("mt_rejections", &self.shared.rejections())
            .finish_non_exhaustive()
    }
}

impl<R> Remote<R> {
    /// `xtc_batch_submit_mt`: hands `request` with a fixed `charge` to the
    /// driver and returns its handle at once, before admission (B-116). The
    /// handle is returned only once the record is on the ring, so a cancel
    /// or resume for it is always drained after it (B-121). Every `Ok` is
    /// followed by exactly one completion (B-119).
    ///
    /// # Errors
    /// The request comes back in [`SubmitError`] with: `Range` for a charge
    /// outside `1..=resource_capacity` or an exhausted handle space (B-120);
    /// `Again` when every SUBMIT record is in use (the ring is full) or the
    /// group was closed (B-110, B-141); then no handle was issued. Every
    /// refused submit (`Range` or `Again`) counts in `mt_rejections`, never in
    /// the owner-loop `rejections` (B-177). See the type's doc for retrying.
    pub fn submit(&self, request: R, charge: u64) -> Result<Handle, SubmitError<R>> {
        if charge == 0 || charge > self.resource_capacity {
            self.shared.count_rejection(); // refused mt calls count apart (B-177)
            return Err(SubmitError {
                error: Error::Range,
                request,
            });
        }
        match self.shared.submit(request, charge) {
            Ok(h) => Ok(handle_of(h)),
            Err((error, request)) => Err(SubmitError { error, request }),
        }
    }

    /// `xtc_batch_cancel_mt`: cancels the request of `h` wherever it is
    /// (held, waiting: it never runs; active; in flight: consumed at its
    /// completion boundary), drained after the submit that issued `h`
    /// (B-121, B-122). For a completed handle it is discarded at no cost
    /// (B-123).
    ///
    /// # Errors
    /// `Again` while every control record is in use (counted in
    /// `mt_rejections`; retry); `Inval` for a handle this group never
    /// issued, or once the driver has finished (B-143).
    pub fn cancel(&self, h: Handle) -> Result<()> {
        self.control(ControlOp::Cancel, h)
    }

    /// `xtc_batch_resume_mt`: resumes the request of `h` if it is BLOCKED
    /// when the driver drains it (otherwise it is discarded, as for a
    /// completed handle). Errors as [`Remote::cancel`].
    pub fn resume(&self, h: Handle) -> Result<()> {
        self.control(ControlOp::Resume, h)
    }

    fn control(&self, op: ControlOp, h: Handle) -> Result<()> {
        let handle = NonZeroU64::new(h.get()).expect("handles are nonzero");
        self.shared.control(op, handle)
    }
}

// ---- Hooks called by the group (api.rs) and the driver (driver.rs). Each is
// a no-op for a group without cross-loop admission.

/// Bytes to charge at create for cross-loop admission (0 when disabled).
pub(crate) fn bytes_for<R>(l: &Limits) -> Result<u64> {
    match l.mt_queue_cap {
        0 => Ok(0),
        cap => MtState::<R>::bytes_for(cap),
    }
}

/// The ring's consumer side for a group with `mt_queue_cap > 0`.
pub(crate) fn create<R>(l: &Limits, handles: &HandleAlloc) -> Result<Option<RefCell<MtState<R>>>> {
    if l.mt_queue_cap == 0 {
        return Ok(None);
    }
    let mt = MtState::new(l.mt_queue_cap, handles.space().clone(), l.resource_capacity)?;
    Ok(Some(RefCell::new(mt)))
}

/// Boundary, first step: drain the ring into the core (B-117).
pub(crate) fn drain<R>(sh: &GroupState<R>) {
    if let Some(mt) = &sh.mt {
        mt.borrow_mut().drain(&mut *sh.core.borrow_mut());
    }
}

/// Boundary, last step: return records of hand-ins no longer held (B-111).
pub(crate) fn settle<R>(sh: &GroupState<R>) {
    if let Some(mt) = &sh.mt {
        mt.borrow_mut().settle(&*sh.core.borrow());
    }
}

/// Owner-loop cancel of a handle the core does not know (B-052, B-053).
pub(crate) fn owner_cancel<R>(sh: &GroupState<R>, h: Handle) -> Result<()> {
    let mt = sh.mt.as_ref().ok_or(Error::Inval)?;
    let handle = NonZeroU64::new(h.get()).expect("handles are nonzero");
    mt.borrow_mut().owner_cancel(handle)
}

/// The driver's completion boundary, ring part (B-093, B-121, B-122): after
/// an operation's wait ended and before its collect, drains the ring so a
/// cancel_mt accepted while the operation was outstanding is recorded, and
/// consumed at this completion, even when the operation finished before
/// the driver looked at the ring. Returns `true` when a cancel of one of
/// `in_flight` is written behind a position still being written (the caller
/// yields and drains again: a producer never pauses mid-write).
pub(crate) fn drain_at_completion<R>(sh: &GroupState<R>, in_flight: &[Item<'_, R>]) -> bool {
    let Some(mt) = &sh.mt else {
        return false;
    };
    let mut mt = mt.borrow_mut();
    match mt.drain_deferring(&mut *sh.core.borrow_mut()) {
        DrainEnd::Empty => false,
        DrainEnd::Busy => {
            mt.cancel_stuck(|h| in_flight.iter().any(|it| it.handle.get() == h.get()))
        }
    }
}

/// `close` (either mode): the ring refuses submits from now on (B-141).
pub(crate) fn close<R>(sh: &GroupState<R>) {
    if let Some(mt) = &sh.mt {
        mt.borrow_mut().close();
    }
}

/// Whether every hand-in that raced close has been drained (B-143).
pub(crate) fn may_finish<R>(sh: &GroupState<R>) -> bool {
    sh.mt.as_ref().is_none_or(|mt| mt.borrow().may_finish())
}

/// The driver finished: controls answer `Inval` (B-143).
pub(crate) fn finish<R>(sh: &GroupState<R>) {
    if let Some(mt) = &sh.mt {
        mt.borrow_mut().finish();
    }
}

/// Before the driver parks: arm the doorbell; `true` if a hand-in is ready.
pub(crate) fn arm<R>(sh: &GroupState<R>, waker: &Waker) -> bool {
    sh.mt.as_ref().is_some_and(|mt| mt.borrow().arm(waker))
}

/// During an operation wait: arms the doorbell with the wait's `waker`; if
/// hand-ins are ready, drains them (a cancel_mt of an in-flight member is
/// recorded at once, so its hint fires, B-094; a submit is set aside for the
/// next boundary, B-117) and re-arms. Returns `true` when the drain recorded
/// a cancel (the wait then fires hints).
pub(crate) fn drain_while_waiting<R>(sh: &GroupState<R>, waker: &Waker) -> bool {
    if !arm(sh, waker) {
        return false;
    }
    let seq = sh.core.borrow().cancel_seq;
    if let Some(mt) = &sh.mt {
        mt.borrow_mut().drain_deferring(&mut *sh.core.borrow_mut());
    }
    if arm(sh, waker) {
        waker.wake_by_ref(); // more landed meanwhile: poll again
    }
    sh.core.borrow().cancel_seq != seq
}

/// After an unexpected driver exit: close the ring and drain every hand-in
/// that reserved before, so each gets its one completion (B-119). A producer
/// still writing is waited for by yielding (it never blocks mid-write).
pub(crate) async fn drain_for_exit<R>(sh: &GroupState<R>) {
    let Some(mt) = &sh.mt else {
        return;
    };
    mt.borrow_mut().close();
    loop {
        {
            let mut mt = mt.borrow_mut();
            mt.drain(&mut *sh.core.borrow_mut());
            if mt.may_finish() {
                return;
            }
        }
        crate::rt::yield_now().await;
    }
}

/// `mt_queued` and `mt_rejections` of the async statistics (B-104).
pub(crate) fn add_stats<R>(sh: &GroupState<R>, a: &mut AsyncStats) {
    if let Some(mt) = &sh.mt {
        let mt = mt.borrow();
        a.mt_queued = mt.mt_queued();
        a.mt_rejections = mt.mt_rejections();
    }
}

#[cfg(test)]
mod tests;
