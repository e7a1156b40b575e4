//! Loom models of the ring and the record pools.
//!
//! Run with a separate target directory (every crate is rebuilt with the cfg):
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom -C debug-assertions" \
//!     CARGO_TARGET_DIR=target/loom \
//!     cargo test --release -p xtc --lib batch::ring
//! ```
//!
//! Capacities are tiny (2 slots) so the models reach wrap-around. Loom's
//! `UnsafeCell` reports any concurrent access to a slot's value, so "nothing
//! overwritten or read twice" is checked on every explored interleaving as
//! well as by the assertions on the values.

// Models assume debug assertions (the pool's double-release check, the slot
// index check), as tokio's loom tests do.
#[cfg(not(debug_assertions))]
compile_error!("loom models need debug assertions: build with a profile that keeps them");

use std::num::NonZeroU64;

use loom::sync::Arc;
use loom::thread;

use super::admission::{Admission, ControlOp, HandIn, HandleSpace};
use super::{Class, Pop, Refusal, Ring};

/// Pops until `n` values arrived, yielding to the model while empty or busy.
fn pop_n<T>(ring: &Ring<T>, key: &mut super::ConsumerKey, n: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match ring.pop(key) {
            Pop::Item(v) => out.push(v),
            Pop::Empty | Pop::Busy => thread::yield_now(),
        }
    }
    out
}

/// Reservation order: two producers, one pushing two values in sequence;
/// every value arrives exactly once and one producer's values keep their
/// order.
#[test]
fn reservation_order() {
    loom::model(|| {
        let (ring, mut key) = Ring::with_capacity(4).unwrap();
        let ring = Arc::new(ring);
        let r2 = ring.clone();
        let t = thread::spawn(move || {
            r2.push(1u32, Class::Submit).unwrap();
            r2.push(2u32, Class::Control).unwrap();
        });
        ring.push(10u32, Class::Submit).unwrap();
        let got = pop_n(&ring, &mut key, 3);
        t.join().unwrap();
        let p1: Vec<_> = got.iter().filter(|v| **v < 10).copied().collect();
        assert_eq!(p1, vec![1, 2]);
        assert!(got.contains(&10));
        assert_eq!(ring.pop(&mut key), Pop::Empty);
    });
}

/// A producer paused between reserving and writing: the consumer sees `Busy`
/// (never `Empty`, never a later value) at that position until it commits,
/// even when a later producer has already written its own slot.
#[test]
fn paused_producer_blocks_later_positions() {
    loom::model(|| {
        let (ring, mut key) = Ring::with_capacity(2).unwrap();
        let ring = Arc::new(ring);
        let r = ring.reserve(Class::Submit).unwrap();
        let r2 = ring.clone();
        let later = thread::spawn(move || r2.push(2u32, Class::Submit).unwrap());
        // Whatever the later producer did, position 0 is reserved: Busy.
        assert_eq!(ring.pop(&mut key), Pop::Busy);
        let writer = {
            let r3 = ring.clone();
            thread::spawn(move || r3.commit(r, 1u32))
        };
        assert_eq!(pop_n(&ring, &mut key, 2), vec![1, 2]);
        assert_eq!(writer.join().unwrap(), 0);
        assert_eq!(later.join().unwrap(), 1);
    });
}

/// Wrap-around with a paused producer on a 2-slot ring: positions 0 and 1 are
/// consumed, so position 2 reuses slot 0 while a producer of position 3 may be
/// paused between reserving and writing. No value is overwritten, lost or
/// read twice, and a push that finds the ring full gets its value back.
#[test]
fn wrap_around_with_paused_producer() {
    loom::model(|| {
        let (ring, mut key) = Ring::with_capacity(2).unwrap();
        let ring = Arc::new(ring);
        ring.push(0u32, Class::Submit).unwrap();
        ring.push(1u32, Class::Submit).unwrap();
        let r2 = ring.clone();
        let producer = thread::spawn(move || {
            let mut pushed = Vec::new();
            for v in [2u32, 3] {
                let mut v = v;
                loop {
                    match r2.push(v, Class::Submit) {
                        Ok(pos) => {
                            pushed.push(pos);
                            break;
                        }
                        Err(e) => {
                            assert_eq!(e.refusal, Refusal::Full);
                            v = e.value;
                            thread::yield_now();
                        }
                    }
                }
            }
            pushed
        });
        assert_eq!(pop_n(&ring, &mut key, 4), vec![0, 1, 2, 3]);
        assert_eq!(producer.join().unwrap(), vec![2, 3]);
        assert_eq!(ring.pop(&mut key), Pop::Empty);
    });
}

/// Wrap-around with an explicitly paused producer: on a lapped 2-slot ring,
/// producer A reserves a position, yields, then writes; producer B pushes
/// concurrently. The consumer gets both values in reservation order, never
/// B's value in A's position, and never a value twice.
#[test]
fn lapped_ring_paused_between_reserve_and_write() {
    loom::model(|| {
        let (ring, mut key) = Ring::with_capacity(2).unwrap();
        let ring = Arc::new(ring);
        for v in [0u32, 1] {
            ring.push(v, Class::Submit).unwrap();
        }
        assert_eq!(pop_n(&ring, &mut key, 2), vec![0, 1]);
        let ra = ring.clone();
        let a = thread::spawn(move || {
            let r = ra.reserve(Class::Submit).unwrap();
            thread::yield_now(); // paused between reserving and writing
            ra.commit(r, 20)
        });
        let rb = ring.clone();
        let b = thread::spawn(move || rb.push(30u32, Class::Control).unwrap());
        let got = pop_n(&ring, &mut key, 2);
        let (pa, pb) = (a.join().unwrap(), b.join().unwrap());
        assert_eq!(
            {
                let mut p = [pa, pb];
                p.sort_unstable();
                p
            },
            [2, 3]
        );
        let expected = if pa < pb { vec![20, 30] } else { vec![30, 20] };
        assert_eq!(got, expected);
        assert_eq!(ring.pop(&mut key), Pop::Empty);
    });
}

/// Two producers racing for the last free slot of a lapped ring: exactly one
/// wins it, the loser sees `Full` and gets its value back.
#[test]
fn race_for_the_last_slot() {
    loom::model(|| {
        let (ring, mut key) = Ring::with_capacity(2).unwrap();
        let ring = Arc::new(ring);
        ring.push(0u32, Class::Submit).unwrap();
        ring.push(1u32, Class::Submit).unwrap();
        assert_eq!(ring.pop(&mut key), Pop::Item(0));
        let handles: Vec<_> = [7u32, 8]
            .into_iter()
            .map(|v| {
                let r = ring.clone();
                thread::spawn(move || r.push(v, Class::Submit).map_err(|e| (e.refusal, e.value)))
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let winners = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(winners, 1);
        for r in &results {
            if let Err((refusal, v)) = r {
                assert_eq!(*refusal, Refusal::Full);
                assert!(*v == 7 || *v == 8);
            }
        }
        let got = pop_n(&ring, &mut key, 2);
        assert_eq!(got[0], 1);
        assert!(got[1] == 7 || got[1] == 8);
    });
}

/// Close racing a submit: the submit either is refused (and issued no
/// position) or reserved below the close position and is drained.
#[test]
fn close_races_submit() {
    loom::model(|| {
        let (ring, mut key) = Ring::with_capacity(2).unwrap();
        let ring = Arc::new(ring);
        let r2 = ring.clone();
        let t = thread::spawn(move || r2.push(5u32, Class::Submit).map_err(|e| e.refusal));
        let close_pos = ring.close();
        let got = pop_n(&ring, &mut key, close_pos as usize);
        match t.join().unwrap() {
            Ok(pos) => {
                assert_eq!((pos, close_pos), (0, 1));
                assert_eq!(got, vec![5]);
            }
            Err(refusal) => {
                assert_eq!((refusal, close_pos), (Refusal::Closed, 0));
                assert!(got.is_empty());
            }
        }
        assert_eq!(ring.pop(&mut key), Pop::Empty);
    });
}

/// The pools through the admission front end on a 1-record admission: a
/// submit and a cancel race, the consumer drains and releases; a control is
/// always drained after the submit whose handle it names, and every record
/// comes back.
#[test]
fn admission_submit_then_cancel_with_pools() {
    loom::model(|| {
        let (shared, mut inbox) =
            Admission::<u32>::new(1, std::sync::Arc::new(HandleSpace::default())).unwrap();
        let s2 = shared.clone();
        let producer = thread::spawn(move || {
            let h = s2.submit(9, 1).unwrap();
            s2.control(ControlOp::Cancel, h).unwrap();
            h
        });
        let mut order = Vec::new();
        while order.len() < 2 {
            match inbox.pop() {
                Pop::Item(HandIn::Submit { handle, .. }) => {
                    order.push(("submit", handle));
                    inbox.release_submit();
                }
                Pop::Item(HandIn::Control { handle, .. }) => order.push(("cancel", handle)),
                Pop::Empty | Pop::Busy => thread::yield_now(),
            }
        }
        let h = producer.join().unwrap();
        assert_eq!(order, vec![("submit", h), ("cancel", h)]);
        assert_eq!(h, NonZeroU64::MIN);
        assert_eq!(shared.free_submit_records(), 1);
        assert_eq!(shared.free_control_records(), 1);
    });
}
