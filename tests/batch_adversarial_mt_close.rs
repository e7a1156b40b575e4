//! Adversarial tests of cross-loop admission (`Remote`) against
//! xtc_batch(3) under `rt::Sim`, when the group ends: close (DRAIN and
//! CANCEL), a driver kill or exit, and destroy, with hand-ins on the ring or
//! held; and a ring the budget cannot hold. The test thread calls the
//! `Remote` between simulator steps, as a plain OS thread would. Companions:
//! `batch_adversarial_mt.rs`, `batch_adversarial_mt_wait.rs`.
//!
//! Each test is named for the clause (B-NNN, `spec/clauses.md`) it attacks.

mod batch_adversarial_support;

use std::thread;

use batch_adversarial_support::mt::*;
use batch_adversarial_support::*;
use xtc::Error;
use xtc::batch::{CloseMode, ExecStatus, Group, StepResult};
use xtc::rt::Sim;

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
