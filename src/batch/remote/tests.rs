//! `MtState` against a fake group core (the real group is tested in
//! `tests/batch_mt*.rs`).

use std::collections::BTreeMap;
use std::num::NonZeroU64;
use std::sync::Arc;

use super::*;

fn nz(v: u64) -> NonZeroU64 {
    NonZeroU64::new(v).unwrap()
}

/// A group core with `capacity` slots; records what the glue did.
#[derive(Default)]
struct Fake {
    capacity: usize,
    live: BTreeMap<NonZeroU64, (u32, bool)>, // request, cancelled
    admitted: Vec<NonZeroU64>,
    resumed: Vec<NonZeroU64>,
}

impl Members<u32> for Fake {
    fn has_free_slot(&self) -> bool {
        self.live.len() < self.capacity
    }
    fn admit(&mut self, handle: NonZeroU64, request: u32, _charge: u64) {
        assert!(self.has_free_slot());
        self.live.insert(handle, (request, false));
        self.admitted.push(handle);
    }
    fn cancel(&mut self, handle: NonZeroU64) -> bool {
        self.live.get_mut(&handle).map(|m| m.1 = true).is_some()
    }
    fn resume(&mut self, handle: NonZeroU64) -> bool {
        self.resumed.push(handle);
        self.live.contains_key(&handle)
    }
}

fn setup(cap: usize, capacity: usize) -> (MtState<u32>, Arc<Admission<u32>>, Fake) {
    let mt = MtState::new(cap, Arc::new(HandleSpace::default())).unwrap();
    let shared = mt.shared().clone();
    let fake = Fake {
        capacity,
        ..Fake::default()
    };
    (mt, shared, fake)
}

#[test]
fn boundary_admits_in_arrival_order_and_holds_the_rest() {
    let (mut mt, shared, mut m) = setup(4, 2);
    let hs: Vec<_> = (0..3).map(|i| shared.submit(i, 1).unwrap()).collect();
    assert!(
        !mt.any_held() && m.admitted.is_empty(),
        "admission waits for a boundary"
    );
    assert_eq!(mt.boundary(&mut m), DrainEnd::Empty);
    assert_eq!(m.admitted, hs[..2]);
    assert!(mt.any_held());
    assert_eq!((mt.held_len(), mt.mt_queued()), (1, 3));
    // The held hand-in keeps its record; admitted ones gave theirs back.
    assert_eq!(shared.free_submit_records(), 3);
    m.live.remove(&hs[0]);
    mt.boundary(&mut m);
    assert_eq!(m.admitted, hs);
    assert!(!mt.any_held());
    assert_eq!(shared.free_submit_records(), 4);
}

#[test]
fn a_held_hand_in_takes_the_next_slot_before_later_ones() {
    let (mut mt, shared, mut m) = setup(4, 1);
    let a = shared.submit(1, 1).unwrap();
    let b = shared.submit(2, 1).unwrap();
    mt.boundary(&mut m);
    let c = shared.submit(3, 1).unwrap();
    m.live.clear();
    mt.boundary(&mut m);
    assert_eq!(m.admitted, vec![a, b]);
    m.live.clear();
    mt.boundary(&mut m);
    assert_eq!(m.admitted, vec![a, b, c]);
}

#[test]
fn cancel_mt_applies_wherever_the_request_is() {
    let (mut mt, shared, mut m) = setup(4, 1);
    let live = shared.submit(1, 1).unwrap();
    let held = shared.submit(2, 1).unwrap();
    mt.boundary(&mut m);
    shared.control(ControlOp::Cancel, live).unwrap();
    shared.control(ControlOp::Cancel, held).unwrap();
    shared.control(ControlOp::Resume, held).unwrap();
    mt.boundary(&mut m);
    assert!(m.live[&live].1, "the live member's cancel was recorded");
    assert_eq!(
        m.resumed,
        Vec::<NonZeroU64>::new(),
        "a held hand-in is not resumable"
    );
    assert_eq!(mt.take_aborted(), Some((held, 2)));
    assert_eq!(mt.take_aborted(), None);
    assert!(!mt.any_held());
    assert_eq!(m.admitted, vec![live], "the cancelled hand-in never ran");
    assert_eq!(shared.free_submit_records(), 4);
}

#[test]
fn a_cancel_on_the_ring_with_its_submit_ends_the_hand_in_unadmitted() {
    let (mut mt, shared, mut m) = setup(4, 4);
    let h = shared.submit(7, 1).unwrap();
    shared.control(ControlOp::Cancel, h).unwrap();
    mt.boundary(&mut m);
    assert!(m.admitted.is_empty());
    assert_eq!(mt.take_aborted(), Some((h, 7)));
}

#[test]
fn stale_controls_for_completed_handles_are_discarded_at_no_cost() {
    let (mut mt, shared, mut m) = setup(2, 2);
    let h = shared.submit(1, 1).unwrap();
    mt.boundary(&mut m);
    m.live.clear(); // completed
    for _ in 0..100 {
        shared.control(ControlOp::Cancel, h).unwrap();
        shared.control(ControlOp::Resume, h).unwrap();
        mt.boundary(&mut m);
    }
    assert_eq!(shared.free_control_records(), 2, "nothing retained");
    let later = shared.submit(2, 1).unwrap();
    mt.boundary(&mut m);
    assert!(
        !m.live[&later].1,
        "a stale cancel never touches a later request"
    );
    assert_ne!(later, h);
}

#[test]
fn owner_cancel_of_an_unadmitted_mt_handle() {
    let (mut mt, shared, mut m) = setup(4, 1);
    assert_eq!(
        mt.owner_cancel(nz(1), &mut m),
        Err(Error::Inval),
        "never issued"
    );
    let a = shared.submit(1, 1).unwrap();
    let b = shared.submit(2, 1).unwrap();
    // `b` is still on the ring: the owner's cancel finds it.
    assert_eq!(mt.owner_cancel(b, &mut m), Ok(()));
    mt.boundary(&mut m);
    assert_eq!(m.admitted, vec![a]);
    assert_eq!(mt.take_aborted(), Some((b, 2)));
    assert_eq!(mt.owner_cancel(b, &mut m), Err(Error::Inval), "completed");
    // An earlier hand-in still being written: retry.
    let paused = shared.submit_paused(3, 1);
    let c = shared.submit(4, 1).unwrap();
    assert_eq!(mt.owner_cancel(c, &mut m), Err(Error::Again));
    paused.commit();
    assert_eq!(mt.owner_cancel(c, &mut m), Ok(()));
}

#[test]
fn close_drain_admits_racing_hand_ins_and_gates_finish() {
    let (mut mt, shared, mut m) = setup(4, 4);
    let h = shared.submit(1, 1).unwrap();
    assert!(!mt.may_finish(), "not closed");
    mt.close(false);
    assert_eq!(shared.submit(2, 1).unwrap_err(), (Error::Again, 2));
    assert!(
        !mt.may_finish(),
        "a hand-in that raced close is still on the ring"
    );
    mt.boundary(&mut m);
    assert_eq!(m.admitted, vec![h], "DRAIN runs it");
    assert!(mt.may_finish());
    shared.control(ControlOp::Cancel, h).unwrap();
    mt.boundary(&mut m);
    assert!(m.live[&h].1, "a cancel during the drain still matters");
    mt.finish();
    assert_eq!(shared.control(ControlOp::Cancel, h), Err(Error::Inval));
}

#[test]
fn close_cancel_aborts_held_and_racing_hand_ins() {
    let (mut mt, shared, mut m) = setup(4, 1);
    let a = shared.submit(1, 1).unwrap();
    let b = shared.submit(2, 1).unwrap();
    mt.boundary(&mut m);
    let c = shared.submit(3, 1).unwrap();
    mt.close(true);
    mt.boundary(&mut m);
    assert_eq!(m.admitted, vec![a]);
    assert_eq!(mt.take_aborted(), Some((b, 2)));
    assert_eq!(mt.take_aborted(), Some((c, 3)));
    assert!(mt.may_finish());
}

#[test]
fn sizes_are_checked_and_cover_the_held_queue() {
    assert!(MtState::<u64>::bytes_for(8).unwrap() > Admission::<u64>::bytes_for(8).unwrap());
    assert_eq!(
        MtState::<u64>::bytes_for(usize::MAX).unwrap_err(),
        Error::Range
    );
    assert_eq!(
        MtState::<u64>::new(0, Arc::new(HandleSpace::default())).unwrap_err(),
        Error::Inval
    );
}
