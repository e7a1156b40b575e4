//! Adversarial tests of the batch engine against xtc_batch(3), synchronous
//! groups: callbacks (mutators from peers and other groups), kills,
//! ownership, close, create and destroy.
//!
//! Each test is named for the clause (B-NNN, `spec/clauses.md`) it attacks. A
//! failing test here is a bug found by the breaker (see its report); none is
//! ignored. Admission, handles, cancels and statistics:
//! `batch_adversarial_admission.rs`; asynchronous groups:
//! `batch_adversarial_async.rs`.

mod batch_adversarial_support;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use batch_adversarial_support::*;
use xtc::Error;
use xtc::batch::{CloseMode, Group, Handle, StepResult, SyncOpts};
use xtc::rt::{self, Loop, Sim};

#[test]
fn b041_deadlk_from_peer_during_yielding_complete() {
    let sim = Sim::from_env(101);
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
    let sim = Sim::from_env(102);
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
    let sim = Sim::from_env(103);
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

#[test]
fn b039_kill_inside_complete_recorded_done_survives_and_is_not_repeated() {
    let sim = Sim::from_env(104);
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
    let sim = Sim::from_env(105);
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
    let sim = Sim::from_env(113);
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
    let sim = Sim::from_env(114);
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
fn b017_failed_create_at_process_spawn_publishes_nothing_and_releases_class() {
    for n in 1..=2 {
        let sim = Sim::from_env(116);
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
        // Observed at once, before the loop runs: (processes left in the
        // table, bytes still charged, a second create with the same class).
        let procs = lp.n_procs();
        let leaked = lp.budget().used() - used;
        let again = Group::create(&lp, o.clone(), S(c.clone()), Fin(c.clone()));
        let again_err = again.as_ref().err().copied();
        assert_eq!(
            (procs, leaked, again_err),
            (0, 0, None),
            "charge {n}: (procs published, bytes leaked, class reuse error)"
        );
        let g = again.unwrap();
        g.close(CloseMode::Drain).unwrap();
        run(&sim);
        g.destroy().unwrap();
    }
}

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

#[test]
fn b014_failed_destroy_keeps_the_class_registration() {
    let sim = Sim::from_env(145);
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

/// Deadlk is per group: a completion of one group may submit to another
/// group of the same loop (a pipeline), and that group runs it (B-041).
#[test]
fn b041_callback_of_one_group_may_mutate_another_group() {
    let sim = Sim::from_env(147);
    let lp = sim.new_loop();
    let (g2, c2) = sync_group(&lp, sync_opts(8, 4, 4));
    let forwarded = Rc::new(RefCell::new(Vec::new()));
    let (to, fw) = (g2.clone(), forwarded.clone());
    let c1 = C::default();
    let g1 = Group::create(
        &lp,
        sync_opts(8, 4, 4),
        S(c1.clone()),
        move |_h: Handle, r: Rq, o: xtc::Result<()>| {
            assert_eq!(o, Ok(()));
            let r = to.submit(r, 1).map_err(|e| e.error);
            fw.borrow_mut().push(r);
        },
    )
    .unwrap();
    for i in 0..4 {
        g1.submit(rq(i, 1 + i), 1).unwrap();
    }
    g1.close(CloseMode::Drain).unwrap();
    let (g1b, g2b) = (g1.clone(), g2.clone());
    lp.spawn(async move {
        while g1b.owner_loop().is_alive(g1b.driver_pid()) {
            rt::yield_now().await;
        }
        g2b.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    run(&sim);
    let fw = forwarded.borrow();
    assert_eq!(fw.len(), 4);
    assert!(fw.iter().all(|r| r.is_ok()), "{fw:?}");
    assert_eq!(c2.done.borrow().len(), 4);
    g1.destroy().unwrap();
    g2.destroy().unwrap();
}
