//! Shared helpers of the `batch_*` integration tests.
#![allow(dead_code)]

mod opts;

use std::cell::RefCell;
use std::rc::Rc;

use xtc::Error;
use xtc::batch::{Handle, Item, StepResult};

#[allow(unused_imports)] // each test binary uses a subset
pub use opts::{async_opts, sync_opts};

/// A request: an id and how many more iterations it needs before DONE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Req {
    pub id: u32,
    pub left: u32,
}

pub fn req(id: u32, left: u32) -> Req {
    Req { id, left }
}

/// One delivered completion.
pub type Done = (Handle, Req, Result<(), Error>);

/// Completions in delivery order.
#[derive(Clone, Default)]
pub struct Log(pub Rc<RefCell<Vec<Done>>>);

impl Log {
    pub fn complete(&self) -> impl FnMut(Handle, Req, Result<(), Error>) + 'static {
        let l = self.0.clone();
        move |h, r, o| l.borrow_mut().push((h, r, o))
    }
    pub fn len(&self) -> usize {
        self.0.borrow().len()
    }
    pub fn outcome(&self, h: Handle) -> Vec<Result<(), Error>> {
        self.0
            .borrow()
            .iter()
            .filter(|d| d.0 == h)
            .map(|d| d.2)
            .collect()
    }
    pub fn outcomes(&self) -> Vec<(u32, Result<(), Error>)> {
        self.0.borrow().iter().map(|d| (d.1.id, d.2)).collect()
    }
}

/// Counts down each member's `left`; DONE at zero, CONTINUE otherwise.
pub fn countdown(items: &mut [Item<'_, Req>], results: &mut [StepResult]) {
    for (it, r) in items.iter_mut().zip(results.iter_mut()) {
        it.request.left = it.request.left.saturating_sub(1);
        *r = if it.request.left == 0 {
            StepResult::Done
        } else {
            StepResult::Continue
        };
    }
}

/// A countdown step as a [`xtc::batch::Step`].
pub fn countdown_step() -> impl xtc::batch::Step<Req> + 'static {
    xtc::batch::step_fn(|items: &mut [Item<'_, Req>], results: &mut [StepResult]| {
        countdown(items, results);
        Ok(())
    })
}

/// Runs a Sim to idle and panics with the stall report (it names the seed).
pub fn run_idle(sim: &xtc::rt::Sim) {
    if let Err(stall) = sim.run_until_idle() {
        panic!("sim stalled: {stall}");
    }
}

/// A completion that yields, so peers run while it is in flight.
pub struct SlowComplete {
    pub log: Log,
    pub yields: u32,
}

impl xtc::batch::Complete<Req> for SlowComplete {
    async fn complete(&mut self, h: Handle, r: Req, o: xtc::Result<()>) {
        self.log.0.borrow_mut().push((h, r, o)); // logs the invocation
        for _ in 0..self.yields {
            xtc::rt::yield_now().await;
        }
    }
}
