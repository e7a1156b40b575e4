//! The two engines a driver runs: [`SyncEngine`] (one step per iteration)
//! and [`AsyncEngine`] (submit, await the operation, collect).
//!
//! Both record results through the same core; only how an iteration reaches
//! its result words differs (B-059: the async group is otherwise identical).

use std::future::{Future, poll_fn};
use std::os::fd::AsFd;
use std::pin::{Pin, pin};
use std::rc::Rc;
use std::task::Poll;

use super::api::GroupState;
use super::driver::{Bufs, Engine, FrozenVector, InCallback, Phase, fail_vector, record};
use super::group::{Core, Member};
use super::remote;
use super::{AsyncStep, CloseMode, Exec, ExecStatus, Item, Step, StepResult};
use crate::error::{Error, Result};
use crate::rt::{self, Instant};

/// A synchronous group's engine: one [`Step`] call per iteration.
pub(crate) struct SyncEngine<S> {
    step: S,
}

impl<S> SyncEngine<S> {
    pub(crate) fn new(step: S) -> Self {
        SyncEngine { step }
    }
}

impl<R: 'static, S: Step<R> + 'static> Engine<R> for SyncEngine<S> {
    async fn iterate(&mut self, sh: &GroupState<R>, fl: &mut FrozenVector<R>, bufs: &mut Bufs<R>) {
        bufs.reset_results(fl.members.len());
        fl.phase = Phase::Callback;
        let mut items = bufs.items(&mut fl.members);
        let ret = {
            let _cb = InCallback::enter(sh);
            self.step.step(&mut items, &mut bufs.results).await
        };
        bufs.give_back(items);
        fl.phase = Phase::Idle;
        record(
            &mut sh.core.borrow_mut(),
            &mut fl.members,
            &bufs.results,
            ret,
        );
    }

    async fn teardown(
        &mut self,
        sh: &GroupState<R>,
        fl: &mut FrozenVector<R>,
        _bufs: &mut Bufs<R>,
    ) {
        // Killed inside the step: its results are unknown (B-039).
        fail_vector(&mut sh.core.borrow_mut(), &mut fl.members, Error::Internal);
        fl.phase = Phase::Idle;
    }
}

/// An asynchronous group's engine: submit, await, collect (B-063..B-103).
pub(crate) struct AsyncEngine<A> {
    step: A,
}

impl<A> AsyncEngine<A> {
    pub(crate) fn new(step: A) -> Self {
        AsyncEngine { step }
    }
}

/// What ended one poll of an operation wait.
enum WaitEvent {
    Done(ExecStatus),
    Timeout,
    Cancel,
}

fn status_of(r: Result<()>) -> ExecStatus {
    match r {
        Ok(()) => ExecStatus::Ok,
        Err(e) => ExecStatus::Failed(e),
    }
}

impl<R: 'static, A: AsyncStep<R> + 'static> Engine<R> for AsyncEngine<A> {
    async fn iterate(&mut self, sh: &GroupState<R>, fl: &mut FrozenVector<R>, bufs: &mut Bufs<R>) {
        bufs.reset_results(fl.members.len());
        fl.phase = Phase::Callback;
        let mut items = bufs.items(&mut fl.members);
        let exec = {
            let _cb = InCallback::enter(sh);
            self.step.submit(&mut items).await
        };
        let exec = match exec {
            Ok(x) => x,
            Err(e) => {
                // No operation is outstanding (B-080).
                bufs.give_back(items);
                fl.phase = Phase::Idle;
                fail_vector(&mut sh.core.borrow_mut(), &mut fl.members, e);
                return;
            }
        };
        let seq0 = {
            let mut c = sh.core.borrow_mut();
            c.astats.offloads = c.astats.offloads.saturating_add(1);
            c.cancel_seq
        };
        fl.phase = Phase::Waiting;
        let status = self
            .await_exec(sh, &items, exec, &mut fl.blocking, &mut fl.fence)
            .await;
        count_status(&mut sh.core.borrow_mut(), status);
        self.completion_boundary(sh, &items, seq0).await;
        fl.phase = Phase::Callback;
        let ret = {
            let _cb = InCallback::enter(sh);
            self.step
                .collect(&mut items, &mut bufs.results, status)
                .await
        };
        bufs.give_back(items);
        fl.fence = None; // collect returned: the engine's clone goes (B-067)
        fl.phase = Phase::Idle;
        let mut c = sh.core.borrow_mut();
        let cancels = c.cancel_seq != seq0;
        record_async(&mut c, &mut fl.members, &bufs.results, status, ret, cancels);
    }

    async fn teardown(&mut self, sh: &GroupState<R>, fl: &mut FrozenVector<R>, bufs: &mut Bufs<R>) {
        if fl.phase != Phase::Waiting {
            // Killed in submit or collect: the operation's fate was already
            // reported or none is outstanding; results are unknown.
            fail_vector(&mut sh.core.borrow_mut(), &mut fl.members, Error::Internal);
            fl.phase = Phase::Idle;
            return;
        }
        // Parked on the token: hints for every in-flight member, then one
        // collect with ABORTED, then every member ends Aborted (B-094, B-101).
        let mut items = bufs.items(&mut fl.members);
        self.hints(sh, &items, true).await;
        if let Some(job) = fl.blocking.take() {
            let _ = job.await; // a BLOCKING wait lasts until the closure returns (B-103)
        }
        bufs.reset_results(items.len());
        {
            let _cb = InCallback::enter(sh);
            let _ = self
                .step
                .collect(&mut items, &mut bufs.results, ExecStatus::Aborted)
                .await;
        }
        bufs.give_back(items);
        fl.fence = None; // after the teardown's collect (B-067)
        fail_vector(&mut sh.core.borrow_mut(), &mut fl.members, Error::Aborted);
        fl.phase = Phase::Idle;
    }
}

impl<A> AsyncEngine<A> {
    /// Awaits the operation `exec` describes and returns its raw status. A
    /// FENCE's `Rc` is kept in `fence` (the in-flight vector's slot), which
    /// the caller clears only after collect returned.
    async fn await_exec<R>(
        &mut self,
        sh: &GroupState<R>,
        items: &[Item<'_, R>],
        exec: Exec,
        blocking: &mut Option<rt::Future<Result<()>>>,
        fence: &mut Option<Rc<dyn AsFd>>,
    ) -> ExecStatus
    where
        A: AsyncStep<R>,
    {
        let deadline = sh.exec_timeout.and_then(|d| sh.lp.now().checked_add(d));
        match exec {
            Exec::Inline => ExecStatus::Ok,
            Exec::Fence(shared) => {
                // Borrowed from the engine's clone, which outlives the wait.
                let held: &Rc<dyn AsFd> = fence.insert(shared);
                let fd = (**held).as_fd();
                let op = async move { status_of(rt::wait_readable(fd).await) };
                self.wait(sh, items, pin!(op), deadline, true).await
            }
            Exec::Future(f) => {
                let op = async move { status_of(f.await) };
                self.wait(sh, items, pin!(op), deadline, true).await
            }
            Exec::Blocking(job) => match rt::blocking_run(job) {
                Err(e) => ExecStatus::Failed(e),
                Ok(f) => {
                    *blocking = Some(f);
                    let op = poll_fn(|cx| {
                        let f = blocking.as_mut().expect("set above");
                        Pin::new(f).poll(cx).map(|r| status_of(r.and_then(|x| x)))
                    });
                    let s = self.wait(sh, items, pin!(op), None, false).await;
                    *blocking = None;
                    s
                }
            },
        }
    }

    /// Races the operation against the deadline and cancel notifications:
    /// a member's cancel fires hints and keeps waiting; close(CANCEL) ends a
    /// FENCE or FUTURE wait with ABORTED (B-068, B-094, B-097).
    async fn wait<R, F>(
        &mut self,
        sh: &GroupState<R>,
        items: &[Item<'_, R>],
        mut op: Pin<&mut F>,
        deadline: Option<Instant>,
        close_ends: bool,
    ) -> ExecStatus
    where
        A: AsyncStep<R>,
        F: Future<Output = ExecStatus>,
    {
        let mut timer = deadline.map(rt::sleep_until);
        let mut seen = sh.core.borrow().cancel_seq;
        loop {
            let ev = poll_fn(|cx| {
                if let Poll::Ready(s) = op.as_mut().poll(cx) {
                    return Poll::Ready(WaitEvent::Done(s));
                }
                if let Some(t) = timer.as_mut()
                    && Pin::new(t).poll(cx).is_ready()
                {
                    return Poll::Ready(WaitEvent::Timeout);
                }
                if sh.core.borrow().cancel_seq != seen {
                    return Poll::Ready(WaitEvent::Cancel);
                }
                // Cross-loop hand-ins landing during the wait: drain them now
                // so a cancel_mt of an in-flight member fires its hint.
                if remote::drain_while_waiting(sh, cx.waker()) {
                    return Poll::Ready(WaitEvent::Cancel);
                }
                sh.set_waker(cx.waker());
                Poll::Pending
            })
            .await;
            match ev {
                WaitEvent::Done(s) => return s,
                WaitEvent::Timeout => return ExecStatus::Timeout,
                WaitEvent::Cancel => {
                    seen = sh.core.borrow().cancel_seq;
                    self.hints(sh, items, false).await;
                    if close_ends && sh.core.borrow().closed == Some(CloseMode::Cancel) {
                        return ExecStatus::Aborted;
                    }
                }
            }
        }
    }

    /// The completion boundary (B-093, B-094, B-121, B-122): the wait ended
    /// and the operation is still outstanding as far as the application
    /// knows (collect has not run). Every cancel accepted before this point
    /// is recorded here, whichever path carried it: the owner's is in the
    /// core already, a cancel_mt is drained from the ring now (the operation
    /// may have finished before the driver ever looked at the ring). Each
    /// newly cancelled member gets its hint, then collect runs and the
    /// member ends `Aborted` ("already recorded DONE wins" cannot apply: DONE
    /// is recorded only after collect). Hints may yield, so the ring is
    /// drained again after them; nothing suspends between the last drain
    /// and collect. A cancel of a member written behind a position whose
    /// producer is still writing is waited for by yielding (a producer
    /// never pauses mid-write).
    async fn completion_boundary<R>(&mut self, sh: &GroupState<R>, items: &[Item<'_, R>], seq0: u64)
    where
        A: AsyncStep<R>,
    {
        let mut hinted_at = seq0;
        loop {
            let stuck = remote::drain_at_completion(sh, items);
            let seq = sh.core.borrow().cancel_seq;
            if seq != hinted_at {
                hinted_at = seq;
                self.hints(sh, items, false).await; // once per member (B-094)
                continue;
            }
            if !stuck {
                return;
            }
            rt::yield_now().await;
        }
    }

    /// Fires `cancel_hint` once per member that is cancelled (or every
    /// member, `all`, for a forced teardown) and not yet hinted (B-094).
    async fn hints<R>(&mut self, sh: &GroupState<R>, items: &[Item<'_, R>], all: bool)
    where
        A: AsyncStep<R>,
    {
        for it in items {
            let fire = sh.core.borrow_mut().take_hint(it.handle, all);
            if fire {
                let _cb = InCallback::enter(sh);
                self.step.cancel_hint(it.handle).await;
            }
        }
    }
}

/// Records an async iteration by the status rules (B-086..B-090, B-096):
/// a member whose cancel was recorded ends `Aborted`; ABORTED and a negative
/// status end every member with that status; a failed collect fails the
/// vector; after TIMEOUT only DONE and ERROR are honoured (else `Again`);
/// after OK the result words apply as for a step.
/// Counts the wait's outcome (B-086, B-104), before collect runs, so a kill
/// inside collect does not lose it.
fn count_status<R>(c: &mut Core<R>, status: ExecStatus) {
    let a = &mut c.astats;
    match status {
        ExecStatus::Timeout => a.offload_timeouts = a.offload_timeouts.saturating_add(1),
        ExecStatus::Failed(_) => a.offload_errors = a.offload_errors.saturating_add(1),
        _ => {}
    }
}

fn record_async<R>(
    c: &mut Core<R>,
    members: &mut Vec<Member<R>>,
    results: &[StepResult],
    status: ExecStatus,
    ret: Result<()>,
    cancels: bool,
) {
    for (m, r) in members.drain(..).zip(results) {
        if cancels && c.is_cancelled(m.handle) {
            c.finish(m, Err(Error::Aborted), true);
            continue;
        }
        let outcome = match (status, ret) {
            (ExecStatus::Aborted, _) => Err(Error::Aborted),
            (ExecStatus::Failed(e), _) | (_, Err(e)) => Err(e),
            (ExecStatus::Timeout, Ok(())) => match r {
                StepResult::Done => Ok(()),
                StepResult::Error(e) => Err(*e),
                _ => Err(Error::Again),
            },
            (ExecStatus::Ok, Ok(())) => {
                c.apply(m, *r);
                continue;
            }
        };
        c.finish(m, outcome, true);
    }
}
