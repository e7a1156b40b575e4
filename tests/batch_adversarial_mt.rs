//! Adversarial tests of cross-loop admission (`Remote`: submit_mt, cancel_mt,
//! resume_mt) and of asynchronous groups against xtc_batch(3), under
//! `rt::Sim`: held hand-ins, FCFS across the owner and mt paths, controls
//! wherever the request is, stale controls, close and kill ordering with
//! hand-ins on the ring, and the statistics that count them. The test thread
//! calls the `Remote` between simulator steps, as a plain OS thread would.
//! Real threads: `batch_adversarial_mt_threads.rs`.
//!
//! Each test is named for the clause (B-NNN, `spec/clauses.md`) it attacks.

mod batch_adversarial_support;

use std::thread;

use batch_adversarial_support::mt::*;
use batch_adversarial_support::*;
use xtc::Error;
use xtc::batch::{CloseMode, ExecStatus, Group, Handle, StepResult};
use xtc::rt::Sim;

#[test]
fn b118_owner_submit_is_again_while_a_hand_in_is_held() {
    let sim = Sim::from_env(118);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(1, 1, 2), Kind::Inline);
    let [a, h1, h2] = one_blocked_two_held(&sim, &c, &g, &r);
    // B-174: held hand-ins count as queued.
    assert_eq!(g.stats().queued, 2, "held hand-ins are queued");
    let g2 = g.clone();
    let refused = on_owner(&sim, &lp, move || {
        g2.submit(rq(9, 1), 1).map_err(|e| e.error)
    });
    assert_eq!(
        refused.unwrap_err(),
        Error::Again,
        "owner submit while held"
    );
    // The slot frees: the held hand-ins take it, in arrival order, before a
    // later owner submit.
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.resume(a)).unwrap();
    let g2 = g.clone();
    let d = on_owner(&sim, &lp, move || {
        g2.submit(rq(4, 1), 1).map_err(|e| e.error)
    })
    .unwrap();
    assert!(d > h2 && h2 > h1 && h1 > a, "one monotonic space");
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
    run(&sim);
    assert_eq!(ids(&c), vec![1, 2, 3, 4], "held first, in arrival order");
    assert!(c.done.borrow().iter().all(|d| d.2.is_ok()));
    g.destroy().unwrap();
}

#[test]
fn b177_an_accepted_hand_in_is_never_a_rejection_and_refused_mt_calls_count_apart() {
    let sim = Sim::from_env(177);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(1, 1, 2), Kind::Inline);
    let [a, _h1, _h2] = one_blocked_two_held(&sim, &c, &g, &r);
    assert_eq!(g.stats().rejections, 0, "held hand-ins are accepted");
    assert_eq!(
        submit_mt(&r, 9, 1),
        Err(Error::Again),
        "SUBMIT pool exhausted"
    );
    assert_eq!(g.async_stats().mt_rejections, 1);
    assert_eq!(g.stats().rejections, 0, "an mt refusal is not a rejection");
    let g2 = g.clone();
    let e = on_owner(&sim, &lp, move || {
        g2.submit(rq(9, 1), 1).map_err(|e| e.error)
    });
    assert_eq!(e.unwrap_err(), Error::Again);
    assert_eq!(g.stats().rejections, 1, "the owner submit counts");
    assert_eq!(g.async_stats().mt_rejections, 1, "but not as an mt refusal");
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.resume(a)).unwrap();
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
    run(&sim);
    assert_eq!(g.stats().completed, 3);
    assert_eq!(g.stats().rejections, 1);
    g.destroy().unwrap();
}

/// A submit_mt refused for its charge is a refused mt call: it counts in
/// `mt_rejections`, as the same owner-loop submit counts in `rejections`.
#[test]
fn b177_submit_mt_refused_for_its_charge_counts_in_mt_rejections() {
    let sim = Sim::from_env(1771);
    let lp = sim.new_loop();
    let (g, _c, r) = mt_group(&lp, mt_opts(2, 1, 2), Kind::Inline);
    assert_eq!(g.submit(rq(1, 1), 101).unwrap_err().error, Error::Range);
    assert_eq!(g.stats().rejections, 1, "owner: counted");
    assert_eq!(r.submit(rq(2, 1), 101).unwrap_err().error, Error::Range);
    assert_eq!(r.submit(rq(3, 1), 0).unwrap_err().error, Error::Range);
    assert_eq!(g.async_stats().mt_rejections, 2, "mt: counted apart");
    assert_eq!(g.stats().rejections, 1, "never as an owner rejection");
    g.close(CloseMode::Drain).unwrap();
    run(&sim);
    g.destroy().unwrap();
}

#[test]
fn b122_cancel_mt_applies_held_waiting_active_and_in_flight() {
    let sim = Sim::from_env(122);
    let lp = sim.new_loop();
    // capacity 3, one active place: F in flight, B blocked cannot coexist, so
    // use W waiting behind F, X a second waiting, two held behind them.
    let (g, c, r) = mt_group(&lp, mt_opts(3, 1, 4), Kind::Future);
    let f = g.submit(rq(1, 2), 1).unwrap();
    let w = g.submit(rq(2, 1), 1).unwrap();
    let x = g.submit(rq(3, 1), 1).unwrap();
    settle(&sim);
    assert_eq!(c.vectors.borrow().as_slice(), &[vec![f]], "F in flight");
    let h1 = submit_mt(&r, 4, 1).unwrap();
    let h2 = submit_mt(&r, 5, 1).unwrap();
    settle(&sim);
    assert_eq!(
        g.stats().queued,
        2,
        "W, X; the hand-ins wait for a boundary"
    );
    c.promises.borrow_mut().remove(0).set(Ok(()));
    settle(&sim); // boundary: every slot taken, both held; F's second op
    assert_eq!(g.stats().queued, 4, "W, X and two held hand-ins");
    for h in [f, w, h1] {
        r.cancel(h).unwrap();
    }
    settle(&sim);
    assert_eq!(
        c.hints.borrow().as_slice(),
        &[f],
        "the in-flight member's hint"
    );
    assert_eq!(
        c.collects.borrow().len(),
        1,
        "a member cancel does not end the wait"
    );
    c.promises.borrow_mut().remove(0).set(Ok(()));
    // X and H2 run (FUTURE each time): resolve as they come.
    settle(&sim);
    resolve_rounds(&sim, &c, 10);
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
    run(&sim);
    assert_eq!(
        c.outcome(f),
        vec![Err(Error::Aborted)],
        "in flight: collect, then Aborted"
    );
    assert_eq!(c.outcome(w), vec![Err(Error::Aborted)]);
    assert_eq!(c.outcome(h1), vec![Err(Error::Aborted)]);
    assert_eq!(c.outcome(x), vec![Ok(())]);
    assert_eq!(c.outcome(h2), vec![Ok(())]);
    for h in [w, h1] {
        assert_eq!(
            c.in_vectors(h),
            0,
            "a cancelled waiting/held member never runs"
        );
    }
    assert_eq!(c.collects.borrow()[1], (vec![f], ExecStatus::Ok));
    g.destroy().unwrap();
}

#[test]
fn b122_resume_mt_of_a_blocked_member_and_cancel_mt_of_an_active_one() {
    let sim = Sim::from_env(1222);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(2, 2, 2), Kind::Inline);
    let a = g.submit(rq(1, 1), 1).unwrap();
    let b = g.submit(rq(2, 1), 1).unwrap();
    c.script(a, &[StepResult::Blocked]);
    c.script(b, &[StepResult::Blocked]);
    settle(&sim);
    assert_eq!(g.stats().blocked, 2);
    r.resume(a).unwrap();
    r.cancel(b).unwrap();
    settle(&sim);
    assert_eq!(c.outcome(a), vec![Ok(())]);
    assert_eq!(c.outcome(b), vec![Err(Error::Aborted)]);
    assert_eq!(g.stats().reserved_units, 0, "charges released");
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
    run(&sim);
    g.destroy().unwrap();
}

#[test]
fn b123_cancel_mt_of_a_completed_handle_10000_times_costs_nothing() {
    let sim = Sim::from_env(123);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(1, 1, 4), Kind::Inline);
    let first = submit_mt(&r, 1, 1).unwrap();
    settle(&sim);
    assert_eq!(c.outcome(first), vec![Ok(())]);
    let (stats, astats, used) = (g.stats(), g.async_stats(), lp.budget().used());
    let procs = lp.n_procs();
    for i in 0..10_000 {
        let ctl = if i % 2 == 0 {
            r.cancel(first)
        } else {
            r.resume(first)
        };
        ctl.unwrap(); // four control records: drained before they run out
        if i % 4 == 3 {
            settle(&sim);
        }
    }
    settle(&sim);
    assert_eq!(
        g.stats(),
        stats,
        "no effect on the group's state or counters"
    );
    assert_eq!(g.async_stats(), astats, "not even an mt rejection");
    assert_eq!(lp.budget().used(), used, "nothing retained");
    assert_eq!(lp.n_procs(), procs);
    let later = submit_mt(&r, 2, 2).unwrap();
    settle(&sim);
    assert!(later > first);
    assert_eq!(
        c.outcome(later),
        vec![Ok(())],
        "a later request is unaffected"
    );
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
    run(&sim);
    assert_eq!(c.done.borrow().len(), 2);
    g.destroy().unwrap();
}

#[test]
fn b112_slots_all_blocked_behind_held_hand_ins_stay_controllable() {
    let sim = Sim::from_env(112);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(1, 1, 2), Kind::Inline);
    let [a, h1, h2] = one_blocked_two_held(&sim, &c, &g, &r);
    assert_eq!(
        submit_mt(&r, 9, 1),
        Err(Error::Again),
        "SUBMIT records all held"
    );
    // Held hand-ins took no control record: mt_queue_cap controls fit.
    r.cancel(h1).unwrap();
    r.resume(a).unwrap();
    assert_eq!(
        r.cancel(h2),
        Err(Error::Again),
        "two other controls undrained"
    );
    settle(&sim);
    assert_eq!(c.outcome(a), vec![Ok(())]);
    assert_eq!(c.outcome(h1), vec![Err(Error::Aborted)]);
    assert_eq!(c.outcome(h2), vec![Ok(())]);
    assert_eq!(c.in_vectors(h1), 0);
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
    run(&sim);
    g.destroy().unwrap();
}

#[test]
fn b141_submit_mt_after_close_is_again_without_issuing_a_handle() {
    let sim = Sim::from_env(141);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(2, 1, 2), Kind::Inline);
    let h = g.submit(rq(1, 1), 1).unwrap();
    g.close(CloseMode::Drain).unwrap();
    for _ in 0..3 {
        assert_eq!(submit_mt(&r, 2, 1), Err(Error::Again));
    }
    assert_eq!(g.async_stats().mt_rejections, 3);
    // The next handle was never issued: a control for it is Inval, one for
    // the issued handle is accepted.
    let next = Handle::new(h.get() + 1).unwrap();
    assert_eq!(r.cancel(next), Err(Error::Inval), "no handle consumed");
    r.resume(h).unwrap();
    run(&sim);
    assert_eq!(c.outcome(h), vec![Ok(())]);
    assert_eq!(submit_mt(&r, 3, 1), Err(Error::Again));
    g.destroy().unwrap();
}

#[test]
fn b143_controls_matter_during_a_drain_and_are_inval_after_the_driver_finished() {
    let sim = Sim::from_env(143);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(2, 2, 2), Kind::Inline);
    let a = g.submit(rq(1, 1), 1).unwrap();
    let b = g.submit(rq(2, 1), 1).unwrap();
    c.script(a, &[StepResult::Blocked]);
    c.script(b, &[StepResult::Blocked]);
    g.close(CloseMode::Drain).unwrap();
    settle(&sim);
    assert_eq!(g.stats().blocked, 2, "the drain waits for BLOCKED members");
    r.cancel(a).unwrap();
    settle(&sim);
    assert!(lp.is_alive(g.driver_pid()), "b still blocked");
    r.resume(b).unwrap();
    run(&sim);
    assert_eq!(c.outcome(a), vec![Err(Error::Aborted)]);
    assert_eq!(c.outcome(b), vec![Ok(())]);
    for h in [a, b] {
        assert_eq!(r.cancel(h), Err(Error::Inval), "driver finished");
        assert_eq!(r.resume(h), Err(Error::Inval), "driver finished");
    }
    assert_eq!(
        g.async_stats().mt_rejections,
        0,
        "Inval is not a ring refusal"
    );
    g.destroy().unwrap();
}

#[test]
fn b052_owner_cancel_of_a_held_mt_handle_never_runs_it() {
    let sim = Sim::from_env(52);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(1, 1, 2), Kind::Inline);
    let [a, h1, h2] = one_blocked_two_held(&sim, &c, &g, &r);
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.cancel(h1)).unwrap();
    // And one on the ring or held (whichever the driver reaches first).
    let h3 = submit_mt(&r, 4, 1).unwrap();
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.cancel(h3)).unwrap();
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.resume(a)).unwrap();
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
    run(&sim);
    for h in [h1, h3] {
        assert_eq!(c.outcome(h), vec![Err(Error::Aborted)]);
        assert_eq!(c.in_vectors(h), 0, "never ran");
    }
    assert_eq!(c.outcome(a), vec![Ok(())]);
    assert_eq!(c.outcome(h2), vec![Ok(())]);
    g.destroy().unwrap();
}

#[test]
fn b120_owner_and_mt_handles_interleave_strictly_increasing() {
    let sim = Sim::from_env(120);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(16, 4, 16), Kind::Inline);
    let mut hs = Vec::new();
    for i in 0..16u32 {
        let h = if i % 2 == 0 {
            g.submit(rq(i, 1 + i % 3), 1).unwrap()
        } else {
            submit_mt(&r, i, 1 + i % 3).unwrap()
        };
        hs.push(h);
    }
    assert!(hs.windows(2).all(|w| w[0] < w[1]), "strictly increasing");
    g.close(CloseMode::Drain).unwrap();
    run(&sim);
    for h in &hs {
        assert_eq!(c.outcome(*h), vec![Ok(())], "exactly one completion");
    }
    g.destroy().unwrap();
}

#[test]
fn b119_driver_killed_with_hand_ins_on_the_ring_and_held_completes_each_once() {
    let sim = Sim::from_env(119);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(1, 1, 3), Kind::Inline);
    let [a, h1, h2] = one_blocked_two_held(&sim, &c, &g, &r);
    let h3 = submit_mt(&r, 4, 1).unwrap(); // on the ring, not drained
    let (lp2, pid) = (lp.clone(), g.driver_pid());
    on_owner(&sim, &lp, move || lp2.kill(pid)).unwrap();
    run(&sim);
    for h in [a, h1, h2, h3] {
        assert_eq!(c.invocations(h), 1, "exactly one completion for {h}");
        assert_eq!(c.outcome(h), vec![Err(Error::Internal)]);
    }
    assert_eq!(c.in_vectors(h3), 0);
    assert_eq!(
        submit_mt(&r, 5, 1),
        Err(Error::Again),
        "exit closes the group"
    );
    assert_eq!(r.cancel(h3), Err(Error::Inval), "the driver is gone");
    assert_eq!(g.stats().queued, 0);
    g.destroy().unwrap();
}

/// B-119 / B-100 with an operation outstanding: the in-flight member gets one
/// collect with ABORTED, a held hand-in one Internal completion.
#[test]
fn b119_kill_while_parked_on_a_future_with_a_held_hand_in() {
    let sim = Sim::from_env(1191);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(1, 1, 2), Kind::Future);
    let f = g.submit(rq(1, 2), 1).unwrap();
    settle(&sim);
    let h = submit_mt(&r, 2, 1).unwrap();
    settle(&sim);
    assert_eq!(g.stats().queued, 0, "on the ring until a boundary (B-117)");
    c.promises.borrow_mut().remove(0).set(Ok(()));
    settle(&sim); // boundary: the only slot is F's, h is held
    assert_eq!(g.stats().queued, 1, "held");
    let (lp2, pid) = (lp.clone(), g.driver_pid());
    on_owner(&sim, &lp, move || lp2.kill(pid)).unwrap();
    run(&sim);
    assert_eq!(
        c.collects.borrow().as_slice(),
        &[(vec![f], ExecStatus::Ok), (vec![f], ExecStatus::Aborted)]
    );
    assert_eq!(c.outcome(f), vec![Err(Error::Aborted)]);
    assert_eq!(c.outcome(h), vec![Err(Error::Internal)]);
    // The promise outlives the group: resolving it later is safe (B-075).
    g.destroy().unwrap();
    let p = c.promises.borrow_mut().remove(0);
    thread::spawn(move || p.set(Ok(()))).join().unwrap();
}

#[test]
fn b075_future_resolved_from_another_thread_after_destroy_is_safe() {
    let sim = Sim::from_env(75);
    let lp = sim.new_loop();
    let (g, c, _r) = mt_group(&lp, mt_opts(2, 2, 1), Kind::Future);
    let h = g.submit(rq(1, 1), 1).unwrap();
    settle(&sim);
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.close(CloseMode::Cancel)).unwrap();
    run(&sim);
    assert_eq!(
        c.collects.borrow().as_slice(),
        &[(vec![h], ExecStatus::Aborted)]
    );
    assert_eq!(c.outcome(h), vec![Err(Error::Aborted)]);
    g.destroy().unwrap();
    drop(g);
    let p = c.promises.borrow_mut().remove(0);
    let t = thread::spawn(move || p.set(Ok(())));
    t.join().expect("resolving after destroy is safe");
}

/// B-118 / B-142: a hand-in that passes the ring after close(DRAIN) and finds
/// no slot is held, never rejected, and runs once the slot frees.
#[test]
fn b118_a_hand_in_held_across_a_drain_close_is_never_rejected() {
    for seed in 0..16 {
        let sim = Sim::new(1180 + seed);
        let lp = sim.new_loop();
        let (g, c, r) = mt_group(&lp, mt_opts(1, 1, 2), Kind::Inline);
        let a = g.submit(rq(1, 1), 1).unwrap();
        c.script(a, &[StepResult::Blocked]);
        settle(&sim);
        let h = submit_mt(&r, 2, 1).unwrap(); // on the ring when close runs, or held
        let g2 = g.clone();
        on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
        assert_eq!(submit_mt(&r, 3, 1), Err(Error::Again), "closed");
        assert!(
            lp.is_alive(g.driver_pid()),
            "seed {seed}: a and h outstanding"
        );
        let g2 = g.clone();
        on_owner(&sim, &lp, move || g2.resume(a)).unwrap();
        run(&sim);
        assert_eq!(c.outcome(a), vec![Ok(())]);
        assert_eq!(c.outcome(h), vec![Ok(())], "seed {seed}: DRAIN runs it");
        g.destroy().unwrap();
    }
}

/// B-142: close(CANCEL) ends held hand-ins and hand-ins still on the ring
/// `Aborted`; none of them runs; escalation from DRAIN included.
#[test]
fn b142_close_cancel_aborts_held_and_ring_hand_ins_without_running_them() {
    for (seed, escalate) in [(0, false), (1, true), (2, false), (3, true)] {
        let sim = Sim::new(1420 + seed);
        let lp = sim.new_loop();
        let (g, c, r) = mt_group(&lp, mt_opts(1, 1, 3), Kind::Inline);
        let [a, h1, h2] = one_blocked_two_held(&sim, &c, &g, &r);
        let h3 = submit_mt(&r, 4, 1).unwrap();
        let g2 = g.clone();
        on_owner(&sim, &lp, move || {
            if escalate {
                g2.close(CloseMode::Drain)?;
            }
            g2.close(CloseMode::Cancel)
        })
        .unwrap();
        run(&sim);
        for h in [a, h1, h2, h3] {
            assert_eq!(c.outcome(h), vec![Err(Error::Aborted)], "{h}");
        }
        for h in [h1, h2, h3] {
            assert_eq!(c.in_vectors(h), 0, "never ran");
        }
        assert_eq!(g.stats().cancelled, 4);
        g.destroy().unwrap();
    }
}

/// B-143: the driver does not finish before every hand-in accepted before
/// close was drained; it then runs (DRAIN).
#[test]
fn b143_hand_ins_accepted_before_close_are_drained_before_the_driver_ends() {
    let sim = Sim::from_env(1431);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(1, 1, 4), Kind::Inline);
    let hs: Vec<_> = (0..4).map(|i| submit_mt(&r, i, 2).unwrap()).collect();
    g.close(CloseMode::Drain).unwrap(); // pre-run: all four still on the ring
    run(&sim);
    for h in &hs {
        assert_eq!(c.outcome(*h), vec![Ok(())]);
    }
    assert_eq!(g.async_stats().mt_queued, 4);
    g.destroy().unwrap();
}

/// B-119: a kill before the driver's first run: hand-ins on the ring still
/// get exactly one completion.
#[test]
fn b119_kill_before_the_first_run_with_hand_ins_on_the_ring() {
    let sim = Sim::from_env(1192);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(2, 1, 4), Kind::Inline);
    let hs: Vec<_> = (0..3).map(|i| submit_mt(&r, i, 1).unwrap()).collect();
    lp.kill(g.driver_pid()).unwrap(); // pre-run setup
    run(&sim);
    for h in &hs {
        assert_eq!(c.invocations(*h), 1);
        assert_eq!(c.outcome(*h), vec![Err(Error::Internal)]);
    }
    assert_eq!(submit_mt(&r, 9, 1), Err(Error::Again));
    g.destroy().unwrap();
}

/// B-029 / B-121: controls with another group's handle are `Inval` and touch
/// nothing; handle exhaustion on the mt path is `Range`, never a wrap.
#[test]
fn b120_foreign_handles_and_exhaustion_on_the_mt_path() {
    let sim = Sim::from_env(1201);
    let lp = sim.new_loop();
    let (g1, c1, r1) = mt_group(&lp, mt_opts(2, 1, 2), Kind::Inline);
    let (g2, _c2, r2) = mt_group(&lp, mt_opts(2, 1, 2), Kind::Inline);
    let h1 = submit_mt(&r1, 1, 1).unwrap();
    assert_eq!(r2.cancel(h1), Err(Error::Inval), "foreign handle");
    assert_eq!(r2.resume(h1), Err(Error::Inval), "foreign handle");
    g2.debug_set_last_handle(u64::MAX - 1);
    let last = submit_mt(&r2, 2, 1).unwrap();
    assert_eq!(last.get(), u64::MAX);
    assert_eq!(submit_mt(&r2, 3, 1), Err(Error::Range), "exhausted");
    assert_eq!(g2.submit(rq(4, 1), 1).unwrap_err().error, Error::Range);
    assert_eq!(submit_mt(&r2, 5, 1), Err(Error::Range), "stays exhausted");
    assert_eq!(
        g2.async_stats().mt_rejections,
        2,
        "refused mt calls (B-177)"
    );
    assert_eq!(g2.stats().rejections, 1, "only the owner submit");
    g1.close(CloseMode::Drain).unwrap();
    g2.close(CloseMode::Drain).unwrap();
    run(&sim);
    assert_eq!(c1.outcome(h1), vec![Ok(())]);
    g1.destroy().unwrap();
    g2.destroy().unwrap();
}

/// B-052: an owner-loop cancel of a hand-in still on the ring while the
/// driver is parked on a FUTURE: it never runs; the in-flight member is
/// untouched.
#[test]
fn b052_owner_cancel_of_a_ring_hand_in_during_an_operation_wait() {
    let sim = Sim::from_env(521);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(2, 1, 2), Kind::Future);
    let f = g.submit(rq(1, 1), 1).unwrap();
    settle(&sim);
    let h = submit_mt(&r, 2, 1).unwrap();
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.cancel(h)).unwrap();
    assert!(c.hints.borrow().is_empty(), "f was not cancelled");
    c.promises.borrow_mut().remove(0).set(Ok(()));
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
    run(&sim);
    assert_eq!(c.outcome(f), vec![Ok(())]);
    assert_eq!(c.outcome(h), vec![Err(Error::Aborted)]);
    assert_eq!(c.in_vectors(h), 0);
    g.destroy().unwrap();
}

/// B-109 / B-017: the ring and both record pools are charged at create; a
/// budget that cannot hold them fails the create with nothing published (no
/// process, no charge), and a smaller ring then fits.
#[test]
fn b109_a_ring_the_budget_cannot_hold_fails_create_with_nothing_published() {
    let sim = Sim::from_env(109);
    let lp = sim.new_loop_with_budget(1 << 20);
    let c = C::default();
    c.kind.set(Some(Kind::Inline));
    let big = mt_opts(4, 2, 1 << 20);
    let r = Group::create_async(&lp, big, A(c.clone()), Fin(c.clone()));
    assert_eq!(r.err(), Some(Error::Nomem));
    assert_eq!(lp.n_procs(), 0, "no driver published");
    assert_eq!(lp.budget().used(), 0, "no charge kept");
    let (g, c, r) = mt_group(&lp, mt_opts(4, 2, 64), Kind::Inline);
    let h = submit_mt(&r, 1, 1).unwrap();
    g.close(CloseMode::Drain).unwrap();
    run(&sim);
    assert_eq!(c.outcome(h), vec![Ok(())]);
    g.destroy().unwrap();
    assert_eq!(lp.budget().used(), 0);
}

/// Runs `a` (an owner submit with three iterations left) to its third
/// operation wait: two FUTURE operations resolved, the third outstanding.
fn to_third_wait(sim: &Sim, c: &Ctl) {
    for _ in 0..2 {
        settle(sim);
        c.promises.borrow_mut().remove(0).set(Ok(()));
    }
    settle(sim);
    assert_eq!(c.vectors.borrow().len(), 3, "third operation outstanding");
    assert_eq!(c.promises.borrow().len(), 1);
}

/// Issue 12 item 1 (B-093, B-094, B-121, B-122): a cancel_mt accepted while
/// the operation is outstanding, with the operation completing before the
/// driver runs again, is consumed at the completion boundary: the hint
/// fires and the member ends `Aborted`, though collect says DONE. It used to
/// complete `Ok` with no hint, the cancel drained at the next boundary and
/// dropped as "already completed".
#[test]
fn b122_cancel_mt_accepted_during_the_wait_is_consumed_at_its_completion() {
    for seed in 0..16 {
        let sim = Sim::new(12_200 + seed);
        let lp = sim.new_loop();
        let (g, c, r) = mt_group(&lp, mt_opts(2, 1, 2), Kind::Future);
        let a = g.submit(rq(1, 3), 1).unwrap(); // DONE in its 3rd iteration
        to_third_wait(&sim, &c);
        r.cancel(a).unwrap(); // accepted while the operation is outstanding
        c.promises.borrow_mut().remove(0).set(Ok(())); // before the driver runs
        settle(&sim);
        assert_eq!(c.outcome(a), vec![Err(Error::Aborted)], "seed {seed}");
        assert_eq!(c.hints.borrow().as_slice(), &[a], "seed {seed}: one hint");
        let last = c.collects.borrow().last().cloned();
        assert_eq!(last, Some((vec![a], ExecStatus::Ok)), "collect still ran");
        let g2 = g.clone();
        on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
        run(&sim);
        assert_eq!(c.invocations(a), 1, "exactly once");
        assert_eq!(g.stats().cancelled, 1);
        g.destroy().unwrap();
    }
}

/// Issue 12 item 1, the owner path in the same interleaving: an owner cancel
/// and the promise set in one turn of a peer, before the driver runs again.
#[test]
fn b094_owner_cancel_racing_the_completion_fires_the_hint_and_aborts() {
    let sim = Sim::from_env(1294);
    let lp = sim.new_loop();
    let (g, c, _r) = mt_group(&lp, mt_opts(2, 1, 2), Kind::Future);
    let a = g.submit(rq(1, 3), 1).unwrap();
    to_third_wait(&sim, &c);
    let p = c.promises.borrow_mut().remove(0);
    let g2 = g.clone();
    on_owner(&sim, &lp, move || {
        g2.cancel(a).unwrap();
        p.set(Ok(()));
    });
    assert_eq!(c.outcome(a), vec![Err(Error::Aborted)]);
    assert_eq!(c.hints.borrow().as_slice(), &[a]);
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
    run(&sim);
    g.destroy().unwrap();
}

/// Issue 12 item 2 (B-050, B-123): an owner cancel of a completed handle on
/// an mt-enabled group whose driver is parked is `Inval`, and later
/// hand-ins still reach the driver with no owner action. The cancel used to
/// drain the ring from the peer process, disarming the doorbell without a
/// wake, so every later submit_mt was accepted and never drained.
#[test]
fn b123_a_stale_owner_cancel_never_wedges_cross_loop_admission() {
    for seed in 0..16 {
        let sim = Sim::new(12_300 + seed);
        let lp = sim.new_loop();
        let (g, c, r) = mt_group(&lp, mt_opts(2, 2, 2), Kind::Inline);
        let a = g.submit(rq(1, 1), 1).unwrap();
        settle(&sim);
        assert_eq!(c.outcome(a), vec![Ok(())]);
        let g2 = g.clone();
        let stale = on_owner(&sim, &lp, move || g2.cancel(a));
        assert_eq!(stale, Err(Error::Inval), "completed: stale");
        // No owner action from here on: the hand-ins must run by themselves.
        let hs: Vec<Handle> = (0..6)
            .map(|i| {
                let h = submit_mt(&r, 10 + i, 1).unwrap();
                settle(&sim);
                h
            })
            .collect();
        for h in &hs {
            assert_eq!(c.outcome(*h), vec![Ok(())], "seed {seed}: {h} ran");
        }
        let g2 = g.clone();
        on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
        run(&sim);
        g.destroy().unwrap();
    }
}

/// Issue 12 item 4 (B-052, B-117): an owner cancel of a hand-in still on
/// the ring cancels it without draining the ring: no waiting slot is made
/// outside a driver boundary, so an owner submit right after is accepted
/// exactly as without the cancel. It used to drain the hand-in into the only
/// slot (`queued` 1) and refuse the owner submit with `Again`.
#[test]
fn b117_owner_cancel_of_a_ring_hand_in_takes_no_slot_before_the_boundary() {
    let sim = Sim::from_env(1217);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(1, 1, 2), Kind::Inline);
    let x = submit_mt(&r, 1, 1).unwrap();
    g.cancel(x).unwrap(); // setup, before the owner's first run
    assert_eq!(g.stats().queued, 0, "still on the ring: not queued");
    let y = g.submit(rq(2, 1), 1).map_err(|e| e.error);
    let y = y.expect("the slot is free as without the cancel");
    g.close(CloseMode::Drain).unwrap();
    run(&sim);
    assert_eq!(c.outcome(x), vec![Err(Error::Aborted)]);
    assert_eq!(c.in_vectors(x), 0, "never ran");
    assert_eq!(c.outcome(y), vec![Ok(())]);
    assert_eq!(g.stats().queued, 0);
    g.destroy().unwrap();
}

/// B-117, B-118: a hand-in that lands while an operation is outstanding
/// stays on the ring until the driver's next iteration boundary, as one
/// landing at any other time does: no waiting slot, not `queued`, not
/// `mt_queued` before the boundary, so an owner submit in between takes the
/// free slot (FCFS among what reached a boundary) and the hand-in is held
/// for the next one. The driver's operation wait (which drains the ring so a
/// cancel_mt fires its hint) used to hand it in at once: `queued` 1, and the
/// owner submit refused with `Again` and counted as a rejection.
#[test]
fn b117_a_hand_in_landing_during_an_operation_wait_takes_no_slot_before_the_boundary() {
    let sim = Sim::from_env(1317);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(2, 1, 2), Kind::Future);
    let a = g.submit(rq(1, 1), 1).unwrap();
    settle(&sim);
    assert_eq!(c.promises.borrow().len(), 1, "a's operation is outstanding");
    let x = submit_mt(&r, 2, 1).unwrap();
    settle(&sim); // the hand-in wakes the driver's wait
    let s = g.stats();
    assert_eq!((s.queued, s.ready), (0, 1), "x is still on the ring");
    assert_eq!(g.async_stats().mt_queued, 0, "not handed in yet");
    let g2 = g.clone();
    let y = on_owner(&sim, &lp, move || {
        g2.submit(rq(3, 1), 1).map_err(|e| e.error)
    });
    let y = y.expect("the free slot: x has not reached a boundary");
    assert_eq!(g.stats().rejections, 0);
    resolve_rounds(&sim, &c, 4);
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
    run(&sim);
    assert_eq!(
        *c.vectors.borrow(),
        vec![vec![a], vec![y], vec![x]],
        "y reached the slot first; x was held, then ran"
    );
    assert_eq!(ids(&c), vec![1, 3, 2]);
    assert_eq!(g.async_stats().mt_queued, 1);
    g.destroy().unwrap();
}

/// B-052, B-117, B-122: a hand-in set aside by an operation wait is, until
/// the boundary, cancelled as one still on the ring: by the owner (`Ok`, not
/// `Inval`) or by a cancel_mt drained in the same wait; it never runs, ends
/// `Aborted` once, and its SUBMIT record comes back. A resume_mt for it is
/// dropped (not resumable).
#[test]
fn b052_b122_hand_ins_set_aside_by_a_wait_are_cancelled_as_on_the_ring() {
    let sim = Sim::from_env(1318);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(3, 1, 3), Kind::Future);
    let a = g.submit(rq(1, 1), 1).unwrap();
    settle(&sim);
    let x = submit_mt(&r, 2, 1).unwrap();
    let y = submit_mt(&r, 3, 1).unwrap();
    let z = submit_mt(&r, 4, 1).unwrap();
    settle(&sim); // set aside by the wait
    r.resume(z).unwrap();
    r.cancel(y).unwrap();
    settle(&sim); // drained by the wait too
    let g2 = g.clone();
    assert_eq!(on_owner(&sim, &lp, move || g2.cancel(x)), Ok(()));
    assert!(c.hints.borrow().is_empty(), "none of them is in flight");
    c.promises.borrow_mut().remove(0).set(Ok(()));
    settle(&sim);
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
    resolve_rounds(&sim, &c, 4);
    run(&sim);
    assert_eq!(c.outcome(a), vec![Ok(())]);
    assert_eq!(c.outcome(x), vec![Err(Error::Aborted)]);
    assert_eq!(c.outcome(y), vec![Err(Error::Aborted)]);
    assert_eq!(c.outcome(z), vec![Ok(())]);
    assert_eq!((c.in_vectors(x), c.in_vectors(y)), (0, 0), "never ran");
    let s = g.stats();
    assert_eq!((s.completed, s.cancelled), (2, 2));
    assert_eq!(g.async_stats().mt_queued, 3);
    g.destroy().unwrap();
}

/// `rounds` times: every outstanding FUTURE operation succeeds, then the
/// loop settles (the driver collects and starts the next iteration).
fn resolve_rounds(sim: &Sim, c: &Ctl, rounds: usize) {
    for _ in 0..rounds {
        c.promises
            .borrow_mut()
            .drain(..)
            .for_each(|p| p.set(Ok(())));
        settle(sim);
    }
}

/// B-039, B-024, B-141: an unexpected driver exit closes the group on every
/// path at once. With the finalizer still parked on the in-flight vector's
/// BLOCKING closure (teardown), an owner-loop submit is `Again`, and so is a
/// submit_mt (counted in `mt_rejections`, no handle issued). The ring used
/// to stay open until the finalizer's teardown ended: submit_mt kept
/// issuing handles for the dead group (each then failed `Internal`).
#[test]
fn b039_b024_driver_exit_closes_the_ring_to_submit_mt_at_once() {
    let sim = Sim::from_env(1039);
    let lp = sim.new_loop();
    let (g, c, r) = mt_group(&lp, mt_opts(2, 1, 2), Kind::Blocking);
    let (gate_tx, gate_rx) = crossbeam_channel::bounded::<()>(1);
    let (ran_tx, ran_rx) = crossbeam_channel::bounded::<()>(1);
    *c.gate.borrow_mut() = Some(gate_rx);
    *c.ran.borrow_mut() = Some(ran_tx);
    let a = g.submit(rq(1, 1), 1).unwrap();
    settle(&sim);
    ran_rx.recv().unwrap(); // a's closure runs on a pool thread
    let x = submit_mt(&r, 2, 1).unwrap(); // before the exit: runs its course
    lp.kill(g.driver_pid()).unwrap();
    settle(&sim);
    assert!(!lp.is_alive(g.driver_pid()), "the driver exited");
    assert!(
        lp.is_alive(g.finalizer_pid()),
        "teardown awaits the closure"
    );
    let g2 = g.clone();
    let owner = on_owner(&sim, &lp, move || {
        g2.submit(rq(3, 1), 1).map_err(|e| e.error)
    });
    assert_eq!(owner.unwrap_err(), Error::Again, "owner path: closed");
    let refused = g.async_stats().mt_rejections;
    assert_eq!(submit_mt(&r, 4, 1), Err(Error::Again), "mt path: closed");
    assert_eq!(g.async_stats().mt_rejections, refused + 1);
    gate_tx.send(()).unwrap();
    run_with_pool(&sim, &lp);
    assert_eq!(c.outcome(a), vec![Err(Error::Aborted)]);
    assert_eq!(c.outcome(x), vec![Err(Error::Internal)]);
    let s = g.stats();
    assert_eq!((s.cancelled, s.failed, s.completed), (1, 1, 0));
    assert_eq!(c.done.borrow().len(), 2, "nothing else was accepted");
    g.destroy().unwrap();
}

/// B-041, B-106, B-122: the `_mt` calls are not refused during the group's
/// own callbacks (they only push onto the ring; the driver applies them at
/// its next drain), while every owner-loop mutator is `Deadlk` there. A
/// cancel_mt from the submit callback of an in-flight member is consumed at
/// that operation's completion boundary (hint, then `Aborted`, though collect
/// says DONE); a submit_mt from a complete callback (a follow-up request) is
/// accepted, runs and completes once.
#[test]
fn b041_b122_mt_calls_from_the_groups_own_callbacks_apply_at_the_next_drain() {
    use std::cell::RefCell;
    use std::rc::Rc;
    use xtc::batch::{AsyncOpts, AsyncStep, Exec, Item, Remote};

    type Slot = Rc<RefCell<Option<(Group<u32>, Remote<u32>)>>>;
    type Log = Rc<RefCell<Vec<String>>>;
    struct St(Slot, Log);
    impl AsyncStep<u32> for St {
        async fn submit(&mut self, items: &mut [Item<'_, u32>]) -> xtc::Result<Exec> {
            let (g, r) = self.0.borrow().clone().expect("set after create");
            for it in items.iter().filter(|it| *it.request == 1) {
                let mut log = self.1.borrow_mut();
                log.push(format!("submit: cancel_mt {:?}", r.cancel(it.handle)));
                log.push(format!("submit: cancel {:?}", g.cancel(it.handle)));
            }
            Ok(Exec::Inline)
        }
        async fn collect(
            &mut self,
            _: &mut [Item<'_, u32>],
            res: &mut [StepResult],
            _: ExecStatus,
        ) -> xtc::Result<()> {
            res.fill(StepResult::Done);
            Ok(())
        }
        async fn cancel_hint(&mut self, h: Handle) {
            self.1.borrow_mut().push(format!("hint {}", h.get()));
        }
    }

    let sim = Sim::from_env(1041);
    let lp = sim.new_loop();
    let slot: Slot = Rc::default();
    let log: Log = Rc::default();
    let outs = Rc::new(RefCell::new(Vec::new()));
    let (s2, o2, l2) = (slot.clone(), outs.clone(), log.clone());
    let opts = AsyncOpts {
        mt_queue_cap: 2,
        ..async_opts(2, 2, None)
    };
    let complete = move |h: Handle, rq: u32, out: xtc::Result<()>| {
        o2.borrow_mut().push((h, rq, out));
        if rq == 2 {
            let (g, r) = s2.borrow().clone().expect("set after create");
            let mut log = l2.borrow_mut();
            log.push(format!(
                "complete: submit {:?}",
                g.submit(9, 1).err().map(|e| e.error)
            ));
            log.push(format!("complete: submit_mt ok {}", r.submit(3, 1).is_ok()));
        }
    };
    let g = Group::create_async(&lp, opts, St(slot.clone(), log.clone()), complete).unwrap();
    *slot.borrow_mut() = Some((g.clone(), g.remote().unwrap()));
    let a = g.submit(1, 1).unwrap();
    let b = g.submit(2, 1).unwrap();
    settle(&sim);
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
    run(&sim);
    assert_eq!(
        *log.borrow(),
        vec![
            "submit: cancel_mt Ok(())".to_string(),
            "submit: cancel Err(Deadlk)".into(),
            format!("hint {}", a.get()),
            "complete: submit Some(Deadlk)".into(),
            "complete: submit_mt ok true".into(),
        ]
    );
    let outs = outs.borrow();
    assert_eq!(outs.len(), 3, "a, b and the follow-up, once each");
    assert_eq!(outs[0], (a, 1, Err(Error::Aborted)));
    assert_eq!(outs[1], (b, 2, Ok(())));
    assert_eq!((outs[2].1, outs[2].2), (3, Ok(())));
    assert!(outs[2].0 > b);
    assert_eq!(g.async_stats().mt_queued, 1);
    *slot.borrow_mut() = None;
    g.destroy().unwrap();
}

/// B-119, B-122, B-039: a kill while hand-ins are set aside by the
/// operation wait (one of them cancelled by a cancel_mt drained in that
/// wait) and one more is on the ring: the finalizer hands each in once, the
/// cancelled one ends `Aborted`, the others `Internal`, the in-flight member
/// `Aborted` (teardown); a submit_mt after the exit is `Again` and the
/// counters add up to the accepted handles.
#[test]
fn b119_b122_kill_with_hand_ins_set_aside_by_the_wait() {
    for seed in 0..20 {
        let sim = Sim::new(1190 + seed);
        let lp = sim.new_loop();
        let (g, c, r) = mt_group(&lp, mt_opts(2, 1, 3), Kind::Future);
        let a = g.submit(rq(1, 3), 1).unwrap();
        settle(&sim);
        let x = submit_mt(&r, 2, 1).unwrap();
        let y = submit_mt(&r, 3, 1).unwrap();
        settle(&sim); // both set aside by a's wait
        r.cancel(y).unwrap();
        settle(&sim); // drained by the wait too: noted for y
        let z = submit_mt(&r, 4, 1).unwrap(); // on the ring
        lp.kill(g.driver_pid()).unwrap();
        run(&sim);
        assert_eq!(c.outcome(a), vec![Err(Error::Aborted)], "seed {seed}");
        assert_eq!(c.outcome(x), vec![Err(Error::Internal)], "seed {seed}");
        assert_eq!(c.outcome(y), vec![Err(Error::Aborted)], "seed {seed}");
        assert_eq!(c.outcome(z), vec![Err(Error::Internal)], "seed {seed}");
        assert_eq!(c.in_vectors(x) + c.in_vectors(y) + c.in_vectors(z), 0);
        assert_eq!(submit_mt(&r, 5, 1), Err(Error::Again), "the exit closed it");
        assert_eq!(r.cancel(x), Err(Error::Inval), "finished");
        let s = g.stats();
        assert_eq!((s.cancelled, s.failed, s.completed), (2, 2, 0));
        assert_eq!((s.reserved_units, s.queued, s.ready), (0, 0, 0));
        assert_eq!(g.async_stats().mt_queued, 3);
        g.destroy().unwrap();
    }
}

/// B-078, B-094, B-097, B-122, B-142: a BLOCKING operation (not in the
/// randomized cross-loop model) with cross-loop controls: a cancel_mt of an
/// in-flight member fires its hint while the closure runs, a resume_mt of
/// the other in-flight member is harmless, and neither close(CANCEL) nor a
/// kill ends the wait; collect runs once after the closure returns, both
/// in-flight members end `Aborted`, and a hand-in accepted meanwhile never
/// runs (`Aborted` by the close, `Internal` after the kill).
#[test]
fn b078_b122_blocking_wait_with_cross_loop_controls_close_and_kill() {
    for kill in [false, true] {
        let sim = Sim::from_env(1078);
        let lp = sim.new_loop();
        let (g, c, r) = mt_group(&lp, mt_opts(3, 2, 2), Kind::Blocking);
        let (gate_tx, gate_rx) = crossbeam_channel::bounded::<()>(1);
        let (ran_tx, ran_rx) = crossbeam_channel::bounded::<()>(1);
        *c.gate.borrow_mut() = Some(gate_rx);
        *c.ran.borrow_mut() = Some(ran_tx);
        let a = g.submit(rq(1, 1), 1).unwrap();
        let b = g.submit(rq(2, 1), 1).unwrap();
        settle(&sim);
        ran_rx.recv().unwrap(); // the closure runs on a pool thread
        let x = submit_mt(&r, 3, 1).unwrap();
        r.cancel(a).unwrap();
        r.resume(b).unwrap();
        settle(&sim);
        assert_eq!(
            c.hints.borrow().as_slice(),
            &[a],
            "{kill}: hint during the closure"
        );
        if kill {
            lp.kill(g.driver_pid()).unwrap();
        } else {
            let g2 = g.clone();
            on_owner(&sim, &lp, move || g2.close(CloseMode::Cancel)).unwrap();
        }
        settle(&sim);
        assert!(c.collects.borrow().is_empty(), "{kill}: the wait lasts");
        gate_tx.send(()).unwrap();
        run_with_pool(&sim, &lp);
        assert_eq!(c.outcome(a), vec![Err(Error::Aborted)], "{kill}");
        assert_eq!(c.outcome(b), vec![Err(Error::Aborted)], "{kill}");
        let x_out = if kill {
            Error::Internal
        } else {
            Error::Aborted
        };
        assert_eq!(c.outcome(x), vec![Err(x_out)], "{kill}");
        assert_eq!(c.in_vectors(x), 0, "{kill}");
        assert_eq!(c.collects.borrow().len(), 1, "{kill}: collect once");
        let hints_a = c.hints.borrow().iter().filter(|h| **h == a).count();
        assert_eq!(hints_a, 1, "{kill}: once per member");
        g.destroy().unwrap();
        assert_eq!(submit_mt(&r, 4, 1), Err(Error::Again));
    }
}
