//! Synchronous groups: the xtc_batch(3) contract for create, submit, step,
//! complete, cancel, resume, close, destroy and statistics (under `rt::Sim`
//! unless a real loop is the point).

mod batch_support;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use batch_support::*;
use xtc::Error;
use xtc::batch::{CloseMode, Group, Item, Step, StepResult, SyncOpts, step_fn};
use xtc::rt::{self, Loop, Sim};

fn group(lp: &Loop, opts: SyncOpts, log: &Log) -> Group<Req> {
    Group::create(lp, opts, countdown_step(), log.complete()).unwrap()
}

/// A group handle reachable from inside its own callbacks.
type Slot = Rc<RefCell<Option<Group<Req>>>>;

fn slot_get(s: &Slot) -> Group<Req> {
    s.borrow().clone().unwrap()
}

#[test]
fn create_validates_options() {
    let sim = Sim::from_env(1);
    let lp = sim.new_loop();
    let log = Log::default();
    for (c, m, u) in [(0, 0, 1), (1, 2, 1), (2, 0, 1), (2, 1, 0)] {
        let r = Group::<Req>::create(&lp, sync_opts(c, m, u), countdown_step(), log.complete());
        assert_eq!(
            r.unwrap_err(),
            Error::Inval,
            "capacity {c} max_active {m} units {u}"
        );
    }
    let big = Group::<Req>::create(
        &lp,
        sync_opts(usize::MAX / 2, 1, 1),
        countdown_step(),
        log.complete(),
    );
    assert_eq!(big.unwrap_err(), Error::Range, "size arithmetic is checked");
    assert_eq!(lp.n_procs(), 0, "failed creates publish nothing");
    let g = group(&lp, sync_opts(2, 1, 1), &log);
    assert!(lp.is_alive(g.driver_pid()), "a group owns a driver process");
    g.close(CloseMode::Drain).unwrap();
    run_idle(&sim);
    g.destroy().unwrap();
}

#[test]
fn create_after_first_run_is_again() {
    let sim = Sim::from_env(2);
    let lp = sim.new_loop();
    let log = Log::default();
    let g = group(&lp, sync_opts(2, 1, 1), &log);
    assert!(sim.step());
    let r = Group::<Req>::create(&lp, sync_opts(2, 1, 1), countdown_step(), log.complete());
    assert_eq!(r.unwrap_err(), Error::Again);
    let closer = g.clone();
    lp.spawn(async move { closer.close(CloseMode::Drain).unwrap() })
        .unwrap();
    run_idle(&sim);
    g.destroy().unwrap();
}

#[test]
fn sched_class_must_be_own_and_unshared_between_groups() {
    let sim = Sim::from_env(3);
    let (a, b) = (sim.new_loop(), sim.new_loop());
    let log = Log::default();
    let foreign = b.new_class(2).unwrap();
    let with = |_: &Loop, c: &rt::SchedClass| SyncOpts {
        sched_class: Some(c.clone()),
        ..sync_opts(2, 1, 1)
    };
    let r = Group::<Req>::create(&a, with(&a, &foreign), countdown_step(), log.complete());
    assert_eq!(r.unwrap_err(), Error::Inval, "class of another loop");
    let class = a.new_class(2).unwrap();
    // A create that fails later releases its registration.
    a.budget().fail_after(0);
    let r = Group::<Req>::create(&a, with(&a, &class), countdown_step(), log.complete());
    assert_eq!(r.unwrap_err(), Error::Nomem);
    let g = Group::<Req>::create(&a, with(&a, &class), countdown_step(), log.complete()).unwrap();
    let r = Group::<Req>::create(&a, with(&a, &class), countdown_step(), log.complete());
    assert_eq!(r.unwrap_err(), Error::Inval, "registered to another group");
    let ran = Rc::new(Cell::new(false));
    let r2 = ran.clone();
    a.spawn_in(&class, async move { r2.set(true) }).unwrap();
    g.close(CloseMode::Drain).unwrap();
    run_idle(&sim);
    assert!(ran.get(), "ordinary processes may share the class");
    g.destroy().unwrap();
}

#[test]
fn failed_create_publishes_nothing() {
    for n in 0..3 {
        let sim = Sim::from_env(4);
        let lp = sim.new_loop();
        let used = lp.budget().used();
        lp.budget().fail_after(n);
        let r = Group::<Req>::create(
            &lp,
            sync_opts(4, 2, 4),
            countdown_step(),
            Log::default().complete(),
        );
        assert_eq!(
            r.unwrap_err(),
            Error::Nomem,
            "injected failure at charge {n}"
        );
        run_idle(&sim);
        assert_eq!(lp.n_procs(), 0, "no process left (charge {n})");
        assert_eq!(
            lp.budget().used(),
            used,
            "every charge released (charge {n})"
        );
    }
}

#[test]
fn iterations_hand_the_whole_vector_once() {
    let sim = Sim::from_env(5);
    let lp = sim.new_loop();
    let log = Log::default();
    let sizes = Rc::new(RefCell::new(Vec::new()));
    let s2 = sizes.clone();
    let step = step_fn(move |items: &mut [Item<'_, Req>], res: &mut [StepResult]| {
        assert!(
            res.iter().all(|r| *r == StepResult::Unset),
            "results start UNSET"
        );
        let mut hs: Vec<_> = items.iter().map(|i| i.handle).collect();
        hs.dedup();
        assert_eq!(hs.len(), items.len(), "a member appears once per vector");
        s2.borrow_mut().push(items.len());
        countdown(items, res);
        Ok(())
    });
    let g = Group::create(&lp, sync_opts(8, 4, 100), step, log.complete()).unwrap();
    let mut handles = Vec::new();
    for i in 1..=6 {
        handles.push(g.submit(req(i, i), 10).unwrap());
    }
    assert!(
        handles.windows(2).all(|w| w[0] < w[1]),
        "handles strictly increasing"
    );
    g.close(CloseMode::Drain).unwrap();
    run_idle(&sim);
    // 1..4 admitted; 1 leaves after one iteration and 5 refills, 2 leaves
    // and 6 refills; then members leave one by one.
    assert_eq!(*sizes.borrow(), vec![4, 4, 4, 3, 2, 2, 1, 1]);
    let out = log.0.borrow();
    assert_eq!(out.len(), 6, "one completion per submit");
    assert!(
        out.iter().all(|(_, r, o)| o.is_ok() && r.left == 0),
        "requests come back by value"
    );
    let s = g.stats();
    assert_eq!(
        (s.iterations, s.max_vector, s.total_members, s.completed),
        (8, 4, 21, 6)
    );
    assert_eq!(
        (s.queued, s.ready, s.blocked, s.reserved_units),
        (0, 0, 0, 0)
    );
    drop(out);
    g.destroy().unwrap();
}

#[test]
fn result_words_and_step_errors() {
    let sim = Sim::from_env(6);
    let lp = sim.new_loop();
    let log = Log::default();
    let calls = Rc::new(Cell::new(0));
    let c2 = calls.clone();
    let step = step_fn(move |items: &mut [Item<'_, Req>], res: &mut [StepResult]| {
        c2.set(c2.get() + 1);
        if items.iter().any(|i| i.request.id == 10) {
            return Err(Error::Nomem); // fails the whole vector
        }
        for (i, r) in items.iter().zip(res.iter_mut()) {
            *r = match i.request.id {
                1 => StepResult::Done,
                2 => StepResult::Error(Error::Range),
                _ => StepResult::Unset,
            };
        }
        Ok(())
    });
    let g = Group::create(&lp, sync_opts(8, 8, 8), step, log.complete()).unwrap();
    for id in 1..=3 {
        g.submit(req(id, 1), 1).unwrap();
    }
    let closer = g.clone();
    lp.spawn(async move {
        while closer.stats().iterations == 0 {
            rt::yield_now().await;
        }
        closer.submit(req(10, 1), 1).unwrap();
        closer.submit(req(11, 1), 1).unwrap();
        closer.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    run_idle(&sim);
    let mut got = log.outcomes();
    got.sort_by_key(|o| o.0);
    assert_eq!(
        got,
        vec![
            (1, Ok(())),
            (2, Err(Error::Range)),
            (3, Err(Error::Internal)),
            (10, Err(Error::Nomem)),
            (11, Err(Error::Nomem))
        ]
    );
    assert_eq!(calls.get(), 2, "nothing is retried");
    let s = g.stats();
    assert_eq!((s.completed, s.failed), (1, 4));
}

#[test]
fn submit_errors_hand_the_request_back_and_count_rejections() {
    let sim = Sim::from_env(7);
    let lp = sim.new_loop();
    let log = Log::default();
    let g = group(&lp, sync_opts(2, 1, 5), &log);
    assert_eq!(g.submit(req(1, 1), 0).unwrap_err().error, Error::Range);
    let e = g.submit(req(2, 1), 6).unwrap_err();
    assert_eq!((e.error, e.into_inner()), (Error::Range, req(2, 1)));
    g.submit(req(3, 1), 5).unwrap();
    g.submit(req(4, 1), 5).unwrap();
    let e = g.submit(req(5, 1), 1).unwrap_err();
    assert_eq!((e.error, e.request.id), (Error::Again, 5), "full");
    assert_eq!(g.stats().rejections, 3);
    g.close(CloseMode::Drain).unwrap();
    assert_eq!(
        g.submit(req(6, 1), 1).unwrap_err().error,
        Error::Again,
        "closed"
    );
    run_idle(&sim);
    assert_eq!(log.len(), 2, "failed submits cause no callback");
    assert_eq!(g.stats().rejections, 4);
}

#[test]
fn handles_are_paired_with_their_group_and_never_wrap() {
    let sim = Sim::from_env(8);
    let lp = sim.new_loop();
    let log = Log::default();
    let a = group(&lp, sync_opts(4, 1, 1), &log);
    let b = group(&lp, sync_opts(4, 1, 1), &log);
    let ha = a.submit(req(1, 1), 1).unwrap();
    let hb = b.submit(req(2, 1), 1).unwrap();
    assert_ne!(ha, hb);
    assert_eq!(b.cancel(ha), Err(Error::Inval), "handle of another group");
    assert_eq!(b.resume(ha), Err(Error::Inval));
    b.debug_set_last_handle(u64::MAX - 1);
    assert_eq!(b.submit(req(3, 1), 1).unwrap().get(), u64::MAX);
    let e = b.submit(req(4, 1), 1).unwrap_err();
    assert_eq!(
        (e.error, e.request.id),
        (Error::Range, 4),
        "exhaustion is Range, never a wrap"
    );
    a.close(CloseMode::Drain).unwrap();
    b.close(CloseMode::Drain).unwrap();
    run_idle(&sim);
    assert_eq!(log.len(), 3);
}

/// A step that blocks member 1 on its first iteration and counts down others.
fn blocking_first() -> impl Step<Req> {
    let blocked = Rc::new(Cell::new(false));
    step_fn(move |items: &mut [Item<'_, Req>], res: &mut [StepResult]| {
        countdown(items, res);
        for (i, r) in items.iter().zip(res.iter_mut()) {
            if i.request.id == 1 && !blocked.replace(true) {
                *r = StepResult::Blocked;
            }
        }
        Ok(())
    })
}

#[test]
fn blocked_members_keep_slot_and_charge_until_resumed() {
    let sim = Sim::from_env(9);
    let lp = sim.new_loop();
    let log = Log::default();
    let g = Group::create(&lp, sync_opts(3, 1, 4), blocking_first(), log.complete()).unwrap();
    let h1 = g.submit(req(1, 3), 4).unwrap();
    let h2 = g.submit(req(2, 1), 1).unwrap();
    g.close(CloseMode::Drain).unwrap();
    run_idle_or_parked(&sim);
    let s = g.stats();
    assert_eq!(
        (s.blocked, s.ready, s.queued, s.reserved_units),
        (1, 0, 1, 4),
        "BLOCKED keeps slot and charge"
    );
    assert_eq!(log.len(), 0, "drain waits for the blocked member");
    let g2 = g.clone();
    lp.spawn(async move {
        assert_eq!(g2.resume(h2), Err(Error::Inval), "WAITING is not resumable");
        g2.resume(h1).unwrap();
        g2.resume(h1).unwrap(); // duplicate resume on READY is harmless
        assert_eq!(g2.stats().reserved_units, 4, "resume keeps the charge");
    })
    .unwrap();
    run_idle(&sim);
    assert_eq!(log.outcomes(), vec![(1, Ok(())), (2, Ok(()))]);
    let g3 = g.clone();
    lp.spawn(async move { assert_eq!(g3.resume(h1), Err(Error::Inval), "terminal") })
        .unwrap();
    run_idle(&sim);
    g.destroy().unwrap();
}

/// Steps until nothing is runnable; the group's driver may stay parked.
fn run_idle_or_parked(sim: &Sim) {
    while sim.step() {}
}

#[test]
fn all_blocked_and_waiting_close_cancel_makes_progress() {
    let sim = Sim::from_env(10);
    let lp = sim.new_loop();
    let log = Log::default();
    let step = step_fn(|_: &mut [Item<'_, Req>], res: &mut [StepResult]| {
        res.fill(StepResult::Blocked);
        Ok(())
    });
    let g = Group::create(&lp, sync_opts(3, 1, 1), step, log.complete()).unwrap();
    for id in 1..=3 {
        g.submit(req(id, 1), 1).unwrap();
    }
    run_idle_or_parked(&sim);
    assert_eq!((g.stats().blocked, g.stats().queued), (1, 2));
    let g2 = g.clone();
    lp.spawn(async move {
        g2.close(CloseMode::Drain).unwrap();
        g2.close(CloseMode::Cancel).unwrap(); // escalation
        g2.close(CloseMode::Drain).unwrap(); // never a downgrade
    })
    .unwrap();
    run_idle(&sim);
    assert_eq!(
        log.outcomes()
            .iter()
            .filter(|o| o.1 == Err(Error::Aborted))
            .count(),
        3
    );
    assert_eq!(g.stats().cancelled, 3);
    g.destroy().unwrap();
}

#[test]
fn cancel_rules_at_the_boundary() {
    let sim = Sim::from_env(11);
    let lp = sim.new_loop();
    let log = Log::default();
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s2 = seen.clone();
    let step = step_fn(move |items: &mut [Item<'_, Req>], res: &mut [StepResult]| {
        s2.borrow_mut().extend(items.iter().map(|i| i.request.id));
        countdown(items, res);
        Ok(())
    });
    let g = Group::create(&lp, sync_opts(4, 1, 1), step, log.complete()).unwrap();
    let h1 = g.submit(req(1, 2), 1).unwrap();
    let h2 = g.submit(req(2, 1), 1).unwrap();
    g.cancel(h2).unwrap();
    g.cancel(h2).unwrap(); // duplicate before notification: harmless
    let g2 = g.clone();
    lp.spawn(async move {
        while g2.stats().completed == 0 {
            rt::yield_now().await;
        }
        assert_eq!(g2.cancel(h1), Err(Error::Inval), "stale after notification");
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    run_idle(&sim);
    assert!(
        !seen.borrow().contains(&2),
        "a cancelled waiting request never runs"
    );
    assert_eq!(log.outcome(h2), vec![Err(Error::Aborted)]);
    assert_eq!(log.outcome(h1), vec![Ok(())]);
    let s = g.stats();
    assert_eq!((s.completed, s.cancelled, s.reserved_units), (1, 1, 0));
}

#[test]
fn cancel_during_the_last_iteration_reports_done_once() {
    let sim = Sim::from_env(12);
    let lp = sim.new_loop();
    let log = Log::default();
    let g = Group::create(
        &lp,
        sync_opts(2, 1, 3),
        countdown_step(),
        SlowComplete {
            log: log.clone(),
            yields: 3,
        },
    )
    .unwrap();
    let h = g.submit(req(1, 1), 3).unwrap();
    let g2 = g.clone();
    let results = Rc::new(RefCell::new(Vec::new()));
    let r2 = results.clone();
    lp.spawn(async move {
        loop {
            let r = g2.cancel(h);
            r2.borrow_mut().push(r);
            if r == Err(Error::Inval) {
                break;
            }
            rt::yield_now().await;
        }
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    run_idle(&sim);
    let rs = results.borrow();
    assert_eq!(
        *rs.last().unwrap(),
        Err(Error::Inval),
        "a cancel after completion is Inval"
    );
    let outcomes = log.outcome(h);
    if rs.iter().any(|r| r.is_ok()) {
        // The cancel landed before the vector: it excluded the member.
        assert_eq!(outcomes, vec![Err(Error::Aborted)]);
    } else {
        assert_eq!(outcomes, vec![Ok(())], "DONE reported once");
        assert!(
            rs.contains(&Err(Error::Deadlk)),
            "refused while the completion ran"
        );
    }
    assert_eq!(g.stats().reserved_units, 0, "charge released");
}

#[test]
fn cancel_after_done_in_the_same_iteration_finishes_once() {
    // A peer cancels while the step (which returns DONE) is suspended.
    let sim = Sim::from_env(13);
    let lp = sim.new_loop();
    let log = Log::default();
    struct YieldStep;
    impl Step<Req> for YieldStep {
        async fn step(
            &mut self,
            items: &mut [Item<'_, Req>],
            res: &mut [StepResult],
        ) -> xtc::Result<()> {
            rt::yield_now().await;
            rt::yield_now().await;
            countdown(items, res);
            Ok(())
        }
    }
    let g = Group::create(&lp, sync_opts(2, 1, 1), YieldStep, log.complete()).unwrap();
    let h = g.submit(req(1, 1), 1).unwrap();
    let g2 = g.clone();
    lp.spawn(async move {
        while g2.stats().iterations == 0 {
            rt::yield_now().await;
        }
        let r = g2.cancel(h);
        assert!(matches!(r, Err(Error::Deadlk) | Err(Error::Inval)), "{r:?}");
        while g2.close(CloseMode::Drain).is_err() {
            rt::yield_now().await;
        }
    })
    .unwrap();
    run_idle(&sim);
    assert_eq!(log.outcome(h), vec![Ok(())], "finished exactly once");
}

#[test]
fn mutators_are_deadlk_during_callbacks_and_stats_stay_readable() {
    let sim = Sim::from_env(14);
    let lp = sim.new_loop();
    let log = Log::default();
    let slot: Slot = Rc::new(RefCell::new(None));
    let errs = Rc::new(RefCell::new(Vec::new()));
    struct Probe {
        slot: Slot,
        errs: Rc<RefCell<Vec<Error>>>,
    }
    impl Step<Req> for Probe {
        async fn step(
            &mut self,
            items: &mut [Item<'_, Req>],
            res: &mut [StepResult],
        ) -> xtc::Result<()> {
            let g = slot_get(&self.slot);
            let h = items[0].handle;
            let errs = [
                g.submit(req(99, 1), 1).unwrap_err().error,
                g.cancel(h).unwrap_err(),
                g.resume(h).unwrap_err(),
                g.close(CloseMode::Cancel).unwrap_err(),
                g.destroy().unwrap_err(),
            ];
            self.errs.borrow_mut().extend(errs);
            assert_eq!(
                g.stats().ready,
                items.len() as u64,
                "stats readable in a callback"
            );
            rt::yield_now().await;
            countdown(items, res);
            Ok(())
        }
    }
    let g = Group::create(
        &lp,
        sync_opts(4, 2, 2),
        Probe {
            slot: slot.clone(),
            errs: errs.clone(),
        },
        log.complete(),
    )
    .unwrap();
    *slot.borrow_mut() = Some(g.clone());
    let h = g.submit(req(1, 2), 1).unwrap();
    let peer = g.clone();
    let peer_errs = errs.clone();
    lp.spawn(async move {
        while peer.stats().iterations == 0 {
            rt::yield_now().await;
        }
        // The step is suspended in its yield: peers are refused too.
        let mut e = peer_errs.borrow_mut();
        e.push(peer.submit(req(98, 1), 1).unwrap_err().error);
        e.push(peer.cancel(h).unwrap_err());
        e.push(peer.close(CloseMode::Drain).unwrap_err());
        e.push(peer.destroy().unwrap_err());
    })
    .unwrap();
    let closer = g.clone();
    lp.spawn(async move {
        while closer.close(CloseMode::Drain).is_err() {
            rt::yield_now().await;
        }
    })
    .unwrap();
    run_idle(&sim);
    let e = errs.borrow();
    assert!(e.len() >= 10, "{e:?}");
    assert!(e.iter().all(|x| *x == Error::Deadlk), "{e:?}");
    assert_eq!(log.outcome(h), vec![Ok(())]);
    assert_eq!(g.stats().rejections, 0, "Deadlk submits are not rejections");
    *slot.borrow_mut() = None;
}
