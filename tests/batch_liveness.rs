//! Liveness of the driver (B-003, B-040, B-047): it never runs two vectors
//! in one poll, whether members continue (ready path) or finish and are
//! refilled from the waiting queue (refill path), so the loop's other
//! processes always get a turn between vectors.

mod batch_support;

use std::cell::RefCell;
use std::rc::Rc;

use batch_support::*;
use xtc::batch::{CloseMode, Group, Item, StepResult, step_fn};
use xtc::rt::{Sim, TraceKind};

/// Runs `members` requests of `len` iterations through a group of
/// `max_active` with a non-yielding step; returns, per step call, how many
/// times the driver had been polled.
fn polls_per_vector(seed: u64, max_active: usize, members: u32, len: u32) -> Vec<usize> {
    let sim = Rc::new(Sim::new(seed));
    let lp = sim.new_loop();
    let seen = Rc::new(RefCell::new(Vec::new()));
    let driver = Rc::new(RefCell::new(None));
    let (s2, sim2, d2) = (seen.clone(), sim.clone(), driver.clone());
    let step = step_fn(move |items: &mut [Item<'_, Req>], res: &mut [StepResult]| {
        let seq = d2.borrow().expect("driver pid set before the run");
        let polls = sim2
            .trace()
            .iter()
            .filter(|e| e.kind == TraceKind::Poll && e.seq == seq)
            .count();
        s2.borrow_mut().push(polls);
        countdown(items, res);
        Ok(())
    });
    let log = Log::default();
    let cap = members as usize;
    let g = Group::create(&lp, sync_opts(cap, max_active, 64), step, log.complete()).unwrap();
    *driver.borrow_mut() = Some(g.driver_pid().seq());
    for i in 0..members {
        g.submit(req(i, len), 1).unwrap();
    }
    g.close(CloseMode::Drain).unwrap();
    run_idle(&sim);
    assert_eq!(log.len(), members as usize);
    g.destroy().unwrap();
    seen.borrow().clone()
}

fn assert_one_vector_per_poll(v: &[usize]) {
    assert!(
        v.windows(2).all(|w| w[0] < w[1]),
        "two vectors ran in one driver poll: {v:?}"
    );
}

#[test]
fn continuing_members_never_run_two_vectors_in_one_poll() {
    for seed in 0..4 {
        let v = polls_per_vector(seed, 4, 4, 6);
        assert_eq!(v.len(), 6);
        assert_one_vector_per_poll(&v);
    }
}

#[test]
fn refilled_members_never_run_two_vectors_in_one_poll() {
    for seed in 0..4 {
        // max_active 1, one iteration each: every vector empties the active
        // set and the next one is a refill from the waiting queue.
        let v = polls_per_vector(seed, 1, 5, 1);
        assert_eq!(v.len(), 5);
        assert_one_vector_per_poll(&v);
    }
}
