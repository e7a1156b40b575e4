//! Unit tests and threaded stress of the ring alone (the loom models are in
//! `loom_models.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;

use super::*;

mod admission_tests;

/// Counts drops, to prove values are dropped exactly once.
#[derive(Debug)]
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

fn drain<T>(ring: &Ring<T>, key: &mut ConsumerKey) -> Vec<T> {
    let mut out = Vec::new();
    while let Pop::Item(v) = ring.pop(key) {
        out.push(v);
    }
    out
}

#[test]
fn fifo_and_empty() {
    let (ring, mut key) = Ring::with_capacity(4).unwrap();
    assert_eq!(ring.pop(&mut key), Pop::Empty);
    for i in 0..3 {
        assert_eq!(ring.push(i, Class::Submit).unwrap(), i as u64);
    }
    assert_eq!(drain(&ring, &mut key), vec![0, 1, 2]);
    assert_eq!(ring.pop(&mut key), Pop::Empty);
    assert_eq!(key.head(), 3);
}

#[test]
fn capacity_rounds_up_to_a_power_of_two_at_least_two() {
    assert_eq!(Ring::<u8>::with_capacity(0).unwrap().0.slots(), 2);
    assert_eq!(Ring::<u8>::with_capacity(1).unwrap().0.slots(), 2);
    assert_eq!(Ring::<u8>::with_capacity(3).unwrap().0.slots(), 4);
    assert_eq!(Ring::<u8>::with_capacity(8).unwrap().0.slots(), 8);
    assert_eq!(
        Ring::<u8>::with_capacity(usize::MAX).unwrap_err(),
        Error::Range
    );
    assert_eq!(Ring::<u8>::bytes_for(usize::MAX).unwrap_err(), Error::Range);
    let small = Ring::<u64>::bytes_for(2).unwrap();
    let big = Ring::<u64>::bytes_for(64).unwrap();
    assert!(big > small && big >= 64 * 16);
}

#[test]
fn full_hands_the_value_back_and_frees_after_a_pop() {
    let (ring, mut key) = Ring::with_capacity(2).unwrap();
    ring.push("a", Class::Submit).unwrap();
    ring.push("b", Class::Control).unwrap();
    let err = ring.push("c", Class::Submit).unwrap_err();
    assert_eq!((err.refusal, err.value), (Refusal::Full, "c"));
    assert_eq!(ring.pop(&mut key), Pop::Item("a"));
    ring.push("c", Class::Submit).unwrap();
    assert_eq!(drain(&ring, &mut key), vec!["b", "c"]);
}

#[test]
fn many_laps_keep_order() {
    let (ring, mut key) = Ring::with_capacity(2).unwrap();
    for i in 0..1000u32 {
        ring.push(i, Class::Submit).unwrap();
        if i % 2 == 1 {
            assert_eq!(drain(&ring, &mut key), vec![i - 1, i]);
        }
    }
    assert_eq!(key.head(), 1000);
}

#[test]
fn close_refuses_submits_but_not_controls() {
    let (ring, mut key) = Ring::with_capacity(4).unwrap();
    ring.push(1, Class::Submit).unwrap();
    assert!(!ring.is_closed());
    assert_eq!(ring.close(), 1);
    assert!(ring.is_closed());
    let err = ring.push(2, Class::Submit).unwrap_err();
    assert_eq!((err.refusal, err.value), (Refusal::Closed, 2));
    ring.push(3, Class::Control).unwrap();
    assert_eq!(ring.close(), 2, "close is idempotent; returns the tail");
    assert_eq!(drain(&ring, &mut key), vec![1, 3]);
    ring.finish();
    assert!(ring.is_finished());
    for class in [Class::Submit, Class::Control] {
        assert_eq!(ring.push(4, class).unwrap_err().refusal, Refusal::Finished);
    }
}

#[test]
fn a_reserved_unwritten_slot_reads_busy_and_blocks_later_ones() {
    let (ring, mut key) = Ring::with_capacity(4).unwrap();
    let r = ring.reserve(Class::Submit).unwrap();
    ring.push(2, Class::Submit).unwrap();
    assert_eq!(ring.pop(&mut key), Pop::Busy, "position 0 is being written");
    assert_eq!(ring.pop(&mut key), Pop::Busy, "position 1 must wait for 0");
    assert_eq!(ring.commit(r, 1), 0);
    assert_eq!(drain(&ring, &mut key), vec![1, 2]);
}

#[test]
fn drop_releases_values_left_on_the_ring_exactly_once() {
    let drops = Arc::new(AtomicUsize::new(0));
    {
        let (ring, mut key) = Ring::with_capacity(4).unwrap();
        for _ in 0..3 {
            ring.push(Counted(drops.clone()), Class::Submit).unwrap();
        }
        drop(ring.pop(&mut key));
        assert_eq!(drops.load(Ordering::Relaxed), 1);
        for _ in 0..2 {
            ring.push(Counted(drops.clone()), Class::Submit).unwrap();
        }
    }
    assert_eq!(drops.load(Ordering::Relaxed), 5);
}

#[test]
#[should_panic(expected = "ConsumerKey of another ring")]
fn a_foreign_key_is_refused() {
    let (ring, _key) = Ring::<u8>::with_capacity(2).unwrap();
    let (_other, mut foreign) = Ring::<u8>::with_capacity(2).unwrap();
    let _ = ring.pop(&mut foreign);
}

const PRODUCERS: usize = 4;
const PER_PRODUCER: u64 = if cfg!(miri) { 50 } else { 50_000 };

/// Several producers, a small ring, one consumer: every value arrives exactly
/// once and each producer's values arrive in its push order.
#[test]
fn threaded_stress_exactly_once_in_order() {
    let (ring, mut key) = Ring::with_capacity(8).unwrap();
    let ring = Arc::new(ring);
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let ring = ring.clone();
            thread::spawn(move || {
                let mut full = 0u64;
                for seq in 0..PER_PRODUCER {
                    let mut v = (p, seq);
                    while let Err(e) = ring.push(v, Class::Submit) {
                        assert_eq!(e.refusal, Refusal::Full);
                        v = e.value;
                        full += 1;
                        thread::yield_now();
                    }
                }
                full
            })
        })
        .collect();
    let mut next = [0u64; PRODUCERS];
    let total = PRODUCERS as u64 * PER_PRODUCER;
    while key.head() < total {
        match ring.pop(&mut key) {
            Pop::Item((p, seq)) => {
                assert_eq!(seq, next[p], "producer {p} out of order");
                next[p] += 1;
            }
            Pop::Empty | Pop::Busy => thread::yield_now(),
        }
    }
    for p in producers {
        p.join().unwrap();
    }
    assert_eq!(next, [PER_PRODUCER; PRODUCERS]);
    assert_eq!(ring.pop(&mut key), Pop::Empty);
}

/// Producers race close: a push that succeeded reserved before close (its
/// position is below the close position) and is drained exactly once; a push
/// that started after close returned is refused.
#[test]
fn threaded_close_race_drains_every_accepted_push() {
    for round in 0..20u64 {
        let (ring, mut key) = Ring::with_capacity(1 << 12).unwrap();
        let ring = Arc::new(ring);
        let closed = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (ring, closed) = (ring.clone(), closed.clone());
                thread::spawn(move || {
                    let mut accepted = Vec::new();
                    for seq in 0u64.. {
                        let after_close = closed.load(Ordering::SeqCst);
                        match ring.push((p, seq), Class::Submit) {
                            Ok(pos) => {
                                assert!(!after_close, "accepted after close returned");
                                accepted.push((pos, seq));
                            }
                            Err(e) if e.refusal == Refusal::Closed => return accepted,
                            Err(e) => assert_eq!(e.refusal, Refusal::Full),
                        }
                    }
                    unreachable!()
                })
            })
            .collect();
        let mut got = Vec::new();
        let stop_after = 200 + round * 97;
        while (got.len() as u64) < stop_after {
            if let Pop::Item(v) = ring.pop(&mut key) {
                got.push(v);
            }
        }
        let close_pos = ring.close();
        closed.store(true, Ordering::SeqCst);
        while key.head() < close_pos {
            if let Pop::Item(v) = ring.pop(&mut key) {
                got.push(v);
            }
        }
        assert_eq!(ring.pop(&mut key), Pop::Empty);
        let mut expected: Vec<(usize, u64)> = Vec::new();
        for (p, h) in producers.into_iter().enumerate() {
            for (pos, seq) in h.join().unwrap() {
                assert!(pos < close_pos);
                expected.push((p, seq));
            }
        }
        got.sort_unstable();
        expected.sort_unstable();
        assert_eq!(got, expected);
    }
}

/// B-017, B-018, B-185: a ring whose slots cannot be allocated is a typed
/// error from create, never a process abort. 2^31 slots of 256 MiB (2^59
/// bytes) fit `isize` but no address space (`Nomem`); 2^31 slots of 8 GiB
/// overflow it (`Range`). The slots used to be collected infallibly: an
/// `mt_queue_cap` too large for memory aborted the whole process from
/// `xtc_batch_create_async` on an unlimited-budget loop.
#[test]
fn b185_a_ring_that_cannot_be_allocated_is_nomem_not_an_abort() {
    let huge = Ring::<[u8; 1 << 28]>::with_capacity(1 << 31);
    assert_eq!(huge.err(), Some(Error::Nomem));
    let overflow = Ring::<[u8; 1 << 33]>::with_capacity(1 << 31);
    assert_eq!(overflow.err(), Some(Error::Range));
}
