//! [`Loop`]: the single-threaded executor of processes.
//!
//! A loop is an `Rc` handle (`!Send`): its process table, ready set, timers and
//! epoll registrations are touched only by the thread that runs it. Other
//! threads reach it only through wakers, which push into the loop's inbox
//! (see `proc_table`). A real loop and a [`Sim`](super::Sim) loop are the same
//! type; the backend decides where time comes from and how the loop waits.
//!
//! One turn of a real loop: move the inbox into the ready set, fire due timers,
//! run as many processes as were ready at the start of the turn (each pick
//! sees the processes woken so far), then (only if
//! nothing is ready) park in `epoll_wait` until the nearest timer, an fd event
//! or an eventfd wake.

use super::budget::{Budget, Charge};
use super::class::{ReadySet, SchedClass};
use super::io::Poller;
use super::proc_table::{
    Inbox, LocalSaved, ProcMeta, ProcRunnable, ProcTable, local_enter, local_exit,
};
use super::sim::{SimCore, TraceKind};
use super::timer::Timers;
use super::{Instant, LoopId, Pid};
use crate::{Error, Result};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::marker::PhantomData;
use std::rc::{Rc, Weak};
use std::sync::{Arc, OnceLock};

/// Bytes charged to the loop's [`Budget`] per process, on top of the future's size.
pub(crate) const PROC_OVERHEAD: u64 = 128;
/// Longest single `epoll_wait` (~24.8 days, the largest millisecond timeout
/// plain `epoll_pwait` takes; kernels before 5.11 lack `epoll_pwait2`). A
/// farther deadline just parks again.
const MAX_PARK: std::time::Duration = std::time::Duration::from_millis(i32::MAX as u64);
/// Bytes charged per scheduling class.
pub(crate) const CLASS_COST: u64 = 64;

thread_local! {
    /// The loop whose process is being polled on this thread (rt rule: a thread
    /// identity is not a loop identity, so this is set per run / per Sim step).
    static CURRENT: RefCell<Option<Loop>> = const { RefCell::new(None) };
}

/// Makes a loop current for its lifetime (and owner of the thread-local wake
/// queue); restores the previous one on drop, moving the wakes still queued
/// locally into the loop's ready set.
pub(crate) struct CurrentGuard {
    lp: Loop,
    prev: Option<Loop>,
    prev_local: Option<LocalSaved>,
}

impl CurrentGuard {
    pub(crate) fn enter(lp: &Loop) -> CurrentGuard {
        let prev = CURRENT.with(|c| c.replace(Some(lp.clone())));
        let buf = std::mem::take(&mut *lp.inner.local_buf.borrow_mut());
        let prev_local = Some(local_enter(&lp.inner.inbox, buf));
        CurrentGuard {
            lp: lp.clone(),
            prev,
            prev_local,
        }
    }
}

impl Drop for CurrentGuard {
    fn drop(&mut self) {
        let mut left = local_exit(self.prev_local.take().unwrap_or_default());
        if !left.is_empty() {
            match self.lp.inner.ready.try_borrow_mut() {
                Ok(mut ready) => left.drain(..).for_each(|r| ready.push(r)),
                // Never drop a wake: the inbox takes it (the local queue has
                // its previous owner back, so this is the locked path).
                Err(_) => left.drain(..).for_each(|r| self.lp.inner.inbox.push(r)),
            }
        }
        // Keep the (now empty) buffer for the next time the loop is current.
        if let Ok(mut keep) = self.lp.inner.local_buf.try_borrow_mut()
            && keep.capacity() < left.capacity()
        {
            *keep = left;
        }
        let prev = self.prev.take();
        let _ = CURRENT.try_with(|c| c.replace(prev));
    }
}

pub(crate) enum Backend {
    Real(Poller),
    Sim { core: Rc<SimCore>, idx: usize },
}

pub(crate) struct LoopInner {
    pub(crate) id: LoopId,
    pub(crate) inbox: Arc<Inbox>,
    pub(crate) procs: RefCell<ProcTable>,
    pub(crate) ready: RefCell<ReadySet>,
    pub(crate) timers: RefCell<Timers>,
    backend: Backend,
    budget: Budget,
    has_run: Cell<bool>,
    stopped: Cell<bool>,
    /// Spare buffer swapped with the inbox's queue.
    spare: RefCell<Vec<ProcRunnable>>,
    /// The thread-local wake queue's buffer while the loop is not current
    /// (kept so that a same-loop wake allocates nothing in steady state).
    local_buf: RefCell<Vec<ProcRunnable>>,
    /// Sequence number of the process being polled.
    polling: Cell<Option<u64>>,
    /// The charges of the loop's scheduling classes: a class lives as long as
    /// the loop, and its bytes return to the budget when the loop is dropped.
    class_charges: RefCell<Vec<Charge>>,
}

impl LoopInner {
    pub(crate) fn poller(&self) -> Option<&Poller> {
        match &self.backend {
            Backend::Real(p) => Some(p),
            Backend::Sim { .. } => None,
        }
    }

    pub(crate) fn sim(&self) -> Option<(&Rc<SimCore>, usize)> {
        match &self.backend {
            Backend::Real(_) => None,
            Backend::Sim { core, idx } => Some((core, *idx)),
        }
    }
}

/// A single-threaded executor of processes (`xtc_loop_t`).
///
/// Cheap to clone (an `Rc` handle); `!Send`: a loop lives on the thread that
/// created it. See the [module docs](super) for the kill and current-loop rules.
///
/// The compiler refuses to move a loop to another thread:
///
/// ```compile_fail,E0277
/// fn needs_send<T: Send>(_: T) {}
/// needs_send(xtc::rt::Loop::new().unwrap());
/// ```
#[derive(Clone)]
pub struct Loop {
    inner: Rc<LoopInner>,
    _not_send: PhantomData<Rc<()>>,
}

impl std::fmt::Debug for Loop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loop")
            .field("id", &self.inner.id)
            .field("sim", &self.is_sim())
            .field("n_procs", &self.n_procs())
            .finish()
    }
}

/// Process-wide origin of real loops' clocks.
fn epoch() -> std::time::Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

impl Loop {
    /// A real loop: epoll instance, eventfd waker, unlimited budget.
    ///
    /// # Errors
    /// `Internal` when the kernel refuses epoll or eventfd (fd exhaustion).
    pub fn new() -> Result<Loop> {
        Loop::with_budget(u64::MAX)
    }

    /// A real loop whose resource accountant allows `bytes` (see [`Budget`]).
    ///
    /// # Errors
    /// As [`Loop::new`].
    pub fn with_budget(bytes: u64) -> Result<Loop> {
        let (poller, wake) = Poller::new()?;
        Ok(Loop::build(Backend::Real(poller), Some(wake), bytes))
    }

    pub(crate) fn new_sim(core: Rc<SimCore>, idx: usize, bytes: u64) -> Loop {
        Loop::build(Backend::Sim { core, idx }, None, bytes)
    }

    fn build(backend: Backend, wake: Option<rustix::fd::OwnedFd>, bytes: u64) -> Loop {
        Loop {
            inner: Rc::new(LoopInner {
                id: LoopId::fresh(),
                inbox: Arc::new(Inbox::new(wake)),
                procs: RefCell::new(ProcTable::default()),
                ready: RefCell::new(ReadySet::new()),
                timers: RefCell::new(Timers::default()),
                backend,
                budget: Budget::new(bytes),
                has_run: Cell::new(false),
                stopped: Cell::new(false),
                spare: RefCell::new(Vec::new()),
                local_buf: RefCell::new(Vec::new()),
                polling: Cell::new(None),
                class_charges: RefCell::new(Vec::new()),
            }),
            _not_send: PhantomData,
        }
    }

    pub(crate) fn inner(&self) -> &LoopInner {
        &self.inner
    }

    pub(crate) fn weak(&self) -> Weak<LoopInner> {
        Rc::downgrade(&self.inner)
    }

    /// The loop whose process is being polled on this thread (set by
    /// [`Loop::run`] and by each [`Sim::step`](super::Sim::step)); `None`
    /// outside. Under `Sim` several loops share a thread: this names the loop,
    /// not the thread.
    pub fn current() -> Option<Loop> {
        CURRENT.try_with(|c| c.borrow().clone()).ok().flatten()
    }

    /// The pid of the process this loop is polling (`None` between polls).
    pub fn polling(&self) -> Option<Pid> {
        self.inner.polling.get().map(|s| Pid::new(self.id(), s))
    }

    /// This loop's process-wide unique id.
    pub fn id(&self) -> LoopId {
        self.inner.id
    }

    /// Whether this loop belongs to a [`Sim`](super::Sim).
    pub fn is_sim(&self) -> bool {
        self.inner.sim().is_some()
    }

    /// The loop's resource accountant.
    pub fn budget(&self) -> &Budget {
        &self.inner.budget
    }

    /// Whether the loop has run: set by the first [`run`](Loop::run), or by the
    /// first [`Sim::step`](super::Sim::step) that polls one of its processes
    /// (rt rule "create only before the loop's first run or simulation step").
    pub fn has_run(&self) -> bool {
        self.inner.has_run.get()
    }

    pub(crate) fn mark_run(&self) {
        self.inner.has_run.set(true);
    }

    /// The loop's clock: monotonic real time for a real loop (never read by a
    /// `Sim` loop), the virtual clock for a `Sim` loop.
    pub fn now(&self) -> Instant {
        match self.inner.sim() {
            Some((core, _)) => core.now(),
            None => {
                let ns = epoch().elapsed().as_nanos();
                Instant(u64::try_from(ns).unwrap_or(u64::MAX))
            }
        }
    }

    /// Fds registered for readiness on this loop (0 for a `Sim` loop);
    /// diagnostics: a dropped or killed waiter leaves no registration behind.
    pub fn n_fds(&self) -> usize {
        self.inner.poller().map_or(0, Poller::n_fds)
    }

    /// Processes in the table (killed ones count until their future is dropped).
    pub fn n_procs(&self) -> usize {
        self.inner.procs.borrow().len()
    }

    /// Whether `pid` is still in this loop's process table (false for a pid of
    /// another loop).
    pub fn is_alive(&self, pid: Pid) -> bool {
        pid.loop_id() == self.id() && self.inner.procs.borrow().contains(pid.seq())
    }

    /// Spawns a process in the loop's default class.
    ///
    /// The process first runs on the loop's next turn (never inside `spawn`).
    ///
    /// # Errors
    /// `Again` while the loop is stopped ([`stop`](Loop::stop) until the next
    /// [`run`](Loop::run)); `Nomem` when the budget refuses the process's
    /// charge (size of `f` + 128 bytes). Nothing is spawned on error.
    pub fn spawn<F: Future<Output = ()> + 'static>(&self, f: F) -> Result<Pid> {
        self.spawn_class(0, f)
    }

    /// Spawns a process into scheduling class `class` (see [`SchedClass`]).
    ///
    /// # Errors
    /// `Inval` when `class` belongs to another loop; otherwise as [`spawn`](Loop::spawn).
    pub fn spawn_in<F: Future<Output = ()> + 'static>(
        &self,
        class: &SchedClass,
        f: F,
    ) -> Result<Pid> {
        if class.loop_id() != self.id() {
            return Err(Error::Inval);
        }
        self.spawn_class(class.id(), f)
    }

    /// Spawns two processes into one class as a unit: both or neither (a
    /// batch group's driver and its finalizer, B-017). Both charges are taken
    /// before either process exists, so on error the table and the budget are
    /// as before and both futures have been dropped. `a` gets the lower pid
    /// and is scheduled first; `None` is the default class.
    ///
    /// # Errors
    /// `Inval` when `class` belongs to another loop; `Again` while the loop is
    /// stopped; `Nomem` when the budget refuses either charge.
    pub fn spawn_pair<A, B>(&self, class: Option<&SchedClass>, a: A, b: B) -> Result<(Pid, Pid)>
    where
        A: Future<Output = ()> + 'static,
        B: Future<Output = ()> + 'static,
    {
        let class = match class {
            None => 0,
            Some(c) if c.loop_id() == self.id() => c.id(),
            Some(_) => return Err(Error::Inval),
        };
        let charge_a = self.reserve::<A>()?;
        let charge_b = self.reserve::<B>()?;
        let pa = self.spawn_charged(class, a, charge_a);
        let pb = self.spawn_charged(class, b, charge_b);
        Ok((pa, pb))
    }

    fn spawn_class<F: Future<Output = ()> + 'static>(&self, class: u32, f: F) -> Result<Pid> {
        let charge = self.reserve::<F>()?;
        Ok(self.spawn_charged(class, f, charge))
    }

    /// The charge of a process running `F` (`Again` while stopped).
    fn reserve<F>(&self) -> Result<Charge> {
        if self.inner.stopped.get() {
            return Err(Error::Again);
        }
        let cost = PROC_OVERHEAD + std::mem::size_of::<F>() as u64;
        self.inner.budget.charge(cost)
    }

    /// Spawns `f` holding `charge` (infallible once charged).
    fn spawn_charged<F: Future<Output = ()> + 'static>(
        &self,
        class: u32,
        f: F,
        charge: Charge,
    ) -> Pid {
        let seq = self.inner.procs.borrow_mut().next_seq();
        let inbox = self.inner.inbox.clone();
        let table = self.weak();
        let fut = async move {
            let _charge = charge;
            f.await;
            if let Some(lp) = table.upgrade() {
                lp.procs.borrow_mut().note_finished(seq);
            }
        };
        let (runnable, task) = async_task::Builder::new()
            .metadata(ProcMeta { seq, class })
            .spawn_local(move |_| fut, move |r| inbox.push(r));
        self.inner.procs.borrow_mut().insert(seq, task);
        self.trace(TraceKind::Spawn, seq);
        runnable.schedule();
        Pid::new(self.id(), seq)
    }

    /// Kills `pid`: its future is dropped at its next suspension point (a
    /// parked process is woken to die; a process killing itself dies when its
    /// current poll returns). Its `Drop` guards (exit hooks) run exactly once,
    /// on this loop, with [`Loop::current`] set; they may spawn processes.
    /// Killing a process already killed but not yet dropped is `Ok`.
    ///
    /// # Errors
    /// `Inval` for a pid of another loop, or one no longer in the table.
    pub fn kill(&self, pid: Pid) -> Result<()> {
        if pid.loop_id() != self.id() {
            return Err(Error::Inval);
        }
        let taken = self.inner.procs.borrow_mut().take_for_kill(pid.seq());
        match taken {
            None => Err(Error::Inval),
            Some(task) => {
                // Dropping the handle closes the cell; an idle cell is
                // scheduled so the loop drops its future on its next turn.
                drop(task);
                self.trace(TraceKind::Kill, pid.seq());
                Ok(())
            }
        }
    }

    /// Creates a scheduling class of this loop with relative `weight`.
    ///
    /// # Errors
    /// `Inval` for weight 0; `Nomem` when the budget refuses 64 bytes.
    pub fn new_class(&self, weight: u32) -> Result<SchedClass> {
        if weight == 0 {
            return Err(Error::Inval);
        }
        // The class lives as long as the loop: so does its charge.
        let charge = self.inner.budget.charge(CLASS_COST)?;
        self.inner.class_charges.borrow_mut().push(charge);
        let idx = self.inner.ready.borrow_mut().add_class(weight);
        Ok(SchedClass::new(self.id(), idx, weight))
    }

    /// Asks [`run`](Loop::run) to return at its next turn. Processes stay in
    /// the table; [`spawn`](Loop::spawn) is refused (`Again`) until the next
    /// `run`, which resumes the loop.
    pub fn stop(&self) {
        self.inner.stopped.set(true);
    }

    /// Whether the loop is stopped (see [`stop`](Loop::stop)).
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.get()
    }

    /// Runs the loop until no process remains or [`stop`](Loop::stop) is called.
    ///
    /// # Errors
    /// `Inval` when called from inside a running loop or a `Sim` step (this
    /// one or another), or on a `Sim` loop (use [`Sim::step`](super::Sim::step));
    /// `Internal` if `epoll_wait` fails.
    pub fn run(&self) -> Result<()> {
        if Loop::current().is_some() {
            return Err(Error::Inval);
        }
        let Some(poller) = self.inner.poller() else {
            return Err(Error::Inval);
        };
        self.inner.stopped.set(false);
        self.mark_run();
        let _current = CurrentGuard::enter(self);
        self.run_turns(poller)
    }

    fn run_turns(&self, poller: &Poller) -> Result<()> {
        loop {
            self.drain_inbox();
            self.fire_due_timers();
            if self.inner.stopped.get() {
                return Ok(());
            }
            let n = self.inner.ready.borrow().len();
            if n == 0 {
                if self.n_procs() == 0 {
                    return Ok(());
                }
                self.park(poller)?;
                continue;
            }
            for i in 0..n {
                // Processes woken by the previous one compete for this pick,
                // so class weights hold even for processes that just yielded.
                if i > 0 {
                    self.drain_inbox();
                }
                let Some(r) = self.inner.ready.borrow_mut().pop() else {
                    break;
                };
                self.run_one(r);
                if self.inner.stopped.get() {
                    break;
                }
            }
            if poller.has_fds() {
                poller.wait(Some(std::time::Duration::ZERO), None)?;
            }
        }
    }

    /// Parks in `epoll_wait` until the nearest timer, an fd event or a wake.
    fn park(&self, poller: &Poller) -> Result<()> {
        let timeout = self
            .inner
            .timers
            .borrow()
            .next_deadline()
            .map(|d| d.saturating_duration_since(self.now()).min(MAX_PARK));
        if !self.inner.inbox.try_park() {
            return Ok(());
        }
        let res = poller.wait(timeout, self.inner.inbox.wake_fd());
        self.inner.inbox.unpark();
        res
    }

    /// Moves woken processes from the inbox into the ready set.
    pub(crate) fn drain_inbox(&self) {
        let mut buf = self.inner.spare.borrow_mut();
        self.inner.inbox.drain_into(&mut buf);
        if buf.is_empty() {
            return;
        }
        let mut ready = self.inner.ready.borrow_mut();
        for r in buf.drain(..) {
            ready.push(r);
        }
    }

    /// Real loop: fires due timers, reading the clock only if a timer is armed.
    fn fire_due_timers(&self) {
        let next = self.inner.timers.borrow().next_deadline();
        if let Some(next) = next
            && next <= self.now()
        {
            self.fire_timers(self.now());
        }
    }

    /// Wakes every timer due at `now` (in deadline order).
    pub(crate) fn fire_timers(&self, now: Instant) {
        let due = self.inner.timers.borrow_mut().take_due(now);
        if due.is_empty() {
            return;
        }
        due.into_iter().for_each(|w| w.wake());
        self.drain_inbox();
    }

    /// Runs one process (poll, or drop if killed) and reaps it if its future is gone.
    pub(crate) fn run_one(&self, r: ProcRunnable) {
        let seq = r.metadata().seq;
        self.trace(TraceKind::Poll, seq);
        let outer = self.inner.polling.replace(Some(seq));
        r.run();
        self.inner.polling.set(outer);
        let gone = self.inner.procs.borrow_mut().reap_after_run(seq);
        for (seq, task) in gone {
            drop(task);
            self.trace(TraceKind::Exit, seq);
        }
    }

    fn trace(&self, kind: TraceKind, seq: u64) {
        if let Some((core, idx)) = self.inner.sim() {
            core.record(kind, idx, seq);
        }
    }

    /// Pids in the table, ascending (stall reports).
    pub(crate) fn pids(&self) -> Vec<Pid> {
        let seqs = self.inner.procs.borrow().seqs();
        seqs.into_iter().map(|s| Pid::new(self.id(), s)).collect()
    }
}

impl Drop for LoopInner {
    /// Teardown: closes every cell and drops every queued runnable, which
    /// drops the futures (exit hooks run here, with no current loop).
    fn drop(&mut self) {
        let tasks = self.procs.get_mut().drain();
        drop(tasks);
        let wakers = self.timers.get_mut().clear();
        drop(wakers);
        loop {
            let mut buf = Vec::new();
            self.inbox.drain_into(&mut buf);
            buf.extend(self.ready.get_mut().drain_all());
            if buf.is_empty() {
                break;
            }
            drop(buf);
        }
    }
}
