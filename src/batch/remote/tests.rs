//! `MtState` against the group's real core, without a loop (the full path
//! with loops and threads is in `tests/batch_mt*.rs`).

use std::num::NonZeroU64;
use std::sync::Arc;

use super::*;

fn core(capacity: usize, mt_queue_cap: usize) -> Core<u32> {
    Core::new(Limits {
        capacity,
        max_active: capacity,
        resource_capacity: 10,
        mt_queue_cap,
    })
    .unwrap()
}

fn setup(cap: usize, capacity: usize) -> (MtState<u32>, Remote<u32>, Core<u32>) {
    let mt = MtState::new(cap, Arc::new(HandleSpace::default()), 10).unwrap();
    let remote = mt.remote();
    (mt, remote, core(capacity, cap))
}

/// One driver boundary as the driver runs it: drain, cancels, admit, settle;
/// returns the outcomes delivered.
fn boundary(mt: &mut MtState<u32>, c: &mut Core<u32>) -> Vec<(u64, u32, Result<()>)> {
    mt.drain(c);
    c.consume_cancels();
    let mut out = Vec::new();
    while let Some((h, r, o)) = c.pop_delivery() {
        out.push((h.get(), r, o));
        c.retire_delivery();
    }
    c.admit();
    mt.settle(c);
    out
}

/// Runs every READY member to DONE (one iteration) and delivers.
fn run_all(mt: &mut MtState<u32>, c: &mut Core<u32>) -> Vec<(u64, u32, Result<()>)> {
    let ready: Vec<_> = std::mem::take(&mut c.ready);
    for m in ready {
        c.apply(m, crate::batch::StepResult::Done);
    }
    boundary(mt, c)
}

fn free(r: &Remote<u32>) -> usize {
    r.shared.free_submit_records()
}

#[test]
fn hand_ins_are_admitted_at_the_boundary_in_ring_order() {
    let (mut mt, remote, mut c) = setup(4, 2);
    let hs: Vec<_> = (0..3).map(|i| remote.submit(i, 1).unwrap()).collect();
    assert_eq!(c.snapshot().queued, 0, "nothing before a boundary (B-117)");
    boundary(&mut mt, &mut c);
    let s = c.snapshot();
    assert_eq!((s.ready, s.queued), (2, 1), "third one held (B-118)");
    assert_eq!(
        free(&remote),
        3,
        "the held hand-in keeps its record (B-111)"
    );
    assert_eq!(
        c.check_submit(1),
        Err(Error::Again),
        "owner submit waits (FCFS)"
    );
    let done = run_all(&mut mt, &mut c);
    assert_eq!(
        done.iter().map(|d| d.0).collect::<Vec<_>>(),
        vec![hs[0].get(), hs[1].get()]
    );
    assert_eq!(c.snapshot().ready, 1);
    assert_eq!(free(&remote), 4);
    assert_eq!(mt.mt_queued(), 3);
}

#[test]
fn charge_is_checked_before_anything_is_claimed() {
    let (_mt, remote, _c) = setup(2, 2);
    for bad in [0, 11] {
        let e = remote.submit(5, bad).unwrap_err();
        assert_eq!((e.error, e.into_inner()), (Error::Range, 5));
    }
    assert_eq!(free(&remote), 2);
    assert_eq!(remote.shared.rejections(), 2, "refused mt calls (B-177)");
}

#[test]
fn cancel_mt_applies_wherever_the_request_is() {
    let (mut mt, remote, mut c) = setup(4, 1);
    let live = remote.submit(1, 1).unwrap();
    let held = remote.submit(2, 1).unwrap();
    boundary(&mut mt, &mut c);
    remote.cancel(live).unwrap();
    remote.resume(held).unwrap(); // held: not resumable, dropped
    remote.cancel(held).unwrap();
    let out = boundary(&mut mt, &mut c);
    let mut got: Vec<_> = out.iter().map(|d| (d.1, d.2)).collect();
    got.sort_by_key(|d| d.0);
    assert_eq!(
        got,
        vec![(1, Err(Error::Aborted)), (2, Err(Error::Aborted))]
    );
    assert_eq!(free(&remote), 4);
}

#[test]
fn a_cancel_behind_its_submit_on_the_ring_means_it_never_runs() {
    let (mut mt, remote, mut c) = setup(4, 4);
    let h = remote.submit(7, 1).unwrap();
    remote.cancel(h).unwrap();
    let out = boundary(&mut mt, &mut c);
    assert_eq!(out, vec![(h.get(), 7, Err(Error::Aborted))]);
    assert_eq!(c.snapshot().ready, 0);
}

#[test]
fn stale_controls_cost_nothing_and_never_touch_later_requests() {
    let (mut mt, remote, mut c) = setup(2, 2);
    let h = remote.submit(1, 1).unwrap();
    boundary(&mut mt, &mut c);
    assert_eq!(run_all(&mut mt, &mut c).len(), 1);
    for _ in 0..100 {
        remote.cancel(h).unwrap();
        remote.resume(h).unwrap();
        boundary(&mut mt, &mut c);
    }
    assert_eq!(remote.shared.free_control_records(), 2, "nothing retained");
    let later = remote.submit(2, 1).unwrap();
    assert_ne!(later, h, "handles are never reused");
    boundary(&mut mt, &mut c);
    assert_eq!(run_all(&mut mt, &mut c), vec![(later.get(), 2, Ok(()))]);
}

#[test]
fn owner_cancel_finds_unadmitted_hand_ins_or_says_again() {
    let (mut mt, remote, mut c) = setup(4, 4);
    let nz = |h: Handle| NonZeroU64::new(h.get()).unwrap();
    assert_eq!(
        mt.owner_cancel(NonZeroU64::new(99).unwrap()),
        Err(Error::Inval),
        "never issued"
    );
    let a = remote.submit(1, 1).unwrap();
    assert_eq!(mt.owner_cancel(nz(a)), Ok(()), "still on the ring");
    assert_eq!(
        boundary(&mut mt, &mut c),
        vec![(a.get(), 1, Err(Error::Aborted))]
    );
    assert_eq!(mt.owner_cancel(nz(a)), Err(Error::Inval), "completed");
    let paused = remote.shared.submit_paused(2, 1);
    let b = remote.submit(3, 1).unwrap();
    assert_eq!(
        mt.owner_cancel(nz(b)),
        Err(Error::Again),
        "earlier one being written"
    );
    paused.commit();
    assert_eq!(mt.owner_cancel(nz(b)), Ok(()));
    let out = boundary(&mut mt, &mut c);
    assert_eq!(out, vec![(b.get(), 3, Err(Error::Aborted))]);
    assert_eq!(c.snapshot().ready, 1, "the paused hand-in runs");
}

#[test]
fn close_drain_runs_racing_hand_ins_and_gates_the_finish() {
    let (mut mt, remote, mut c) = setup(4, 4);
    let h = remote.submit(1, 1).unwrap();
    c.close(CloseMode::Drain);
    mt.close();
    assert_eq!(remote.submit(2, 1).unwrap_err().error, Error::Again);
    assert!(
        !mt.may_finish(),
        "a hand-in that raced close is on the ring"
    );
    boundary(&mut mt, &mut c);
    assert!(mt.may_finish());
    remote.cancel(h).unwrap(); // still accepted while the driver runs
    let out = boundary(&mut mt, &mut c);
    assert_eq!(
        out,
        vec![(h.get(), 1, Err(Error::Aborted))],
        "a cancel during drain matters"
    );
    mt.finish();
    assert_eq!(remote.cancel(h), Err(Error::Inval));
    assert_eq!(remote.resume(h), Err(Error::Inval));
    assert_eq!(mt.mt_rejections(), 1);
}

#[test]
fn close_cancel_aborts_held_and_racing_hand_ins() {
    let (mut mt, remote, mut c) = setup(4, 1);
    let a = remote.submit(1, 1).unwrap();
    let b = remote.submit(2, 1).unwrap();
    boundary(&mut mt, &mut c);
    let late = remote.submit(3, 1).unwrap();
    c.close(CloseMode::Cancel);
    mt.close();
    let mut out: Vec<_> = boundary(&mut mt, &mut c).into_iter().map(|d| d.0).collect();
    out.sort_unstable();
    assert_eq!(out, vec![a.get(), b.get(), late.get()]);
    assert!(c.finished() && mt.may_finish());
    assert_eq!(free(&remote), 4);
}

/// B-050 / B-053: a stale handle (completed) is `Inval` for the owner even
/// while a LATER hand-in is still being written; `Again` is only for a live
/// hand-in on the ring behind the one being written.
#[test]
fn owner_cancel_of_a_completed_handle_is_inval_while_a_later_hand_in_is_written() {
    let (mut mt, remote, mut c) = setup(4, 4);
    let nz = |h: Handle| NonZeroU64::new(h.get()).unwrap();
    let a = remote.submit(1, 1).unwrap();
    boundary(&mut mt, &mut c);
    assert_eq!(run_all(&mut mt, &mut c), vec![(a.get(), 1, Ok(()))]);
    let paused = remote.shared.submit_paused(2, 1);
    assert_eq!(
        mt.owner_cancel(nz(a)),
        Err(Error::Inval),
        "completed: stale, whatever is being written after it"
    );
    let b = remote.submit(3, 1).unwrap(); // on the ring behind the paused one
    assert_eq!(mt.owner_cancel(nz(b)), Err(Error::Again));
    paused.commit();
    assert_eq!(mt.owner_cancel(nz(b)), Ok(()));
    assert_eq!(mt.owner_cancel(nz(a)), Err(Error::Inval));
    let out = boundary(&mut mt, &mut c);
    assert_eq!(out, vec![(b.get(), 3, Err(Error::Aborted))]);
}

// ---- The owner-cancel paths on a running group (a Sim loop): they must never
// touch the doorbell the parked driver armed.

mod on_a_loop {
    use std::cell::RefCell;
    use std::rc::Rc;

    use crate::batch::{AsyncOpts, AsyncStep, Exec, ExecStatus, Group, Item, StepResult};
    use crate::rt::{Loop, Sim};
    use crate::{Error, Result};

    struct Inline;

    impl AsyncStep<u32> for Inline {
        async fn submit(&mut self, _: &mut [Item<'_, u32>]) -> Result<Exec> {
            Ok(Exec::Inline)
        }
        async fn collect(
            &mut self,
            _: &mut [Item<'_, u32>],
            results: &mut [StepResult],
            _: ExecStatus,
        ) -> Result<()> {
            results.fill(StepResult::Done);
            Ok(())
        }
    }

    type Done = Rc<RefCell<Vec<(u32, Result<()>)>>>;

    fn group(lp: &Loop) -> (Group<u32>, Done) {
        let done = Done::default();
        let d2 = done.clone();
        let o = AsyncOpts {
            capacity: 4,
            max_active: 4,
            resource_capacity: 4,
            mt_queue_cap: 4,
            ..Default::default()
        };
        let g = Group::create_async(lp, o, Inline, move |_h, r: u32, o: Result<()>| {
            d2.borrow_mut().push((r, o));
        })
        .unwrap();
        (g, done)
    }

    fn settle(sim: &Sim) {
        for _ in 0..100_000 {
            if !sim.step() {
                return;
            }
        }
        panic!("simulator never quiesced");
    }

    fn on_owner<T: 'static>(sim: &Sim, lp: &Loop, f: impl FnOnce() -> T + 'static) -> T {
        let out = Rc::new(RefCell::new(None));
        let o = out.clone();
        lp.spawn(async move { *o.borrow_mut() = Some(f()) })
            .unwrap();
        settle(sim);
        out.take().expect("owner process ran")
    }

    /// Issue 12 item 2, the `Again` path (B-053): the owner cancel of a
    /// hand-in behind one still being written answers `Again`; the write
    /// then finishing must still wake the parked driver. The cancel used to
    /// drain the ring itself, disarming the doorbell without waking anyone,
    /// so both hand-ins stayed on the ring for good.
    #[test]
    fn an_owner_cancel_answered_again_never_loses_the_drivers_wake() {
        let sim = Sim::new(53);
        let lp = sim.new_loop();
        let (g, done) = group(&lp);
        let remote = g.remote().unwrap();
        settle(&sim); // the driver parks, doorbell armed
        let paused = remote.shared.submit_paused(1, 1);
        let b = remote.submit(2, 1).unwrap(); // written behind the paused one
        settle(&sim); // the driver finds the head still being written: parks
        let g2 = g.clone();
        assert_eq!(on_owner(&sim, &lp, move || g2.cancel(b)), Err(Error::Again));
        paused.commit(); // no owner action from here on
        settle(&sim);
        assert_eq!(done.borrow().as_slice(), &[(1, Ok(())), (2, Ok(()))]);
        let g2 = g.clone();
        on_owner(&sim, &lp, move || g2.close(crate::batch::CloseMode::Drain)).unwrap();
        sim.run_until_idle().unwrap();
        g.destroy().unwrap();
    }
}

/// B-111, B-117, B-143: a submit popped by an operation wait is set aside:
/// no slot, not `mt_queued`, its SUBMIT record still claimed across a
/// settle, and the driver may not finish; the next boundary hands it in.
#[test]
fn submits_set_aside_by_a_wait_wait_for_the_boundary() {
    let (mut mt, remote, mut c) = setup(2, 2);
    let h = remote.submit(1, 1).unwrap();
    assert_eq!(mt.drain_deferring(&mut c), DrainEnd::Empty);
    assert_eq!(c.snapshot().queued, 0, "no waiting slot before a boundary");
    assert_eq!(
        c.check_submit(1),
        Ok(()),
        "an owner submit sees a free slot"
    );
    mt.settle(&c);
    assert_eq!(free(&remote), 1, "the record stays claimed (B-111)");
    assert_eq!(mt.mt_queued(), 0);
    mt.close();
    assert!(!mt.may_finish(), "not handed in yet (B-143)");
    assert!(boundary(&mut mt, &mut c).is_empty());
    assert_eq!(c.snapshot().ready, 1);
    assert_eq!((mt.mt_queued(), free(&remote)), (1, 2));
    assert!(mt.may_finish());
    assert_eq!(run_all(&mut mt, &mut c), vec![(h.get(), 1, Ok(()))]);
}
