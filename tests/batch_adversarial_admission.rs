//! Adversarial tests of the batch engine against xtc_batch(3), synchronous
//! groups: admission (FCFS under charge, the resource bound near
//! `u64::MAX`), cancels at the boundary, handles (exhaustion, foreign
//! handles), statistics and steady-state allocation.
//!
//! Each test is named for the clause (B-NNN, `spec/clauses.md`) it attacks. A
//! failing test here is a bug found by the breaker (see its report); none is
//! ignored. Callbacks, kills, ownership and lifetime: `batch_adversarial.rs`.

mod batch_adversarial_support;

use std::cell::RefCell;
use std::rc::Rc;

use batch_adversarial_support::*;
use xtc::Error;
use xtc::batch::{CloseMode, Handle, StepResult};
use xtc::rt::{self, Sim};

#[test]
fn b021_fcfs_large_head_charge_blocks_smaller_younger_requests() {
    let sim = Sim::from_env(106);
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
    let sim = Sim::from_env(107);
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

/// Issue 12 item 3: the fit test near `u64::MAX`. A member holding every
/// unit of a `u64::MAX` capacity keeps a charge-1 request waiting; the
/// unchecked `reserved + charge` panicked in the driver (debug) or admitted
/// both (release, `reserved_units` wrapped to 0).
#[test]
fn b022_admission_near_u64_max_units_keeps_the_resource_bound() {
    let sim = Sim::from_env(1222);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(4, 4, u64::MAX));
    let big = g.submit(rq(1, 1), u64::MAX).unwrap();
    c.script(big, &[StepResult::Blocked, StepResult::Done]);
    let small = g.submit(rq(2, 1), 1).unwrap();
    settle_sim(&sim);
    let s = g.stats();
    assert_eq!(
        (s.blocked, s.queued, s.reserved_units),
        (1, 1, u64::MAX),
        "the charge-1 request waits: {s:?}"
    );
    assert_eq!(
        c.in_vectors(small),
        0,
        "never admitted beside the full charge"
    );
    let g2 = g.clone();
    lp.spawn(async move {
        g2.resume(big).unwrap();
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    run(&sim);
    assert_eq!(c.outcome(big), vec![Ok(())]);
    assert_eq!(c.outcome(small), vec![Ok(())]);
    assert_eq!(g.stats().reserved_units, 0);
    g.destroy().unwrap();
}

/// Steps `sim` until nothing is runnable (parked processes may remain).
fn settle_sim(sim: &Sim) {
    for _ in 0..1_000_000 {
        if !sim.step() {
            return;
        }
    }
    panic!("simulator never quiesced");
}

#[test]
fn b022_cancel_of_blocked_member_releases_charge_once() {
    let sim = Sim::from_env(108);
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

#[test]
fn b025_failed_submits_cause_no_callback_and_count_rejections() {
    let sim = Sim::from_env(109);
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
    let sim = Sim::from_env(110);
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
    let sim = Sim::from_env(111);
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

#[test]
fn b029_handle_spaces_of_two_groups_never_overlap() {
    let sim = Sim::from_env(112);
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

#[test]
fn b175_statistics_match_the_vectors_and_deliveries() {
    let sim = Sim::from_env(117);
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

#[test]
fn b047_peer_cancel_reaches_a_member_of_a_nonyielding_step() {
    let sim = Sim::from_env(118);
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

#[test]
fn b017_steady_state_submits_allocate_nothing() {
    let before = allocs();
    let probe_box = std::hint::black_box(Box::new(7u64));
    assert!(allocs() > before, "the counting allocator counts");
    drop(probe_box);
    let sim = Sim::from_env(140);
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
                    *r3.borrow_mut() = Some((
                        g3.cancel(y),
                        g3.close(CloseMode::Cancel),
                        g3.resume(y), // B-056: terminal is not resumable
                        g3.cancel(x), // B-050: invocation recorded: stale
                    ));
                }
            },
        );
        run(&sim);
        assert_eq!(c.invocations(x), 1);
        assert_eq!(c.invocations(y), 1);
        if let Some(r) = res.borrow_mut().take() {
            hits += 1;
            assert_eq!(
                r,
                (Ok(()), Ok(()), Err(Error::Inval), Err(Error::Inval)),
                "seed {seed}"
            );
            assert_eq!(c.outcome(y), vec![Ok(())], "seed {seed}: DONE must win");
        }
        g.destroy().unwrap();
    }
    assert!(hits > 0, "no seed reached the window");
}

/// Continuous batching: a finished member leaves and the next waiting member
/// joins at the very next boundary while the others continue (B-002, B-003).
#[test]
fn b003_waiting_members_refill_at_the_next_boundary() {
    let sim = Sim::from_env(146);
    let lp = sim.new_loop();
    let (g, c) = sync_group(&lp, sync_opts(4, 2, 2));
    let a = g.submit(rq(1, 1), 1).unwrap();
    let b = g.submit(rq(2, 3), 1).unwrap();
    let d = g.submit(rq(3, 2), 1).unwrap();
    let e = g.submit(rq(4, 1), 1).unwrap();
    g.close(CloseMode::Drain).unwrap();
    run(&sim);
    let mut v = c.vectors.borrow().clone();
    v.iter_mut().for_each(|x| x.sort());
    assert_eq!(v, vec![vec![a, b], vec![b, d], vec![b, d], vec![e]]);
    for h in [a, b, d, e] {
        assert_eq!(c.outcome(h), vec![Ok(())]);
    }
    let s = g.stats();
    assert_eq!((s.iterations, s.total_members, s.max_vector), (4, 7, 2));
    g.destroy().unwrap();
}
