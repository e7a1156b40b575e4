//! `batch`: bounded continuous batching, the manual page `xtc_batch(3)`.
//!
//! The clause ids (B-xxx) below are that page's sentences; the C form of
//! each item (`xtc_batch_create`, `xtc_batch_t`, ...) is documented in
//! `docs/man/xtc_batch.3` (the `xtc-capi` crate wraps this module).
//!
//! A [`Group`] owns a pinned driver process on one [`rt::Loop`] (B-001).
//! Requests are admitted first-come-first-served under a fixed resource
//! charge; every iteration hands the whole ready vector to ONE call: a
//! [`Step`] for a synchronous group, or an [`AsyncStep`]'s submit / collect
//! pair around one awaited operation for an asynchronous group. Finished
//! members leave and waiting members refill at the next boundary (B-003).
//!
//! # What the group owns
//! - every accepted request `R`, from `submit` until it is handed back by
//!   value to [`Complete::complete`] (a failed submit hands it back in
//!   [`SubmitError`]);
//! - `capacity` slots (waiting + active + recorded-but-undelivered members),
//!   `max_active` active places and `resource_capacity` units, all storage
//!   allocated and charged to the loop's [`rt::Budget`] before the driver is
//!   published (B-017);
//! - a handle allocator (`HandleAlloc`, a shared, checked, never-wrapping
//!   counter the cross-loop ring stamps from too, B-027, B-028) over the
//!   group's own range of the 64-bit space: tag (high 32 bits, one per
//!   group) and counter (low 32 bits), so groups never share a handle (B-029);
//! - two processes on the loop: the **driver** (runs iterations) and its
//!   **finalizer** (parked until the driver ends; if the driver was killed it
//!   runs the teardown callbacks). Destroy waits until both are gone from the
//!   process table (B-147, B-148).
//!
//! # Member state machine
//! ```text
//!  submit ─► WAITING ──admit (FCFS, charge fits)──► READY ◄──resume── BLOCKED
//!   (held ─► WAITING for ring hand-ins)               │  ▲                ▲
//!                                                     ▼  │ CONTINUE       │ BLOCKED
//!                                                 IN_FLIGHT (step / op + collect)
//!                                                     │ DONE / ERROR / UNSET / cancel
//!                                                     ▼
//!                          TERMINAL (outcome recorded, charge released)
//!                                                     │ completion invoked (recorded first)
//!                                                     ▼
//!                                            gone: handle stale (Inval)
//! ```
//! A cancel sets a flag; at the next boundary a cancelled WAITING, READY or
//! BLOCKED member goes straight to TERMINAL(`Aborted`); an IN_FLIGHT one
//! (asynchronous groups only: during a synchronous step every mutator is
//! `Deadlk`) gets its `cancel_hint`, goes through collect, then ends `Aborted`.
//!
//! # Invariants
//! - waiting + active + terminal ≤ `capacity`; active ≤ `max_active`;
//!   reserved units ≤ `resource_capacity` (B-019..B-023);
//! - admission is strict FCFS: the front of the queue blocks younger requests
//!   (B-021);
//! - exactly one completion per accepted submit: the invocation is recorded
//!   (`Core::pop_delivery`) before user code runs, so the finalizer of a killed
//!   driver retires an interrupted delivery instead of repeating it (B-039);
//! - a member is never in a vector after its cancel was recorded (B-048), and
//!   never resubmitted while its previous operation may still run (B-087).
//!
//! # Who may touch what
//! - the core (`group::Core`) sits in a `RefCell` shared by the [`Group`]
//!   handles, the driver and the finalizer; nobody holds the borrow across an
//!   await, so [`Group::stats`] always reads committed state (B-043);
//! - a callback counter in the core makes every mutator return `Deadlk` while
//!   any callback of the group is in flight, from any process (B-041);
//! - mutators run from a process of the owner loop, or from outside every
//!   loop during setup before the owner's first run; a process of any other
//!   loop gets `Inval`, before the owner's first run too (B-128, B-130);
//! - the driver alone moves members between lists; mutators only record
//!   (cancel flag, close mode) or move BLOCKED → READY (resume), then signal
//!   the driver's boundary.
//!
//! The iteration boundary (`driver::Driver::boundary`) is the one place where
//! a cross-loop ring is drained (then cancels consumed, outcomes delivered,
//! waiting members admitted).
//!
//! There is no hidden thread, periodic wake, clock read outside the loop's
//! clock, or unseeded randomness in the engine (B-155).

mod api;
mod driver;
mod engine;
pub(crate) mod group;
pub mod placement;
pub mod router;
mod step;

// Cross-loop admission (issue 8): the lock-free ring, its pools, the loom
// facade, and the group-side glue with `Remote`.
mod remote;
#[doc(hidden)]
pub mod ring; // public only for benches/ring.rs (bench_support)
mod sync_facade;

pub use api::Group;
pub use placement::{LoopNodes, loop_for, loop_for_device, place};
pub use remote::Remote;
pub use router::Router;
pub use step::{AsyncStep, Complete, Exec, ExecStatus, Item, Step, StepFn, StepResult, step_fn};

use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::Error;
use crate::rt;

/// A request's identity within its group: nonzero, issued monotonically,
/// never reused and never wrapping (B-027, B-028). Not transferable between
/// groups (B-029): the high 32 bits are the issuing group's tag and a group
/// never issues past its own range (`Range` instead), so handle spaces of
/// different groups are disjoint and a foreign handle is `Inval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Handle(NonZeroU64);

impl Handle {
    /// The handle's `uint64_t` value.
    pub fn get(self) -> u64 {
        self.0.get()
    }

    /// A handle from its value; `None` for 0.
    pub fn new(v: u64) -> Option<Handle> {
        NonZeroU64::new(v).map(Handle)
    }
}

impl std::fmt::Display for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Low bits of a handle: the per-group counter (`1..=2^32 - 1`).
const COUNTER_BITS: u32 = 32;
const COUNTER_MASK: u64 = (1 << COUNTER_BITS) - 1;
/// High bits: the group tag. Groups get tags `0..TEST_TAG` in creation order;
/// the top range (`TEST_TAG`, ending at `u64::MAX`) is never given to a group:
/// it is where [`HandleAlloc::set_last`] lets tests reach `u64::MAX`.
const TEST_TAG: u64 = u64::MAX >> COUNTER_BITS;
static GROUP_TAGS: AtomicU64 = AtomicU64::new(0);

/// Takes the next group tag from `tags`, never wrapping.
///
/// # Errors
/// `Range` once every tag below [`TEST_TAG`] was taken: the handle space of
/// the OS process is exhausted (B-028, B-182).
fn take_tag(tags: &AtomicU64) -> Result<u64, Error> {
    tags.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
        (t < TEST_TAG).then_some(t + 1)
    })
    .map_err(|_| Error::Range)
}

/// The handle range of group `tag`: `tag·2^32 + 1 ..= tag·2^32 + 2^32 - 1`.
fn tag_range(tag: u64) -> (NonZeroU64, NonZeroU64) {
    let base = tag << COUNTER_BITS;
    let first = NonZeroU64::new(base | 1).expect("low bit set");
    let last = NonZeroU64::new(base | COUNTER_MASK).expect("low bits set");
    (first, last)
}

/// The group's handle allocator: shared (the cross-loop ring stamps handles
/// from other threads), checked, never wrapping (B-027, B-028, B-116, B-120).
/// A thin owner-side view of the ring's [`ring::admission::HandleSpace`].
///
/// The 64-bit space is partitioned: a handle is the group's tag (high 32
/// bits) and a per-group counter (low 32 bits, from 1). A group's range ends
/// at counter `2^32 - 1`; issuing past it is `Range`, so a group's handles
/// never enter another group's range and a foreign handle is `Inval` (B-029).
#[derive(Debug, Clone)]
pub(crate) struct HandleAlloc {
    space: Arc<ring::admission::HandleSpace>,
    tag: u64,
}

impl HandleAlloc {
    /// A fresh allocator over a new group tag's range.
    ///
    /// # Errors
    /// `Range` when group tags are exhausted (see [`take_tag`]).
    pub(crate) fn new() -> Result<HandleAlloc, Error> {
        let tag = take_tag(&GROUP_TAGS)?;
        let (first, last) = tag_range(tag);
        Ok(HandleAlloc {
            space: Arc::new(ring::admission::HandleSpace::within(first, last)),
            tag,
        })
    }

    /// Issues the next handle; `Range` once the group's range is exhausted.
    pub(crate) fn alloc(&self) -> Result<Handle, Error> {
        self.space.issue().map(Handle)
    }

    /// The shared space (the cross-loop ring stamps from it too).
    pub(crate) fn space(&self) -> &Arc<ring::admission::HandleSpace> {
        &self.space
    }

    /// Test hook, before the group issued handles in use: the next handle has
    /// the counter of `last + 1`, in this group's own range (a `last` in
    /// another group's range never moves it there; `last`'s counter at the
    /// range end means exhausted). A `last` in the top range moves the group
    /// there instead, so tests see `u64::MAX` issued, then `Range`.
    pub(crate) fn set_last(&self, last: u64) {
        if last >> COUNTER_BITS == TEST_TAG {
            let (first, end) = tag_range(TEST_TAG);
            self.space.rebase(first, end);
            self.space.set_last(last);
        } else {
            self.space
                .set_last(self.tag << COUNTER_BITS | (last & COUNTER_MASK));
        }
    }
}

/// `xtc_batch_close` modes (B-131..B-135). `Cancel` > `Drain`: close may
/// escalate, never downgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CloseMode {
    /// Stop admission; accepted work finishes (BLOCKED members need resume or
    /// cancel).
    Drain,
    /// Stop admission and cancel every nonterminal member.
    Cancel,
}

/// `xtc_batch_stats_t` (B-172..B-178). Gauges: `queued` (waiting for
/// admission, held hand-ins included), `ready` and `blocked` (active members),
/// `reserved_units`. Cumulative counters saturate at `u64::MAX`; terminal
/// counters advance after completion delivery returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Members waiting for admission (and held cross-loop hand-ins).
    pub queued: u64,
    /// Active members that are READY (in flight included).
    pub ready: u64,
    /// Active members that are BLOCKED.
    pub blocked: u64,
    /// Resource units reserved by active members.
    pub reserved_units: u64,
    /// Vector calls (steps, or submits of an async group).
    pub iterations: u64,
    /// Completions delivered with `Ok`.
    pub completed: u64,
    /// Completions delivered with `Aborted`.
    pub cancelled: u64,
    /// Completions delivered with any other error.
    pub failed: u64,
    /// Owner-loop submits that failed after owner/callback validation.
    pub rejections: u64,
    /// Largest ready vector so far.
    pub max_vector: u64,
    /// Sum of ready-vector lengths (occupancy).
    pub total_members: u64,
}

/// `xtc_batch_async_stats_t` (B-104, B-105): zero on a synchronous group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AsyncStats {
    /// Operations launched (submit returned `Ok`).
    pub offloads: u64,
    /// Operations whose wait ended at `exec_timeout`.
    pub offload_timeouts: u64,
    /// Operations that could not be awaited (negative status).
    pub offload_errors: u64,
    /// Cross-loop submit hand-ins the driver has taken into the group at an
    /// iteration boundary so far (cumulative, saturating; a hand-in accepted
    /// but not yet handed in is not counted).
    pub mt_queued: u64,
    /// Cross-loop calls refused (maintained by the ring): every refused
    /// submit_mt (`Again` or `Range`) and every `Again` control (B-177).
    pub mt_rejections: u64,
}

/// A failed submit: the error and the request handed back (B-025).
pub struct SubmitError<R> {
    /// Why the submit failed (`Inval`, `Deadlk`, `Range`, `Again`, `Nosys`).
    pub error: Error,
    /// The request, untouched.
    pub request: R,
}

impl<R> SubmitError<R> {
    /// The request, handed back.
    pub fn into_inner(self) -> R {
        self.request
    }
}

impl<R> std::fmt::Debug for SubmitError<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SubmitError({:?}, ..)", self.error)
    }
}

impl<R> std::fmt::Display for SubmitError<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "submit failed: {}", self.error)
    }
}

impl<R> std::error::Error for SubmitError<R> {}

/// Options of [`Group::create`] (`xtc_batch_opts_t`, B-008..B-014).
#[derive(Debug, Clone, Default)]
pub struct SyncOpts {
    /// Slots: waiting plus active requests; at least `max_active`.
    pub capacity: usize,
    /// Active members at most; positive.
    pub max_active: usize,
    /// Units active members may reserve together; positive.
    pub resource_capacity: u64,
    /// Class of the driver; must belong to the loop and to no other group.
    pub sched_class: Option<rt::SchedClass>,
}

/// Options of [`Group::create_async`] (`xtc_batch_async_opts_t`, B-060).
#[derive(Debug, Clone, Default)]
pub struct AsyncOpts {
    /// Slots: waiting plus active requests; at least `max_active`.
    pub capacity: usize,
    /// Active members at most; positive.
    pub max_active: usize,
    /// Units active members may reserve together; positive.
    pub resource_capacity: u64,
    /// Engine timeout of a FENCE or FUTURE wait; `None` (the page's 0): none.
    /// Negative values are impossible by type.
    pub exec_timeout: Option<Duration>,
    /// Class of the driver; must belong to the loop and to no other group.
    pub sched_class: Option<rt::SchedClass>,
    /// Cross-loop admission ring size; 0 disables the `_mt` calls.
    pub mt_queue_cap: usize,
}

#[cfg(test)]
mod handle_tests {
    use super::*;

    #[test]
    fn a_group_range_ends_in_range_never_in_the_next_group() {
        let a = HandleAlloc::new().unwrap();
        let first = a.alloc().unwrap().get();
        assert_eq!(first & COUNTER_MASK, 1, "counter starts at 1");
        let base = first & !COUNTER_MASK;
        a.set_last(base | (COUNTER_MASK - 1)); // counter 2^32 - 2 issued
        let last = a.alloc().unwrap().get();
        assert_eq!(last, base | COUNTER_MASK, "the range's last handle");
        assert_eq!(a.alloc(), Err(Error::Range), "exhausted: no next range");
        assert_eq!(a.alloc(), Err(Error::Range), "stays exhausted");
        let next_group_first = (last + 1) | 1;
        let space = a.space();
        assert!(space.is_issued(Handle::new(last).unwrap().0));
        assert!(!space.is_issued(NonZeroU64::new(next_group_first).unwrap()));
    }

    #[test]
    fn set_last_in_another_groups_range_stays_in_its_own() {
        let a = HandleAlloc::new().unwrap();
        let b = HandleAlloc::new().unwrap();
        let hb = b.alloc().unwrap().get();
        a.set_last(hb - 1);
        let ha = a.alloc().unwrap().get();
        assert_ne!(ha >> COUNTER_BITS, hb >> COUNTER_BITS);
        assert_eq!(ha >> COUNTER_BITS, a.tag);
        assert!(!b.space().is_issued(NonZeroU64::new(ha).unwrap()));
        assert!(!a.space().is_issued(NonZeroU64::new(hb).unwrap()));
    }

    #[test]
    fn group_tags_never_wrap_and_never_reach_the_test_range() {
        let tags = AtomicU64::new(TEST_TAG - 2);
        assert_eq!(take_tag(&tags), Ok(TEST_TAG - 2));
        assert_eq!(take_tag(&tags), Ok(TEST_TAG - 1));
        assert_eq!(take_tag(&tags), Err(Error::Range));
        assert_eq!(take_tag(&tags), Err(Error::Range), "stays exhausted");
        assert_eq!(tag_range(TEST_TAG).1.get(), u64::MAX);
        assert_eq!(tag_range(0).0.get(), 1, "handles are nonzero");
    }
}
