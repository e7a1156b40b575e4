//! Adversarial tests of asynchronous operations in mt-enabled groups under
//! `rt::Sim`: deadlines across cross-loop wakes, futures discarded on
//! timeout, and a seeded randomized mix of every owner and mt call (with
//! close or kill at a random moment) checked against the exactly-once and
//! accounting invariants. Companions: `batch_adversarial_mt.rs` (held
//! hand-ins, controls), `batch_adversarial_mt_close.rs` (close/kill
//! ordering), `batch_adversarial_mt_wait.rs` (operation waits),
//! `batch_adversarial_mt_threads.rs`.
//!
//! Each test is named for the clause (B-NNN, `spec/clauses.md`) it attacks.

mod batch_adversarial_support;

use std::time::Duration;

use batch_adversarial_support::mt::*;
use batch_adversarial_support::*;
use xtc::Error;
use xtc::batch::{AsyncOpts, CloseMode, ExecStatus, Handle, StepResult};
use xtc::rt::{self, Sim};

/// B-085 in virtual time: a process of another loop sends cancel_mt (and
/// resume_mt) every millisecond; the FUTURE never resolves; the wait still
/// ends exactly at the 10 ms deadline with TIMEOUT.
#[test]
fn b085_sim_wait_ends_at_the_deadline_across_cross_loop_wakes() {
    for seed in 0..8 {
        let sim = Sim::new(850 + seed);
        let lp = sim.new_loop();
        let peer = sim.new_loop();
        let o = AsyncOpts {
            exec_timeout: Some(Duration::from_millis(10)),
            ..mt_opts(2, 1, 2)
        };
        let (g, c, r) = mt_group(&lp, o, Kind::Future);
        let h = g.submit(rq(1, 1), 1).unwrap();
        let other = g.submit(rq(2, 1), 1).unwrap(); // waiting: resume_mt is discarded
        peer.spawn(async move {
            for i in 0..30u32 {
                rt::sleep(Duration::from_millis(1)).await;
                let ctl = if i % 2 == 0 {
                    r.cancel(h)
                } else {
                    r.resume(other)
                };
                if ctl == Err(Error::Inval) {
                    return; // the driver finished
                }
            }
        })
        .unwrap();
        settle(&sim);
        let collects = c.collects.borrow().clone();
        assert_eq!(collects[0].1, ExecStatus::Timeout, "seed {seed}");
        let t = c.times.borrow().clone();
        let (s0, c0) = (t[0], t.iter().find(|x| x.0 == "collect").copied().unwrap());
        assert_eq!(s0.0, "submit");
        assert_eq!(c0.1 - s0.1, 10_000_000, "seed {seed}: ends at the deadline");
        assert_eq!(c.outcome(h), vec![Err(Error::Aborted)]);
        let g2 = g.clone();
        on_owner(&sim, &lp, move || g2.close(CloseMode::Cancel)).unwrap();
        run(&sim);
        g.destroy().unwrap();
        drop(c.promises.borrow_mut().drain(..));
    }
}

/// B-072 / B-087: a FUTURE discarded on timeout is consumed once: resolving
/// its promise later ends nothing (the next operation waits for its own).
#[test]
fn b072_a_promise_resolved_after_its_timeout_does_not_end_the_next_wait() {
    let sim = Sim::from_env(72);
    let lp = sim.new_loop();
    let o = AsyncOpts {
        exec_timeout: Some(Duration::from_millis(5)),
        ..mt_opts(2, 1, 2)
    };
    let (g, c, r) = mt_group(&lp, o, Kind::Future);
    let a = g.submit(rq(1, 3), 1).unwrap();
    let b = submit_mt(&r, 2, 3).unwrap();
    settle(&sim); // a times out (CONTINUE → Again); b launched, times out too
    assert_eq!(c.outcome(a), vec![Err(Error::Again)]);
    assert_eq!(c.collects.borrow()[0], (vec![a], ExecStatus::Timeout));
    assert_eq!(c.collects.borrow().len(), 2);
    assert_eq!(
        c.outcome(b),
        vec![Err(Error::Again)],
        "b was never resubmitted"
    );
    // A third member: its wait must end only on its own promise or deadline.
    let d = submit_mt(&r, 3, 3).unwrap();
    for _ in 0..3 {
        if c.vectors.borrow().len() == 3 {
            break;
        }
        assert!(sim.step());
    }
    assert_eq!(c.vectors.borrow().len(), 3, "d launched");
    let old: Vec<_> = c.promises.borrow_mut().drain(..2).collect();
    for p in old {
        p.set(Ok(())); // the discarded futures' promises
    }
    settle(&sim);
    assert_eq!(
        c.collects.borrow()[2],
        (vec![d], ExecStatus::Timeout),
        "not OK"
    );
    let g2 = g.clone();
    on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap();
    run(&sim);
    assert_eq!(g.async_stats().offload_timeouts, 3);
    assert_eq!(g.async_stats().offloads, 3);
    g.destroy().unwrap();
}

/// Randomized (seeded, deterministic) mix of every owner and mt call, BLOCKED
/// and CONTINUE scripts, INLINE or FUTURE operations, a close in either mode
/// (or a kill) at a random moment. Invariants: every accepted handle is
/// completed exactly once, handles strictly increase across both paths, the
/// terminal counters add up, gauges end at zero, controls end `Inval`.
#[test]
fn b119_b122_randomized_owner_and_mt_calls_complete_each_handle_once() {
    for seed in 0..200u64 {
        let sim = Sim::new(9000 + seed);
        let lp = sim.new_loop();
        let mut rng = fastrand::Rng::with_seed(seed);
        let kind = if seed % 2 == 0 {
            Kind::Inline
        } else {
            Kind::Future
        };
        let o = AsyncOpts {
            exec_timeout: (seed % 3 == 0).then(|| Duration::from_millis(3)),
            ..mt_opts(1 + rng.usize(0..4), 1, 1 + rng.usize(0..3))
        };
        let o = AsyncOpts {
            max_active: 1 + rng.usize(0..o.capacity),
            ..o
        };
        let (g, c, r) = mt_group(&lp, o, kind);
        let mut issued: Vec<Handle> = Vec::new();
        let mut closed = false;
        for step in 0..200u32 {
            let pick = rng.u32(0..100);
            let target = (!issued.is_empty()).then(|| issued[rng.usize(0..issued.len())]);
            let left = 1 + rng.u32(0..3);
            match pick {
                0..=24 => {
                    if let Ok(h) = submit_mt(&r, step, left) {
                        if rng.bool() {
                            c.script(h, &[StepResult::Blocked]);
                        }
                        issued.push(h);
                    }
                }
                25..=39 => {
                    let g2 = g.clone();
                    let res = on_owner(&sim, &lp, move || g2.submit(rq(step, left), 1).ok());
                    if let Some(h) = res {
                        issued.push(h);
                    }
                }
                40..=49 => {
                    if let Some(h) = target {
                        let _ = r.cancel(h);
                    }
                }
                50..=64 => {
                    if let Some(h) = target {
                        let _ = r.resume(h);
                    }
                }
                65..=69 => {
                    if let Some(h) = target {
                        let g2 = g.clone();
                        let _ = on_owner(&sim, &lp, move || g2.cancel(h));
                    }
                }
                70..=79 => {
                    if let Some(h) = target {
                        let g2 = g.clone();
                        let _ = on_owner(&sim, &lp, move || g2.resume(h));
                    }
                }
                80..=84 => {
                    let p = c.promises.borrow_mut().drain(..).collect::<Vec<_>>();
                    for p in p {
                        p.set(if rng.u32(0..8) == 0 {
                            Err(Error::Internal)
                        } else {
                            Ok(())
                        });
                    }
                }
                85 if !closed && step > 100 => {
                    let g2 = g.clone();
                    match rng.u32(0..3) {
                        0 => on_owner(&sim, &lp, move || g2.close(CloseMode::Drain)).unwrap(),
                        1 => on_owner(&sim, &lp, move || g2.close(CloseMode::Cancel)).unwrap(),
                        _ => {
                            let pid = g2.driver_pid();
                            let _ = on_owner(&sim, &lp, move || g2.owner_loop().kill(pid));
                        }
                    }
                    closed = true;
                }
                _ => {
                    for _ in 0..rng.u32(0..20) {
                        if !sim.step() {
                            break;
                        }
                    }
                }
            }
        }
        let g2 = g.clone();
        on_owner(&sim, &lp, move || g2.close(CloseMode::Cancel)).unwrap();
        for _ in 0..1000 {
            settle(&sim);
            let p = c.promises.borrow_mut().drain(..).collect::<Vec<_>>();
            if p.is_empty() && !lp.is_alive(g.driver_pid()) {
                break;
            }
            for p in p {
                p.set(Ok(()));
            }
        }
        run(&sim);
        assert!(
            issued.windows(2).all(|w| w[0] < w[1]),
            "seed {seed}: monotonic"
        );
        for h in &issued {
            assert_eq!(c.invocations(*h), 1, "seed {seed}: {h} completed once");
        }
        let s = g.stats();
        assert_eq!(
            c.done.borrow().len(),
            issued.len(),
            "seed {seed}: no stranger"
        );
        assert_eq!(s.completed + s.cancelled + s.failed, issued.len() as u64);
        assert_eq!(
            (s.queued, s.ready, s.blocked, s.reserved_units),
            (0, 0, 0, 0)
        );
        if let Some(h) = issued.first() {
            assert_eq!(r.cancel(*h), Err(Error::Inval), "seed {seed}: finished");
        }
        assert_eq!(submit_mt(&r, 0, 1), Err(Error::Again));
        g.destroy().unwrap();
    }
}
