//! Adversarial tests of the batch engine against xtc_batch(3): asynchronous
//! groups (submit / collect / cancel_hint, FUTURE, INLINE, BLOCKING), the
//! status rules, and exactly-once across a driver kill at every suspension
//! point.
//!
//! Each test is named for the clause (B-NNN, `spec/clauses.md`) it attacks.

mod batch_adversarial_support;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use batch_adversarial_support::*;
use xtc::Error;
use xtc::batch::{AsyncOpts, CloseMode, ExecStatus, Group, StepResult};
use xtc::rt::{self, Loop, Sim};

#[test]
fn b015_create_async_after_first_step_is_again() {
    let sim = Sim::from_env(115);
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

#[test]
fn b041_deadlk_from_peer_during_async_submit_collect_and_cancel_hint() {
    let sim = Sim::from_env(119);
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
    let sim = Sim::from_env(120);
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
    let sim = Sim::from_env(121);
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
    let sim = Sim::from_env(122);
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
    // A promise resolved with an error, a dropped promise (under Sim), a
    // fence the readiness path refuses (a real loop: no fd readiness under
    // Sim, B-070).
    for (seed, how) in [(123, 0), (124, 1), (125, 2)] {
        let sim = Sim::new(seed);
        let lp = if how == 2 {
            Loop::new().unwrap()
        } else {
            sim.new_loop()
        };
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
        if how == 2 {
            lp.run().unwrap();
        } else {
            run(&sim);
        }
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
    let sim = Sim::from_env(126);
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

#[test]
fn b101_kill_parked_on_future_hints_all_then_collects_once_with_same_vector() {
    let sim = Sim::from_env(127);
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

#[test]
fn b100_kill_inside_collect_never_collects_or_completes_twice() {
    let sim = Sim::from_env(128);
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
    let sim = Sim::from_env(129);
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
    let sim = Sim::from_env(130);
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
    let sim = Sim::from_env(131);
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
    let sim = Sim::from_env(132);
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

#[test]
fn b155_same_seed_same_schedule() {
    let once = || {
        let sim = Sim::from_env(141);
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

#[test]
fn b078_blocking_wait_hints_on_cancel_but_close_cancel_does_not_end_it() {
    let sim = Sim::from_env(142);
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
    let sim = Sim::from_env(143);
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

#[test]
fn b085_timeout_deadline_holds_across_spurious_wakes() {
    let sim = Sim::from_env(144);
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
