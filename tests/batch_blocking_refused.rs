//! A BLOCKING operation the pool refuses (xtc_blocking_run fails without
//! running it) reaches collect as that negative status (B-079), and counts
//! in `offload_errors`. Alone in its binary: it fills the process-wide pool.

use std::cell::RefCell;
use std::rc::Rc;

use xtc::Error;
use xtc::batch::{
    AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Handle, Item, StepResult,
};
use xtc::rt::{self, Loop};

struct Refused {
    statuses: Rc<RefCell<Vec<ExecStatus>>>,
    ran: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl AsyncStep<u32> for Refused {
    async fn submit(&mut self, _: &mut [Item<'_, u32>]) -> xtc::Result<Exec> {
        let ran = self.ran.clone();
        Ok(Exec::Blocking(Box::new(move || {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })))
    }

    async fn collect(
        &mut self,
        _: &mut [Item<'_, u32>],
        r: &mut [StepResult],
        s: ExecStatus,
    ) -> xtc::Result<()> {
        self.statuses.borrow_mut().push(s);
        r.fill(StepResult::Done);
        Ok(())
    }
}

#[test]
fn a_refused_blocking_closure_is_a_negative_status() {
    // Fill the default pool: every worker parked and the queue full.
    let (release, gate) = crossbeam_channel::unbounded::<()>();
    let mut held = Vec::new();
    loop {
        let gate = gate.clone();
        match rt::blocking_run(move || gate.recv().is_err()) {
            Ok(f) => held.push(f),
            Err(e) => {
                assert_eq!(e, Error::Again);
                break;
            }
        }
    }
    let lp = Loop::new().unwrap();
    let statuses = Rc::new(RefCell::new(Vec::new()));
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let app = Refused {
        statuses: statuses.clone(),
        ran: ran.clone(),
    };
    let outcomes = Rc::new(RefCell::new(Vec::new()));
    let o2 = outcomes.clone();
    let complete = move |_: Handle, _: u32, o: xtc::Result<()>| o2.borrow_mut().push(o);
    let opts = AsyncOpts {
        capacity: 2,
        max_active: 2,
        resource_capacity: 2,
        ..AsyncOpts::default()
    };
    let g = Group::create_async(&lp, opts, app, complete).unwrap();
    g.submit(1, 1).unwrap();
    g.close(CloseMode::Drain).unwrap();
    lp.run().unwrap();
    assert_eq!(*statuses.borrow(), vec![ExecStatus::Failed(Error::Again)]);
    assert_eq!(*outcomes.borrow(), vec![Err(Error::Again)]);
    assert_eq!(g.async_stats().offload_errors, 1);
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "the refused closure never ran"
    );
    drop(release);
    drop(gate);
    drop(held);
    g.destroy().unwrap();
}
