//! Scheduling classes and the resource accountant.

use std::cell::RefCell;
use std::rc::Rc;
use xtc::Error;
use xtc::rt::{self, Loop, Sim};

fn share_of_a(log: &str, window: usize) -> usize {
    log.chars().take(window).filter(|c| *c == 'a').count()
}

#[test]
fn a_real_loop_gives_turns_in_proportion_to_weight() {
    let lp = Loop::new().unwrap();
    let log = Rc::new(RefCell::new(String::new()));
    let a = lp.new_class(300).unwrap();
    let b = lp.new_class(100).unwrap();
    for (class, c) in [(&a, 'a'), (&b, 'b')] {
        let log = log.clone();
        lp.spawn_in(class, async move {
            for _ in 0..400 {
                log.borrow_mut().push(c);
                rt::yield_now().await;
            }
        })
        .unwrap();
    }
    lp.run().unwrap();
    let share = share_of_a(&log.borrow(), 400);
    assert!((290..=310).contains(&share), "a got {share} of 400 turns");
}

#[test]
fn a_sim_picks_classes_in_proportion_to_weight() {
    let sim = Sim::from_env(11);
    let lp = sim.new_loop();
    let log = Rc::new(RefCell::new(String::new()));
    let a = lp.new_class(900).unwrap();
    let b = lp.new_class(100).unwrap();
    for (class, c) in [(&a, 'a'), (&b, 'b')] {
        let log = log.clone();
        lp.spawn_in(class, async move {
            for _ in 0..2000 {
                log.borrow_mut().push(c);
                rt::yield_now().await;
            }
        })
        .unwrap();
    }
    sim.run_until_idle().unwrap();
    let share = share_of_a(&log.borrow(), 1000);
    assert!(share > 800, "a got {share} of 1000 picks at weight 9:1");
}

#[test]
fn a_foreign_class_is_inval_and_spawns_nothing() {
    let a = Loop::new().unwrap();
    let b = Loop::new().unwrap();
    let class = a.new_class(10).unwrap();
    assert_eq!(class.loop_id(), a.id());
    assert_eq!(class.weight(), 10);
    assert_eq!(b.spawn_in(&class, async {}).unwrap_err(), Error::Inval);
    assert_eq!(b.n_procs(), 0);
    assert_eq!(a.new_class(0).unwrap_err(), Error::Inval);
}

#[test]
fn budget_exhaustion_is_nomem_and_nothing_leaks() {
    let lp = Loop::with_budget(1000).unwrap();
    let mut pids = Vec::new();
    let err = loop {
        match lp.spawn(async { rt::yield_now().await }) {
            Ok(p) => pids.push(p),
            Err(e) => break e,
        }
    };
    assert_eq!(err, Error::Nomem);
    assert!(!pids.is_empty());
    assert_eq!(
        lp.n_procs(),
        pids.len(),
        "the refused spawn left nothing behind"
    );
    assert!(lp.budget().used() <= 1000);
    lp.run().unwrap();
    assert_eq!(lp.budget().used(), 0);
    lp.spawn(async {}).unwrap();
    lp.run().unwrap();
}

#[test]
fn injected_allocation_failure_fails_exactly_that_spawn() {
    let lp = Loop::new().unwrap();
    lp.budget().fail_after(2);
    assert!(lp.spawn(async {}).is_ok());
    assert!(lp.spawn(async {}).is_ok());
    assert_eq!(lp.spawn(async {}).unwrap_err(), Error::Nomem);
    assert!(lp.spawn(async {}).is_ok());
    assert_eq!(lp.n_procs(), 3);
    assert!(lp.budget().used() > 0);
    lp.run().unwrap();
    assert_eq!(lp.budget().used(), 0);
    lp.budget().fail_after(0);
    assert_eq!(lp.new_class(5).unwrap_err(), Error::Nomem);
}

/// Drops its flag when dropped (the future was dropped, not leaked).
struct DropFlag(Rc<std::cell::Cell<bool>>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.set(true);
    }
}

#[test]
fn spawn_pair_spawns_both_or_neither() {
    let sim = Sim::from_env(3);
    let lp = sim.new_loop();
    let class = lp.new_class(2).unwrap();
    let used = lp.budget().used();
    for n in 0..=1 {
        // The first (n = 0) or the second (n = 1) process charge fails.
        let (da, db) = (Rc::default(), Rc::default());
        let (fa, fb) = (DropFlag(Rc::clone(&da)), DropFlag(Rc::clone(&db)));
        lp.budget().fail_after(n);
        let r = lp.spawn_pair(
            Some(&class),
            async move { drop(fa) },
            async move { drop(fb) },
        );
        assert_eq!(r, Err(Error::Nomem), "charge {n}");
        assert_eq!(lp.n_procs(), 0, "nothing published");
        assert_eq!(lp.budget().used(), used, "nothing charged");
        assert!(da.get() && db.get(), "both futures dropped at once");
    }
    let ran = Rc::new(RefCell::new(String::new()));
    let (r1, r2) = (ran.clone(), ran.clone());
    let (a, b) = lp
        .spawn_pair(
            Some(&class),
            async move { r1.borrow_mut().push('a') },
            async move { r2.borrow_mut().push('b') },
        )
        .unwrap();
    assert!(a.seq() < b.seq());
    assert_eq!(lp.n_procs(), 2);
    sim.run_until_idle().unwrap();
    assert_eq!(ran.borrow().len(), 2);
    assert_eq!(lp.budget().used(), used);
    let other = sim.new_loop().new_class(1).unwrap();
    assert_eq!(
        lp.spawn_pair(Some(&other), async {}, async {}),
        Err(Error::Inval),
        "class of another loop"
    );
    lp.stop();
    assert_eq!(lp.spawn_pair(None, async {}, async {}), Err(Error::Again));
    assert_eq!(lp.n_procs(), 0);
}

#[test]
fn a_killed_process_returns_its_charge() {
    let lp = Loop::new().unwrap();
    let (fut, _p) = rt::future_pair::<()>();
    let pid = lp
        .spawn(async move {
            let _ = fut.await;
        })
        .unwrap();
    assert!(lp.budget().used() > 0);
    lp.kill(pid).unwrap();
    lp.run().unwrap();
    assert_eq!(lp.budget().used(), 0);
}

/// A class's charge lives as long as its loop and returns with it. Before the
/// fix `Loop::new_class` forgot the charge, so its bytes never came back and
/// the budget's shared account leaked (40 bytes per loop with a class, found
/// by valgrind and LeakSanitizer running the C examples' errors.c).
#[test]
fn class_charges_return_to_the_budget_when_the_loop_drops() {
    let lp = Loop::with_budget(1 << 20).unwrap();
    let budget = lp.budget().clone();
    lp.new_class(2).unwrap();
    lp.new_class(3).unwrap();
    assert_eq!(
        budget.used(),
        128,
        "64 bytes per class while the loop lives"
    );
    drop(lp);
    assert_eq!(budget.used(), 0, "nothing leaks once the loop is gone");
}
