//! Tests of the admission front end: handle space, pools, close, finish.

use std::collections::HashSet;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use super::super::Pop;
use super::super::admission::*;
use crate::Error;

fn nz(v: u64) -> NonZeroU64 {
    NonZeroU64::new(v).unwrap()
}

fn admission(cap: usize) -> (Arc<Admission<u32>>, Inbox<u32>) {
    Admission::new(cap, Arc::new(HandleSpace::default())).unwrap()
}

#[test]
fn handles_are_monotonic_and_exhaustion_never_wraps() {
    let space = HandleSpace::default();
    assert_eq!(space.issue().unwrap(), nz(1));
    assert_eq!(space.issue().unwrap(), nz(2));
    assert!(space.is_issued(nz(2)) && !space.is_issued(nz(3)));
    let space = HandleSpace::starting_at(nz(u64::MAX - 1));
    assert_eq!(space.issue().unwrap(), nz(u64::MAX - 1));
    assert_eq!(space.issue().unwrap(), nz(u64::MAX));
    assert!(space.is_issued(nz(u64::MAX)));
    for _ in 0..3 {
        assert_eq!(space.issue().unwrap_err(), Error::Range);
    }
}

#[test]
fn concurrent_exhaustion_issues_each_handle_once_and_never_wraps() {
    let space = Arc::new(HandleSpace::starting_at(nz(u64::MAX - 9_999)));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let space = space.clone();
            thread::spawn(move || {
                let mut mine = Vec::new();
                loop {
                    match space.issue() {
                        Ok(h) => mine.push(h.get()),
                        Err(e) => {
                            assert_eq!(e, Error::Range);
                            return mine;
                        }
                    }
                }
            })
        })
        .collect();
    let mut all = HashSet::new();
    for t in threads {
        for h in t.join().unwrap() {
            assert!(h > u64::MAX - 10_000, "wrapped to {h}");
            assert!(all.insert(h), "handle {h} issued twice");
        }
    }
    assert_eq!(all.len(), 10_000);
}

#[test]
fn zero_cap_is_inval_and_sizes_are_checked() {
    let err = Admission::<u32>::new(0, Arc::new(HandleSpace::default())).unwrap_err();
    assert_eq!(err, Error::Inval);
    assert_eq!(
        Admission::<u32>::bytes_for(usize::MAX).unwrap_err(),
        Error::Range
    );
    assert!(Admission::<u32>::bytes_for(4).unwrap() > Admission::<u32>::bytes_for(1).unwrap());
}

#[test]
fn submit_returns_a_handle_and_the_record_stays_claimed_until_released() {
    let (shared, mut inbox) = admission(2);
    let h1 = shared.submit(10, 3).unwrap();
    let h2 = shared.submit(11, 4).unwrap();
    assert!(h2 > h1);
    let (err, back) = shared.submit(12, 1).unwrap_err();
    assert_eq!((err, back), (Error::Again, 12));
    assert_eq!(shared.rejections(), 1);
    let Pop::Item(HandIn::Submit {
        handle,
        request,
        charge,
    }) = inbox.pop()
    else {
        panic!("expected the first submit")
    };
    assert_eq!((handle, request, charge), (h1, 10, 3));
    // Drained but not admitted (held): the record is still claimed (B-111).
    assert_eq!(shared.free_submit_records(), 0);
    assert_eq!(shared.submit(12, 1).unwrap_err().0, Error::Again);
    inbox.release_submit();
    assert!(shared.submit(12, 1).is_ok());
    assert_eq!(shared.rejections(), 2);
}

#[test]
fn controls_use_their_own_pool_and_return_it_when_drained() {
    let (shared, mut inbox) = admission(1);
    let h = shared.submit(1, 1).unwrap();
    assert_eq!(shared.submit(2, 1).unwrap_err().0, Error::Again);
    // Every SUBMIT record is taken; controls still go through (B-112).
    shared.control(ControlOp::Resume, h).unwrap();
    assert_eq!(
        shared.control(ControlOp::Cancel, h).unwrap_err(),
        Error::Again
    );
    assert!(matches!(inbox.pop(), Pop::Item(HandIn::Submit { .. })));
    assert_eq!(shared.free_control_records(), 0);
    let Pop::Item(HandIn::Control { op, handle }) = inbox.pop() else {
        panic!("expected the resume")
    };
    assert_eq!((op, handle), (ControlOp::Resume, h));
    assert_eq!(shared.free_control_records(), 1);
    shared.control(ControlOp::Cancel, h).unwrap();
    assert_eq!(shared.rejections(), 2);
}

#[test]
fn controls_for_unissued_handles_and_after_finish_are_inval() {
    let (shared, mut inbox) = admission(2);
    assert_eq!(
        shared.control(ControlOp::Cancel, nz(1)).unwrap_err(),
        Error::Inval
    );
    let h = shared.submit(1, 1).unwrap();
    inbox.close();
    shared.control(ControlOp::Cancel, h).unwrap();
    inbox.finish();
    assert_eq!(
        shared.control(ControlOp::Cancel, h).unwrap_err(),
        Error::Inval
    );
    assert_eq!(
        shared.control(ControlOp::Resume, h).unwrap_err(),
        Error::Inval
    );
    assert_eq!(shared.rejections(), 0, "Inval is not a rejection");
}

#[test]
fn close_refuses_submits_without_a_handle_and_tracks_the_drain() {
    let (shared, mut inbox) = admission(4);
    let space = shared.handles().clone();
    shared.submit(1, 1).unwrap();
    assert!(!inbox.submits_drained(), "not closed yet");
    inbox.close();
    assert!(!inbox.submits_drained(), "one submit still on the ring");
    assert_eq!(shared.submit(2, 1).unwrap_err(), (Error::Again, 2));
    assert!(!space.is_issued(nz(2)), "a refused submit issues no handle");
    assert!(matches!(inbox.pop(), Pop::Item(HandIn::Submit { .. })));
    assert!(inbox.submits_drained());
    assert_eq!(shared.rejections(), 1);
}

#[test]
fn submit_at_handle_exhaustion_is_range_and_keeps_the_record() {
    let space = Arc::new(HandleSpace::starting_at(nz(u64::MAX)));
    let (shared, _inbox) = Admission::<u32>::new(1, space).unwrap();
    assert_eq!(shared.submit(1, 1).unwrap().get(), u64::MAX);
    let (shared, _inbox) = Admission::<u32>::new(1, shared.handles().clone()).unwrap();
    assert_eq!(shared.submit(2, 1).unwrap_err(), (Error::Range, 2));
    assert_eq!(shared.free_submit_records(), 1);
}

/// Producers submit (with back-off on `Again`) and cancel their own handles
/// while the consumer admits (releases records) and closes at a moment that
/// depends on the round: every handle returned was drained exactly once, each
/// control after its submit, and no submit starting after close succeeded.
#[test]
fn threaded_submit_cancel_close_race() {
    for round in 0..10u64 {
        let (shared, mut inbox) = admission(16);
        let closed = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> = (0..3u32)
            .map(|p| {
                let (shared, closed) = (shared.clone(), closed.clone());
                thread::spawn(move || {
                    let mut handles = Vec::new();
                    for i in 0u32.. {
                        let after_close = closed.load(Ordering::SeqCst);
                        match shared.submit(p * 1_000_000 + i, 1) {
                            Ok(h) => {
                                assert!(!after_close, "accepted after close returned");
                                handles.push(h);
                                while shared.control(ControlOp::Cancel, h) == Err(Error::Again) {
                                    thread::yield_now();
                                }
                            }
                            Err((Error::Again, _)) if after_close => return handles,
                            Err((e, _)) => {
                                assert_eq!(e, Error::Again);
                                thread::yield_now();
                            }
                        }
                    }
                    unreachable!()
                })
            })
            .collect();
        let mut seen = HashSet::new();
        let close_after = 50 + round * 40;
        let mut closing = false;
        loop {
            match inbox.pop() {
                Pop::Item(HandIn::Submit { handle, .. }) => {
                    assert!(seen.insert(handle), "submit drained twice");
                    inbox.release_submit();
                }
                Pop::Item(HandIn::Control { handle, .. }) => {
                    assert!(seen.contains(&handle), "control drained before its submit");
                }
                Pop::Empty | Pop::Busy if closing && inbox.submits_drained() => break,
                Pop::Empty | Pop::Busy => thread::yield_now(),
            }
            if !closing && seen.len() as u64 >= close_after {
                inbox.close();
                closed.store(true, Ordering::SeqCst);
                closing = true;
            }
        }
        // Producers may still be handing in their last cancels: keep
        // draining (only controls can arrive now) until they are done.
        loop {
            let done = producers.iter().all(|p| p.is_finished());
            match inbox.pop() {
                Pop::Item(item) => assert!(matches!(item, HandIn::Control { .. })),
                Pop::Empty if done => break,
                Pop::Empty | Pop::Busy => thread::yield_now(),
            }
        }
        let mut issued = HashSet::new();
        for p in producers {
            issued.extend(p.join().unwrap());
        }
        assert_eq!(seen, issued);
        assert_eq!(shared.free_submit_records(), 16);
        assert_eq!(shared.free_control_records(), 16);
    }
}

/// A waker that counts wakes and unparks the consumer thread.
struct ThreadWaker {
    wakes: std::sync::atomic::AtomicUsize,
    thread: thread::Thread,
}

impl std::task::Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.thread.unpark();
    }
}

fn thread_waker() -> (Arc<ThreadWaker>, std::task::Waker) {
    let w = Arc::new(ThreadWaker {
        wakes: Default::default(),
        thread: thread::current(),
    });
    (w.clone(), std::task::Waker::from(w))
}

#[test]
fn doorbell_wakes_an_armed_consumer_once_and_not_a_running_one() {
    let (shared, mut inbox) = admission(4);
    let (count, waker) = thread_waker();
    shared.submit(1, 1).unwrap();
    assert_eq!(count.wakes.load(Ordering::SeqCst), 0, "not armed: no wake");
    assert!(inbox.arm(&waker), "a ready hand-in: do not park");
    assert!(matches!(inbox.pop(), Pop::Item(_)));
    inbox.release_submit();
    assert!(!inbox.arm(&waker), "empty: park");
    shared.submit(2, 1).unwrap();
    shared.control(ControlOp::Cancel, nz(2)).unwrap();
    assert_eq!(count.wakes.load(Ordering::SeqCst), 1, "one wake per arming");
    while let Pop::Item(_) = inbox.pop() {}
    assert!(!inbox.arm(&waker));
    shared.control(ControlOp::Resume, nz(2)).unwrap();
    assert_eq!(count.wakes.load(Ordering::SeqCst), 2, "a control rings too");
}

/// Producers push while the consumer parks whenever the ring is empty; a wake
/// that went missing would leave a ready hand-in behind a timed-out park.
#[test]
fn threaded_doorbell_loses_no_wake() {
    const N: u32 = 20_000;
    let (shared, mut inbox) = admission(8);
    let (count, waker) = thread_waker();
    let producers: Vec<_> = (0..2)
        .map(|_| {
            let shared = shared.clone();
            thread::spawn(move || {
                for i in 0..N {
                    while shared.submit(i, 1).is_err() {
                        thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let (mut got, mut lost) = (0, 0);
    while got < 2 * N {
        match inbox.pop() {
            Pop::Item(_) => {
                inbox.release_submit();
                got += 1;
            }
            Pop::Empty | Pop::Busy => {
                let before = count.wakes.load(Ordering::SeqCst);
                if !inbox.arm(&waker) {
                    // Park until woken. A park may also end early (a stale
                    // unpark token), so only a wake ends the wait; a hand-in
                    // that is ready while no wake came for 10 s was pushed by
                    // a producer that did not ring: a lost wake.
                    let start = std::time::Instant::now();
                    while count.wakes.load(Ordering::SeqCst) == before {
                        if start.elapsed() > std::time::Duration::from_secs(10) {
                            lost += usize::from(inbox.arm(&waker));
                            break;
                        }
                        thread::park_timeout(std::time::Duration::from_millis(100));
                    }
                }
                inbox.disarm();
            }
        }
    }
    for p in producers {
        p.join().unwrap();
    }
    assert_eq!(lost, 0);
}
