//! [`Group`]: the public handle of a batch group (`xtc_batch_t`).
//!
//! A cheap-clone, `!Send` handle over the shared state ([`GroupState`]): the core
//! in a `RefCell`, the owner loop, the handle allocator, the driver's wake
//! slot, and the two process ids whose absence `destroy` checks.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Mutex;
use std::task::Waker;
use std::time::Duration;

use super::driver::{self, AsyncEngine, SyncEngine};
use super::group::{Core, Limits};
use super::remote::{self, MtState, Remote};
use super::{
    AsyncOpts, AsyncStats, AsyncStep, CloseMode, Complete, Handle, HandleAlloc, Stats, Step,
};
use super::{SubmitError, SyncOpts};
use crate::error::{Error, Result};
use crate::rt::{Charge, Loop, LoopId, Pid, SchedClass};

/// Scheduling classes registered to a batch group, process-wide (B-012, B-014).
static CLASSES: Mutex<Vec<(LoopId, u32)>> = Mutex::new(Vec::new());

fn classes() -> std::sync::MutexGuard<'static, Vec<(LoopId, u32)>> {
    CLASSES.lock().unwrap_or_else(|p| p.into_inner())
}

/// A class registration; released by a successful destroy (B-014) or when a
/// create fails.
pub(crate) struct ClassReg(Option<(LoopId, u32)>);

impl ClassReg {
    fn register(lp: &Loop, class: Option<&SchedClass>) -> Result<ClassReg> {
        let Some(c) = class else {
            return Ok(ClassReg(None));
        };
        if c.loop_id() != lp.id() {
            return Err(Error::Inval); // foreign class (B-012, B-180)
        }
        let key = (c.loop_id(), c.id());
        let mut reg = classes();
        if reg.contains(&key) {
            return Err(Error::Inval); // registered to another group
        }
        reg.push(key);
        Ok(ClassReg(Some(key)))
    }

    fn release(&mut self) {
        if let Some(key) = self.0.take() {
            classes().retain(|k| *k != key);
        }
    }
}

impl Drop for ClassReg {
    fn drop(&mut self) {
        self.release();
    }
}

/// State shared by the group's handles, its driver and its finalizer.
pub(crate) struct GroupState<R> {
    pub(crate) core: RefCell<Core<R>>,
    pub(crate) lp: Loop,
    pub(crate) handles: HandleAlloc,
    pub(crate) exec_timeout: Option<Duration>,
    /// Boundary work is pending (set by mutators, consumed when parking).
    signal: Cell<bool>,
    waker: Cell<Option<Waker>>,
    driver: Cell<Option<Pid>>,
    finalizer: Cell<Option<Pid>>,
    class: RefCell<ClassReg>,
    class_opt: Option<SchedClass>,
    charge: RefCell<Option<Charge>>,
    /// Cross-loop admission (`mt_queue_cap > 0`): the ring's consumer side.
    pub(crate) mt: Option<RefCell<MtState<R>>>,
}

impl<R> GroupState<R> {
    /// Signals boundary work to the driver and wakes it (B-135).
    pub(crate) fn signal(&self) {
        self.signal.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Takes a pending signal (the driver, before parking).
    pub(crate) fn take_signal(&self) -> bool {
        self.signal.replace(false)
    }

    /// Registers the driver's waker.
    pub(crate) fn set_waker(&self, w: &Waker) {
        self.waker.set(Some(w.clone()));
    }

    /// Mutation is allowed from a process of the owner loop, and from outside
    /// every loop only during the externally serialized setup before the
    /// owner loop's first run (B-128). A process of ANY other loop is refused
    /// even before the owner has run: under `Sim` loops share one thread, so
    /// only [`Loop::current`] tells them apart (B-130).
    fn check_owner(&self) -> Result<()> {
        match Loop::current() {
            Some(c) if c.id() == self.lp.id() => Ok(()),
            Some(_) => Err(Error::Inval), // foreign loop (B-180)
            None if !self.lp.has_run() => Ok(()),
            None => Err(Error::Inval),
        }
    }

    /// Owner, destroyed and callback checks common to every mutator.
    fn check_mutator(&self) -> Result<()> {
        feature_gate()?;
        if self.core.borrow().destroyed {
            return Err(Error::Inval);
        }
        self.check_owner()?;
        if self.core.borrow().in_callback > 0 {
            return Err(Error::Deadlk); // B-041
        }
        Ok(())
    }
}

fn feature_gate() -> Result<()> {
    if cfg!(feature = "sched-policy") {
        Ok(())
    } else {
        Err(Error::Nosys)
    }
}

/// A batch group (`xtc_batch_t`): cheap to clone, `!Send`, owner-loop only.
///
/// Created before its loop's first run with [`Group::create`] (synchronous
/// step) or [`Group::create_async`] (submit / collect); requests go in with
/// [`Group::submit`] and come back by value through the `complete` callback.
/// Lifetime: [`close`](Group::close), run the loop until the driver ends,
/// [`destroy`](Group::destroy) (B-136..B-139).
///
/// A group cannot leave its owner loop's thread (other threads use a
/// [`Remote`](super::Remote)); the compiler refuses:
///
/// ```compile_fail,E0277
/// fn needs_send<T: Send>(_: T) {}
/// fn give_away(g: xtc::batch::Group<u32>) {
///     needs_send(g);
/// }
/// ```
pub struct Group<R: 'static> {
    sh: Rc<GroupState<R>>,
}

impl<R: 'static> Clone for Group<R> {
    fn clone(&self) -> Self {
        Group {
            sh: self.sh.clone(),
        }
    }
}

impl<R: 'static> std::fmt::Debug for Group<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("stats", &self.stats())
            .finish()
    }
}

fn limits(capacity: usize, max_active: usize, units: u64, mt: usize) -> Result<Limits> {
    if max_active == 0 || capacity < max_active || units == 0 {
        return Err(Error::Inval); // B-010, B-011
    }
    Ok(Limits {
        capacity,
        max_active,
        resource_capacity: units,
        mt_queue_cap: mt,
    })
}

impl<R: 'static> Group<R> {
    /// `xtc_batch_create`: a synchronous group on `lp` (B-001..B-018).
    ///
    /// # Errors
    /// `Nosys` without the `sched-policy` feature; `Again` once `lp` has run
    /// (B-015); `Inval` for `capacity < max_active`, a zero limit, a class of
    /// another loop or one registered to another group; `Range` when the
    /// storage size overflows (B-018) or every group handle range (2^32 - 1
    /// groups per OS process) was taken (B-028, B-182); `Nomem` when the loop's budget refuses
    /// the storage or a process (nothing is published then, B-017).
    pub fn create(
        lp: &Loop,
        opts: SyncOpts,
        step: impl Step<R> + 'static,
        complete: impl Complete<R> + 'static,
    ) -> Result<Group<R>> {
        feature_gate()?;
        let l = limits(opts.capacity, opts.max_active, opts.resource_capacity, 0)?;
        Group::build(
            lp,
            l,
            None,
            opts.sched_class,
            SyncEngine::new(step),
            complete,
        )
    }

    /// `xtc_batch_create_async`: an asynchronous group whose iterations launch
    /// one operation each through `step` (B-058..B-105).
    ///
    /// `mt_queue_cap` is recorded for the cross-loop ring. Errors as
    /// [`Group::create`].
    pub fn create_async(
        lp: &Loop,
        opts: AsyncOpts,
        step: impl AsyncStep<R> + 'static,
        complete: impl Complete<R> + 'static,
    ) -> Result<Group<R>> {
        feature_gate()?;
        let l = limits(
            opts.capacity,
            opts.max_active,
            opts.resource_capacity,
            opts.mt_queue_cap,
        )?;
        let timeout = opts.exec_timeout.filter(|d| !d.is_zero());
        Group::build(
            lp,
            l,
            timeout,
            opts.sched_class,
            AsyncEngine::new(step),
            complete,
        )
    }

    fn build<E, C>(
        lp: &Loop,
        l: Limits,
        timeout: Option<Duration>,
        class: Option<SchedClass>,
        engine: E,
        complete: C,
    ) -> Result<Group<R>>
    where
        E: driver::Engine<R>,
        C: Complete<R> + 'static,
    {
        if lp.has_run() {
            return Err(Error::Again); // B-015
        }
        let reg = ClassReg::register(lp, class.as_ref())?;
        let bytes = Core::<R>::storage_bytes(&l)?;
        let bytes = (bytes.checked_add(remote::bytes_for::<R>(&l)?)).ok_or(Error::Range)?;
        let charge = lp.budget().charge(bytes)?;
        let core = Core::new(l)?;
        let handles = HandleAlloc::new()?;
        let mt = remote::create(&l, &handles)?;
        let sh = Rc::new(GroupState {
            core: RefCell::new(core),
            lp: lp.clone(),
            handles,
            exec_timeout: timeout,
            signal: Cell::new(true),
            waker: Cell::new(None),
            driver: Cell::new(None),
            finalizer: Cell::new(None),
            class: RefCell::new(reg),
            class_opt: class,
            charge: RefCell::new(Some(charge)),
            mt,
        });
        let (drv, fin) = driver::spawn(&sh, engine, complete, sh.class_opt.as_ref())?;
        sh.driver.set(Some(drv));
        sh.finalizer.set(Some(fin));
        Ok(Group { sh })
    }

    /// `xtc_batch_submit`: queues `request` with a fixed `charge` and returns
    /// its handle (B-019..B-029).
    ///
    /// # Errors
    /// The request comes back in [`SubmitError`] with: `Nosys` (feature off),
    /// `Inval` (destroyed group, a process of another loop, or a caller
    /// outside every loop once the owner has run: B-128, B-130), `Deadlk` (a callback is in flight), `Range` (charge outside
    /// `1..=resource_capacity`, or handles exhausted), `Again` (full, closed,
    /// driver gone, or cross-loop hand-ins held). Failures after the owner and
    /// callback checks count in `rejections` (B-177).
    pub fn submit(&self, request: R, charge: u64) -> Result<Handle, SubmitError<R>> {
        if let Err(error) = self.sh.check_mutator() {
            return Err(SubmitError { error, request });
        }
        let mut c = self.sh.core.borrow_mut();
        let res = c
            .check_submit(charge)
            .and_then(|()| self.sh.handles.alloc());
        match res {
            Ok(h) => {
                c.enqueue(h, charge, request);
                drop(c);
                self.sh.signal();
                Ok(h)
            }
            Err(error) => {
                c.note_rejection();
                Err(SubmitError { error, request })
            }
        }
    }

    /// `xtc_batch_cancel`: records a cancel consumed at the next boundary
    /// (B-047..B-051, B-093). Harmless twice or after DONE was recorded.
    ///
    /// # Errors
    /// `Inval` for a stale (already notified) or foreign handle, plus the
    /// mutator errors of [`Group::submit`]; `Again` when `h` is a live
    /// `submit_mt` hand-in still on the ring behind one whose producer is
    /// still writing it (retry, B-053). A live hand-in not admitted yet (on
    /// the ring or held) is cancelled and never runs (B-052); one still on
    /// the ring stays there until the driver's next boundary (the cancel is
    /// noted for it, nothing is drained here), so it takes no slot before
    /// then and the driver's wake-up is left alone (B-117).
    ///
    /// A cancel accepted while the member's operation is outstanding is
    /// consumed at that operation's completion boundary: its hint fires and
    /// it ends `Aborted` even if the operation finished first (B-093, B-094).
    pub fn cancel(&self, h: Handle) -> Result<()> {
        self.sh.check_mutator()?;
        let known = self.sh.core.borrow_mut().cancel(h);
        match known {
            // Maybe a live mt hand-in not drained yet (B-052, B-053): `Again` if an
            // earlier one is still being written.
            Err(Error::Inval) => remote::owner_cancel(&self.sh, h)?,
            other => other?,
        }
        self.sh.signal();
        Ok(())
    }

    /// `xtc_batch_resume`: BLOCKED → READY, keeping the charge (B-054..B-057).
    ///
    /// # Errors
    /// `Inval` for a WAITING, terminal, stale or foreign handle, plus the
    /// mutator errors of [`Group::submit`].
    pub fn resume(&self, h: Handle) -> Result<()> {
        self.sh.check_mutator()?;
        self.sh.core.borrow_mut().resume(h)?;
        self.sh.signal();
        Ok(())
    }

    /// `xtc_batch_close`: stops admission; `Cancel` also cancels every
    /// nonterminal member. Idempotent; escalates, never downgrades; always
    /// signals boundary work (B-131..B-135).
    ///
    /// # Errors
    /// The mutator errors of [`Group::submit`].
    pub fn close(&self, mode: CloseMode) -> Result<()> {
        self.sh.check_mutator()?;
        self.sh.core.borrow_mut().close(mode);
        remote::close(&self.sh); // submit_mt answers Again from here on (B-141)
        self.sh.signal();
        Ok(())
    }

    /// `xtc_batch_destroy`: releases the group's class registration and
    /// storage charge (B-147..B-150). Takes `&self`; afterwards every mutator
    /// of every clone returns `Inval` and [`Group::stats`] stays readable.
    ///
    /// Allowed from the owner loop, or from outside any loop after the
    /// executor returned (an externally synchronized quiescent call).
    ///
    /// # Errors
    /// `Inval` when already destroyed or called from another loop; `Deadlk`
    /// while a callback is in flight (B-042); `Again` when the group is not
    /// closed or its driver or finalizer is still in the process table
    /// (B-147, B-148: a flag is not enough).
    pub fn destroy(&self) -> Result<()> {
        feature_gate()?;
        let sh = &self.sh;
        if sh.core.borrow().destroyed {
            return Err(Error::Inval);
        }
        if let Some(cur) = Loop::current()
            && cur.id() != sh.lp.id()
        {
            return Err(Error::Inval);
        }
        let c = sh.core.borrow();
        if c.in_callback > 0 {
            return Err(Error::Deadlk);
        }
        let alive = |p: &Cell<Option<Pid>>| p.get().is_some_and(|p| sh.lp.is_alive(p));
        if c.closed.is_none() || alive(&sh.driver) || alive(&sh.finalizer) {
            return Err(Error::Again);
        }
        drop(c);
        sh.core.borrow_mut().destroyed = true;
        sh.class.borrow_mut().release();
        sh.charge.borrow_mut().take();
        Ok(())
    }

    /// `xtc_batch_get_stats`: a snapshot of committed state, readable at any
    /// time, also during callbacks (B-043, B-172..B-178).
    pub fn stats(&self) -> Stats {
        self.sh.core.borrow().snapshot()
    }

    /// `xtc_batch_get_async_stats` (B-104, B-105): zero on a synchronous group.
    pub fn async_stats(&self) -> AsyncStats {
        let mut a = self.sh.core.borrow().astats;
        remote::add_stats(&self.sh, &mut a);
        a
    }

    /// `xtc_batch_submit_mt` / `_cancel_mt` / `_resume_mt`: a [`Remote`] for
    /// this group, usable from any loop or thread (B-106..B-127).
    ///
    /// # Errors
    /// `Nosys` for a synchronous group or one created with `mt_queue_cap == 0`
    /// (B-107), or without the `sched-policy` feature.
    pub fn remote(&self) -> Result<Remote<R>>
    where
        R: Send,
    {
        feature_gate()?;
        let mt = self.sh.mt.as_ref().ok_or(Error::Nosys)?;
        Ok(mt.borrow().remote())
    }

    /// The driver's process id (for [`Loop::kill`] in tests and supervision).
    pub fn driver_pid(&self) -> Pid {
        self.sh.driver.get().expect("set at create")
    }

    /// The finalizer's process id: parked until the driver ends; finalizes
    /// outstanding work after an unexpected driver exit. Exposed for
    /// supervision and tests; killing it forfeits the exactly-once delivery
    /// that it provides after a driver kill.
    pub fn finalizer_pid(&self) -> Pid {
        self.sh.finalizer.get().expect("set at create")
    }

    /// The loop that owns the group.
    pub fn owner_loop(&self) -> &Loop {
        &self.sh.lp
    }

    /// Test hook for handle exhaustion (B-028): the next handle issued is
    /// `last + 1` (`Range` once `u64::MAX` was issued).
    #[doc(hidden)]
    pub fn debug_set_last_handle(&self, last: u64) {
        self.sh.handles.set_last(last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{Item, StepResult, step_fn};
    use crate::rt::Sim;

    #[test]
    fn class_registration_is_released_by_successful_destroy_only() {
        let sim = Sim::new(1);
        let lp = sim.new_loop();
        let class = lp.new_class(3).unwrap();
        let key = (lp.id(), class.id());
        let step = step_fn(|_: &mut [Item<'_, u32>], r: &mut [StepResult]| {
            r.fill(StepResult::Done);
            Ok(())
        });
        let opts = SyncOpts {
            capacity: 2,
            max_active: 1,
            resource_capacity: 1,
            sched_class: Some(class),
        };
        let g = Group::create(&lp, opts, step, |_: Handle, _: u32, _: Result<()>| {}).unwrap();
        assert!(classes().contains(&key));
        g.close(CloseMode::Drain).unwrap();
        assert_eq!(g.destroy(), Err(Error::Again));
        assert!(
            classes().contains(&key),
            "a failed destroy keeps the registration"
        );
        sim.run_until_idle().unwrap();
        g.destroy().unwrap();
        assert!(
            !classes().contains(&key),
            "released by the successful destroy"
        );
    }
}
