//! Adversarial tests of the batch engine against xtc_batch(3).
//!
//! Each test is named for the clause (B-NNN, see `spec/clauses.md`) it
//! attacks. They target the corners most likely to be wrong: peers running
//! while a callback is suspended, kills at every suspension point, teardown,
//! FCFS with a large charge at the head, the asynchronous status rules.
//! A failing test here is a bug found (reported by the breaker); none is
//! ignored. Everything runs under `rt::Sim` except the BLOCKING cases, whose
//! closures run on real pool threads.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

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

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// A request: an id and how many iterations it still needs before DONE.
#[derive(Debug)]
struct Rq {
    id: u32,
    left: u32,
}

fn rq(id: u32, left: u32) -> Rq {
    Rq { id, left }
}

/// How an asynchronous submit launches its operation.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Inline,
    Future,
    Blocking,
    BadFence,
}

/// Knobs and observations shared by the scripted callbacks and the test.
#[derive(Default)]
struct Ctl {
    /// Yields inside each step (sync) or collect (async).
    yields_step: Cell<u32>,
    /// Yields inside each async submit.
    yields_submit: Cell<u32>,
    /// Yields inside each completion.
    yields_complete: Cell<u32>,
    /// Yields inside each cancel hint.
    yields_hint: Cell<u32>,
    /// The callback currently suspended ("" when none).
    in_cb: Cell<&'static str>,
    /// Ready vectors handed to step / submit.
    vectors: RefCell<Vec<Vec<Handle>>>,
    /// Vectors and statuses handed to collect.
    collects: RefCell<Vec<(Vec<Handle>, ExecStatus)>>,
    hints: RefCell<Vec<Handle>>,
    promises: RefCell<Vec<Promise<()>>>,
    /// Result words forced per handle (instead of the countdown), consumed.
    script: RefCell<HashMap<Handle, Vec<StepResult>>>,
    /// Completion invocations started (handle).
    started: RefCell<Vec<Handle>>,
    /// Completions that returned: handle, request id, outcome.
    done: RefCell<Vec<(Handle, u32, xtc::Result<()>)>>,
    kind: Cell<Option<Kind>>,
    /// BLOCKING closures wait for this gate.
    gate: RefCell<Option<crossbeam_channel::Receiver<()>>>,
    /// Set by a BLOCKING closure when it started.
    ran: RefCell<Option<crossbeam_channel::Sender<()>>>,
    /// Step calls after which a non-yielding step gives up (livelock guard).
    give_up_after: Cell<u64>,
    calls: Cell<u64>,
    /// Loop clock at each submit / collect entry (ns).
    times: RefCell<Vec<(&'static str, u64)>>,
}

type C = Rc<Ctl>;

/// Clears `Ctl::in_cb` when a suspended callback returns or is dropped.
struct Reset<'a>(&'a Cell<&'static str>);

impl Drop for Reset<'_> {
    fn drop(&mut self) {
        self.0.set("");
    }
}

/// Yields inside a suspended callback: enough for a peer to observe it.
const Y: u32 = 20;

impl Ctl {
    async fn suspend(&self, what: &'static str, n: u32) {
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
    fn fill(&self, items: &mut [Item<'_, Rq>], res: &mut [StepResult]) {
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

    fn script(&self, h: Handle, words: &[StepResult]) {
        self.script.borrow_mut().insert(h, words.to_vec());
    }

    fn invocations(&self, h: Handle) -> usize {
        self.started.borrow().iter().filter(|x| **x == h).count()
    }

    fn outcome(&self, h: Handle) -> Vec<xtc::Result<()>> {
        let d = self.done.borrow();
        d.iter().filter(|x| x.0 == h).map(|x| x.2).collect()
    }

    fn in_vectors(&self, h: Handle) -> usize {
        self.vectors
            .borrow()
            .iter()
            .filter(|v| v.contains(&h))
            .count()
    }
}

struct S(C);

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

struct Fin(C);

impl Complete<Rq> for Fin {
    async fn complete(&mut self, h: Handle, r: Rq, o: xtc::Result<()>) {
        self.0.started.borrow_mut().push(h);
        self.0
            .suspend("complete", self.0.yields_complete.get())
            .await;
        self.0.done.borrow_mut().push((h, r.id, o));
    }
}

struct A(C);

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
            Kind::BadFence => Exec::Fence(-1),
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

fn handles(items: &[Item<'_, Rq>]) -> Vec<Handle> {
    items.iter().map(|i| i.handle).collect()
}

fn sync_opts(capacity: usize, max_active: usize, units: u64) -> SyncOpts {
    SyncOpts {
        capacity,
        max_active,
        resource_capacity: units,
        sched_class: None,
    }
}

fn async_opts(capacity: usize, max_active: usize, timeout: Option<Duration>) -> AsyncOpts {
    AsyncOpts {
        capacity,
        max_active,
        resource_capacity: 100,
        exec_timeout: timeout,
        sched_class: None,
        mt_queue_cap: 0,
    }
}

fn sync_group(lp: &Loop, o: SyncOpts) -> (Group<Rq>, C) {
    let c = C::default();
    let g = Group::create(lp, o, S(c.clone()), Fin(c.clone())).unwrap();
    (g, c)
}

fn async_group(lp: &Loop, o: AsyncOpts, kind: Kind) -> (Group<Rq>, C) {
    let c = C::default();
    c.kind.set(Some(kind));
    let g = Group::create_async(lp, o, A(c.clone()), Fin(c.clone())).unwrap();
    (g, c)
}

/// Spawns a process on `lp` that waits (yielding) until `cond` holds, then
/// runs `f`. Panics (failing the test) if the condition never holds.
fn when(lp: &Loop, cond: impl Fn() -> bool + 'static, f: impl FnOnce() + 'static) {
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
async fn yields(n: u32) {
    for _ in 0..n {
        rt::yield_now().await;
    }
}

fn run(sim: &Sim) {
    if let Err(stall) = sim.run_until_idle() {
        panic!("sim stalled: {stall}");
    }
}

/// Steps a Sim whose BLOCKING closures run on pool threads until `lp` is empty.
fn run_with_pool(sim: &Sim, lp: &Loop) {
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
fn probe(g: &Group<Rq>, h: Handle) -> Vec<xtc::Result<()>> {
    vec![
        g.submit(rq(999, 1), 1).map(|_| ()).map_err(|e| e.error),
        g.cancel(h),
        g.resume(h),
        g.close(CloseMode::Cancel),
        g.destroy(),
    ]
}

fn all_deadlk(v: &[xtc::Result<()>]) -> bool {
    v.iter().all(|r| *r == Err(Error::Deadlk))
}

fn close_later(lp: &Loop, g: &Group<Rq>, mode: CloseMode, cond: impl Fn() -> bool + 'static) {
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

// ---------------------------------------------------------------------------
// B-041 / B-042 / B-043 / B-176: peers while a callback is suspended
// ---------------------------------------------------------------------------

#[test]
fn b041_deadlk_from_peer_during_yielding_complete() {
    let sim = Sim::new(101);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(4, 2, 2));
    c.yields_complete.set(Y);
    let h = g.submit(rq(1, 1), 1).unwrap();
    let h2 = g.submit(rq(2, 3), 1).unwrap();
    let seen = Rc::new(RefCell::new(None));
    let (g2, c2, s2) = (g.clone(), c.clone(), seen.clone());
    when(
        &lp,
        move || c2.in_cb.get() == "complete",
        move || {
            let st = g2.stats();
            *s2.borrow_mut() = Some((probe(&g2, h2), st));
        },
    );
    close_later(&lp, &g, CloseMode::Drain, || true);
    run(&sim);
    let (errs, st) = seen.borrow_mut().take().expect("peer ran");
    assert!(
        all_deadlk(&errs),
        "every mutator Deadlk in complete: {errs:?}"
    );
    assert_eq!(
        st.completed, 0,
        "B-176: counters advance after delivery returns"
    );
    assert_eq!(c.outcome(h), vec![Ok(())]);
    assert_eq!(c.outcome(h2), vec![Ok(())]);
    assert_eq!(g.stats().rejections, 0, "Deadlk submits are not rejections");
    g.destroy().unwrap();
}

#[test]
fn b043_stats_during_yielding_step_report_committed_state_not_result_words() {
    let sim = Sim::new(102);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(4, 2, 4));
    c.yields_step.set(Y);
    let h = g.submit(rq(1, 1), 2).unwrap(); // DONE written before the step yields
    let seen = Rc::new(RefCell::new(None));
    let (g2, c2, s2) = (g.clone(), c.clone(), seen.clone());
    when(
        &lp,
        move || c2.in_cb.get() == "step",
        move || *s2.borrow_mut() = Some((probe(&g2, h), g2.stats())),
    );
    close_later(&lp, &g, CloseMode::Drain, || true);
    run(&sim);
    let (errs, st) = seen.borrow_mut().take().expect("peer ran");
    assert!(all_deadlk(&errs), "{errs:?}");
    assert_eq!(
        (st.completed, st.ready, st.reserved_units),
        (0, 1, 2),
        "{st:?}"
    );
    assert_eq!(st.iterations, 1);
    assert_eq!(c.outcome(h), vec![Ok(())]);
    g.destroy().unwrap();
}

#[test]
fn b041_deadlk_from_peer_during_finalizer_complete_after_kill() {
    let sim = Sim::new(103);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(4, 2, 2));
    c.yields_step.set(Y);
    c.yields_complete.set(Y);
    let h1 = g.submit(rq(1, 5), 1).unwrap();
    let h2 = g.submit(rq(2, 5), 1).unwrap();
    let (g2, c2) = (g.clone(), c.clone());
    when(
        &lp,
        move || c2.in_cb.get() == "step",
        move || g2.owner_loop().kill(g2.driver_pid()).unwrap(),
    );
    let seen = Rc::new(RefCell::new(None));
    let (g3, c3, s3) = (g.clone(), c.clone(), seen.clone());
    let (drv, lp3) = (g.driver_pid(), lp.clone());
    when(
        &lp,
        move || !lp3.is_alive(drv) && c3.in_cb.get() == "complete",
        move || *s3.borrow_mut() = Some(probe(&g3, h2)),
    );
    run(&sim);
    let errs = seen.borrow_mut().take().expect("peer ran");
    assert!(
        all_deadlk(&errs),
        "finalizer's complete is a callback: {errs:?}"
    );
    assert_eq!(c.outcome(h1), vec![Err(Error::Internal)]);
    assert_eq!(c.outcome(h2), vec![Err(Error::Internal)]);
    g.destroy().unwrap();
}

// ---------------------------------------------------------------------------
// B-039: exactly one completion across a driver kill; recorded DONE survives
// ---------------------------------------------------------------------------

#[test]
fn b039_kill_inside_complete_recorded_done_survives_and_is_not_repeated() {
    let sim = Sim::new(104);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(8, 4, 4));
    c.yields_complete.set(Y);
    let hs: Vec<_> = (0..3).map(|i| g.submit(rq(i, 1), 1).unwrap()).collect();
    let h4 = g.submit(rq(3, 9), 1).unwrap();
    let (g2, c2) = (g.clone(), c.clone());
    when(
        &lp,
        move || !c2.started.borrow().is_empty(),
        move || g2.owner_loop().kill(g2.driver_pid()).unwrap(),
    );
    run(&sim);
    for h in &hs {
        assert_eq!(c.invocations(*h), 1, "one invocation for {h}");
    }
    assert_eq!(c.invocations(h4), 1);
    // The interrupted delivery never returned; the other recorded DONEs did.
    assert_eq!(c.done.borrow().len(), 3);
    assert_eq!(c.outcome(hs[1]), vec![Ok(())], "recorded DONE survives");
    assert_eq!(c.outcome(hs[2]), vec![Ok(())], "recorded DONE survives");
    assert_eq!(c.outcome(h4), vec![Err(Error::Internal)]);
    let s = g.stats();
    assert_eq!((s.completed, s.failed, s.cancelled), (3, 1, 0), "{s:?}");
    g.destroy().unwrap();
}

#[test]
fn b039_kill_while_parked_between_iterations_fails_outstanding_and_closes() {
    let sim = Sim::new(105);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(4, 1, 1));
    let a = g.submit(rq(1, 5), 1).unwrap();
    c.script(a, &[StepResult::Blocked]);
    let b = g.submit(rq(2, 1), 1).unwrap(); // waits behind the blocked member
    let d = g.submit(rq(3, 1), 1).unwrap();
    let (g2, lp2, gq) = (g.clone(), lp.clone(), g.clone());
    when(
        &lp,
        move || gq.stats().blocked == 1,
        move || {
            // Same turn: the cancel is recorded but the driver dies before
            // its boundary consumes it.
            g2.cancel(d).unwrap();
            lp2.kill(g2.driver_pid()).unwrap();
        },
    );
    run(&sim);
    assert_eq!(c.outcome(a), vec![Err(Error::Internal)]);
    assert_eq!(c.outcome(b), vec![Err(Error::Internal)]);
    assert_eq!(c.outcome(d), vec![Err(Error::Aborted)], "already cancelled");
    assert_eq!(c.in_vectors(b), 0);
    let g3 = g.clone();
    let again = Rc::new(Cell::new(None));
    let a2 = again.clone();
    lp.spawn(async move {
        a2.set(Some(
            g3.submit(rq(9, 1), 1).map(|_| ()).map_err(|e| e.error),
        ))
    })
    .unwrap();
    run(&sim);
    assert_eq!(
        again.get(),
        Some(Err(Error::Again)),
        "such exit closes the group"
    );
    g.destroy().unwrap();
}

// ---------------------------------------------------------------------------
// B-020..B-023, B-048, B-050, B-051, B-054..B-057: admission, cancel, resume
// ---------------------------------------------------------------------------

#[test]
fn b021_fcfs_large_head_charge_blocks_smaller_younger_requests() {
    let sim = Sim::new(106);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(8, 4, 4));
    let a = g.submit(rq(1, 1), 3).unwrap();
    c.script(a, &[StepResult::Blocked, StepResult::Done]);
    let b = g.submit(rq(2, 1), 2).unwrap(); // does not fit next to a
    let small = g.submit(rq(3, 1), 1).unwrap(); // would fit, must not pass b
    let seen = Rc::new(RefCell::new(Vec::new()));
    let (g2, c2, s2) = (g.clone(), c.clone(), seen.clone());
    lp.spawn(async move {
        while g2.stats().blocked == 0 {
            rt::yield_now().await;
        }
        yields(20).await; // give the driver every chance to admit `small`
        let st = g2.stats();
        s2.borrow_mut()
            .push((st.queued, st.reserved_units, st.blocked, st.ready));
        assert_eq!(
            c2.in_vectors(small),
            0,
            "B-021: younger request passed the head"
        );
        // B-056: WAITING is not resumable; B-055: duplicate resume harmless.
        s2.borrow_mut().push((
            u64::from(g2.resume(b) == Err(Error::Inval)),
            u64::from(g2.resume(a).is_ok()),
            u64::from(g2.resume(a).is_ok()),
            0,
        ));
        // B-057: resume neither releases nor reacquires the charge.
        s2.borrow_mut().push((0, g2.stats().reserved_units, 0, 0));
        while g2.close(CloseMode::Drain).is_err() {
            rt::yield_now().await;
        }
    })
    .unwrap();
    run(&sim);
    let s = seen.borrow();
    assert_eq!(
        s[0],
        (2, 3, 1, 0),
        "B-022: BLOCKED keeps its charge; queued 2"
    );
    assert_eq!(s[1], (1, 1, 1, 0), "resume rules");
    assert_eq!(s[2].1, 3, "B-057");
    let v = c.vectors.borrow();
    let first = |h: Handle| v.iter().position(|x| x.contains(&h)).unwrap();
    assert!(first(b) <= first(small), "FCFS: {v:?}");
    for h in [a, b, small] {
        assert_eq!(c.outcome(h), vec![Ok(())]);
    }
    assert_eq!(g.stats().reserved_units, 0);
    g.destroy().unwrap();
}

#[test]
fn b048_cancel_of_waiting_member_excluded_before_next_vector() {
    let sim = Sim::new(107);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(4, 1, 1));
    let a = g.submit(rq(1, 1), 1).unwrap();
    c.script(a, &[StepResult::Blocked, StepResult::Done]);
    let b = g.submit(rq(2, 1), 1).unwrap();
    let e = g.submit(rq(3, 1), 1).unwrap();
    let res = Rc::new(RefCell::new(Vec::new()));
    let (g2, r2, gq) = (g.clone(), res.clone(), g.clone());
    when(
        &lp,
        move || gq.stats().blocked == 1,
        move || {
            let mut r = r2.borrow_mut();
            r.push(g2.cancel(b)); // WAITING
            r.push(g2.cancel(b)); // B-051 duplicate, harmless
            r.push(g2.resume(a)); // frees a's place at the next boundary
            r.push(g2.close(CloseMode::Drain));
        },
    );
    run(&sim);
    assert_eq!(*res.borrow(), vec![Ok(()); 4]);
    assert_eq!(c.in_vectors(b), 0, "B-048: cancelled WAITING member ran");
    assert_eq!(c.outcome(b), vec![Err(Error::Aborted)]);
    assert_eq!(c.outcome(a), vec![Ok(())]);
    assert_eq!(c.outcome(e), vec![Ok(())]);
    assert_eq!(g.stats().cancelled, 1);
    // B-050: stale handles after terminal notification.
    let g3 = g.clone();
    let stale = Rc::new(RefCell::new(Vec::new()));
    let s3 = stale.clone();
    lp.spawn(async move {
        s3.borrow_mut()
            .extend([g3.cancel(a), g3.resume(b), g3.cancel(e)])
    })
    .unwrap();
    run(&sim);
    assert_eq!(*stale.borrow(), vec![Err(Error::Inval); 3]);
    g.destroy().unwrap();
}

#[test]
fn b022_cancel_of_blocked_member_releases_charge_once() {
    let sim = Sim::new(108);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(4, 2, 3));
    let a = g.submit(rq(1, 1), 3).unwrap();
    c.script(a, &[StepResult::Blocked]);
    let b = g.submit(rq(2, 1), 1).unwrap();
    let (g2, c2) = (g.clone(), c.clone());
    lp.spawn(async move {
        while g2.stats().blocked == 0 {
            rt::yield_now().await;
        }
        assert_eq!(g2.stats().reserved_units, 3);
        assert_eq!(c2.in_vectors(b), 0, "b does not fit next to blocked a");
        g2.cancel(a).unwrap();
        while c2.outcome(b).is_empty() {
            rt::yield_now().await;
        }
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    run(&sim);
    assert_eq!(c.outcome(a), vec![Err(Error::Aborted)]);
    assert_eq!(c.outcome(b), vec![Ok(())]);
    g.destroy().unwrap();
}

// ---------------------------------------------------------------------------
// B-025, B-027..B-029, B-177: submit failures and handles
// ---------------------------------------------------------------------------

#[test]
fn b025_failed_submits_cause_no_callback_and_count_rejections() {
    let sim = Sim::new(109);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(2, 1, 4));
    let e0 = g.submit(rq(10, 1), 0).unwrap_err();
    assert_eq!((e0.error, e0.request.id), (Error::Range, 10));
    let e5 = g.submit(rq(11, 1), 5).unwrap_err();
    assert_eq!((e5.error, e5.request.id), (Error::Range, 11));
    let a = g.submit(rq(1, 1), 4).unwrap();
    let b = g.submit(rq(2, 1), 4).unwrap();
    let full = g.submit(rq(12, 1), 1).unwrap_err();
    assert_eq!(
        (full.error, full.request.id),
        (Error::Again, 12),
        "B-020: slots count waiting"
    );
    g.close(CloseMode::Drain).unwrap();
    let closed = g.submit(rq(13, 1), 1).unwrap_err();
    assert_eq!(closed.error, Error::Again);
    run(&sim);
    assert_eq!(
        c.started.borrow().len(),
        2,
        "no callback for failed submits"
    );
    assert_eq!(c.outcome(a), vec![Ok(())]);
    assert_eq!(c.outcome(b), vec![Ok(())]);
    assert_eq!(g.stats().rejections, 4);
    assert!(
        a.get() != 0 && b.get() > a.get(),
        "B-027 nonzero, monotonic"
    );
    g.destroy().unwrap();
}

#[test]
fn b028_handle_exhaustion_is_range_and_never_wraps() {
    let sim = Sim::new(110);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(4, 2, 2));
    g.debug_set_last_handle(u64::MAX - 1);
    let last = g.submit(rq(1, 1), 1).unwrap();
    assert_eq!(last.get(), u64::MAX);
    let e = g.submit(rq(2, 1), 1).unwrap_err();
    assert_eq!((e.error, e.request.id), (Error::Range, 2));
    let e = g.submit(rq(3, 1), 1).unwrap_err();
    assert_eq!(e.error, Error::Range, "stays exhausted, no wrap to 1");
    assert_eq!(g.stats().queued, 1);
    assert_eq!(g.stats().rejections, 2);
    g.close(CloseMode::Drain).unwrap();
    run(&sim);
    assert_eq!(c.outcome(last), vec![Ok(())]);
    assert_eq!(c.started.borrow().len(), 1);
    g.destroy().unwrap();
}

#[test]
fn b029_handle_from_another_group_is_inval() {
    let sim = Sim::new(111);
    let lp = sim.new_loop();
    let (g1, _c1) = sync_group(&lp, sync_opts(4, 1, 1));
    let (g2, _c2) = sync_group(&lp, sync_opts(4, 1, 1));
    let h1 = g1.submit(rq(1, 1), 1).unwrap();
    let h2 = g2.submit(rq(2, 1), 1).unwrap();
    assert_eq!(g2.cancel(h1), Err(Error::Inval));
    assert_eq!(g2.resume(h1), Err(Error::Inval));
    assert_eq!(g1.cancel(h2), Err(Error::Inval));
    for g in [&g1, &g2] {
        g.close(CloseMode::Drain).unwrap();
    }
    run(&sim);
    g1.destroy().unwrap();
    g2.destroy().unwrap();
}

/// A long-lived group that issued 2^32 handles must still not issue handles
/// another group issued: handle spaces are per-group bases 2^32 apart, so they
/// overlap. Simulated with the exhaustion hook (the next handle is `last+1`).
#[test]
fn b029_handle_spaces_of_two_groups_never_overlap() {
    let sim = Sim::new(112);
    let lp = sim.new_loop();
    let (g1, c1) = sync_group(&lp, sync_opts(4, 1, 1));
    let (g2, c2) = sync_group(&lp, sync_opts(4, 1, 1));
    let h2 = g2.submit(rq(2, 1), 1).unwrap();
    // g1 has issued handles up to just before g2's first one.
    g1.debug_set_last_handle(h2.get() - 1);
    let h1 = g1.submit(rq(1, 1), 1).unwrap();
    let foreign = g2.cancel(h1);
    for g in [&g1, &g2] {
        g.close(CloseMode::Drain).unwrap();
    }
    run(&sim);
    assert_eq!(
        c2.outcome(h2),
        vec![Ok(())],
        "g2's member must not be cancelled by g1's handle"
    );
    assert_eq!(c1.outcome(h1), vec![Ok(())]);
    assert_eq!(
        foreign,
        Err(Error::Inval),
        "g1's handle {h1} accepted by g2 (its {h2})"
    );
}

// ---------------------------------------------------------------------------
// B-128..B-139: ownership, close, lifetime
// ---------------------------------------------------------------------------

/// A process of another loop is execution, not externally serialized pre-run
/// setup, even while the owner loop has not been polled yet.
#[test]
fn b128_mutation_from_peer_loop_before_owner_polled_is_inval() {
    let mut hit = 0;
    for seed in 0..24 {
        let sim = Sim::new(seed);
        let (a, b) = (sim.new_loop(), sim.new_loop());
        let (g, _c) = sync_group(&a, sync_opts(4, 1, 1));
        let res = Rc::new(RefCell::new(None));
        let (g2, r2, a2) = (g.clone(), res.clone(), a.clone());
        b.spawn(async move {
            if !a2.has_run() {
                let r = g2.submit(rq(1, 1), 1).map(|_| ()).map_err(|e| e.error);
                *r2.borrow_mut() = Some(r);
            }
        })
        .unwrap();
        let g3 = g.clone();
        a.spawn(async move {
            while g3.close(CloseMode::Drain).is_err() {
                rt::yield_now().await;
            }
        })
        .unwrap();
        run(&sim);
        if let Some(r) = res.borrow_mut().take() {
            hit += 1;
            assert_eq!(
                r,
                Err(Error::Inval),
                "seed {seed}: a loop-B process mutated loop A's group"
            );
        }
    }
    assert!(hit > 0, "no seed ran the peer loop first");
}

#[test]
fn b134_close_escalates_drain_to_cancel_and_never_downgrades() {
    let sim = Sim::new(113);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(4, 2, 2));
    let a = g.submit(rq(1, 1), 1).unwrap();
    c.script(a, &[StepResult::Blocked]);
    let b = g.submit(rq(2, 3), 1).unwrap();
    let (g2, c2) = (g.clone(), c.clone());
    lp.spawn(async move {
        while g2.stats().blocked == 0 {
            rt::yield_now().await;
        }
        g2.close(CloseMode::Drain).unwrap();
        g2.close(CloseMode::Drain).unwrap();
        while c2.outcome(b).is_empty() {
            rt::yield_now().await;
        }
        yields(10).await;
        assert!(c2.outcome(a).is_empty(), "DRAIN waits for BLOCKED a");
        assert!(g2.owner_loop().is_alive(g2.driver_pid()));
        g2.close(CloseMode::Cancel).unwrap();
        g2.close(CloseMode::Drain).unwrap(); // no downgrade
    })
    .unwrap();
    run(&sim);
    assert_eq!(c.outcome(b), vec![Ok(())]);
    assert_eq!(c.outcome(a), vec![Err(Error::Aborted)]);
    g.destroy().unwrap();
}

#[test]
fn b137_close_empty_group_before_first_run_requires_the_driver() {
    let sim = Sim::new(114);
    let lp = sim.new_loop();
    let (g, _c) = sync_group(&lp, sync_opts(2, 1, 1));
    g.close(CloseMode::Cancel).unwrap();
    g.close(CloseMode::Drain).unwrap();
    assert_eq!(g.destroy(), Err(Error::Again));
    assert_eq!(g.destroy(), Err(Error::Again));
    run(&sim);
    assert_eq!(lp.n_procs(), 0);
    g.destroy().unwrap();
    assert_eq!(g.close(CloseMode::Drain), Err(Error::Inval), "destroyed");
}

#[test]
fn b015_create_async_after_first_step_is_again() {
    let sim = Sim::new(115);
    let lp = sim.new_loop();
    let (g, _c) = async_group(&lp, async_opts(2, 1, None), Kind::Inline);
    assert!(sim.step());
    let c = C::default();
    c.kind.set(Some(Kind::Inline));
    let r = Group::create_async(&lp, async_opts(2, 1, None), A(c.clone()), Fin(c));
    assert_eq!(r.err(), Some(Error::Again));
    close_later(&lp, &g, CloseMode::Drain, || true);
    run(&sim);
    g.destroy().unwrap();
}

/// A create that fails when spawning its processes must publish nothing at
/// once: no process in the table, every charge and the class registration
/// released, so the same class can be used by the next create.
#[test]
fn b017_failed_create_at_process_spawn_publishes_nothing_and_releases_class() {
    for n in 1..=2 {
        let sim = Sim::new(116);
        let lp = sim.new_loop();
        let class = lp.new_class(3).unwrap();
        let used = lp.budget().used();
        let o = SyncOpts {
            sched_class: Some(class.clone()),
            ..sync_opts(4, 2, 2)
        };
        lp.budget().fail_after(n); // storage charge ok, then a process charge fails
        let c = C::default();
        let r = Group::create(&lp, o.clone(), S(c.clone()), Fin(c.clone()));
        assert_eq!(r.err(), Some(Error::Nomem), "charge {n}");
        assert_eq!(
            lp.n_procs(),
            0,
            "charge {n}: a process of the failed create is still published"
        );
        assert_eq!(lp.budget().used(), used, "charge {n}: charges not released");
        let g = Group::create(&lp, o, S(c.clone()), Fin(c))
            .unwrap_or_else(|e| panic!("charge {n}: class registration kept: {e:?}"));
        g.close(CloseMode::Drain).unwrap();
        run(&sim);
        g.destroy().unwrap();
    }
}

// ---------------------------------------------------------------------------
// B-172..B-178: statistics
// ---------------------------------------------------------------------------

#[test]
fn b175_statistics_match_the_vectors_and_deliveries() {
    let sim = Sim::new(117);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(12, 3, 6));
    c.yields_step.set(Y);
    let mut hs = Vec::new();
    for i in 0..10 {
        hs.push(g.submit(rq(i, 1 + i % 4), 1 + u64::from(i % 3)).unwrap());
    }
    c.script(hs[3], &[StepResult::Error(Error::Range)]);
    c.script(hs[4], &[StepResult::Unset]);
    g.cancel(hs[9]).unwrap();
    g.close(CloseMode::Drain).unwrap();
    run(&sim);
    let s = g.stats();
    let v = c.vectors.borrow();
    assert_eq!(s.iterations, v.len() as u64);
    assert_eq!(
        s.total_members,
        v.iter().map(|x| x.len() as u64).sum::<u64>()
    );
    assert_eq!(
        s.max_vector,
        v.iter().map(|x| x.len() as u64).max().unwrap()
    );
    assert!(s.max_vector <= 3);
    assert_eq!(c.outcome(hs[3]), vec![Err(Error::Range)]);
    assert_eq!(c.outcome(hs[4]), vec![Err(Error::Internal)], "B-036");
    assert_eq!(c.outcome(hs[9]), vec![Err(Error::Aborted)]);
    assert_eq!((s.completed, s.failed, s.cancelled), (7, 2, 1), "{s:?}");
    assert_eq!(
        (s.queued, s.ready, s.blocked, s.reserved_units),
        (0, 0, 0, 0)
    );
    assert_eq!(g.async_stats(), Default::default(), "B-105");
    g.destroy().unwrap();
}

/// The driver must let peers run between iterations: otherwise a member that
/// CONTINUEs until cancelled (a stream the client ends) can never be
/// cancelled, and nothing can be submitted or closed, on its own loop. The
/// step below never yields and gives up (DONE) after 2000 calls.
#[test]
fn b047_peer_cancel_reaches_a_member_of_a_nonyielding_step() {
    let sim = Sim::new(118);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(2, 1, 1));
    c.give_up_after.set(2000);
    let h = g.submit(rq(1, u32::MAX), 1).unwrap();
    let g3 = g.clone();
    lp.spawn(async move {
        while g3.stats().iterations == 0 {
            rt::yield_now().await;
        }
        let _ = g3.cancel(h); // Inval if the member already finished
        g3.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    run(&sim);
    assert_eq!(
        c.outcome(h),
        vec![Err(Error::Aborted)],
        "peer never ran while the member continued ({} step calls)",
        c.calls.get()
    );
    g.destroy().unwrap();
}

// ---------------------------------------------------------------------------
// Asynchronous groups: B-041 during submit / collect / hint, B-083..B-103
// ---------------------------------------------------------------------------

#[test]
fn b041_deadlk_from_peer_during_async_submit_collect_and_cancel_hint() {
    let sim = Sim::new(119);
    let lp = sim.new_loop();
    let (g, c) = async_group(&lp, async_opts(4, 2, None), Kind::Future);
    c.yields_submit.set(Y);
    c.yields_step.set(Y);
    c.yields_hint.set(Y);
    let h1 = g.submit(rq(1, 1), 1).unwrap();
    let h2 = g.submit(rq(2, 1), 1).unwrap();
    let probes = Rc::new(RefCell::new(Vec::new()));
    let (g2, c2, p2) = (g.clone(), c.clone(), probes.clone());
    lp.spawn(async move {
        let mut seen = Vec::new();
        for want in ["submit", "hint", "collect"] {
            let mut turns = 0;
            while c2.in_cb.get() != want {
                turns += 1;
                assert!(turns < 100_000, "never saw {want}");
                if want == "hint" && c2.in_cb.get().is_empty() && !c2.promises.borrow().is_empty() {
                    g2.cancel(h1).unwrap(); // operation outstanding: ask for a hint
                } else if want == "collect"
                    && c2.in_cb.get().is_empty()
                    && let Some(p) = c2.promises.borrow_mut().pop()
                {
                    p.set(Ok(()));
                }
                rt::yield_now().await;
            }
            seen.push((want, probe(&g2, h2)));
        }
        *p2.borrow_mut() = seen;
        while g2.close(CloseMode::Drain).is_err() {
            rt::yield_now().await;
        }
    })
    .unwrap();
    run(&sim);
    let p = probes.borrow();
    assert_eq!(p.len(), 3);
    for (what, errs) in p.iter() {
        assert!(all_deadlk(errs), "during {what}: {errs:?}");
    }
    assert_eq!(*c.hints.borrow(), vec![h1], "B-094 once per member");
    assert_eq!(c.outcome(h1), vec![Err(Error::Aborted)]);
    assert_eq!(c.outcome(h2), vec![Ok(())]);
    g.destroy().unwrap();
}

#[test]
fn b094_cancel_hint_once_per_member_and_does_not_end_the_wait() {
    let sim = Sim::new(120);
    let lp = sim.new_loop();
    let (g, c) = async_group(&lp, async_opts(4, 3, None), Kind::Future);
    let hs: Vec<_> = (0..3).map(|i| g.submit(rq(i, 1), 1).unwrap()).collect();
    let (g2, c2, hs2) = (g.clone(), c.clone(), hs.clone());
    lp.spawn(async move {
        while c2.promises.borrow().is_empty() {
            rt::yield_now().await;
        }
        g2.cancel(hs2[0]).unwrap();
        yields(10).await;
        g2.cancel(hs2[0]).unwrap(); // duplicate: no second hint
        g2.cancel(hs2[1]).unwrap();
        yields(10).await;
        assert!(
            c2.collects.borrow().is_empty(),
            "B-097: a member cancel ended the wait"
        );
        c2.promises.borrow_mut().pop().unwrap().set(Ok(()));
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    run(&sim);
    assert_eq!(*c.hints.borrow(), vec![hs[0], hs[1]]);
    assert_eq!(*c.collects.borrow(), vec![(hs.clone(), ExecStatus::Ok)]);
    assert_eq!(c.outcome(hs[0]), vec![Err(Error::Aborted)]);
    assert_eq!(c.outcome(hs[1]), vec![Err(Error::Aborted)]);
    assert_eq!(c.outcome(hs[2]), vec![Ok(())]);
    g.destroy().unwrap();
}

#[test]
fn b097_close_cancel_ends_future_wait_aborted_and_drain_does_not_downgrade() {
    let sim = Sim::new(121);
    let lp = sim.new_loop();
    let (g, c) = async_group(&lp, async_opts(4, 2, None), Kind::Future);
    // left 1: collect writes DONE, which ABORTED must override (B-090).
    let hs: Vec<_> = (0..2).map(|i| g.submit(rq(i, 1), 1).unwrap()).collect();
    let kept = Rc::new(RefCell::new(None));
    let (g2, c2, k2) = (g.clone(), c.clone(), kept.clone());
    lp.spawn(async move {
        while c2.promises.borrow().is_empty() {
            rt::yield_now().await;
        }
        g2.close(CloseMode::Drain).unwrap();
        yields(10).await;
        assert!(
            c2.collects.borrow().is_empty(),
            "DRAIN does not end the wait"
        );
        g2.close(CloseMode::Cancel).unwrap();
        g2.close(CloseMode::Drain).unwrap(); // same turn: must not downgrade
        *k2.borrow_mut() = c2.promises.borrow_mut().pop();
    })
    .unwrap();
    run(&sim);
    assert_eq!(
        *c.collects.borrow(),
        vec![(hs.clone(), ExecStatus::Aborted)]
    );
    let mut hints = c.hints.borrow().clone();
    hints.sort();
    assert_eq!(hints, hs, "hint once per in-flight member");
    for h in &hs {
        assert_eq!(c.outcome(*h), vec![Err(Error::Aborted)]);
    }
    g.destroy().unwrap();
    // B-075: resolving the promise after destroy is safe.
    kept.borrow_mut().take().expect("promise kept").set(Ok(()));
    assert_eq!(g.stats().cancelled, 2);
}

#[test]
fn b089_timeout_honours_done_and_error_and_ends_the_rest_again() {
    let sim = Sim::new(122);
    let lp = sim.new_loop();
    let (g, c) = async_group(
        &lp,
        async_opts(8, 5, Some(Duration::from_micros(5))),
        Kind::Future,
    );
    let hs: Vec<_> = (0..5).map(|i| g.submit(rq(i, 9), 1).unwrap()).collect();
    let words = [
        StepResult::Done,
        StepResult::Error(Error::Range),
        StepResult::Continue,
        StepResult::Blocked,
        StepResult::Unset,
    ];
    for (h, w) in hs.iter().zip(words) {
        c.script(*h, &[w]);
    }
    g.close(CloseMode::Drain).unwrap();
    run(&sim); // the promise is never resolved (kept in c.promises)
    assert_eq!(
        *c.collects.borrow(),
        vec![(hs.clone(), ExecStatus::Timeout)]
    );
    let want = [
        Ok(()),
        Err(Error::Range),
        Err(Error::Again),
        Err(Error::Again),
        Err(Error::Again),
    ];
    for (h, w) in hs.iter().zip(want) {
        assert_eq!(c.outcome(*h), vec![w], "{h}");
    }
    assert_eq!(c.vectors.borrow().len(), 1, "B-087: never resubmitted");
    let a = g.async_stats();
    assert_eq!(
        (a.offloads, a.offload_timeouts, a.offload_errors),
        (1, 1, 0)
    );
    g.destroy().unwrap();
    c.promises.borrow_mut().pop().unwrap().set(Ok(())); // after destroy: safe
}

#[test]
fn b086_negative_statuses_fail_every_member_and_count_offload_errors() {
    // A promise resolved with an error, a dropped promise, a bad fence fd.
    for (seed, how) in [(123, 0), (124, 1), (125, 2)] {
        let sim = Sim::new(seed);
        let lp = sim.new_loop();
        let kind = if how == 2 {
            Kind::BadFence
        } else {
            Kind::Future
        };
        let (g, c) = async_group(&lp, async_opts(4, 2, None), kind);
        let hs: Vec<_> = (0..2).map(|i| g.submit(rq(i, 1), 1).unwrap()).collect();
        let c2 = c.clone();
        lp.spawn(async move {
            loop {
                let p = c2.promises.borrow_mut().pop();
                match p {
                    Some(p) if how == 0 => return p.set(Err(Error::Nomem)),
                    Some(p) => return drop(p),
                    None if how == 2 => return,
                    None => rt::yield_now().await,
                }
            }
        })
        .unwrap();
        g.close(CloseMode::Drain).unwrap();
        run(&sim);
        let cs = c.collects.borrow();
        assert_eq!(cs.len(), 1, "case {how}");
        let ExecStatus::Failed(e) = cs[0].1 else {
            panic!("case {how}: status {:?} is not negative", cs[0].1);
        };
        if how == 0 {
            assert_eq!(e, Error::Nomem);
        }
        if how == 2 {
            assert_eq!(e, Error::Inval, "bad fd");
        }
        for h in &hs {
            assert_eq!(c.outcome(*h), vec![Err(e)], "case {how}: DONE word ignored");
        }
        assert_eq!(g.async_stats().offload_errors, 1, "case {how}");
        g.destroy().unwrap();
    }
}

#[test]
fn b048_cancel_of_waiting_member_during_future_wait_never_runs() {
    let sim = Sim::new(126);
    let lp = sim.new_loop();
    let (g, c) = async_group(&lp, async_opts(4, 1, None), Kind::Future);
    let a = g.submit(rq(1, 2), 1).unwrap();
    let b = g.submit(rq(2, 1), 1).unwrap();
    let (g2, c2) = (g.clone(), c.clone());
    lp.spawn(async move {
        for round in 0..2 {
            while c2.promises.borrow().is_empty() {
                rt::yield_now().await;
            }
            if round == 0 {
                g2.cancel(b).unwrap(); // WAITING, while a is in flight
            }
            c2.promises.borrow_mut().pop().unwrap().set(Ok(()));
        }
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    run(&sim);
    assert_eq!(c.in_vectors(b), 0);
    assert_eq!(*c.hints.borrow(), vec![], "b was never in flight");
    assert_eq!(c.outcome(b), vec![Err(Error::Aborted)]);
    assert_eq!(c.outcome(a), vec![Ok(())]);
    assert_eq!(*c.vectors.borrow(), vec![vec![a], vec![a]]);
    g.destroy().unwrap();
}

// ---------------------------------------------------------------------------
// B-099..B-103: exactly once across a kill at every suspension point
// ---------------------------------------------------------------------------

/// Kills the driver once `cond` holds (checked by a peer each turn).
fn kill_when(lp: &Loop, g: &Group<Rq>, cond: impl Fn() -> bool + 'static) {
    let g2 = g.clone();
    when(lp, cond, move || {
        g2.owner_loop().kill(g2.driver_pid()).unwrap()
    });
}

#[test]
fn b101_kill_parked_on_future_hints_all_then_collects_once_with_same_vector() {
    let sim = Sim::new(127);
    let lp = sim.new_loop();
    let (g, c) = async_group(&lp, async_opts(4, 3, None), Kind::Future);
    let hs: Vec<_> = (0..3).map(|i| g.submit(rq(i, 5), 1).unwrap()).collect();
    let kept = Rc::new(RefCell::new(None));
    let (g2, c2, k2) = (g.clone(), c.clone(), kept.clone());
    lp.spawn(async move {
        while c2.promises.borrow().is_empty() {
            rt::yield_now().await;
        }
        g2.cancel(hs_first(&c2)).unwrap();
        while c2.hints.borrow().is_empty() {
            rt::yield_now().await;
        }
        *k2.borrow_mut() = c2.promises.borrow_mut().pop();
        g2.owner_loop().kill(g2.driver_pid()).unwrap();
    })
    .unwrap();
    run(&sim);
    let hints = c.hints.borrow().clone();
    assert_eq!(hints.len(), 3, "one hint per member, none twice: {hints:?}");
    assert_eq!(hints[0], hs[0]);
    assert_eq!(
        *c.collects.borrow(),
        vec![(hs.clone(), ExecStatus::Aborted)]
    );
    for h in &hs {
        assert_eq!(c.outcome(*h), vec![Err(Error::Aborted)]);
    }
    assert_eq!(c.vectors.borrow().len(), 1);
    g.destroy().unwrap();
    kept.borrow_mut().take().unwrap().set(Ok(())); // B-075
}

fn hs_first(c: &Ctl) -> Handle {
    c.vectors.borrow()[0][0]
}

#[test]
fn b100_kill_inside_collect_never_collects_or_completes_twice() {
    let sim = Sim::new(128);
    let lp = sim.new_loop();
    let (g, c) = async_group(&lp, async_opts(4, 2, None), Kind::Inline);
    c.yields_step.set(Y);
    let hs: Vec<_> = (0..2).map(|i| g.submit(rq(i, 1), 1).unwrap()).collect();
    let c2 = c.clone();
    kill_when(&lp, &g, move || c2.in_cb.get() == "collect");
    run(&sim);
    assert_eq!(c.collects.borrow().len(), 1, "collect ran once");
    for h in &hs {
        assert_eq!(c.invocations(*h), 1);
        assert_eq!(c.outcome(*h), vec![Err(Error::Internal)]);
    }
    g.destroy().unwrap();
}

#[test]
fn b100_kill_inside_async_submit_has_no_operation_to_collect() {
    let sim = Sim::new(129);
    let lp = sim.new_loop();
    let (g, c) = async_group(&lp, async_opts(4, 2, None), Kind::Future);
    c.yields_submit.set(Y);
    let hs: Vec<_> = (0..2).map(|i| g.submit(rq(i, 1), 1).unwrap()).collect();
    let c2 = c.clone();
    kill_when(&lp, &g, move || c2.in_cb.get() == "submit");
    run(&sim);
    assert!(
        c.collects.borrow().is_empty(),
        "no operation was outstanding"
    );
    assert!(c.promises.borrow().is_empty());
    for h in &hs {
        assert_eq!(c.outcome(*h), vec![Err(Error::Internal)]);
    }
    assert_eq!(g.async_stats().offloads, 0);
    g.destroy().unwrap();
}

#[test]
fn b094_kill_inside_cancel_hint_fires_no_second_hint() {
    let sim = Sim::new(130);
    let lp = sim.new_loop();
    let (g, c) = async_group(&lp, async_opts(4, 2, None), Kind::Future);
    c.yields_hint.set(Y);
    let hs: Vec<_> = (0..2).map(|i| g.submit(rq(i, 4), 1).unwrap()).collect();
    let (g2, c2, h0) = (g.clone(), c.clone(), hs[0]);
    when(
        &lp,
        move || !c2.promises.borrow().is_empty(),
        move || g2.cancel(h0).unwrap(),
    );
    let c3 = c.clone();
    kill_when(&lp, &g, move || c3.in_cb.get() == "hint");
    run(&sim);
    assert_eq!(*c.hints.borrow(), vec![hs[0], hs[1]]);
    assert_eq!(
        *c.collects.borrow(),
        vec![(hs.clone(), ExecStatus::Aborted)]
    );
    for h in &hs {
        assert_eq!(c.outcome(*h), vec![Err(Error::Aborted)]);
    }
    g.destroy().unwrap();
}

#[test]
fn b039_kill_inside_async_complete_recorded_done_survives() {
    let sim = Sim::new(131);
    let lp = sim.new_loop();
    let (g, c) = async_group(&lp, async_opts(4, 3, None), Kind::Inline);
    c.yields_complete.set(Y);
    let d1 = g.submit(rq(1, 1), 1).unwrap();
    let d2 = g.submit(rq(2, 1), 1).unwrap();
    let cont = g.submit(rq(3, 7), 1).unwrap();
    let c2 = c.clone();
    kill_when(&lp, &g, move || c2.in_cb.get() == "complete");
    run(&sim);
    for h in [d1, d2, cont] {
        assert_eq!(c.invocations(h), 1, "{h}");
    }
    let second = if c.started.borrow()[0] == d1 { d2 } else { d1 };
    assert_eq!(c.outcome(second), vec![Ok(())], "recorded DONE survives");
    assert_eq!(c.outcome(cont), vec![Err(Error::Internal)]);
    assert_eq!(g.stats().completed, 2, "interrupted delivery retired once");
    g.destroy().unwrap();
}

#[test]
fn b148_destroy_is_again_while_finalizer_parked_on_blocking_teardown() {
    let sim = Sim::new(132);
    let lp = sim.new_loop();
    let (g, c) = async_group(&lp, async_opts(2, 1, None), Kind::Blocking);
    let (gate_tx, gate_rx) = crossbeam_channel::bounded::<()>(1);
    let (ran_tx, ran_rx) = crossbeam_channel::bounded::<()>(1);
    *c.gate.borrow_mut() = Some(gate_rx);
    *c.ran.borrow_mut() = Some(ran_tx);
    let h = g.submit(rq(1, 1), 1).unwrap();
    let seen = Rc::new(RefCell::new(Vec::new()));
    let (g2, s2) = (g.clone(), seen.clone());
    lp.spawn(async move {
        while ran_rx.try_recv().is_err() {
            rt::yield_now().await;
        }
        g2.owner_loop().kill(g2.driver_pid()).unwrap();
        while g2.owner_loop().is_alive(g2.driver_pid()) {
            rt::yield_now().await;
        }
        yields(10).await; // the finalizer is parked on the closure
        let fin_alive = g2.owner_loop().is_alive(g2.finalizer_pid());
        s2.borrow_mut().push((fin_alive, g2.destroy()));
        gate_tx.send(()).unwrap();
    })
    .unwrap();
    run_with_pool(&sim, &lp);
    assert_eq!(*seen.borrow(), vec![(true, Err(Error::Again))]);
    assert_eq!(
        *c.hints.borrow(),
        vec![h],
        "forced teardown hints every member"
    );
    assert_eq!(*c.collects.borrow(), vec![(vec![h], ExecStatus::Aborted)]);
    assert_eq!(c.outcome(h), vec![Err(Error::Aborted)]);
    g.destroy().unwrap();
}

// ---------------------------------------------------------------------------
// B-017, B-155: no storage allocated after create; determinism
// ---------------------------------------------------------------------------

/// Submitting into a group that is kept full and churned must not allocate:
/// every container was sized at create (B-017; `Core::new`: "later pushes
/// never allocate"). The handle map's tombstones must not force a regrowth.
#[test]
fn b017_steady_state_submits_allocate_nothing() {
    let before = allocs();
    let probe_box = std::hint::black_box(Box::new(7u64));
    assert!(allocs() > before, "the counting allocator counts");
    drop(probe_box);
    let sim = Sim::new(140);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(8, 8, 8));
    let grown = Rc::new(RefCell::new(Vec::new()));
    let (g2, gr) = (g.clone(), grown.clone());
    lp.spawn(async move {
        // Phase 1: fill and drain in rounds. Phase 2: keep the group full,
        // one submit as soon as a slot frees, members of varied lengths.
        let mut id = 0u32;
        while id < 2000 {
            let before = allocs();
            let r = g2.submit(rq(id, 1 + id % 7), 1);
            let n = allocs() - before;
            if n > 0 {
                gr.borrow_mut().push((id, n));
            }
            match r {
                Ok(_) => id += 1,
                Err(e) => {
                    assert_eq!(e.error, Error::Again);
                    rt::yield_now().await;
                }
            }
        }
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    run(&sim);
    assert_eq!(c.done.borrow().len(), 2000);
    assert_eq!(
        *grown.borrow(),
        vec![],
        "(request id, allocations) inside submit"
    );
    g.destroy().unwrap();
}

/// The same seed gives the same trace and the same completion order (B-155:
/// no unseeded randomness, no real clock read).
#[test]
fn b155_same_seed_same_schedule() {
    let once = || {
        let sim = Sim::new(141);
        let lp = sim.new_loop();
        let (g, c) = async_group(
            &lp,
            async_opts(16, 4, Some(Duration::from_micros(3))),
            Kind::Future,
        );
        c.yields_step.set(2);
        for i in 0..12 {
            g.submit(rq(i, 1 + i % 3), 1).unwrap();
        }
        let c2 = c.clone();
        let (lp2, pid) = (lp.clone(), g.driver_pid());
        lp.spawn(async move {
            let mut n = 0u32;
            while lp2.is_alive(pid) {
                n += 1;
                let p = c2.promises.borrow_mut().pop();
                match p {
                    Some(p) if !n.is_multiple_of(3) => p.set(Ok(())),
                    Some(p) => c2.promises.borrow_mut().insert(0, p), // let it time out
                    None => rt::yield_now().await,
                }
                rt::yield_now().await;
            }
        })
        .unwrap();
        close_later(&lp, &g, CloseMode::Drain, || true);
        run(&sim);
        let order: Vec<_> = c.done.borrow().iter().map(|d| (d.1, d.2)).collect();
        (sim.trace().len(), sim.now(), order)
    };
    assert_eq!(once(), once());
}

// ---------------------------------------------------------------------------
// BLOCKING (B-078, B-094, B-097) and BLOCKED after an OK collect (B-088)
// ---------------------------------------------------------------------------

/// A cancel during a BLOCKING operation fires the hint while the closure
/// still runs; close(CANCEL) does not end a BLOCKING wait (the status stays
/// OK), and every member still ends ABORTED exactly once.
#[test]
fn b078_blocking_wait_hints_on_cancel_but_close_cancel_does_not_end_it() {
    let sim = Sim::new(142);
    let lp = sim.new_loop();
    let (g, c) = async_group(&lp, async_opts(4, 2, None), Kind::Blocking);
    let (gate_tx, gate_rx) = crossbeam_channel::bounded::<()>(1);
    let (ran_tx, ran_rx) = crossbeam_channel::bounded::<()>(1);
    *c.gate.borrow_mut() = Some(gate_rx);
    *c.ran.borrow_mut() = Some(ran_tx);
    let hs: Vec<_> = (0..2).map(|i| g.submit(rq(i, 1), 1).unwrap()).collect();
    let (g2, c2, hs2) = (g.clone(), c.clone(), hs.clone());
    lp.spawn(async move {
        while ran_rx.try_recv().is_err() {
            rt::yield_now().await;
        }
        g2.cancel(hs2[0]).unwrap();
        while c2.hints.borrow().is_empty() {
            rt::yield_now().await;
        }
        assert!(c2.collects.borrow().is_empty(), "closure still running");
        g2.close(CloseMode::Cancel).unwrap();
        while c2.hints.borrow().len() < 2 {
            rt::yield_now().await;
        }
        yields(10).await;
        assert!(
            c2.collects.borrow().is_empty(),
            "close(CANCEL) ended a BLOCKING wait"
        );
        gate_tx.send(()).unwrap();
    })
    .unwrap();
    run_with_pool(&sim, &lp);
    assert_eq!(*c.hints.borrow(), hs);
    assert_eq!(*c.collects.borrow(), vec![(hs.clone(), ExecStatus::Ok)]);
    for h in &hs {
        assert_eq!(c.outcome(*h), vec![Err(Error::Aborted)]);
    }
    g.destroy().unwrap();
}

#[test]
fn b088_blocked_after_ok_collect_keeps_charge_until_resumed() {
    let sim = Sim::new(143);
    let lp = sim.new_loop();
    let o = AsyncOpts {
        resource_capacity: 5,
        ..async_opts(4, 2, None)
    };
    let (g, c) = async_group(&lp, o, Kind::Inline);
    let a = g.submit(rq(1, 1), 4).unwrap();
    c.script(a, &[StepResult::Blocked]);
    let b = g.submit(rq(2, 1), 2).unwrap(); // 4 + 2 > 5: waits behind blocked a
    let (g2, c2) = (g.clone(), c.clone());
    lp.spawn(async move {
        while g2.stats().blocked == 0 {
            rt::yield_now().await;
        }
        yields(10).await;
        let st = g2.stats();
        assert_eq!((st.blocked, st.reserved_units, st.queued), (1, 4, 1));
        assert_eq!(c2.in_vectors(b), 0);
        assert_eq!(g2.resume(b), Err(Error::Inval), "WAITING not resumable");
        g2.resume(a).unwrap();
        assert_eq!(g2.stats().reserved_units, 4);
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    run(&sim);
    assert_eq!(c.outcome(a), vec![Ok(())]);
    assert_eq!(c.outcome(b), vec![Ok(())]);
    assert_eq!(*c.vectors.borrow(), vec![vec![a], vec![a], vec![b]]);
    assert_eq!(g.async_stats().offloads, 3);
    g.destroy().unwrap();
}

/// The wait ends at the exec_timeout deadline even when mutators keep waking
/// the driver (a member cancel, close(DRAIN), resume of a READY member), and
/// the cancelled in-flight member is hinted once and ends ABORTED (B-085,
/// B-089, B-094).
#[test]
fn b085_timeout_deadline_holds_across_spurious_wakes() {
    let sim = Sim::new(144);
    let lp = sim.new_loop();
    let t = Duration::from_micros(10);
    let (g, c) = async_group(&lp, async_opts(4, 3, Some(t)), Kind::Future);
    let hs: Vec<_> = (0..3).map(|i| g.submit(rq(i, 5), 1).unwrap()).collect();
    let (g2, hs2) = (g.clone(), hs.clone());
    lp.spawn(async move {
        for i in 0..9u32 {
            rt::sleep(Duration::from_micros(1)).await;
            match i % 3 {
                0 => g2.resume(hs2[1]).unwrap(),
                1 => g2.cancel(hs2[0]).unwrap(),
                _ => g2.close(CloseMode::Drain).unwrap(),
            }
        }
    })
    .unwrap();
    run(&sim);
    assert_eq!(
        *c.collects.borrow(),
        vec![(hs.clone(), ExecStatus::Timeout)]
    );
    let times = c.times.borrow();
    assert_eq!(
        times[1].1 - times[0].1,
        10_000,
        "wait ended at the deadline: {times:?}"
    );
    assert_eq!(*c.hints.borrow(), vec![hs[0]]);
    assert_eq!(c.outcome(hs[0]), vec![Err(Error::Aborted)]);
    assert_eq!(c.outcome(hs[1]), vec![Err(Error::Again)]);
    assert_eq!(c.outcome(hs[2]), vec![Err(Error::Again)]);
    assert_eq!(g.async_stats().offload_timeouts, 1);
    g.destroy().unwrap();
}

/// A cancel (or close(CANCEL)) that reaches a member whose DONE is recorded
/// but not yet delivered -- here between a driver kill and the finalizer's
/// delivery -- is harmless and DONE wins (B-049, B-051).
#[test]
fn b049_cancel_after_recorded_done_before_delivery_keeps_done() {
    let mut hits = 0;
    for seed in 0..32 {
        let sim = Sim::new(1000 + seed);
        let lp = sim.new_loop();
        let (g, c) = sync_group(&lp, sync_opts(4, 4, 4));
        c.yields_complete.set(Y);
        let x = g.submit(rq(1, 1), 1).unwrap();
        let y = g.submit(rq(2, 1), 1).unwrap();
        let c2 = c.clone();
        kill_when(&lp, &g, move || c2.in_cb.get() == "complete");
        let res = Rc::new(RefCell::new(None));
        let (g3, c3, r3, lp3) = (g.clone(), c.clone(), res.clone(), lp.clone());
        let drv = g.driver_pid();
        when(
            &lp,
            move || !lp3.is_alive(drv),
            move || {
                if c3.started.borrow().len() == 1 && c3.in_cb.get().is_empty() {
                    // The finalizer has not delivered y yet.
                    *r3.borrow_mut() = Some((g3.cancel(y), g3.close(CloseMode::Cancel)));
                }
            },
        );
        run(&sim);
        assert_eq!(c.invocations(x), 1);
        assert_eq!(c.invocations(y), 1);
        if let Some(r) = res.borrow_mut().take() {
            hits += 1;
            assert_eq!(r, (Ok(()), Ok(())), "seed {seed}");
            assert_eq!(c.outcome(y), vec![Ok(())], "seed {seed}: DONE must win");
        }
        g.destroy().unwrap();
    }
    assert!(hits > 0, "no seed reached the window");
}

/// Real loop: stopping is not draining; close routed through an existing
/// owner process after the stopped run, then run again (B-136..B-139, B-149).
#[test]
fn b138_stopped_run_then_close_through_owner_process() {
    let lp = Loop::new().unwrap();
    let (g, c) = sync_group(&lp, sync_opts(4, 1, 1));
    let a = g.submit(rq(1, 1), 1).unwrap();
    c.script(a, &[StepResult::Blocked]);
    let stopper = lp.clone();
    let gs = g.clone();
    lp.spawn(async move {
        while gs.stats().blocked == 0 {
            rt::yield_now().await;
        }
        stopper.stop();
    })
    .unwrap();
    let (cmd, cmd_p) = rt::future_pair::<CloseMode>();
    let owner = g.clone();
    lp.spawn(async move {
        let mode = cmd.await.unwrap();
        owner.close(mode).unwrap();
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(g.stats().blocked, 1);
    assert_eq!(g.destroy(), Err(Error::Again), "stopped, driver present");
    assert_eq!(
        g.close(CloseMode::Cancel),
        Err(Error::Inval),
        "not from outside the loop"
    );
    assert_eq!(g.destroy(), Err(Error::Again));
    cmd_p.set(Ok(CloseMode::Cancel));
    lp.run().unwrap();
    assert_eq!(c.outcome(a), vec![Err(Error::Aborted)]);
    assert_eq!(lp.n_procs(), 0);
    g.destroy().unwrap();
}

/// After a NORMAL driver exit the finalizer may still be in the process table:
/// destroy must say Again until it is gone, then succeed (B-147, B-148).
#[test]
fn b148_destroy_after_normal_exit_waits_for_the_finalizer() {
    let mut hits = 0;
    for seed in 0..32 {
        let sim = Sim::new(2000 + seed);
        let lp = sim.new_loop();
        let (g, c) = sync_group(&lp, sync_opts(2, 1, 1));
        let h = g.submit(rq(1, 2), 1).unwrap();
        g.close(CloseMode::Drain).unwrap();
        let res = Rc::new(RefCell::new(None));
        let (g2, r2, lp2) = (g.clone(), res.clone(), lp.clone());
        let (drv, fin) = (g.driver_pid(), g.finalizer_pid());
        when(
            &lp,
            move || !lp2.is_alive(drv),
            move || {
                if g2.owner_loop().is_alive(fin) {
                    *r2.borrow_mut() = Some(g2.destroy());
                }
            },
        );
        run(&sim);
        if let Some(r) = res.borrow_mut().take() {
            hits += 1;
            assert_eq!(r, Err(Error::Again), "seed {seed}: finalizer still present");
        }
        assert_eq!(c.outcome(h), vec![Ok(())]);
        g.destroy().unwrap();
    }
    assert!(hits > 0, "no seed reached the window");
}

/// A destroy that fails keeps the class registration (B-014): before the
/// first run a second group still cannot take the class.
#[test]
fn b014_failed_destroy_keeps_the_class_registration() {
    let sim = Sim::new(145);
    let lp = sim.new_loop();
    let class = lp.new_class(2).unwrap();
    let o = SyncOpts {
        sched_class: Some(class),
        ..sync_opts(2, 1, 1)
    };
    let c = C::default();
    let g = Group::create(&lp, o.clone(), S(c.clone()), Fin(c.clone())).unwrap();
    assert_eq!(g.destroy(), Err(Error::Again), "not closed");
    g.close(CloseMode::Drain).unwrap();
    assert_eq!(g.destroy(), Err(Error::Again), "driver present");
    let r = Group::create(&lp, o, S(c.clone()), Fin(c));
    assert_eq!(r.err(), Some(Error::Inval), "class still registered to g");
    run(&sim);
    g.destroy().unwrap();
}
