//! Adversarial tests of cross-loop admission with real threads and real
//! loops (bounded work, channels and flags, never sleeps, for
//! synchronisation): producers racing close and owner cancels, cancel_mt
//! hammering an operation wait, a stopped owner loop. The deterministic
//! cases are in `batch_adversarial_mt.rs`, `batch_adversarial_mt_close.rs`
//! and `batch_adversarial_mt_wait.rs`.
//!
//! Each test is named for the clause (B-NNN, `spec/clauses.md`) it attacks.

mod batch_adversarial_support;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use batch_adversarial_support::mt::*;
use batch_adversarial_support::*;
use xtc::Error;
use xtc::batch::{AsyncOpts, CloseMode, ExecStatus, Handle};
use xtc::rt::{self, Loop};

/// The wait ends at the deadline although cancel_mt keeps waking the driver
/// (from another thread, as fast as it can): TIMEOUT, then `Aborted`.
#[test]
fn b085_exec_timeout_ends_the_wait_despite_cancel_mt_waking_the_driver() {
    let lp = Loop::new().unwrap();
    let o = AsyncOpts {
        exec_timeout: Some(Duration::from_millis(200)),
        ..mt_opts(1, 1, 2)
    };
    let (g, c, r) = mt_group(&lp, o, Kind::Future);
    let h = g.submit(rq(1, 1), 1).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (s2, r2) = (stop.clone(), r.clone());
    let (go_tx, go_rx) = crossbeam_channel::bounded::<()>(1);
    let hammer = thread::spawn(move || {
        let mut wakes = 0u64;
        let _ = go_rx.recv(); // h is in flight (a cancel before would exclude it)
        // Livelock guard only (no timing assertion): 20 M controls.
        while !s2.load(Ordering::Acquire) && wakes < 20_000_000 {
            match r2.cancel(h) {
                Ok(()) => wakes += 1,
                Err(Error::Again) => thread::yield_now(),
                Err(Error::Inval) => break, // the driver finished
                Err(e) => panic!("cancel_mt: {e:?}"),
            }
        }
        wakes
    });
    let c2 = c.clone();
    let g2 = g.clone();
    let s3 = stop.clone();
    lp.spawn(async move {
        while c2.vectors.borrow().is_empty() {
            rt::yield_now().await;
        }
        go_tx.send(()).unwrap();
        while c2.done.borrow().is_empty() {
            rt::yield_now().await;
        }
        s3.store(true, Ordering::Release);
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    lp.run().unwrap();
    stop.store(true, Ordering::Release);
    let wakes = hammer.join().unwrap();
    assert!(wakes > 0);
    assert_eq!(
        c.collects.borrow().as_slice(),
        &[(vec![h], ExecStatus::Timeout)]
    );
    assert_eq!(g.async_stats().offload_timeouts, 1);
    // The hammer thread usually lands its first cancel inside the wait (the
    // deadline is long); if the OS starved it until after, the member ended
    // Again and the cancels were discarded: the wait still ended at TIMEOUT.
    let hinted = c.hints.borrow().clone();
    assert!(hinted.len() <= 1, "one hint however many cancels");
    let want = if hinted == [h] {
        Err(Error::Aborted)
    } else {
        Err(Error::Again)
    };
    assert_eq!(c.outcome(h), vec![want]);
    g.destroy().unwrap();
    drop(c.promises.borrow_mut().drain(..));
}

/// B-142 on a real loop: a producer thread races close; every `Ok` handle
/// completes exactly once, DRAIN runs it, CANCEL ends it `Aborted` (jobs
/// block until cancelled, so nothing can end them any other way).
#[test]
fn b142_submit_mt_racing_close_completes_each_accepted_handle_once() {
    for (round, mode) in [CloseMode::Drain, CloseMode::Cancel]
        .into_iter()
        .cycle()
        .take(8)
        .enumerate()
    {
        let lp = Loop::new().unwrap();
        let (g, c, r) = mt_group(&lp, mt_opts(4, 4, 8), Kind::Inline);
        let (tx, rx) = crossbeam_channel::unbounded::<()>();
        let producer = thread::spawn(move || {
            let mut ok = Vec::new();
            let _ = rx.recv(); // the owner loop started
            for i in 0..2_000u32 {
                match submit_mt(
                    &r,
                    i,
                    if mode == CloseMode::Drain {
                        2
                    } else {
                        u32::MAX
                    },
                ) {
                    Ok(h) => ok.push(h),
                    Err(Error::Again) => thread::yield_now(),
                    Err(e) => panic!("{e:?}"),
                }
            }
            ok
        });
        let g2 = g.clone();
        let c2 = c.clone();
        lp.spawn(async move {
            tx.send(()).unwrap();
            // Close after a few completions or at once, by round.
            for _ in 0..(round * 7) {
                rt::yield_now().await;
            }
            let _ = &c2;
            g2.close(mode).unwrap();
        })
        .unwrap();
        lp.run().unwrap();
        let ok = producer.join().unwrap();
        let done = c.done.borrow();
        assert_eq!(
            done.len(),
            ok.len(),
            "{mode:?}: one completion per Ok handle"
        );
        for h in &ok {
            let want = if mode == CloseMode::Drain {
                Ok(())
            } else {
                Err(Error::Aborted)
            };
            assert_eq!(c.outcome(*h), vec![want], "{mode:?} {h}");
        }
        drop(done);
        g.destroy().unwrap();
    }
}

/// B-108: a plain synchronous-style INLINE step in an mt-enabled async group
/// behaves as a synchronous group: variable-length completion, refill at the
/// boundary, from a plain thread's hand-ins.
#[test]
fn b108_remote_on_an_async_group_with_an_inline_step() {
    let lp = Loop::new().unwrap();
    let (g, c, r) = mt_group(&lp, mt_opts(3, 3, 4), Kind::Inline);
    let producer = thread::spawn(move || {
        let mut hs = Vec::new();
        for i in 0..12u32 {
            loop {
                match submit_mt(&r, i, 1 + i % 4) {
                    Ok(h) => break hs.push(h),
                    Err(Error::Again) => thread::yield_now(),
                    Err(e) => panic!("{e:?}"),
                }
            }
        }
        hs
    });
    let (g2, c2) = (g.clone(), c.clone());
    lp.spawn(async move {
        while c2.done.borrow().len() < 12 {
            rt::yield_now().await;
        }
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    lp.run().unwrap();
    let hs = producer.join().unwrap();
    for h in &hs {
        assert_eq!(c.outcome(*h), vec![Ok(())]);
    }
    let s = g.stats();
    assert_eq!(s.completed, 12);
    assert!(s.max_vector <= 3);
    assert_eq!(s.total_members, (0..12u64).map(|i| 1 + i % 4).sum::<u64>());
    g.destroy().unwrap();
}

/// B-052 / B-053 on a real loop: two producer threads hand in jobs that only
/// a cancel can end; the owner loop cancels each handle as soon as it learns
/// it (often still on the ring, or being written behind another producer).
/// The owner cancel answers `Ok` or `Again` (retry), never `Inval` for a live
/// hand-in, and every handle completes exactly once, `Aborted`.
#[test]
fn b052_owner_cancel_races_producer_threads_and_never_loses_a_live_hand_in() {
    const PER: u32 = 150;
    let lp = Loop::new().unwrap();
    let (g, c, r) = mt_group(&lp, mt_opts(4, 2, 4), Kind::Inline);
    let (tx, rx) = crossbeam_channel::unbounded::<Handle>();
    let producers: Vec<_> = (0..2u32)
        .map(|p| {
            let (r, tx) = (r.clone(), tx.clone());
            thread::spawn(move || {
                for i in 0..PER {
                    loop {
                        match submit_mt(&r, p * PER + i, u32::MAX) {
                            Ok(h) => break tx.send(h).unwrap(),
                            Err(Error::Again) => thread::yield_now(),
                            Err(e) => panic!("{e:?}"),
                        }
                    }
                }
            })
        })
        .collect();
    drop(tx);
    let g2 = g.clone();
    let agains = Rc::new(Cell::new(0u64));
    let a2 = agains.clone();
    lp.spawn(async move {
        let mut pending: Vec<Handle> = Vec::new();
        let mut cancelled = 0;
        while cancelled < 2 * PER {
            while let Ok(h) = rx.try_recv() {
                pending.push(h);
            }
            let mut keep = Vec::new();
            for h in pending.drain(..) {
                match g2.cancel(h) {
                    Ok(()) => cancelled += 1,
                    Err(Error::Again) => {
                        a2.set(a2.get() + 1);
                        keep.push(h);
                    }
                    Err(e) => panic!("owner cancel of live {h}: {e:?}"),
                }
            }
            pending = keep;
            rt::yield_now().await;
        }
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    lp.run().unwrap();
    for p in producers {
        p.join().unwrap();
    }
    let done = c.done.borrow();
    assert_eq!(done.len(), 2 * PER as usize);
    assert!(done.iter().all(|d| d.2 == Err(Error::Aborted)));
    let mut ids: Vec<u32> = done.iter().map(|d| d.1).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..2 * PER).collect::<Vec<_>>(), "each exactly once");
    drop(done);
    assert_eq!(g.stats().cancelled, u64::from(2 * PER));
    g.destroy().unwrap();
}

/// B-137 / B-140: a loop stopped with the driver parked, a hand-in from a
/// plain thread while it is stopped (its doorbell rings a stopped loop), then
/// the loop runs again: the hand-in is drained and completes exactly once.
/// The ring's charge stays until destroy (B-145).
#[test]
fn b140_hand_in_while_the_owner_loop_is_stopped_runs_after_the_next_run() {
    let lp = Loop::new().unwrap();
    let base = lp.budget().used();
    let (g, c, r) = mt_group(&lp, mt_opts(2, 2, 2), Kind::Inline);
    let h1 = submit_mt(&r, 1, 1).unwrap();
    let resumed = Arc::new(AtomicBool::new(false));
    let (g2, c2, lp2, res2) = (g.clone(), c.clone(), lp.clone(), resumed.clone());
    lp.spawn(async move {
        while c2.done.borrow().is_empty() {
            rt::yield_now().await;
        }
        lp2.stop();
        while !res2.load(Ordering::Acquire) {
            rt::yield_now().await;
        }
        while c2.done.borrow().len() < 2 {
            rt::yield_now().await;
        }
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(c.outcome(h1), vec![Ok(())]);
    let h2 = thread::spawn(move || submit_mt(&r, 2, 1))
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(g.destroy(), Err(Error::Again), "stopping is not draining");
    resumed.store(true, Ordering::Release);
    lp.run().unwrap();
    assert_eq!(c.outcome(h2), vec![Ok(())]);
    // Every process has exited (their charges are back); the storage charge,
    // ring and pools included, stays until destroy.
    assert_eq!(lp.n_procs(), 0);
    assert!(lp.budget().used() > base, "ring charged until destroy");
    g.destroy().unwrap();
    assert_eq!(lp.budget().used(), base, "released by destroy");
}

/// A FUTURE step whose members run `left` iterations: the first two
/// operations resolve at once, the third one's promise goes to a canceller
/// thread together with the member's handle.
struct ThirdToThread {
    tx: crossbeam_channel::Sender<(Handle, rt::Promise<()>)>,
    iteration: u32,
    hints: Rc<std::cell::RefCell<Vec<Handle>>>,
}

impl xtc::batch::AsyncStep<u32> for ThirdToThread {
    async fn submit(
        &mut self,
        items: &mut [xtc::batch::Item<'_, u32>],
    ) -> xtc::Result<xtc::batch::Exec> {
        self.iteration += 1;
        let (f, p) = rt::future_pair();
        if self.iteration < 3 {
            p.set(Ok(()));
        } else {
            self.tx.send((items[0].handle, p)).unwrap();
        }
        Ok(xtc::batch::Exec::Future(f))
    }

    async fn collect(
        &mut self,
        items: &mut [xtc::batch::Item<'_, u32>],
        results: &mut [xtc::batch::StepResult],
        _: ExecStatus,
    ) -> xtc::Result<()> {
        for (it, r) in items.iter_mut().zip(results.iter_mut()) {
            *it.request -= 1;
            *r = if *it.request == 0 {
                xtc::batch::StepResult::Done
            } else {
                xtc::batch::StepResult::Continue
            };
        }
        Ok(())
    }

    async fn cancel_hint(&mut self, h: Handle) {
        self.hints.borrow_mut().push(h);
    }
}

/// Issue 12 item 1 on real threads (B-093, B-094, B-122): a canceller thread
/// cancels the member whose third (last) operation is outstanding, then
/// resolves that operation. Whatever the driver sees first, the accepted
/// cancel is consumed at the completion boundary: one hint, `Aborted`,
/// exactly once, in every round (4 to 21 of 100 rounds ended `Ok` before).
#[test]
fn b122_cancel_mt_from_a_thread_racing_the_completion_always_aborts() {
    for round in 0..100 {
        let lp = Loop::new().unwrap();
        let (tx, rx) = crossbeam_channel::bounded(1);
        let hints = Rc::new(std::cell::RefCell::new(Vec::new()));
        let step = ThirdToThread {
            tx,
            iteration: 0,
            hints: hints.clone(),
        };
        let done = Rc::new(std::cell::RefCell::new(Vec::new()));
        let d2 = done.clone();
        let complete = move |h: Handle, left: u32, o: xtc::Result<()>| {
            d2.borrow_mut().push((h, left, o));
        };
        let g = xtc::batch::Group::create_async(&lp, mt_opts(2, 1, 2), step, complete).unwrap();
        let r = g.remote().unwrap();
        let a = g.submit(3, 1).unwrap();
        let canceller = thread::spawn(move || {
            let (h, p): (Handle, rt::Promise<()>) = rx.recv().unwrap();
            assert_eq!(h, a);
            r.cancel(h).unwrap(); // accepted: the operation is outstanding
            p.set(Ok(()));
        });
        let (g2, d3) = (g.clone(), done.clone());
        lp.spawn(async move {
            while d3.borrow().is_empty() {
                rt::yield_now().await;
            }
            g2.close(CloseMode::Drain).unwrap();
        })
        .unwrap();
        lp.run().unwrap();
        canceller.join().unwrap();
        assert_eq!(
            done.borrow().as_slice(),
            &[(a, 0, Err(Error::Aborted))],
            "round {round}: the accepted cancel was lost"
        );
        assert_eq!(hints.borrow().as_slice(), &[a], "round {round}: one hint");
        g.destroy().unwrap();
    }
}

/// A FUTURE operation a resolver thread ends at a random moment: `Ok`, a
/// failed status, or a dropped promise.
struct ThreadOp {
    tx: crossbeam_channel::Sender<rt::Promise<()>>,
    rng: fastrand::Rng,
}

impl xtc::batch::AsyncStep<u64> for ThreadOp {
    async fn submit(
        &mut self,
        _: &mut [xtc::batch::Item<'_, u64>],
    ) -> xtc::Result<xtc::batch::Exec> {
        if self.rng.u32(0..20) == 0 {
            return Ok(xtc::batch::Exec::Inline);
        }
        let (f, p) = rt::future_pair();
        self.tx.send(p).expect("resolver alive");
        Ok(xtc::batch::Exec::Future(f))
    }

    async fn collect(
        &mut self,
        items: &mut [xtc::batch::Item<'_, u64>],
        res: &mut [xtc::batch::StepResult],
        _: ExecStatus,
    ) -> xtc::Result<()> {
        use xtc::batch::StepResult;
        for (it, r) in items.iter_mut().zip(res.iter_mut()) {
            *it.request = it.request.saturating_sub(1);
            *r = if *it.request == 0 {
                StepResult::Done
            } else {
                StepResult::Continue
            };
        }
        if self.rng.u32(0..4) == 0 {
            rt::yield_now().await;
        }
        Ok(())
    }

    async fn cancel_hint(&mut self, _: Handle) {
        if self.rng.bool() {
            rt::yield_now().await;
        }
    }
}

/// B-119, B-141, B-039, B-089: producer threads (submit_mt, cancel_mt,
/// resume_mt of their own handles) race FUTURE operations that a resolver
/// thread ends at random moments (some failed, some dropped), an optional
/// exec timeout, and one owner action at a random moment: close(DRAIN),
/// close(CANCEL) or a kill of the driver. Every `Ok` handle gets exactly one
/// completion, the counters add up, nothing stays reserved, and after
/// destroy submit_mt is `Again`.
#[test]
fn b119_b141_producer_threads_race_operations_timeouts_close_and_kill() {
    use std::collections::HashMap;
    for round in 0..30u64 {
        let mut rng = fastrand::Rng::with_seed(round);
        let lp = Loop::new().unwrap();
        let (ptx, prx) = crossbeam_channel::unbounded::<rt::Promise<()>>();
        let mut rrng = fastrand::Rng::with_seed(round ^ 99);
        // Ends when the group's step (the sender) is gone and all is resolved.
        let resolver = thread::spawn(move || {
            for p in prx.iter() {
                thread::sleep(Duration::from_micros(rrng.u64(0..300)));
                match rrng.u32(0..10) {
                    0 => drop(p),
                    1 => p.set(Err(Error::Range)),
                    _ => p.set(Ok(())),
                }
            }
        });
        let started: Rc<std::cell::RefCell<HashMap<Handle, usize>>> = Rc::default();
        let st = started.clone();
        let capacity = 1 + rng.usize(0..4);
        let o = AsyncOpts {
            capacity,
            max_active: 1 + rng.usize(0..capacity),
            resource_capacity: 4,
            exec_timeout: rng.bool().then(|| Duration::from_micros(rng.u64(50..400))),
            sched_class: None,
            mt_queue_cap: 1 + rng.usize(0..4),
        };
        let step = ThreadOp {
            tx: ptx,
            rng: fastrand::Rng::with_seed(round ^ 7),
        };
        let complete = move |h: Handle, _: u64, _: xtc::Result<()>| {
            *st.borrow_mut().entry(h).or_default() += 1;
        };
        let g = xtc::batch::Group::create_async(&lp, o, step, complete).unwrap();
        let r = g.remote().unwrap();
        let (go_tx, go_rx) = crossbeam_channel::unbounded::<()>();
        let producers: Vec<_> = (0..3u64)
            .map(|t| {
                let (r, go_rx) = (r.clone(), go_rx.clone());
                let mut rng = fastrand::Rng::with_seed(round * 31 + t);
                thread::spawn(move || {
                    let _ = go_rx.recv();
                    let mut ok: Vec<Handle> = Vec::new();
                    for _ in 0..400 {
                        let pick = ok.get(rng.usize(0..ok.len().max(1))).copied();
                        match (rng.u32(0..10), pick) {
                            (0..6, _) => match r.submit(1 + rng.u64(0..4), 1 + rng.u64(0..4)) {
                                Ok(h) => ok.push(h),
                                Err(e) => assert_eq!(e.error, Error::Again),
                            },
                            (6..8, Some(h)) => {
                                let e = r.cancel(h);
                                assert!(matches!(e, Ok(()) | Err(Error::Again | Error::Inval)));
                            }
                            (8, Some(h)) => {
                                let e = r.resume(h);
                                assert!(matches!(e, Ok(()) | Err(Error::Again | Error::Inval)));
                            }
                            _ => thread::yield_now(),
                        }
                    }
                    ok
                })
            })
            .collect();
        let action = rng.u32(0..3);
        let delay = rng.u32(0..300);
        let g2 = g.clone();
        lp.spawn(async move {
            for _ in 0..3 {
                go_tx.send(()).unwrap();
            }
            for _ in 0..delay {
                rt::sleep(Duration::from_micros(20)).await;
            }
            let mode = match action {
                0 => CloseMode::Drain,
                1 => CloseMode::Cancel,
                _ => return g2.owner_loop().kill(g2.driver_pid()).unwrap(),
            };
            while g2.close(mode).is_err() {
                rt::yield_now().await; // Deadlk during a callback
            }
        })
        .unwrap();
        lp.run().unwrap();
        let ok: Vec<Handle> = producers
            .into_iter()
            .flat_map(|p| p.join().unwrap())
            .collect();
        let started = started.borrow();
        for h in &ok {
            let n = started.get(h).copied();
            assert_eq!(n, Some(1), "round {round} action {action}: {h}");
        }
        assert_eq!(started.len(), ok.len(), "round {round}: only Ok handles");
        let s = g.stats();
        assert_eq!(s.completed + s.cancelled + s.failed, ok.len() as u64);
        let gauges = (s.queued, s.ready, s.blocked, s.reserved_units);
        assert_eq!(gauges, (0, 0, 0, 0), "round {round}");
        g.destroy().unwrap();
        assert_eq!(r.submit(1, 1).map_err(|e| e.error), Err(Error::Again));
        drop((g, lp));
        resolver.join().unwrap();
    }
}
