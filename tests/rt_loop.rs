//! `rt::Loop` on a real (epoll) loop: process table, kill and exit hooks,
//! timers, yields, current loop, bad input.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;
use xtc::Error;
use xtc::rt::{self, Loop, LoopId, future_pair};

/// Drop guard = exit hook: counts its runs and records the current loop.
struct Hook {
    runs: Rc<Cell<u32>>,
    seen: Rc<Cell<Option<LoopId>>>,
}

impl Drop for Hook {
    fn drop(&mut self) {
        self.runs.set(self.runs.get() + 1);
        self.seen.set(Loop::current().map(|l| l.id()));
    }
}

type Seen = Rc<Cell<Option<LoopId>>>;

fn hook() -> (Hook, Rc<Cell<u32>>, Seen) {
    let runs = Rc::new(Cell::new(0));
    let seen = Rc::new(Cell::new(None));
    (
        Hook {
            runs: runs.clone(),
            seen: seen.clone(),
        },
        runs,
        seen,
    )
}

#[test]
fn spawn_run_to_completion_and_pids_are_never_reused() {
    let lp = Loop::new().unwrap();
    let out = Rc::new(RefCell::new(Vec::new()));
    let mut pids = Vec::new();
    for i in 0..3 {
        let out = out.clone();
        pids.push(lp.spawn(async move { out.borrow_mut().push(i) }).unwrap());
    }
    assert_eq!(lp.n_procs(), 3);
    assert!(pids.iter().all(|p| lp.is_alive(*p)));
    assert!(!lp.has_run());
    lp.run().unwrap();
    assert!(lp.has_run());
    assert_eq!(*out.borrow(), vec![0, 1, 2]);
    assert_eq!(lp.n_procs(), 0);
    assert!(pids.iter().all(|p| !lp.is_alive(*p)));
    let later = lp.spawn(async {}).unwrap();
    assert!(pids.iter().all(|p| *p != later && p.seq() < later.seq()));
    lp.run().unwrap();
}

#[test]
fn current_is_the_running_loop_and_none_outside() {
    assert!(Loop::current().is_none());
    let lp = Loop::new().unwrap();
    let seen = Rc::new(Cell::new(None));
    let s = seen.clone();
    lp.spawn(async move { s.set(Loop::current().map(|l| l.id())) })
        .unwrap();
    lp.run().unwrap();
    assert_eq!(seen.get(), Some(lp.id()));
    assert!(Loop::current().is_none());
}

#[test]
fn kill_of_a_process_parked_on_a_future_runs_its_hook_once_in_the_loop() {
    let lp = Loop::new().unwrap();
    let (fut, promise) = future_pair::<u32>();
    let (h, runs, seen) = hook();
    let victim = lp
        .spawn(async move {
            let _h = h;
            let _ = fut.await;
            unreachable!("a killed process is never resumed");
        })
        .unwrap();
    let l2 = lp.clone();
    lp.spawn(async move {
        rt::yield_now().await; // let the victim park first
        l2.kill(victim).unwrap();
        assert!(
            l2.is_alive(victim),
            "dropped at its next turn, not inside kill"
        );
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(runs.get(), 1);
    assert_eq!(seen.get(), Some(lp.id()));
    assert!(!lp.is_alive(victim));
    assert_eq!(lp.kill(victim), Err(Error::Inval), "stale pid");
    promise.set(Ok(1)); // harmless: the future is gone
}

#[test]
fn kill_of_a_process_parked_on_a_timer_drops_it() {
    let lp = Loop::new().unwrap();
    let (h, runs, _) = hook();
    let victim = lp
        .spawn(async move {
            let _h = h;
            rt::sleep(Duration::from_secs(3600)).await;
        })
        .unwrap();
    let l2 = lp.clone();
    lp.spawn(async move {
        rt::yield_now().await;
        l2.kill(victim).unwrap();
    })
    .unwrap();
    lp.run().unwrap(); // returns only because the sleeper is gone
    assert_eq!(runs.get(), 1);
    assert_eq!(lp.n_procs(), 0);
}

#[test]
fn a_process_killing_itself_dies_at_its_suspension_point() {
    let lp = Loop::new().unwrap();
    let (h, runs, _) = hook();
    let reached = Rc::new(Cell::new(false));
    let r = reached.clone();
    lp.spawn(async move {
        let _h = h;
        let me = Loop::current().unwrap();
        me.kill(rt::current_pid().unwrap()).unwrap();
        assert!(me.is_alive(rt::current_pid().unwrap()));
        rt::yield_now().await;
        r.set(true);
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(runs.get(), 1);
    assert!(!reached.get());
}

#[test]
fn exit_hook_may_spawn_a_finalizer_on_the_same_loop() {
    struct SpawnOnDrop(Rc<Cell<bool>>);
    impl Drop for SpawnOnDrop {
        fn drop(&mut self) {
            let done = self.0.clone();
            let lp = Loop::current().expect("exit hooks run inside the loop");
            lp.spawn(async move {
                rt::yield_now().await;
                done.set(true);
            })
            .unwrap();
        }
    }
    let lp = Loop::new().unwrap();
    let done = Rc::new(Cell::new(false));
    let guard = SpawnOnDrop(done.clone());
    let (fut, _promise) = future_pair::<()>();
    let victim = lp
        .spawn(async move {
            let _g = guard;
            let _ = fut.await;
        })
        .unwrap();
    let l2 = lp.clone();
    lp.spawn(async move { l2.kill(victim).unwrap() }).unwrap();
    lp.run().unwrap();
    assert!(done.get(), "the finalizer ran to completion");
    assert_eq!(lp.n_procs(), 0);
}

#[test]
fn kill_before_first_poll_never_polls_and_runs_hook_once() {
    let lp = Loop::new().unwrap();
    let (h, runs, _) = hook();
    let polled = Rc::new(Cell::new(false));
    let p = polled.clone();
    let pid = lp
        .spawn(async move {
            let _h = h;
            p.set(true);
        })
        .unwrap();
    lp.kill(pid).unwrap();
    assert_eq!(
        lp.kill(pid),
        Ok(()),
        "a second kill before the drop is a no-op"
    );
    assert!(lp.is_alive(pid));
    lp.run().unwrap();
    assert!(!polled.get());
    assert_eq!(runs.get(), 1);
    assert_eq!(lp.kill(pid), Err(Error::Inval));
}

#[test]
fn kill_of_a_foreign_pid_is_inval_and_kills_nothing() {
    let a = Loop::new().unwrap();
    let b = Loop::new().unwrap();
    let pa = a.spawn(async {}).unwrap();
    let pb = b.spawn(async {}).unwrap();
    assert_eq!(pa.seq(), pb.seq(), "same sequence number on both loops");
    assert_eq!(b.kill(pa), Err(Error::Inval));
    assert!(a.is_alive(pa) && b.is_alive(pb));
    assert!(!b.is_alive(pa));
    a.run().unwrap();
    b.run().unwrap();
}

#[test]
fn timers_fire_in_deadline_order() {
    let lp = Loop::new().unwrap();
    let order = Rc::new(RefCell::new(Vec::new()));
    for ms in [30u64, 10, 20, 0] {
        let order = order.clone();
        lp.spawn(async move {
            rt::sleep(Duration::from_millis(ms)).await;
            order.borrow_mut().push(ms);
        })
        .unwrap();
    }
    let start = lp.now();
    lp.run().unwrap();
    assert_eq!(*order.borrow(), vec![0, 10, 20, 30]);
    assert!(lp.now().saturating_duration_since(start) >= Duration::from_millis(30));
}

#[test]
fn sleep_until_a_past_deadline_completes_at_once() {
    let lp = Loop::new().unwrap();
    let done = Rc::new(Cell::new(false));
    let d = done.clone();
    lp.spawn(async move {
        rt::sleep_until(rt::Instant(0)).await;
        d.set(true);
    })
    .unwrap();
    lp.run().unwrap();
    assert!(done.get());
}

#[test]
fn yield_now_interleaves_processes() {
    let lp = Loop::new().unwrap();
    let log = Rc::new(RefCell::new(String::new()));
    for name in ['a', 'b'] {
        let log = log.clone();
        lp.spawn(async move {
            for _ in 0..3 {
                log.borrow_mut().push(name);
                rt::yield_now().await;
            }
        })
        .unwrap();
    }
    lp.run().unwrap();
    assert_eq!(*log.borrow(), "ababab");
}

#[test]
fn run_from_inside_a_loop_is_inval() {
    let lp = Loop::new().unwrap();
    let other = Loop::new().unwrap();
    let res = Rc::new(RefCell::new(Vec::new()));
    let (r, l2) = (res.clone(), lp.clone());
    lp.spawn(async move {
        r.borrow_mut().push(l2.run());
        r.borrow_mut().push(other.run());
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(*res.borrow(), vec![Err(Error::Inval), Err(Error::Inval)]);
}

#[test]
fn stop_returns_from_run_keeps_processes_and_refuses_spawn_until_resumed() {
    let lp = Loop::new().unwrap();
    let steps = Rc::new(Cell::new(0));
    let (s, l2) = (steps.clone(), lp.clone());
    let pid = lp
        .spawn(async move {
            s.set(1);
            l2.stop();
            rt::yield_now().await;
            s.set(2);
        })
        .unwrap();
    lp.run().unwrap();
    assert_eq!(steps.get(), 1);
    assert!(lp.is_alive(pid));
    assert!(lp.is_stopped());
    assert_eq!(lp.spawn(async {}).unwrap_err(), Error::Again);
    lp.run().unwrap();
    assert_eq!(steps.get(), 2);
    assert!(!lp.is_stopped());
    assert_eq!(lp.n_procs(), 0);
}

#[test]
fn dropping_a_loop_runs_the_hooks_of_its_processes() {
    let lp = Loop::new().unwrap();
    let (h, runs, _) = hook();
    lp.spawn(async move {
        let _h = h;
        std::future::pending::<()>().await;
    })
    .unwrap();
    drop(lp);
    assert_eq!(runs.get(), 1);
}

#[test]
fn a_far_deadline_parks_without_error_until_killed() {
    // A deadline ~584 years away must not make epoll_wait fail; the waker
    // from the promise ends the wait.
    let lp = Loop::new().unwrap();
    let (fut, promise) = future_pair::<()>();
    let sleeper = lp
        .spawn(async { rt::sleep_until(rt::Instant(u64::MAX)).await })
        .unwrap();
    let l2 = lp.clone();
    lp.spawn(async move {
        let _ = fut.await;
        l2.kill(sleeper).unwrap();
    })
    .unwrap();
    let setter = std::thread::spawn(move || promise.set(Ok(())));
    lp.run().unwrap();
    setter.join().unwrap();
    assert_eq!(lp.n_procs(), 0);
}
