//! Adversarial tests of cross-loop admission (`Remote`: submit_mt, cancel_mt,
//! resume_mt) and of asynchronous groups against xtc_batch(3), under
//! `rt::Sim`: held hand-ins, FCFS across the owner and mt paths, controls
//! wherever the request is, stale controls, close and kill ordering with
//! hand-ins on the ring, and the statistics that count them. The test thread
//! calls the `Remote` between simulator steps, as a plain OS thread would.
//! Companions: `batch_adversarial_mt_close.rs` (close, kill and destroy with
//! hand-ins on the ring), `batch_adversarial_mt_wait.rs` (hand-ins and
//! controls during an operation wait); real threads:
//! `batch_adversarial_mt_threads.rs`.
//!
//! Each test is named for the clause (B-NNN, `spec/clauses.md`) it attacks.

mod batch_adversarial_support;

use batch_adversarial_support::mt::*;
use batch_adversarial_support::*;
use xtc::Error;
use xtc::batch::{CloseMode, ExecStatus, Handle, StepResult};
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
