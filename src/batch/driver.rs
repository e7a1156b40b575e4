//! The driver process and its finalizer.
//!
//! The driver loops over iterations: at each **boundary** it consumes
//! recorded cancels, delivers recorded outcomes, and admits waiting members;
//! then it hands the whole ready vector to the engine (one step, or one
//! submit + wait + collect) and records the results. It suspends between
//! any two vectors (so a step that never yields cannot starve the loop's
//! other processes, B-040, B-047), parks when there is no ready member, and
//! wakes on any mutator's signal (B-135).
//!
//! Exactly once across a kill (B-039, B-099..B-103): the driver future owns
//! its callbacks and the frozen vector inside [`Driver`]; killing the driver
//! drops that future at its suspension point, and `Driver::drop` (the exit
//! hook) hands them to the **finalizer**, a second process spawned at create
//! that was parked on the exit slot. The finalizer retires an interrupted
//! delivery (its invocation was recorded before user code ran), lets the
//! engine tear down the in-flight vector (cancel hints, one collect with
//! `Aborted`, or `Internal` for an interrupted step), fails every other
//! member, and delivers every recorded outcome once. On a normal exit the
//! finalizer simply ends.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::task::{Poll, Waker};

use super::api::GroupState;
use super::group::{Core, Member};
use super::remote;
use super::{Complete, Item, StepResult};
use crate::error::Result;
use crate::rt::{self, Pid, SchedClass};

pub(crate) use super::engine::{AsyncEngine, SyncEngine};

/// What the in-flight vector is doing; read by the finalizer after a kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// No vector in flight.
    Idle,
    /// A synchronous step, an async submit or collect is running.
    Callback,
    /// An async operation is outstanding (submit returned `Ok`).
    Waiting,
}

/// The frozen vector and its operation (owned by the driver future).
pub(crate) struct FrozenVector<R> {
    pub(crate) members: Vec<Member<R>>,
    pub(crate) phase: Phase,
    /// A BLOCKING closure's result: awaited even after a kill (B-103).
    pub(crate) blocking: Option<crate::rt::Future<Result<()>>>,
    /// The engine's clone of a FENCE operation's fence: held from submit
    /// until collect returned (teardown's collect too), so the fd it waits
    /// on stays open for the whole wait (B-066, B-067).
    pub(crate) fence: Option<Rc<dyn AsFd>>,
}

/// Reused buffers: result words and the item vector.
pub(crate) struct Bufs<R: 'static> {
    pub(crate) results: Vec<StepResult>,
    items: Vec<Item<'static, R>>,
}

impl<R: 'static> Bufs<R> {
    /// Resets `n` result words to `Unset` (B-033).
    pub(crate) fn reset_results(&mut self, n: usize) {
        self.results.clear();
        self.results.resize(n, StepResult::Unset);
    }

    /// Builds the item vector over `members`, reusing the buffer's storage.
    pub(crate) fn items<'a>(&mut self, members: &'a mut [Member<R>]) -> Vec<Item<'a, R>> {
        let mut v = recycle(std::mem::take(&mut self.items));
        v.extend(members.iter_mut().map(|m| Item {
            handle: m.handle,
            request: &mut m.request,
        }));
        v
    }

    /// Returns the item vector's storage for the next iteration.
    pub(crate) fn give_back(&mut self, items: Vec<Item<'_, R>>) {
        self.items = recycle(items);
    }
}

/// Reuses a vector's allocation for another lifetime (in-place collect of an
/// empty iterator keeps the buffer).
fn recycle<'a, 'b, R>(mut v: Vec<Item<'a, R>>) -> Vec<Item<'b, R>> {
    v.clear();
    v.into_iter().map(|_| unreachable!("cleared")).collect()
}

/// The step flavour of a group: synchronous step or asynchronous pair.
pub(crate) trait Engine<R: 'static>: 'static {
    /// Runs one iteration over `fl.members` (the frozen ready vector) and
    /// records every member's result in the core.
    async fn iterate(&mut self, sh: &GroupState<R>, fl: &mut FrozenVector<R>, bufs: &mut Bufs<R>);

    /// After a kill: finalizes the in-flight vector according to its phase.
    async fn teardown(&mut self, sh: &GroupState<R>, fl: &mut FrozenVector<R>, bufs: &mut Bufs<R>);
}

/// Counts a callback in flight (B-041) for the guard's lifetime; the count
/// drops even when a kill drops the callback mid-way.
pub(crate) struct InCallback<'a, R>(&'a RefCell<Core<R>>);

impl<'a, R> InCallback<'a, R> {
    pub(crate) fn enter(sh: &'a GroupState<R>) -> Self {
        sh.core.borrow_mut().in_callback += 1;
        InCallback(&sh.core)
    }
}

impl<R> Drop for InCallback<'_, R> {
    fn drop(&mut self) {
        self.0.borrow_mut().in_callback -= 1;
    }
}

/// Records a finished synchronous step (or OK collect): `Err(e)` fails the
/// whole vector with `e` (B-037), otherwise each word applies (B-034..B-036).
///
/// CONTINUE members stay where they are and the vector becomes the ready
/// list again (no per-member move on the hot path); only leaving or blocked
/// members are extracted.
pub(crate) fn record<R>(
    core: &mut Core<R>,
    members: &mut Vec<Member<R>>,
    results: &[StepResult],
    ret: Result<()>,
) {
    if let Err(e) = ret {
        return fail_vector(core, members, e);
    }
    let mut idx = 0;
    let mut leaving = results.iter().filter(|r| **r != StepResult::Continue);
    let moved = members.extract_if(.., |_| {
        idx += 1;
        results[idx - 1] != StepResult::Continue
    });
    for m in moved {
        core.apply(m, *leaving.next().expect("one word per extracted member"));
    }
    core.keep_ready(members);
}

/// Fails every member of a vector with `err` (`Aborted` if cancelled).
pub(crate) fn fail_vector<R>(core: &mut Core<R>, members: &mut Vec<Member<R>>, err: crate::Error) {
    for m in members.drain(..) {
        let e = core.fail_outcome(m.handle, err);
        core.finish(m, Err(e), true);
    }
}

/// The driver's callbacks and buffers, handed to the finalizer on a kill.
pub(crate) struct Parts<R: 'static, E, C> {
    engine: E,
    complete: C,
    fl: FrozenVector<R>,
    bufs: Bufs<R>,
}

enum Exit<P> {
    Normal,
    Killed(P),
}

/// Where the driver's exit hook leaves its parts for the finalizer.
struct ExitSlot<P> {
    exit: RefCell<Option<Exit<P>>>,
    waker: Cell<Option<Waker>>,
}

impl<P> ExitSlot<P> {
    fn put(&self, e: Exit<P>) {
        *self.exit.borrow_mut() = Some(e);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    async fn take(&self) -> Exit<P> {
        poll_fn(|cx| match self.exit.borrow_mut().take() {
            Some(e) => Poll::Ready(e),
            None => {
                self.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await
    }
}

/// The driver process's state; its `Drop` is the exit hook.
struct Driver<R: 'static, E, C> {
    sh: Rc<GroupState<R>>,
    parts: Option<Parts<R, E, C>>,
    exit: Rc<ExitSlot<Parts<R, E, C>>>,
    normal: bool,
}

impl<R: 'static, E: Engine<R>, C: Complete<R>> Driver<R, E, C> {
    /// The iteration loop. Liveness (B-040, B-047): the driver never runs
    /// two vectors without suspending in between, even when the step never
    /// yields, so the loop's other processes (a cancel, a close, submits) run
    /// and are seen at the next boundary. After a vector that leaves READY
    /// members it yields at once; otherwise it usually parks, and when it
    /// would run another vector without having suspended (a refill, ring
    /// hand-ins), it yields first and redoes the boundary (B-048). A vector
    /// whose members all finished costs no yield (the submit → complete path).
    async fn run(&mut self) {
        let sh = &*self.sh;
        let p = self.parts.as_mut().expect("parts present while running");
        let mut suspended = true; // since the last vector ran
        loop {
            boundary(sh, &mut p.complete).await;
            let n = {
                let mut c = sh.core.borrow_mut();
                if c.finished() && remote::may_finish(sh) {
                    break;
                }
                if !suspended && !c.ready.is_empty() {
                    None
                } else {
                    std::mem::swap(&mut c.ready, &mut p.fl.members);
                    let n = p.fl.members.len();
                    if n > 0 {
                        c.note_vector(n);
                    }
                    Some(n)
                }
            };
            match n {
                None => {
                    rt::yield_now().await;
                    suspended = true;
                    continue;
                }
                Some(0) => {
                    suspended |= park(sh).await;
                    continue;
                }
                Some(_) => {}
            }
            p.engine.iterate(sh, &mut p.fl, &mut p.bufs).await;
            suspended = !sh.core.borrow().ready.is_empty();
            if suspended {
                rt::yield_now().await;
            }
        }
        remote::finish(sh); // cancel_mt/resume_mt: Inval from here on (B-143)
        self.normal = true;
    }
}

impl<R: 'static, E, C> Drop for Driver<R, E, C> {
    fn drop(&mut self) {
        {
            let mut c = self.sh.core.borrow_mut();
            c.driver_gone = true;
            c.closed = Some(c.closed.unwrap_or(super::CloseMode::Drain)); // exit closes (B-039)
        }
        // The exit closes the group on every path at once: submit_mt answers
        // `Again` from here on, as the owner-loop submit does (B-024, B-039,
        // B-141). Hand-ins that reserved before are drained by the finalizer
        // (B-119), which may first spend a while in teardown (a BLOCKING
        // closure, yielding hints).
        remote::close(&self.sh);
        let exit = match (self.normal, self.parts.take()) {
            (false, Some(p)) => Exit::Killed(p),
            _ => Exit::Normal,
        };
        self.exit.put(exit);
    }
}

/// The iteration boundary: the one place where cross-loop hand-ins are
/// drained (ring hook), then cancels consumed (B-048), recorded outcomes
/// delivered (B-039) and waiting members admitted FCFS (B-021).
async fn boundary<R, C: Complete<R>>(sh: &GroupState<R>, complete: &mut C) {
    drain_ring(sh);
    sh.core.borrow_mut().consume_cancels();
    deliver_all(sh, complete).await;
    sh.core.borrow_mut().admit();
    remote::settle(sh); // SUBMIT records of hand-ins no longer held
}

/// The ring hook of the boundary: drains the cross-loop admission ring into
/// `Core::hand_in` and applies its cancel/resume controls, before cancels are
/// consumed (B-117, B-121, B-122). A group without one drains nothing.
fn drain_ring<R>(sh: &GroupState<R>) {
    remote::drain(sh);
}

/// Delivers every recorded outcome, recording each invocation first.
async fn deliver_all<R, C: Complete<R>>(sh: &GroupState<R>, complete: &mut C) {
    loop {
        let next = sh.core.borrow_mut().pop_delivery();
        let Some((h, request, outcome)) = next else {
            break;
        };
        {
            let _cb = InCallback::enter(sh);
            complete.complete(h, request, outcome).await;
        }
        sh.core.borrow_mut().retire_delivery();
    }
}

/// Parks the driver until a mutator signals boundary work; returns whether
/// it suspended (false when work was already signalled).
async fn park<R>(sh: &GroupState<R>) -> bool {
    let mut suspended = false;
    poll_fn(|cx| {
        if sh.take_signal() || remote::arm(sh, cx.waker()) {
            Poll::Ready(suspended)
        } else {
            sh.set_waker(cx.waker());
            suspended = true;
            Poll::Pending
        }
    })
    .await
}

/// The finalizer process: parked until the driver exits; after a kill it
/// finishes every outstanding member exactly once.
async fn finalizer<R: 'static, E: Engine<R>, C: Complete<R>>(
    sh: Rc<GroupState<R>>,
    slot: Rc<ExitSlot<Parts<R, E, C>>>,
) {
    let Exit::Killed(mut p) = slot.take().await else {
        return;
    };
    sh.core.borrow_mut().retire_delivery(); // an interrupted delivery (B-176)
    p.engine.teardown(&sh, &mut p.fl, &mut p.bufs).await;
    remote::drain_for_exit(&sh).await; // hand-ins that raced the exit fail too
    sh.core.borrow_mut().fail_all_outstanding();
    deliver_all(&sh, &mut p.complete).await;
    remote::settle(&sh);
    remote::finish(&sh);
}

/// An empty vector with room for `n` elements, allocated now and fallibly:
/// `Nomem` rather than an abort when the allocator refuses (B-017, B-185).
fn try_vec<T>(n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| crate::Error::Nomem)?;
    Ok(v)
}

/// Spawns the driver and its finalizer (B-001) as one unit
/// ([`Loop::spawn_pair`](crate::rt::Loop::spawn_pair)): on failure neither
/// process was published, both futures (and their `Rc<GroupState>`: class
/// registration, storage charge) are already dropped, and the table holds
/// nothing of the group (B-017). Returns (driver, finalizer).
pub(crate) fn spawn<R: 'static, E: Engine<R>, C: Complete<R> + 'static>(
    sh: &Rc<GroupState<R>>,
    engine: E,
    complete: C,
    class: Option<&SchedClass>,
) -> Result<(Pid, Pid)> {
    let max = sh.core.borrow().limits.max_active;
    let bufs = Bufs {
        results: try_vec(max)?,
        items: try_vec(max)?,
    };
    let fl = FrozenVector {
        members: try_vec(max)?,
        phase: Phase::Idle,
        blocking: None,
        fence: None,
    };
    let slot = Rc::new(ExitSlot {
        exit: RefCell::new(None),
        waker: Cell::new(None),
    });
    let parts = Parts {
        engine,
        complete,
        fl,
        bufs,
    };
    let mut drv = Driver {
        sh: sh.clone(),
        parts: Some(parts),
        exit: slot.clone(),
        normal: false,
    };
    let fin = finalizer(sh.clone(), slot);
    let body = async move { drv.run().await };
    let (fin_pid, pid) = sh.lp.spawn_pair(class, fin, body)?;
    Ok((pid, fin_pid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Handle;

    #[test]
    fn recycled_item_vectors_keep_their_storage() {
        let mut members: Vec<Member<u32>> = (1..=64)
            .map(|i| Member {
                handle: Handle::new(i).unwrap(),
                charge: 1,
                request: i as u32,
            })
            .collect();
        let mut bufs = Bufs::<u32> {
            results: Vec::new(),
            items: Vec::with_capacity(64),
        };
        let ptr = bufs.items.as_ptr() as usize;
        for _ in 0..3 {
            let items = bufs.items(&mut members);
            assert_eq!(items.len(), 64);
            assert_eq!(items.as_ptr() as usize, ptr, "no reallocation");
            bufs.give_back(items);
            assert_eq!(bufs.items.capacity(), 64);
        }
    }
}
