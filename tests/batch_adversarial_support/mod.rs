//! Helpers shared by the breaker's adversarial batch tests: scripted
//! callbacks (sync step, async submit/collect/hint, completion) that record
//! what the engine handed them and can suspend on demand, peer processes, and
//! a per-thread counting allocator.
//!
//! # Safety
//! The one `unsafe` item is the counting `GlobalAlloc`: it forwards each call
//! unchanged to `std::alloc::System` and only bumps a const-initialized
//! thread-local counter (no allocation, no reentrancy).
#![allow(dead_code)] // each test binary uses a subset

pub mod mt;
#[path = "../batch_support/opts.rs"]
mod opts;

#[allow(unused_imports)] // each test binary uses a subset
pub use opts::{async_opts, sync_opts};

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use xtc::Error;
use xtc::batch::{
    AsyncOpts, AsyncStep, CloseMode, Complete, Exec, ExecStatus, Group, Handle, Item, Step,
    StepResult, SyncOpts,
};
use xtc::rt::{self, Loop, Promise, Sim};

/// Counts heap allocations per thread, so a test can check that a window of
/// engine code allocates nothing (B-017: all storage allocated at create).
struct CountingAlloc;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call unchanged to the system allocator; the counter
// is a const-initialized thread-local `Cell` that never allocates.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same layout contract as the caller's.
        unsafe { std::alloc::System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        // SAFETY: `p` came from `alloc` above with layout `l`.
        unsafe { std::alloc::System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, n: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: as the caller's contract.
        unsafe { std::alloc::System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

pub fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// A request: an id and how many iterations it still needs before DONE.
#[derive(Debug)]
pub struct Rq {
    pub id: u32,
    pub left: u32,
}

pub fn rq(id: u32, left: u32) -> Rq {
    Rq { id, left }
}

/// How an asynchronous submit launches its operation.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Kind {
    Inline,
    Future,
    Blocking,
    /// A fence the readiness path refuses (a regular file): run on a real
    /// loop (under `Sim` every fence is `Nosys`, B-070).
    BadFence,
}

/// Knobs and observations shared by the scripted callbacks and the test.
#[derive(Default)]
pub struct Ctl {
    /// Yields inside each step (sync) or collect (async).
    pub yields_step: Cell<u32>,
    /// Yields inside each async submit.
    pub yields_submit: Cell<u32>,
    /// Yields inside each completion.
    pub yields_complete: Cell<u32>,
    /// Yields inside each cancel hint.
    pub yields_hint: Cell<u32>,
    /// The callback currently suspended ("" when none).
    pub in_cb: Cell<&'static str>,
    /// Ready vectors handed to step / submit.
    pub vectors: RefCell<Vec<Vec<Handle>>>,
    /// Vectors and statuses handed to collect.
    pub collects: RefCell<Vec<(Vec<Handle>, ExecStatus)>>,
    pub hints: RefCell<Vec<Handle>>,
    pub promises: RefCell<Vec<Promise<()>>>,
    /// Result words forced per handle (instead of the countdown), consumed.
    pub script: RefCell<HashMap<Handle, Vec<StepResult>>>,
    /// Completion invocations started (handle).
    pub started: RefCell<Vec<Handle>>,
    /// Completions that returned: handle, request id, outcome.
    pub done: RefCell<Vec<(Handle, u32, xtc::Result<()>)>>,
    pub kind: Cell<Option<Kind>>,
    /// BLOCKING closures wait for this gate.
    pub gate: RefCell<Option<crossbeam_channel::Receiver<()>>>,
    /// Set by a BLOCKING closure when it started.
    pub ran: RefCell<Option<crossbeam_channel::Sender<()>>>,
    /// Step calls after which a non-yielding step gives up (livelock guard).
    pub give_up_after: Cell<u64>,
    pub calls: Cell<u64>,
    /// Loop clock at each submit / collect entry (ns).
    pub times: RefCell<Vec<(&'static str, u64)>>,
}

pub type C = Rc<Ctl>;

/// Clears `Ctl::in_cb` when a suspended callback returns or is dropped.
struct Reset<'a>(&'a Cell<&'static str>);

impl Drop for Reset<'_> {
    fn drop(&mut self) {
        self.0.set("");
    }
}

/// Yields inside a suspended callback: enough for a peer to observe it.
pub const Y: u32 = 20;

impl Ctl {
    pub async fn suspend(&self, what: &'static str, n: u32) {
        if n == 0 {
            return;
        }
        self.in_cb.set(what);
        let _reset = Reset(&self.in_cb); // also when a kill drops the callback
        for _ in 0..n {
            rt::yield_now().await;
        }
    }

    /// Countdown unless the script says otherwise for a handle.
    pub fn fill(&self, items: &mut [Item<'_, Rq>], res: &mut [StepResult]) {
        self.calls.set(self.calls.get() + 1);
        let give_up = self.give_up_after.get() != 0 && self.calls.get() >= self.give_up_after.get();
        for (it, r) in items.iter_mut().zip(res.iter_mut()) {
            let forced = self
                .script
                .borrow_mut()
                .get_mut(&it.handle)
                .and_then(|v| (!v.is_empty()).then(|| v.remove(0)));
            *r = if give_up {
                StepResult::Done
            } else if let Some(f) = forced {
                f
            } else {
                it.request.left = it.request.left.saturating_sub(1);
                if it.request.left == 0 {
                    StepResult::Done
                } else {
                    StepResult::Continue
                }
            };
        }
    }

    pub fn script(&self, h: Handle, words: &[StepResult]) {
        self.script.borrow_mut().insert(h, words.to_vec());
    }

    pub fn invocations(&self, h: Handle) -> usize {
        self.started.borrow().iter().filter(|x| **x == h).count()
    }

    pub fn outcome(&self, h: Handle) -> Vec<xtc::Result<()>> {
        let d = self.done.borrow();
        d.iter().filter(|x| x.0 == h).map(|x| x.2).collect()
    }

    pub fn in_vectors(&self, h: Handle) -> usize {
        self.vectors
            .borrow()
            .iter()
            .filter(|v| v.contains(&h))
            .count()
    }
}

pub struct S(pub C);

impl Step<Rq> for S {
    async fn step(
        &mut self,
        items: &mut [Item<'_, Rq>],
        res: &mut [StepResult],
    ) -> xtc::Result<()> {
        assert!(res.iter().all(|r| *r == StepResult::Unset), "B-033");
        self.0.vectors.borrow_mut().push(handles(items));
        // Write the words first, then suspend: peers must not see them.
        self.0.fill(items, res);
        self.0.suspend("step", self.0.yields_step.get()).await;
        Ok(())
    }
}

pub struct Fin(pub C);

impl Complete<Rq> for Fin {
    async fn complete(&mut self, h: Handle, r: Rq, o: xtc::Result<()>) {
        self.0.started.borrow_mut().push(h);
        self.0
            .suspend("complete", self.0.yields_complete.get())
            .await;
        self.0.done.borrow_mut().push((h, r.id, o));
    }
}

pub struct A(pub C);

impl AsyncStep<Rq> for A {
    async fn submit(&mut self, items: &mut [Item<'_, Rq>]) -> xtc::Result<Exec> {
        self.0.vectors.borrow_mut().push(handles(items));
        self.0
            .times
            .borrow_mut()
            .push(("submit", rt::now().as_nanos()));
        self.0.suspend("submit", self.0.yields_submit.get()).await;
        Ok(match self.0.kind.get().expect("kind set") {
            Kind::Inline => Exec::Inline,
            // A regular file: the loop's readiness registration refuses
            // it (`EPERM` → `Inval`, B-069); only a real loop gets that far.
            Kind::BadFence => Exec::Fence(Rc::new(tempfile::tempfile().unwrap())),
            Kind::Future => {
                let (f, p) = rt::future_pair();
                self.0.promises.borrow_mut().push(p);
                Exec::Future(f)
            }
            Kind::Blocking => {
                let rx = self.0.gate.borrow().clone().expect("gate");
                let ran = self.0.ran.borrow().clone().expect("ran");
                Exec::Blocking(Box::new(move || {
                    let _ = ran.send(());
                    rx.recv().map_err(|_| Error::Internal)
                }))
            }
        })
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, Rq>],
        res: &mut [StepResult],
        status: ExecStatus,
    ) -> xtc::Result<()> {
        assert!(res.iter().all(|r| *r == StepResult::Unset), "B-033");
        self.0.collects.borrow_mut().push((handles(items), status));
        self.0
            .times
            .borrow_mut()
            .push(("collect", rt::now().as_nanos()));
        self.0.fill(items, res);
        self.0.suspend("collect", self.0.yields_step.get()).await;
        Ok(())
    }

    async fn cancel_hint(&mut self, h: Handle) {
        self.0.hints.borrow_mut().push(h);
        self.0.suspend("hint", self.0.yields_hint.get()).await;
    }
}

pub fn handles(items: &[Item<'_, Rq>]) -> Vec<Handle> {
    items.iter().map(|i| i.handle).collect()
}

pub fn sync_group(lp: &Loop, o: SyncOpts) -> (Group<Rq>, C) {
    let c = C::default();
    let g = Group::create(lp, o, S(c.clone()), Fin(c.clone())).unwrap();
    (g, c)
}

pub fn async_group(lp: &Loop, o: AsyncOpts, kind: Kind) -> (Group<Rq>, C) {
    let c = C::default();
    c.kind.set(Some(kind));
    let g = Group::create_async(lp, o, A(c.clone()), Fin(c.clone())).unwrap();
    (g, c)
}

/// Spawns a process on `lp` that waits (yielding) until `cond` holds, then
/// runs `f`. Panics (failing the test) if the condition never holds.
pub fn when(lp: &Loop, cond: impl Fn() -> bool + 'static, f: impl FnOnce() + 'static) {
    lp.spawn(async move {
        for _ in 0..200_000 {
            if cond() {
                f();
                return;
            }
            rt::yield_now().await;
        }
        panic!("peer condition never held");
    })
    .unwrap();
}

/// Yields `n` times (a peer letting the driver run).
pub async fn yields(n: u32) {
    for _ in 0..n {
        rt::yield_now().await;
    }
}

pub fn run(sim: &Sim) {
    if let Err(stall) = sim.run_until_idle() {
        panic!("sim stalled: {stall}");
    }
}

/// Steps a Sim whose BLOCKING closures run on pool threads until `lp` is empty.
pub fn run_with_pool(sim: &Sim, lp: &Loop) {
    for _ in 0..50_000_000u64 {
        while sim.step() {}
        if lp.n_procs() == 0 {
            return;
        }
        std::thread::yield_now();
    }
    panic!("loop never emptied");
}

/// Every mutator, as a peer would call it; destroy included (B-042).
pub fn probe(g: &Group<Rq>, h: Handle) -> Vec<xtc::Result<()>> {
    vec![
        g.submit(rq(999, 1), 1).map(|_| ()).map_err(|e| e.error),
        g.cancel(h),
        g.resume(h),
        g.close(CloseMode::Cancel),
        g.destroy(),
    ]
}

pub fn all_deadlk(v: &[xtc::Result<()>]) -> bool {
    v.iter().all(|r| *r == Err(Error::Deadlk))
}

pub fn close_later(lp: &Loop, g: &Group<Rq>, mode: CloseMode, cond: impl Fn() -> bool + 'static) {
    let g = g.clone();
    lp.spawn(async move {
        while !cond() {
            rt::yield_now().await;
        }
        while g.close(mode).is_err() {
            rt::yield_now().await;
        }
    })
    .unwrap();
}

/// Kills the driver once `cond` holds (checked by a peer each turn).
pub fn kill_when(lp: &Loop, g: &Group<Rq>, cond: impl Fn() -> bool + 'static) {
    let g2 = g.clone();
    when(lp, cond, move || {
        g2.owner_loop().kill(g2.driver_pid()).unwrap()
    });
}

pub fn hs_first(c: &Ctl) -> Handle {
    c.vectors.borrow()[0][0]
}
