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
    // Saturate the default pool deterministically. First park every worker:
    // each closure reports that it started, then blocks on the gate. Only
    // once all of them run is the queue filled; a queue filled while a worker
    // was still starting would drain by one when that worker took its first
    // job, and the group's closure would then be queued behind the gate
    // forever (the hang this regression test once had on a 2-core runner).
    let (release, gate) = crossbeam_channel::unbounded::<()>();
    let (started_tx, started) = crossbeam_channel::unbounded::<()>();
    let mut held = Vec::new();
    for _ in 0..rt::DEFAULT_BLOCKING_THREADS {
        let gate = gate.clone();
        let started_tx = started_tx.clone();
        held.push(
            rt::blocking_run(move || {
                started_tx.send(()).unwrap();
                gate.recv().is_err()
            })
            .unwrap(),
        );
    }
    for _ in 0..rt::DEFAULT_BLOCKING_THREADS {
        started
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("every pool worker starts its closure");
    }
    // Every worker is parked on the gate: now the queue fills to exactly its
    // capacity and stays full.
    for _ in 0..rt::DEFAULT_BLOCKING_QUEUE {
        let gate = gate.clone();
        held.push(rt::blocking_run(move || gate.recv().is_err()).unwrap());
    }
    assert_eq!(
        rt::blocking_run(|| ()).err(),
        Some(Error::Again),
        "a full default pool refuses"
    );
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
