//! Group lifetime and teardown: driver kills (exactly once, recorded
//! outcomes survive), close → run → destroy, stopped loops, owner-loop
//! checks, and a group on a real loop.

mod batch_support;

use std::cell::RefCell;
use std::rc::Rc;

use batch_support::*;
use xtc::Error;
use xtc::batch::{CloseMode, Group, Item, Step, StepResult, SyncOpts};
use xtc::rt::{self, Loop, Sim};

fn group(lp: &Loop, opts: SyncOpts, log: &Log) -> Group<Req> {
    Group::create(lp, opts, countdown_step(), log.complete()).unwrap()
}

#[test]
fn killed_driver_never_notifies_twice_and_recorded_outcomes_survive() {
    let sim = Sim::from_env(15);
    let lp = sim.new_loop();
    let log = Log::default();
    let g = Group::create(
        &lp,
        sync_opts(8, 4, 8),
        countdown_step(),
        SlowComplete {
            log: log.clone(),
            yields: 2,
        },
    )
    .unwrap();
    let mut hs = Vec::new();
    for (id, left) in [(1, 1), (2, 1), (3, 5), (4, 5), (5, 5)] {
        hs.push(g.submit(req(id, left), 1).unwrap());
    }
    let killer = g.clone();
    let started = log.clone();
    lp.spawn(async move {
        // Kill while the first completion (DONE of 1) is in flight.
        while started.len() == 0 {
            rt::yield_now().await;
        }
        assert_eq!(killer.cancel(hs[4]), Err(Error::Deadlk));
        killer.owner_loop().kill(killer.driver_pid()).unwrap();
    })
    .unwrap();
    run_idle(&sim);
    assert_eq!(log.len(), 5, "exactly one notification per submit");
    let mut got = log.outcomes();
    got.sort_by_key(|o| o.0);
    assert_eq!(
        got[0].1,
        Ok(()),
        "recorded DONE survives driver exit (delivery interrupted, not repeated)"
    );
    assert_eq!(got[1].1, Ok(()), "recorded DONE survives driver exit");
    for o in &got[2..] {
        assert_eq!(o.1, Err(Error::Internal), "outstanding work fails Internal");
    }
    assert_eq!(
        g.submit(req(9, 1), 1).unwrap_err().error,
        Error::Inval,
        "outside the loop after run"
    );
    let g2 = g.clone();
    lp.spawn(async move {
        assert_eq!(
            g2.submit(req(9, 1), 1).unwrap_err().error,
            Error::Again,
            "exit closed the group"
        )
    })
    .unwrap();
    run_idle(&sim);
    let s = g.stats();
    assert_eq!(
        (s.completed, s.failed),
        (2, 3),
        "interrupted delivery retired once"
    );
    g.destroy().unwrap();
}

#[test]
fn killed_driver_mid_step_fails_the_vector_internal_or_aborted() {
    let sim = Sim::from_env(16);
    let lp = sim.new_loop();
    let log = Log::default();
    struct Parked;
    impl Step<Req> for Parked {
        async fn step(&mut self, _: &mut [Item<'_, Req>], _: &mut [StepResult]) -> xtc::Result<()> {
            std::future::pending::<()>().await;
            Ok(())
        }
    }
    let g = Group::create(&lp, sync_opts(4, 1, 1), Parked, log.complete()).unwrap();
    let h1 = g.submit(req(1, 1), 1).unwrap();
    let h2 = g.submit(req(2, 1), 1).unwrap();
    let h3 = g.submit(req(3, 1), 1).unwrap();
    g.cancel(h3).unwrap();
    let killer = g.clone();
    lp.spawn(async move {
        while killer.stats().iterations == 0 {
            rt::yield_now().await;
        }
        killer.owner_loop().kill(killer.driver_pid()).unwrap();
    })
    .unwrap();
    run_idle(&sim);
    assert_eq!(log.outcome(h1), vec![Err(Error::Internal)]);
    assert_eq!(log.outcome(h2), vec![Err(Error::Internal)]);
    assert_eq!(log.outcome(h3), vec![Err(Error::Aborted)]);
    assert!(!lp.is_alive(g.finalizer_pid()));
    g.destroy().unwrap();
}

#[test]
fn kill_before_the_first_run_still_completes_everything() {
    let sim = Sim::from_env(17);
    let lp = sim.new_loop();
    let log = Log::default();
    let g = group(&lp, sync_opts(4, 1, 1), &log);
    let h = g.submit(req(1, 1), 1).unwrap();
    lp.kill(g.driver_pid()).unwrap();
    run_idle(&sim);
    assert_eq!(log.outcome(h), vec![Err(Error::Internal)]);
    g.destroy().unwrap();
}

#[test]
fn lifetime_close_run_destroy() {
    let sim = Sim::from_env(18);
    let lp = sim.new_loop();
    let log = Log::default();
    let g = group(&lp, sync_opts(2, 1, 1), &log);
    assert_eq!(g.destroy(), Err(Error::Again), "not closed");
    g.close(CloseMode::Drain).unwrap();
    g.close(CloseMode::Drain).unwrap(); // idempotent
    assert_eq!(
        g.destroy(),
        Err(Error::Again),
        "closing an empty group still needs the driver to run"
    );
    assert!(lp.is_alive(g.driver_pid()));
    run_idle(&sim);
    assert!(!lp.is_alive(g.driver_pid()) && !lp.is_alive(g.finalizer_pid()));
    assert_eq!(lp.n_procs(), 0);
    g.destroy().unwrap();
    assert_eq!(g.destroy(), Err(Error::Inval), "already destroyed");
    assert_eq!(g.stats().iterations, 0, "stats stay readable");
}

#[test]
fn stopping_a_loop_is_not_draining() {
    let lp = Loop::new().unwrap();
    let log = Log::default();
    let g = group(&lp, sync_opts(2, 1, 1), &log);
    let h = g.submit(req(1, 3), 1).unwrap();
    let stopper = lp.clone();
    lp.spawn(async move { stopper.stop() }).unwrap();
    // The owner process that will close the group, fed through a mailbox.
    let (tx, rx) = rt::mailbox::<CloseMode>();
    let closer = g.clone();
    lp.spawn(async move { closer.close(rx.recv().await.unwrap()).unwrap() })
        .unwrap();
    lp.run().unwrap();
    assert_eq!(
        g.close(CloseMode::Drain),
        Err(Error::Inval),
        "outside the owner loop after run"
    );
    assert_eq!(g.destroy(), Err(Error::Again), "driver still present");
    tx.send(CloseMode::Drain).unwrap();
    lp.run().unwrap();
    assert_eq!(log.outcome(h), vec![Ok(())]);
    g.destroy().unwrap();
}

#[test]
fn mutation_from_another_loop_is_inval() {
    let sim = Sim::from_env(19);
    let (a, b) = (sim.new_loop(), sim.new_loop());
    let log = Log::default();
    let g = group(&a, sync_opts(2, 1, 1), &log);
    let h = g.submit(req(1, 1), 1).unwrap(); // pre-run setup
    let errs = Rc::new(RefCell::new(Vec::new()));
    let (g2, e2) = (g.clone(), errs.clone());
    let owner = a.clone();
    b.spawn(async move {
        while !owner.has_run() {
            rt::yield_now().await;
        }
        let mut e = e2.borrow_mut();
        e.push(g2.submit(req(2, 1), 1).unwrap_err().error);
        e.push(g2.cancel(h).unwrap_err());
        e.push(g2.resume(h).unwrap_err());
        e.push(g2.close(CloseMode::Cancel).unwrap_err());
        e.push(g2.destroy().unwrap_err());
    })
    .unwrap();
    let g3 = g.clone();
    a.spawn(async move {
        rt::yield_now().await;
        g3.close(CloseMode::Drain).unwrap()
    })
    .unwrap();
    run_idle(&sim);
    assert_eq!(*errs.borrow(), vec![Error::Inval; 5]);
    assert_eq!(log.outcome(h), vec![Ok(())]);
}

#[test]
fn real_loop_runs_a_group() {
    let lp = Loop::new().unwrap();
    let log = Log::default();
    let g = group(&lp, sync_opts(16, 4, 8), &log);
    for i in 0..16 {
        g.submit(req(i, 1 + i % 5), 1 + u64::from(i % 3)).unwrap();
    }
    g.close(CloseMode::Drain).unwrap();
    lp.run().unwrap();
    assert_eq!(log.len(), 16);
    assert!(log.outcomes().iter().all(|o| o.1.is_ok()));
    g.destroy().unwrap();
}
