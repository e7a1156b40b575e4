//! The shared core of every group: slots, the FCFS admission queue, member
//! states, cancel/resume/close state, terminal accounting and statistics.
//!
//! Pure bookkeeping: no loop, no await, no callback. The driver
//! (`driver.rs`) and the public handle (`mod.rs`) call into it while holding
//! the group's `RefCell` borrow and never across an await, so every method
//! sees and leaves committed state (B-043).
//!
//! Where members live (each member is in exactly one place):
//! - `held`: cross-loop hand-ins waiting for a slot (filled by the ring);
//! - `waiting`: WAITING, holds a slot, no units (B-023), FCFS order;
//! - `ready`: active READY members (units reserved);
//! - `blocked`: active BLOCKED members (units kept, B-022);
//! - the driver's frozen vector: READY members in flight (step/op/collect);
//! - `terminal`: outcome recorded, completion not yet delivered.
//!
//! `entries` maps every live handle to its [`Entry`] (state and cancel flag);
//! a handle leaves it when its completion is invoked, after which it is stale
//! (`Inval`, B-050).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use super::{CloseMode, Handle, Stats};
use crate::batch::AsyncStats;
use crate::batch::step::StepResult;
use crate::error::{Error, Result};

/// One member owned by the group: handle, fixed charge and the request.
pub(crate) struct Member<R> {
    pub(crate) handle: Handle,
    pub(crate) charge: u64,
    pub(crate) request: R,
}

/// A member whose terminal outcome is recorded and awaits delivery.
pub(crate) struct Terminal<R> {
    pub(crate) member: Member<R>,
    pub(crate) outcome: Result<()>,
}

/// Where a live member is in its state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// A cross-loop hand-in held for a slot (counts as queued, B-174).
    Held,
    /// Holds a slot, waits for admission.
    Waiting,
    /// Active and runnable (in the ready list or in flight).
    Ready,
    /// Active, out of the ready vector until resumed.
    Blocked,
    /// Outcome recorded; completion not yet invoked.
    Terminal,
}

/// Per-handle state.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    pub(crate) state: State,
    /// A cancel was recorded (B-047); consumed at the next boundary.
    pub(crate) cancelled: bool,
    /// `cancel_hint` already fired for this member (B-094: once per member).
    pub(crate) hinted: bool,
}

/// Deterministic hasher for handle keys (B-155: no unseeded randomness).
#[derive(Default)]
pub(crate) struct HandleHasher(u64);

impl Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 =
                (self.0.rotate_left(5) ^ u64::from(*b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: handles are consecutive, spread the high bits.
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(26);
    }
}

type EntryMap = HashMap<u64, Entry, BuildHasherDefault<HandleHasher>>;

/// The lists a live member can sit in outside the driver.
#[derive(Debug, Clone, Copy)]
enum List {
    Held,
    Waiting,
    Ready,
    Blocked,
}

impl List {
    fn is_active(self) -> bool {
        matches!(self, List::Ready | List::Blocked)
    }
}

/// Fixed limits of a group, validated at create.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) capacity: usize,
    pub(crate) max_active: usize,
    pub(crate) resource_capacity: u64,
    /// Cross-loop hand-ins that may be held beyond `capacity`.
    pub(crate) mt_queue_cap: usize,
}

/// The group's mutable state (see the module doc for where members live).
pub(crate) struct Core<R> {
    pub(crate) limits: Limits,
    entries: EntryMap,
    held: VecDeque<Member<R>>,
    waiting: VecDeque<Member<R>>,
    pub(crate) ready: Vec<Member<R>>,
    blocked: Vec<Member<R>>,
    terminal: VecDeque<Terminal<R>>,
    /// Members with state Ready or Blocked (in flight included).
    active: usize,
    /// Units held by active members (B-022).
    reserved: u64,
    /// Cancel flags recorded and not yet consumed.
    pending_cancels: usize,
    /// Bumped by every recorded cancel and close: wakes an operation wait.
    pub(crate) cancel_seq: u64,
    /// Callbacks in flight (step, submit, collect, hint, complete): B-041.
    pub(crate) in_callback: u32,
    pub(crate) closed: Option<CloseMode>,
    /// The driver ended (normally or killed): admission is over.
    pub(crate) driver_gone: bool,
    pub(crate) destroyed: bool,
    /// A completion was invoked and has not returned (retired on exit, B-176).
    delivering: Option<Result<()>>,
    pub(crate) stats: Stats,
    pub(crate) astats: AsyncStats,
}

impl<R> Core<R> {
    /// Allocates every container at its final capacity (B-017): later pushes
    /// never allocate, since each list is bounded by `capacity`, `max_active`
    /// or `mt_queue_cap`. `Nomem` when an allocation fails.
    pub(crate) fn new(limits: Limits) -> Result<Core<R>> {
        let slots = limits
            .capacity
            .checked_add(limits.mt_queue_cap)
            .ok_or(Error::Range)?;
        let mut entries = EntryMap::default();
        entries.try_reserve(slots).map_err(|_| Error::Nomem)?;
        Ok(Core {
            limits,
            entries,
            held: deque(limits.mt_queue_cap)?,
            waiting: deque(limits.capacity)?,
            ready: vec_with(limits.max_active)?,
            blocked: vec_with(limits.max_active)?,
            terminal: deque(slots)?,
            active: 0,
            reserved: 0,
            pending_cancels: 0,
            cancel_seq: 0,
            in_callback: 0,
            closed: None,
            driver_gone: false,
            destroyed: false,
            delivering: None,
            stats: Stats::default(),
            astats: AsyncStats::default(),
        })
    }

    /// Bytes the containers of a group with `limits` occupy, for the loop's
    /// resource accountant. `Range` when the arithmetic overflows (B-018).
    pub(crate) fn storage_bytes(limits: &Limits) -> Result<u64> {
        let member = size_of::<Member<R>>() as u64;
        let slots = (limits.capacity as u64).checked_add(limits.mt_queue_cap as u64);
        let slots = slots.ok_or(Error::Range)?;
        let entry = (size_of::<(u64, Entry)>() + 1) as u64;
        let per_slot = member
            .checked_mul(2)
            .and_then(|m| m.checked_add(entry))
            .ok_or(Error::Range)?;
        let per_active = member
            .checked_mul(3)
            .and_then(|m| m.checked_add(32))
            .ok_or(Error::Range)?;
        let a = slots.checked_mul(per_slot).ok_or(Error::Range)?;
        let b = (limits.max_active as u64)
            .checked_mul(per_active)
            .ok_or(Error::Range)?;
        let total = a.checked_add(b).ok_or(Error::Range)?;
        // Every container must also be allocatable on this target (B-018).
        if total > isize::MAX as u64 {
            return Err(Error::Range);
        }
        Ok(total)
    }

    /// Validates a submit against charge, close and slots (B-019, B-020,
    /// B-024); the caller then issues the handle and calls [`Core::enqueue`].
    pub(crate) fn check_submit(&self, charge: u64) -> Result<()> {
        if charge == 0 || charge > self.limits.resource_capacity {
            return Err(Error::Range);
        }
        if self.closed.is_some() || self.driver_gone {
            return Err(Error::Again);
        }
        // Held hand-ins go first (FCFS across paths, B-118).
        if self.slots_used() >= self.limits.capacity || !self.held.is_empty() {
            return Err(Error::Again);
        }
        Ok(())
    }

    /// Cross-loop hand-ins held for a slot.
    pub(crate) fn held_len(&self) -> usize {
        self.held.len()
    }

    /// Slots in use: waiting, active and recorded-but-undelivered members.
    pub(crate) fn slots_used(&self) -> usize {
        self.entries.len() - self.held.len()
    }

    /// Puts an accepted request at the back of the admission queue.
    pub(crate) fn enqueue(&mut self, handle: Handle, charge: u64, request: R) {
        self.insert_entry(handle, State::Waiting);
        self.waiting.push_back(Member {
            handle,
            charge,
            request,
        });
    }

    /// A cross-loop hand-in drained from the ring: waits for a slot when none
    /// is free (B-117, B-118). Never rejected once its handle was issued.
    pub(crate) fn hand_in(&mut self, handle: Handle, charge: u64, request: R) {
        if self.held.is_empty() && self.slots_used() < self.limits.capacity {
            self.enqueue(handle, charge, request);
        } else {
            self.insert_entry(handle, State::Held);
            self.held.push_back(Member {
                handle,
                charge,
                request,
            });
        }
    }

    fn insert_entry(&mut self, handle: Handle, state: State) {
        let e = Entry {
            state,
            cancelled: false,
            hinted: false,
        };
        let old = self.entries.insert(handle.get(), e);
        debug_assert!(old.is_none(), "handle issued twice");
    }

    /// Records a cancel (B-047..B-051): `Inval` for a handle this group does
    /// not know (stale or foreign); harmless on a recorded outcome or twice.
    pub(crate) fn cancel(&mut self, handle: Handle) -> Result<()> {
        let e = self.entries.get_mut(&handle.get()).ok_or(Error::Inval)?;
        if e.state == State::Terminal || e.cancelled {
            return Ok(());
        }
        e.cancelled = true;
        self.pending_cancels += 1;
        self.cancel_seq = self.cancel_seq.wrapping_add(1); // compared for change only
        Ok(())
    }

    /// BLOCKED → READY (B-054..B-057): harmless on READY; `Inval` on WAITING,
    /// held, terminal or unknown. The charge stays reserved throughout.
    pub(crate) fn resume(&mut self, handle: Handle) -> Result<()> {
        let e = self.entries.get_mut(&handle.get()).ok_or(Error::Inval)?;
        match e.state {
            State::Ready => Ok(()),
            State::Blocked => {
                e.state = State::Ready;
                let i = self.blocked.iter().position(|m| m.handle == handle);
                let m = self
                    .blocked
                    .swap_remove(i.expect("blocked member is listed"));
                self.ready.push(m);
                Ok(())
            }
            State::Held | State::Waiting | State::Terminal => Err(Error::Inval),
        }
    }

    /// Close (B-131..B-135): DRAIN stops admission; CANCEL also cancels every
    /// nonterminal member; idempotent, escalates, never downgrades.
    pub(crate) fn close(&mut self, mode: CloseMode) {
        if self.closed != Some(CloseMode::Cancel) {
            self.closed = Some(mode);
        }
        if mode == CloseMode::Cancel {
            for e in self.entries.values_mut() {
                if e.state != State::Terminal && !e.cancelled {
                    e.cancelled = true;
                    self.pending_cancels += 1;
                }
            }
        }
        self.cancel_seq = self.cancel_seq.wrapping_add(1); // compared for change only
    }

    /// Marks the hint of `handle` as fired; true when it had not fired and the
    /// member is cancelled (or `all`, for a forced teardown).
    pub(crate) fn take_hint(&mut self, handle: Handle, all: bool) -> bool {
        match self.entries.get_mut(&handle.get()) {
            Some(e) if !e.hinted && (all || e.cancelled) => {
                e.hinted = true;
                true
            }
            _ => false,
        }
    }

    /// Boundary: finalizes every cancelled member that is not in flight as
    /// `Aborted` (B-048: it never enters another vector).
    pub(crate) fn consume_cancels(&mut self) {
        if self.pending_cancels == 0 {
            return;
        }
        for which in [List::Held, List::Waiting, List::Ready, List::Blocked] {
            let mut i = 0;
            while let Some(h) = self.handle_at(which, i) {
                if self.entries[&h.get()].cancelled {
                    let m = self.remove_at(which, i);
                    self.finish(m, Err(Error::Aborted), which.is_active());
                } else {
                    i += 1;
                }
            }
        }
    }

    fn handle_at(&self, which: List, i: usize) -> Option<Handle> {
        match which {
            List::Held => self.held.get(i).map(|m| m.handle),
            List::Waiting => self.waiting.get(i).map(|m| m.handle),
            List::Ready => self.ready.get(i).map(|m| m.handle),
            List::Blocked => self.blocked.get(i).map(|m| m.handle),
        }
    }

    fn remove_at(&mut self, which: List, i: usize) -> Member<R> {
        match which {
            List::Held => self.held.remove(i).expect("index in range"),
            List::Waiting => self.waiting.remove(i).expect("index in range"),
            List::Ready => self.ready.remove(i),
            List::Blocked => self.blocked.swap_remove(i),
        }
    }

    /// Boundary: held hand-ins take freed slots first, then WAITING members
    /// are admitted strictly FCFS while a slot of `max_active` and their
    /// charge fit (B-021..B-023). Returns how many were admitted.
    pub(crate) fn admit(&mut self) -> usize {
        while !self.held.is_empty() && self.slots_used() < self.limits.capacity {
            let m = self.held.pop_front().expect("nonempty");
            self.entries.get_mut(&m.handle.get()).expect("live").state = State::Waiting;
            self.waiting.push_back(m);
        }
        let mut n = 0;
        while let Some(front) = self.waiting.front() {
            // Checked: `reserved + charge` may exceed u64 near the top of a
            // `u64::MAX` capacity (issue 12); no sum, no wrap, no panic.
            let fits = self
                .reserved
                .checked_add(front.charge)
                .is_some_and(|units| units <= self.limits.resource_capacity);
            if self.active >= self.limits.max_active || !fits {
                break; // strict FCFS: nobody passes the front
            }
            let m = self.waiting.pop_front().expect("nonempty");
            self.entries.get_mut(&m.handle.get()).expect("live").state = State::Ready;
            self.active += 1;
            self.reserved += m.charge;
            self.ready.push(m);
            n += 1;
        }
        n
    }

    /// Records a terminal outcome (B-039): releases the charge of an active
    /// member at once; the slot is released when the completion is invoked.
    pub(crate) fn finish(&mut self, member: Member<R>, outcome: Result<()>, active: bool) {
        if active {
            self.active -= 1;
            self.reserved -= member.charge;
        }
        let e = self
            .entries
            .get_mut(&member.handle.get())
            .expect("live member");
        if e.cancelled {
            self.pending_cancels -= 1;
        }
        e.state = State::Terminal;
        self.terminal.push_back(Terminal { member, outcome });
    }

    /// Records one member's result word after a step or an OK collect
    /// (B-034..B-036): CONTINUE back to READY, BLOCKED aside, else terminal.
    pub(crate) fn apply(&mut self, member: Member<R>, result: StepResult) {
        match result {
            StepResult::Continue => self.ready.push(member),
            StepResult::Blocked => {
                self.entries
                    .get_mut(&member.handle.get())
                    .expect("live")
                    .state = State::Blocked;
                self.blocked.push(member);
            }
            StepResult::Done => self.finish(member, Ok(()), true),
            StepResult::Error(e) => self.finish(member, Err(e), true),
            StepResult::Unset => self.finish(member, Err(Error::Internal), true),
        }
    }

    /// Puts CONTINUE members back into the ready list, leaving `members`
    /// empty (a swap when the list is empty, as it is after a step).
    pub(crate) fn keep_ready(&mut self, members: &mut Vec<Member<R>>) {
        if self.ready.is_empty() {
            std::mem::swap(&mut self.ready, members);
        } else {
            self.ready.append(members);
        }
    }

    /// The outcome of an in-flight member that failed with `err`: `Aborted`
    /// when its cancel was recorded (B-039, B-096).
    pub(crate) fn fail_outcome(&self, handle: Handle, err: Error) -> Error {
        match self.entries.get(&handle.get()) {
            Some(e) if e.cancelled => Error::Aborted,
            _ => err,
        }
    }

    /// True when the member's cancel was recorded.
    pub(crate) fn is_cancelled(&self, handle: Handle) -> bool {
        self.entries.get(&handle.get()).is_some_and(|e| e.cancelled)
    }

    /// Takes the next recorded outcome to deliver, recording the invocation
    /// first (B-039): the handle is stale from here on.
    pub(crate) fn pop_delivery(&mut self) -> Option<(Handle, R, Result<()>)> {
        let t = self.terminal.pop_front()?;
        self.entries.remove(&t.member.handle.get());
        self.delivering = Some(t.outcome);
        Some((t.member.handle, t.member.request, t.outcome))
    }

    /// The delivery returned (or was interrupted by driver exit and is now
    /// retired): terminal counters advance (B-176), saturating (B-178).
    pub(crate) fn retire_delivery(&mut self) {
        let Some(outcome) = self.delivering.take() else {
            return;
        };
        let s = &mut self.stats;
        match outcome {
            Ok(()) => s.completed = s.completed.saturating_add(1),
            Err(Error::Aborted) => s.cancelled = s.cancelled.saturating_add(1),
            Err(_) => s.failed = s.failed.saturating_add(1),
        }
    }

    /// Accounts one vector call of `n` members (B-175).
    pub(crate) fn note_vector(&mut self, n: usize) {
        let s = &mut self.stats;
        s.iterations = s.iterations.saturating_add(1);
        s.total_members = s.total_members.saturating_add(n as u64);
        s.max_vector = s.max_vector.max(n as u64);
    }

    /// Counts an owner-loop submit that failed after validation (B-177).
    pub(crate) fn note_rejection(&mut self) {
        self.stats.rejections = self.stats.rejections.saturating_add(1);
    }

    /// After unexpected driver exit: every member not in flight fails with
    /// `Internal` (`Aborted` when cancelled, B-039).
    pub(crate) fn fail_all_outstanding(&mut self) {
        let mut out: Vec<(Member<R>, bool)> = Vec::new();
        out.extend(self.held.drain(..).map(|m| (m, false)));
        out.extend(self.waiting.drain(..).map(|m| (m, false)));
        out.extend(self.ready.drain(..).map(|m| (m, true)));
        out.extend(self.blocked.drain(..).map(|m| (m, true)));
        for (m, active) in out {
            let err = self.fail_outcome(m.handle, Error::Internal);
            self.finish(m, Err(err), active);
        }
    }

    /// True when nothing remains for the driver: closed, no live member.
    pub(crate) fn finished(&self) -> bool {
        self.closed.is_some() && self.entries.is_empty()
    }

    /// A snapshot of committed state (B-172..B-178).
    pub(crate) fn snapshot(&self) -> Stats {
        let mut s = self.stats;
        s.queued = (self.waiting.len() + self.held.len()) as u64;
        s.blocked = self.blocked.len() as u64;
        s.ready = (self.active - self.blocked.len()) as u64;
        s.reserved_units = self.reserved;
        s
    }
}

fn deque<T>(cap: usize) -> Result<VecDeque<T>> {
    let mut d = VecDeque::new();
    d.try_reserve_exact(cap).map_err(|_| Error::Nomem)?;
    Ok(d)
}

fn vec_with<T>(cap: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(cap).map_err(|_| Error::Nomem)?;
    Ok(v)
}

#[cfg(test)]
#[path = "group_tests.rs"]
mod tests;
