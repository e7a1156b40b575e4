//! Adversarial tests of cross-loop admission (`Remote`) against
//! xtc_batch(3) under `rt::Sim`, while an asynchronous operation is
//! outstanding: hand-ins landing or set aside during the wait, cancels
//! (owner and cross-loop) racing the completion, `_mt` calls from the group's
//! own callbacks, and a BLOCKING wait with controls, close and kill. The
//! test thread calls the `Remote` between simulator steps, as a plain OS
//! thread would. Companions: `batch_adversarial_mt.rs`,
//! `batch_adversarial_mt_close.rs`.
//!
//! Each test is named for the clause (B-NNN, `spec/clauses.md`) it attacks.

mod batch_adversarial_support;

use batch_adversarial_support::mt::*;
use batch_adversarial_support::*;
use xtc::Error;
use xtc::batch::{CloseMode, ExecStatus, Group, Handle, StepResult};
use xtc::rt::Sim;

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
