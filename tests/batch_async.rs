//! Asynchronous groups under `rt::Sim`: INLINE, FUTURE and BLOCKING
//! operations, status rules, exec timeout, cancel hints, close(CANCEL) and
//! exactly-once across a driver kill (xtc_batch_create_async).

mod batch_support;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use batch_support::*;
use xtc::Error;
use xtc::batch::{
    AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Handle, Item, StepResult,
};
use xtc::rt::{self, Loop, Promise, Sim};

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Inline,
    Future,
    Blocking,
    Fence,
    SubmitFails,
    CollectFails,
}

/// What the application saw, in order.
#[derive(Default)]
struct Seen {
    submits: Vec<Vec<Handle>>,
    collects: Vec<(Vec<Handle>, ExecStatus)>,
    hints: Vec<Handle>,
    promises: Vec<Promise<()>>,
    probe: Vec<Error>,
}

type SeenRc = Rc<RefCell<Seen>>;

struct App {
    kind: Kind,
    seen: SeenRc,
    group: Rc<RefCell<Option<Group<Req>>>>,
}

impl AsyncStep<Req> for App {
    async fn submit(&mut self, items: &mut [Item<'_, Req>]) -> xtc::Result<Exec> {
        self.seen
            .borrow_mut()
            .submits
            .push(items.iter().map(|i| i.handle).collect());
        match self.kind {
            Kind::Inline | Kind::CollectFails => Ok(Exec::Inline),
            Kind::Future => {
                let (f, p) = rt::future_pair();
                self.seen.borrow_mut().promises.push(p);
                Ok(Exec::Future(f))
            }
            Kind::Blocking => Ok(Exec::Blocking(Box::new(|| Ok(())))),
            // A real, pollable eventfd: the simulator still cannot wait on
            // it (B-070).
            Kind::Fence => {
                let flags = rustix::event::EventfdFlags::CLOEXEC;
                Ok(Exec::Fence(Rc::new(
                    rustix::event::eventfd(0, flags).unwrap(),
                )))
            }
            Kind::SubmitFails => Err(Error::Nomem),
        }
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, Req>],
        results: &mut [StepResult],
        status: ExecStatus,
    ) -> xtc::Result<()> {
        assert!(results.iter().all(|r| *r == StepResult::Unset));
        self.seen
            .borrow_mut()
            .collects
            .push((items.iter().map(|i| i.handle).collect(), status));
        rt::yield_now().await;
        if self.kind == Kind::CollectFails {
            return Err(Error::Range);
        }
        countdown(items, results);
        Ok(())
    }

    async fn cancel_hint(&mut self, h: Handle) {
        self.seen.borrow_mut().hints.push(h);
        if let Some(g) = self.group.borrow().clone() {
            let e = g.cancel(h).unwrap_err();
            self.seen.borrow_mut().probe.push(e);
        }
        rt::yield_now().await;
    }
}

fn make(lp: &Loop, kind: Kind, o: AsyncOpts, log: &Log) -> (Group<Req>, SeenRc) {
    let seen = SeenRc::default();
    let slot = Rc::new(RefCell::new(None));
    let app = App {
        kind,
        seen: seen.clone(),
        group: slot.clone(),
    };
    let g = Group::create_async(lp, o, app, log.complete()).unwrap();
    *slot.borrow_mut() = Some(g.clone());
    (g, seen)
}

/// Spawns an owner process that closes the group once `cond` holds.
fn close_when(
    lp: &Loop,
    g: &Group<Req>,
    mode: CloseMode,
    cond: impl Fn(&Group<Req>) -> bool + 'static,
) {
    let g = g.clone();
    lp.spawn(async move {
        while !cond(&g) {
            rt::yield_now().await;
        }
        while g.close(mode).is_err() {
            rt::yield_now().await;
        }
    })
    .unwrap();
}

/// Runs a sim whose BLOCKING closures run on real pool threads: when nothing
/// is runnable it yields the CPU until a pool thread wakes the loop.
fn run_with_pool(sim: &Sim, lp: &Loop) {
    loop {
        while sim.step() {}
        if lp.n_procs() == 0 {
            return;
        }
        std::thread::yield_now();
    }
}

/// Resolves each promise as soon as it appears (a peer device) with
/// `value` (`None`: drops it), until the group's driver is gone.
fn device(lp: &Loop, g: &Group<Req>, seen: &SeenRc, value: Option<xtc::Result<()>>) {
    let seen = seen.clone();
    let (lp2, pid) = (lp.clone(), g.driver_pid());
    lp.spawn(async move {
        while lp2.is_alive(pid) {
            let p = seen.borrow_mut().promises.pop();
            match (p, value) {
                (Some(p), Some(v)) => p.set(v),
                (Some(p), None) => drop(p),
                (None, _) => rt::yield_now().await,
            }
        }
    })
    .unwrap();
}

#[test]
fn inline_collect_runs_once_per_submit_with_the_same_vector() {
    let sim = Sim::from_env(21);
    let lp = sim.new_loop();
    let log = Log::default();
    let (g, seen) = make(&lp, Kind::Inline, async_opts(8, 3, None), &log);
    for i in 1..=5 {
        g.submit(req(i, i), 10).unwrap();
    }
    g.close(CloseMode::Drain).unwrap();
    run_idle(&sim);
    let s = seen.borrow();
    assert_eq!(
        s.submits.len(),
        s.collects.len(),
        "collect exactly once per operation"
    );
    for (sub, (col, st)) in s.submits.iter().zip(&s.collects) {
        assert_eq!(sub, col, "the same frozen vector");
        assert_eq!(*st, ExecStatus::Ok);
    }
    assert_eq!(log.len(), 5);
    assert!(log.outcomes().iter().all(|o| o.1.is_ok()));
    let a = g.async_stats();
    assert_eq!(
        (a.offloads, a.offload_timeouts, a.offload_errors),
        (s.submits.len() as u64, 0, 0)
    );
    assert_eq!(g.stats().iterations, a.offloads);
}

#[test]
fn future_resolved_by_a_peer_continues_variable_length_batching() {
    let sim = Sim::from_env(22);
    let lp = sim.new_loop();
    let log = Log::default();
    let (g, seen) = make(&lp, Kind::Future, async_opts(8, 4, None), &log);
    for i in 1..=6 {
        g.submit(req(i, 1 + i % 3), 1).unwrap();
    }
    g.close(CloseMode::Drain).unwrap();
    device(&lp, &g, &seen, Some(Ok(())));
    run_idle(&sim);
    assert_eq!(log.len(), 6);
    assert!(log.outcomes().iter().all(|o| o.1.is_ok()));
    let s = seen.borrow();
    assert!(s.collects.iter().all(|c| c.1 == ExecStatus::Ok));
    assert!(
        s.submits.iter().any(|v| v.len() == 4),
        "members share one operation"
    );
}

#[test]
fn failed_or_dropped_promise_is_a_negative_status() {
    for (value, want) in [
        (Some(Err(Error::Nomem)), Error::Nomem),
        (None, Error::Aborted),
    ] {
        let sim = Sim::from_env(23);
        let lp = sim.new_loop();
        let log = Log::default();
        let (g, seen) = make(&lp, Kind::Future, async_opts(4, 4, None), &log);
        g.submit(req(1, 3), 1).unwrap();
        g.submit(req(2, 3), 1).unwrap();
        g.close(CloseMode::Drain).unwrap();
        device(&lp, &g, &seen, value);
        run_idle(&sim);
        assert_eq!(seen.borrow().collects[0].1, ExecStatus::Failed(want));
        assert_eq!(
            log.outcomes(),
            vec![(1, Err(want)), (2, Err(want))],
            "every member ends with it"
        );
        assert_eq!(g.async_stats().offload_errors, 1);
        assert_eq!(seen.borrow().submits.len(), 1, "never retried");
    }
}

#[test]
fn timeout_honours_done_and_error_and_ends_the_rest_again() {
    let sim = Sim::from_env(24);
    let lp = sim.new_loop();
    let log = Log::default();
    let (g, seen) = make(
        &lp,
        Kind::Future,
        async_opts(4, 4, Some(Duration::from_millis(5))),
        &log,
    );
    let h1 = g.submit(req(1, 1), 1).unwrap(); // countdown makes it DONE
    let h2 = g.submit(req(2, 4), 1).unwrap(); // CONTINUE → Again
    g.close(CloseMode::Drain).unwrap();
    run_idle(&sim);
    assert_eq!(seen.borrow().collects.len(), 1);
    assert_eq!(seen.borrow().collects[0].1, ExecStatus::Timeout);
    assert!(
        sim.now().as_nanos() >= 5_000_000,
        "the wait lasted until the deadline"
    );
    assert_eq!(log.outcome(h1), vec![Ok(())]);
    assert_eq!(log.outcome(h2), vec![Err(Error::Again)]);
    assert_eq!(g.async_stats().offload_timeouts, 1);
    assert_eq!(
        seen.borrow().submits.len(),
        1,
        "a member whose operation may run is never resubmitted"
    );
    g.destroy().unwrap();
    // Resolving after the group was destroyed is safe.
    seen.borrow_mut().promises.pop().unwrap().set(Ok(()));
}

#[test]
fn cancel_of_an_in_flight_member_hints_once_and_ends_it_aborted_after_collect() {
    let sim = Sim::from_env(25);
    let lp = sim.new_loop();
    let log = Log::default();
    let (g, seen) = make(&lp, Kind::Future, async_opts(4, 4, None), &log);
    let h1 = g.submit(req(1, 2), 1).unwrap();
    let h2 = g.submit(req(2, 2), 1).unwrap();
    let (g2, s2) = (g.clone(), seen.clone());
    lp.spawn(async move {
        while s2.borrow().promises.is_empty() {
            rt::yield_now().await;
        }
        g2.cancel(h1).unwrap(); // accepted while the operation is outstanding
        while s2.borrow().hints.is_empty() {
            rt::yield_now().await;
        }
        while g2.cancel(h1).is_err() {
            rt::yield_now().await; // Deadlk during the hint, then harmless
        }
        assert!(
            s2.borrow().collects.is_empty(),
            "a member's cancel does not end the wait"
        );
        let p = s2.borrow_mut().promises.pop().unwrap();
        p.set(Ok(()));
    })
    .unwrap();
    device_later(&lp, &g, &seen);
    close_when(&lp, &g, CloseMode::Drain, |_| true);
    run_idle(&sim);
    let s = seen.borrow();
    assert_eq!(
        s.hints,
        vec![h1],
        "hint fires once, on the cancelled member only"
    );
    assert_eq!(
        s.probe,
        vec![Error::Deadlk],
        "mutators are Deadlk during the hint"
    );
    assert_eq!(
        s.collects[0].0,
        vec![h1, h2],
        "collect still runs for the cancelled member"
    );
    assert_eq!(log.outcome(h1), vec![Err(Error::Aborted)]);
    assert_eq!(log.outcome(h2), vec![Ok(())]);
    assert!(
        s.submits[1..].iter().all(|v| !v.contains(&h1)),
        "never in a later vector"
    );
}

/// Resolves promises once the first collect ran (the first is the test's).
fn device_later(lp: &Loop, g: &Group<Req>, seen: &SeenRc) {
    let (lp2, g2, s2) = (lp.clone(), g.clone(), seen.clone());
    lp.spawn(async move {
        while s2.borrow().collects.is_empty() && lp2.is_alive(g2.driver_pid()) {
            rt::yield_now().await;
        }
        device(&lp2, &g2, &s2, Some(Ok(())));
    })
    .unwrap();
}

#[test]
fn close_cancel_ends_a_future_wait_with_aborted() {
    let sim = Sim::from_env(26);
    let lp = sim.new_loop();
    let log = Log::default();
    let (g, seen) = make(&lp, Kind::Future, async_opts(4, 2, None), &log);
    let hs: Vec<_> = (1..=3).map(|i| g.submit(req(i, 5), 1).unwrap()).collect();
    let s2 = seen.clone();
    close_when(&lp, &g, CloseMode::Cancel, move |_| {
        !s2.borrow().promises.is_empty()
    });
    run_idle(&sim);
    let s = seen.borrow();
    assert_eq!(s.collects.len(), 1);
    assert_eq!(s.collects[0].1, ExecStatus::Aborted);
    assert_eq!(
        s.hints,
        vec![hs[0], hs[1]],
        "hints for the in-flight members"
    );
    assert!(log.outcomes().iter().all(|o| o.1 == Err(Error::Aborted)));
    assert_eq!(log.len(), 3);
}

#[test]
fn killed_driver_parked_on_a_future_collects_once_with_aborted() {
    let sim = Sim::from_env(27);
    let lp = sim.new_loop();
    let log = Log::default();
    let (g, seen) = make(&lp, Kind::Future, async_opts(4, 2, None), &log);
    let hs: Vec<_> = (1..=3).map(|i| g.submit(req(i, 5), 1).unwrap()).collect();
    g.cancel(hs[2]).unwrap();
    let (k, s2) = (g.clone(), seen.clone());
    lp.spawn(async move {
        while s2.borrow().promises.is_empty() {
            rt::yield_now().await;
        }
        k.owner_loop().kill(k.driver_pid()).unwrap();
    })
    .unwrap();
    run_idle(&sim);
    let s = seen.borrow();
    assert_eq!(s.collects.len(), 1, "collect exactly once, on teardown");
    assert_eq!(s.collects[0], (vec![hs[0], hs[1]], ExecStatus::Aborted));
    assert_eq!(
        s.hints,
        vec![hs[0], hs[1]],
        "hints for every in-flight member before collect"
    );
    assert_eq!(log.outcome(hs[0]), vec![Err(Error::Aborted)]);
    assert_eq!(log.outcome(hs[1]), vec![Err(Error::Aborted)]);
    assert_eq!(
        log.outcome(hs[2]),
        vec![Err(Error::Aborted)],
        "cancelled before: Aborted"
    );
    drop(s);
    seen.borrow_mut().promises.pop().unwrap().set(Ok(())); // the future was discarded: harmless
    g.destroy().unwrap();
}

#[test]
fn submit_error_fails_the_members_without_an_operation() {
    let sim = Sim::from_env(28);
    let lp = sim.new_loop();
    let log = Log::default();
    let (g, seen) = make(&lp, Kind::SubmitFails, async_opts(4, 4, None), &log);
    g.submit(req(1, 2), 1).unwrap();
    g.submit(req(2, 2), 1).unwrap();
    g.close(CloseMode::Drain).unwrap();
    run_idle(&sim);
    assert!(
        seen.borrow().collects.is_empty(),
        "no operation outstanding, no collect"
    );
    assert_eq!(
        log.outcomes(),
        vec![(1, Err(Error::Nomem)), (2, Err(Error::Nomem))]
    );
    assert_eq!(g.async_stats().offloads, 0);
}

#[test]
fn failed_collect_fails_the_vector() {
    let sim = Sim::from_env(29);
    let lp = sim.new_loop();
    let log = Log::default();
    let (g, _) = make(&lp, Kind::CollectFails, async_opts(4, 4, None), &log);
    g.submit(req(1, 2), 1).unwrap();
    g.close(CloseMode::Drain).unwrap();
    run_idle(&sim);
    assert_eq!(log.outcomes(), vec![(1, Err(Error::Range))]);
}

#[test]
fn fence_is_not_sim_reachable() {
    let sim = Sim::from_env(30);
    let lp = sim.new_loop();
    let log = Log::default();
    let (g, seen) = make(&lp, Kind::Fence, async_opts(4, 4, None), &log);
    g.submit(req(1, 2), 1).unwrap();
    g.close(CloseMode::Drain).unwrap();
    run_idle(&sim);
    assert_eq!(
        seen.borrow().collects[0].1,
        ExecStatus::Failed(Error::Nosys)
    );
    assert_eq!(log.outcomes(), vec![(1, Err(Error::Nosys))]);
    assert_eq!(g.async_stats().offload_errors, 1);
}

#[test]
fn blocking_operation_runs_on_the_pool() {
    let sim = Sim::from_env(31);
    let lp = sim.new_loop();
    let log = Log::default();
    let (g, seen) = make(
        &lp,
        Kind::Blocking,
        async_opts(4, 2, Some(Duration::from_nanos(1))),
        &log,
    );
    for i in 1..=3 {
        g.submit(req(i, 2), 1).unwrap();
    }
    g.close(CloseMode::Drain).unwrap();
    run_with_pool(&sim, &lp);
    assert!(
        seen.borrow().collects.iter().all(|c| c.1 == ExecStatus::Ok),
        "exec_timeout does not apply"
    );
    assert_eq!(log.len(), 3);
    assert!(log.outcomes().iter().all(|o| o.1.is_ok()));
}

#[test]
fn killed_driver_waits_for_a_blocking_closure_before_collect() {
    let sim = Sim::from_env(32);
    let lp = sim.new_loop();
    let log = Log::default();
    let (release_tx, release_rx) = crossbeam_channel::bounded::<()>(1);
    let (ran_tx, ran_rx) = crossbeam_channel::bounded::<()>(1);
    struct Gate {
        rx: crossbeam_channel::Receiver<()>,
        ran: crossbeam_channel::Sender<()>,
        collected: Rc<RefCell<Vec<ExecStatus>>>,
    }
    impl AsyncStep<Req> for Gate {
        async fn submit(&mut self, _: &mut [Item<'_, Req>]) -> xtc::Result<Exec> {
            let (rx, ran) = (self.rx.clone(), self.ran.clone());
            Ok(Exec::Blocking(Box::new(move || {
                ran.send(()).unwrap();
                rx.recv().unwrap();
                Ok(())
            })))
        }
        async fn collect(
            &mut self,
            _: &mut [Item<'_, Req>],
            r: &mut [StepResult],
            s: ExecStatus,
        ) -> xtc::Result<()> {
            self.collected.borrow_mut().push(s);
            r.fill(StepResult::Continue);
            Ok(())
        }
    }
    let collected = Rc::new(RefCell::new(Vec::new()));
    let gate = Gate {
        rx: release_rx,
        ran: ran_tx,
        collected: collected.clone(),
    };
    let g = Group::create_async(&lp, async_opts(2, 1, None), gate, log.complete()).unwrap();
    let h = g.submit(req(1, 1), 1).unwrap();
    let k = g.clone();
    lp.spawn(async move {
        while ran_rx.try_recv().is_err() {
            rt::yield_now().await;
        }
        k.owner_loop().kill(k.driver_pid()).unwrap();
        // Close and kill do not end a BLOCKING wait: still parked.
        for _ in 0..10 {
            rt::yield_now().await;
        }
        assert!(k.stats().completed + k.stats().cancelled == 0);
        release_tx.send(()).unwrap();
    })
    .unwrap();
    run_with_pool(&sim, &lp);
    assert_eq!(*collected.borrow(), vec![ExecStatus::Aborted]);
    assert_eq!(log.outcome(h), vec![Err(Error::Aborted)]);
}

#[test]
fn async_stats_are_zero_on_a_sync_group() {
    let sim = Sim::from_env(33);
    let lp = sim.new_loop();
    let log = Log::default();
    let g = Group::create(&lp, sync_opts(2, 1, 1), countdown_step(), log.complete()).unwrap();
    g.submit(req(1, 2), 1).unwrap();
    g.close(CloseMode::Drain).unwrap();
    run_idle(&sim);
    assert_eq!(g.async_stats(), xtc::batch::AsyncStats::default());
    assert_eq!(g.stats().completed, 1);
}

#[test]
fn async_create_validates_like_sync() {
    let sim = Sim::from_env(34);
    let lp = sim.new_loop();
    let log = Log::default();
    let seen = SeenRc::default();
    let app = || App {
        kind: Kind::Inline,
        seen: seen.clone(),
        group: Rc::new(RefCell::new(None)),
    };
    let bad = AsyncOpts {
        max_active: 0,
        ..async_opts(2, 1, None)
    };
    assert_eq!(
        Group::create_async(&lp, bad, app(), log.complete()).unwrap_err(),
        Error::Inval
    );
    let bad = AsyncOpts {
        resource_capacity: 0,
        ..async_opts(2, 1, None)
    };
    assert_eq!(
        Group::create_async(&lp, bad, app(), log.complete()).unwrap_err(),
        Error::Inval
    );
    let g = Group::create_async(&lp, async_opts(2, 1, None), app(), log.complete()).unwrap();
    g.close(CloseMode::Drain).unwrap();
    run_idle(&sim);
    assert_eq!(
        Group::create_async(&lp, async_opts(2, 1, None), app(), log.complete()).unwrap_err(),
        Error::Again
    );
    g.destroy().unwrap();
}
