//! Helpers of the cross-loop admission tests (`batch_adversarial_mt*.rs`):
//! mt-enabled groups, simulator settling, owner-loop calls from the test.

use std::cell::Cell;
use std::rc::Rc;

use xtc::Error;
use xtc::batch::{AsyncOpts, Group, Handle, Remote, StepResult};
use xtc::rt::{Loop, Sim};

use super::{C, Ctl, Kind, Rq, async_group, async_opts, rq};

/// An mt-enabled async group's options.
pub fn mt_opts(capacity: usize, max_active: usize, mt_queue_cap: usize) -> AsyncOpts {
    AsyncOpts {
        mt_queue_cap,
        ..async_opts(capacity, max_active, None)
    }
}

/// An mt-enabled async group with `kind` operations and its remote.
pub fn mt_group(lp: &Loop, o: AsyncOpts, kind: Kind) -> (Group<Rq>, C, Remote<Rq>) {
    let (g, c) = async_group(lp, o, kind);
    let r = g.remote().unwrap();
    (g, c, r)
}

/// Steps the simulator until nothing is runnable (processes may remain
/// parked: the driver waits for work).
pub fn settle(sim: &Sim) {
    for _ in 0..1_000_000 {
        if !sim.step() {
            return;
        }
    }
    panic!("simulator never quiesced");
}

/// Runs `f` as a process of `lp` (an owner-loop mutator call) and returns its
/// value once the simulator quiesced.
pub fn on_owner<T: 'static>(sim: &Sim, lp: &Loop, f: impl FnOnce() -> T + 'static) -> T {
    let out = Rc::new(Cell::new(None));
    let o = out.clone();
    lp.spawn(async move { o.set(Some(f())) }).unwrap();
    settle(sim);
    out.take().expect("owner process ran")
}

pub fn submit_mt(r: &Remote<Rq>, id: u32, left: u32) -> Result<Handle, Error> {
    r.submit(rq(id, left), 1).map_err(|e| e.error)
}

pub fn ids(c: &Ctl) -> Vec<u32> {
    c.done.borrow().iter().map(|d| d.1).collect()
}

/// Owner member BLOCKED in the only slot; two hand-ins drained and held.
pub fn one_blocked_two_held(sim: &Sim, c: &Ctl, g: &Group<Rq>, r: &Remote<Rq>) -> [Handle; 3] {
    let a = g.submit(rq(1, 1), 1).unwrap();
    c.script(a, &[StepResult::Blocked]);
    settle(sim);
    assert_eq!(g.stats().blocked, 1);
    let h1 = submit_mt(r, 2, 1).unwrap();
    let h2 = submit_mt(r, 3, 1).unwrap();
    settle(sim);
    [a, h1, h2]
}

/// `rounds` times: every outstanding FUTURE operation succeeds, then the
/// loop settles (the driver collects and starts the next iteration).
pub fn resolve_rounds(sim: &Sim, c: &Ctl, rounds: usize) {
    for _ in 0..rounds {
        c.promises
            .borrow_mut()
            .drain(..)
            .for_each(|p| p.set(Ok(())));
        settle(sim);
    }
}
