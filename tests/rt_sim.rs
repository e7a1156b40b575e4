//! `rt::Sim`: seeded scheduling, virtual clock, traces, stall reports, and the
//! per-loop rules (current loop, has_run) when loops share one thread.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;
use std::time::Duration;
use xtc::Error;
use xtc::rt::{self, Loop, LoopId, Sim, TraceEvent, TraceKind, future_pair};

/// Two loops, six processes: yields, sleeps, a cross-loop promise and a kill.
fn workload(seed: u64) -> (Vec<TraceEvent>, Vec<u32>) {
    let sim = Sim::new(seed);
    let a = sim.new_loop();
    let b = sim.new_loop();
    let log = Rc::new(RefCell::new(Vec::new()));
    let (fut, promise) = future_pair::<u32>();
    for i in 0..3u32 {
        let log = log.clone();
        a.spawn(async move {
            for k in 0..3 {
                log.borrow_mut().push(i * 10 + k);
                rt::yield_now().await;
            }
            rt::sleep(Duration::from_micros(u64::from(i) * 7 + 1)).await;
            log.borrow_mut().push(100 + i);
        })
        .unwrap();
    }
    let l = log.clone();
    b.spawn(async move {
        rt::sleep(Duration::from_micros(3)).await;
        promise.set(Ok(7));
        l.borrow_mut().push(200);
    })
    .unwrap();
    let l = log.clone();
    b.spawn(async move {
        let v = fut.await.unwrap();
        l.borrow_mut().push(300 + v);
    })
    .unwrap();
    let victim = b
        .spawn(async { rt::sleep(Duration::from_secs(10)).await })
        .unwrap();
    let b2 = b.clone();
    b.spawn(async move {
        rt::yield_now().await;
        b2.kill(victim).unwrap();
    })
    .unwrap();
    sim.run_until_idle().unwrap();
    let out = log.borrow().clone();
    (sim.trace(), out)
}

#[test]
fn the_same_seed_gives_the_same_trace_over_1000_seeds() {
    for seed in 0..1000 {
        let (t1, l1) = workload(seed);
        let (t2, l2) = workload(seed);
        assert_eq!(t1, t2, "seed {seed}");
        assert_eq!(l1, l2, "seed {seed}");
        assert_eq!(l1.len(), 14, "seed {seed}: every log line written");
        assert!(t1.len() > 40, "seed {seed}: {} events", t1.len());
    }
}

#[test]
fn different_seeds_reach_different_interleavings() {
    let logs: HashSet<Vec<u32>> = (0..50).map(|s| workload(s).1).collect();
    assert!(logs.len() > 10, "only {} interleavings", logs.len());
}

#[test]
fn virtual_time_moves_only_by_jumps_to_timers() {
    let sim = Sim::new(1);
    let lp = sim.new_loop();
    let woke = Rc::new(RefCell::new(Vec::new()));
    for secs in [3600u64, 60, 1] {
        let woke = woke.clone();
        lp.spawn(async move {
            rt::sleep(Duration::from_secs(secs)).await;
            woke.borrow_mut().push(rt::now());
        })
        .unwrap();
    }
    assert_eq!(sim.now(), rt::Instant(0));
    sim.run_until_idle().unwrap();
    let s = |n: u64| rt::Instant(n * 1_000_000_000);
    assert_eq!(*woke.borrow(), vec![s(1), s(60), s(3600)]);
    assert_eq!(sim.now(), s(3600));
    // Every event happens at the time of the latest jump (or 0 before any).
    let mut clock = rt::Instant(0);
    for ev in sim.trace() {
        if ev.kind == TraceKind::Jump {
            assert!(ev.at > clock);
            clock = ev.at;
        }
        assert_eq!(ev.at, clock, "{ev:?}");
    }
}

#[test]
fn a_stall_is_reported_with_the_seed_and_the_waiting_pids() {
    let sim = Sim::new(77);
    let lp = sim.new_loop();
    let (fut, promise) = future_pair::<()>();
    let waiter = lp
        .spawn(async move {
            let _ = fut.await;
        })
        .unwrap();
    lp.spawn(async { rt::sleep(Duration::from_millis(5)).await })
        .unwrap();
    let stall = sim.run_until_idle().unwrap_err();
    assert_eq!(stall.seed, 77);
    assert_eq!(stall.pending, vec![waiter]);
    assert_eq!(stall.at, rt::Instant(5_000_000));
    assert!(stall.to_string().contains("seed 77"), "{stall}");
    promise.set(Ok(()));
    sim.run_until_idle().unwrap();
    assert_eq!(lp.n_procs(), 0);
}

#[test]
fn current_names_the_polled_loop_and_has_run_follows_the_first_poll() {
    let sim = Sim::new(5);
    let loops: Vec<Loop> = (0..3).map(|_| sim.new_loop()).collect();
    let seen: Rc<RefCell<Vec<(LoopId, LoopId)>>> = Rc::default();
    for lp in &loops[..2] {
        for _ in 0..4 {
            let (seen, own) = (seen.clone(), lp.id());
            lp.spawn(async move {
                for _ in 0..3 {
                    seen.borrow_mut().push((own, Loop::current().unwrap().id()));
                    rt::yield_now().await;
                }
            })
            .unwrap();
        }
    }
    assert!(loops.iter().all(|l| !l.has_run()));
    assert!(sim.step());
    assert_eq!(loops.iter().filter(|l| l.has_run()).count(), 1);
    sim.run_until_idle().unwrap();
    let seen = seen.borrow();
    assert_eq!(seen.len(), 24);
    assert!(seen.iter().all(|(own, cur)| own == cur));
    assert!(loops[0].has_run() && loops[1].has_run());
    assert!(
        !loops[2].has_run(),
        "a loop whose process never ran has not run"
    );
    assert!(Loop::current().is_none());
}

#[test]
fn a_killed_sleeper_never_moves_the_clock() {
    let sim = Sim::new(9);
    let lp = sim.new_loop();
    let hook_runs = Rc::new(Cell::new(0));
    struct Hook(Rc<Cell<u32>>);
    impl Drop for Hook {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }
    let h = Hook(hook_runs.clone());
    let victim = lp
        .spawn(async move {
            let _h = h;
            rt::sleep(Duration::from_secs(3600)).await;
        })
        .unwrap();
    let l2 = lp.clone();
    lp.spawn(async move {
        rt::sleep(Duration::from_secs(1)).await;
        l2.kill(victim).unwrap();
    })
    .unwrap();
    sim.run_until_idle().unwrap();
    assert_eq!(hook_runs.get(), 1);
    assert_eq!(sim.now(), rt::Instant(1_000_000_000));
}

#[test]
fn fd_readiness_is_nosys_and_run_is_inval_under_sim() {
    let sim = Sim::new(3);
    let lp = sim.new_loop();
    let (r, _w) = rustix::pipe::pipe().unwrap();
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    lp.spawn(async move {
        *g.borrow_mut() = Some(rt::wait_readable(std::os::fd::AsFd::as_fd(&r)).await);
    })
    .unwrap();
    assert_eq!(lp.run(), Err(Error::Inval));
    sim.run_until_idle().unwrap();
    assert_eq!(*got.borrow(), Some(Err(Error::Nosys)));
}

#[test]
fn step_is_false_on_an_empty_sim_and_run_steps_bounds_a_livelock() {
    let sim = Sim::new(0);
    assert!(!sim.step());
    let lp = sim.new_loop();
    lp.spawn(async {
        loop {
            rt::yield_now().await;
        }
    })
    .unwrap();
    assert_eq!(sim.run_steps(1000), Ok(false));
}

#[test]
fn a_killed_process_hook_spawns_a_finalizer_under_sim() {
    struct Finalize(Rc<Cell<Option<LoopId>>>);
    impl Drop for Finalize {
        fn drop(&mut self) {
            let lp = Loop::current().expect("hooks run with their loop current");
            let (done, id) = (self.0.clone(), lp.id());
            lp.spawn(async move {
                rt::sleep(Duration::from_millis(1)).await;
                done.set(Some(id));
            })
            .unwrap();
        }
    }
    for seed in 0..50 {
        let sim = Sim::new(seed);
        let (a, b) = (sim.new_loop(), sim.new_loop());
        let done = Rc::new(Cell::new(None));
        let guard = Finalize(done.clone());
        let (fut, _promise) = future_pair::<()>();
        let driver = a
            .spawn(async move {
                let _g = guard;
                let _ = fut.await;
            })
            .unwrap();
        let a2 = a.clone();
        b.spawn(async move { rt::yield_now().await }).unwrap();
        a.spawn(async move { a2.kill(driver).unwrap() }).unwrap();
        sim.run_until_idle().unwrap();
        assert_eq!(done.get(), Some(a.id()), "seed {seed}");
        assert!(!a.is_alive(driver));
    }
}

#[test]
fn a_sim_loop_budget_refuses_spawns_with_nomem() {
    let sim = Sim::new(2);
    let lp = sim.new_loop_with_budget(200);
    lp.spawn(async {}).unwrap();
    assert_eq!(lp.spawn(async {}).unwrap_err(), Error::Nomem);
    sim.run_until_idle().unwrap();
    assert_eq!(lp.budget().used(), 0);
    lp.spawn(async {}).unwrap();
}
