//! Unit tests of the pure core: slots, FCFS admission under charge, cancel,
//! resume, close, terminal accounting, statistics.

use super::*;
use crate::batch::HandleAlloc;

fn core(capacity: usize, max_active: usize, units: u64) -> Core<u32> {
    Core::new(Limits {
        capacity,
        max_active,
        resource_capacity: units,
        mt_queue_cap: 2,
    })
    .unwrap()
}

fn h(v: u64) -> Handle {
    Handle::new(v).unwrap()
}

/// Submits through the same checks as `Group::submit`.
fn submit(c: &mut Core<u32>, handle: u64, charge: u64) -> Result<()> {
    c.check_submit(charge)?;
    c.enqueue(h(handle), charge, handle as u32);
    Ok(())
}

fn ready_handles(c: &Core<u32>) -> Vec<u64> {
    c.ready.iter().map(|m| m.handle.get()).collect()
}

fn deliver_all(c: &mut Core<u32>) -> Vec<(u64, Result<()>)> {
    let mut out = Vec::new();
    while let Some((h, r, o)) = c.pop_delivery() {
        assert_eq!(u64::from(r), h.get(), "request comes back with its handle");
        c.retire_delivery();
        out.push((h.get(), o));
    }
    out
}

/// Runs one synchronous iteration with `f` choosing each member's result.
fn iterate(c: &mut Core<u32>, f: impl Fn(u64) -> StepResult) {
    let frozen: Vec<_> = c.ready.drain(..).collect();
    c.note_vector(frozen.len());
    for m in frozen {
        let r = f(m.handle.get());
        c.apply(m, r);
    }
}

#[test]
fn charge_must_be_in_range() {
    let mut c = core(4, 2, 10);
    assert_eq!(submit(&mut c, 1, 0), Err(Error::Range));
    assert_eq!(submit(&mut c, 1, 11), Err(Error::Range));
    assert_eq!(submit(&mut c, 1, 10), Ok(()));
}

#[test]
fn slots_count_waiting_and_active_and_full_is_again() {
    let mut c = core(3, 1, 10);
    for i in 1..=3 {
        submit(&mut c, i, 1).unwrap();
    }
    assert_eq!(submit(&mut c, 4, 1), Err(Error::Again));
    assert_eq!(c.admit(), 1, "max_active bounds admission");
    assert_eq!(
        submit(&mut c, 4, 1),
        Err(Error::Again),
        "active still holds a slot"
    );
    let s = c.snapshot();
    assert_eq!((s.queued, s.ready, s.reserved_units), (2, 1, 1));
}

#[test]
fn admission_is_strict_fcfs_under_charge() {
    let mut c = core(8, 8, 10);
    submit(&mut c, 1, 6).unwrap();
    submit(&mut c, 2, 6).unwrap(); // does not fit beside 1
    submit(&mut c, 3, 1).unwrap(); // would fit, must not pass 2
    assert_eq!(c.admit(), 1);
    assert_eq!(ready_handles(&c), vec![1]);
    assert_eq!(c.snapshot().queued, 2, "skipped requests keep their place");
    iterate(&mut c, |_| StepResult::Done);
    assert_eq!(
        c.snapshot().reserved_units,
        0,
        "charge released when terminal"
    );
    assert_eq!(c.admit(), 2);
    assert_eq!(ready_handles(&c), vec![2, 3], "order kept");
}

#[test]
fn submission_reserves_a_slot_not_units() {
    let mut c = core(4, 4, 5);
    submit(&mut c, 1, 5).unwrap();
    submit(&mut c, 2, 5).unwrap();
    assert_eq!(c.snapshot().reserved_units, 0);
    c.admit();
    assert_eq!(c.snapshot().reserved_units, 5);
}

#[test]
fn max_active_running_makes_further_requests_wait() {
    let mut c = core(8, 2, 100);
    for i in 1..=3 {
        submit(&mut c, i, 1).unwrap();
    }
    c.admit();
    iterate(&mut c, |_| StepResult::Continue);
    assert_eq!(c.admit(), 0, "never an extra member");
    assert_eq!(ready_handles(&c).len(), 2);
}

#[test]
fn blocked_keeps_slot_and_charge_and_resume_rules() {
    let mut c = core(4, 1, 10);
    submit(&mut c, 1, 7).unwrap();
    submit(&mut c, 2, 1).unwrap();
    c.admit();
    iterate(&mut c, |_| StepResult::Blocked);
    let s = c.snapshot();
    assert_eq!(
        (s.blocked, s.ready, s.reserved_units, s.queued),
        (1, 0, 7, 1)
    );
    assert_eq!(c.admit(), 0, "blocked member holds the active place");
    assert_eq!(
        c.resume(h(2)),
        Err(Error::Inval),
        "WAITING is not resumable"
    );
    assert_eq!(c.resume(h(1)), Ok(()));
    assert_eq!(c.resume(h(1)), Ok(()), "duplicate resume on READY harmless");
    assert_eq!(
        c.snapshot().reserved_units,
        7,
        "resume neither releases nor reacquires"
    );
    iterate(&mut c, |_| StepResult::Done);
    deliver_all(&mut c);
    assert_eq!(
        c.resume(h(1)),
        Err(Error::Inval),
        "terminal is not resumable"
    );
    assert_eq!(c.resume(h(99)), Err(Error::Inval));
}

#[test]
fn results_map_to_outcomes_and_unset_is_internal() {
    let mut c = core(8, 8, 8);
    for i in 1..=4 {
        submit(&mut c, i, 1).unwrap();
    }
    c.admit();
    iterate(&mut c, |h| match h {
        1 => StepResult::Done,
        2 => StepResult::Error(Error::Nomem),
        3 => StepResult::Unset,
        _ => StepResult::Continue,
    });
    let got = deliver_all(&mut c);
    assert_eq!(
        got,
        vec![
            (1, Ok(())),
            (2, Err(Error::Nomem)),
            (3, Err(Error::Internal))
        ]
    );
    let s = c.snapshot();
    assert_eq!((s.completed, s.failed, s.cancelled, s.ready), (1, 2, 0, 1));
}

#[test]
fn cancel_rules() {
    let mut c = core(8, 1, 8);
    submit(&mut c, 1, 1).unwrap();
    submit(&mut c, 2, 1).unwrap();
    c.admit();
    assert_eq!(c.cancel(h(2)), Ok(()));
    assert_eq!(c.cancel(h(2)), Ok(()), "duplicate cancel harmless");
    c.consume_cancels();
    assert_eq!(
        deliver_all(&mut c),
        vec![(2, Err(Error::Aborted))],
        "waiting cancel never runs"
    );
    assert_eq!(
        c.cancel(h(2)),
        Err(Error::Inval),
        "stale after notification"
    );
    iterate(&mut c, |_| StepResult::Done);
    assert_eq!(
        c.cancel(h(1)),
        Ok(()),
        "DONE recorded wins over a later cancel"
    );
    c.consume_cancels();
    assert_eq!(deliver_all(&mut c), vec![(1, Ok(()))]);
    let s = c.snapshot();
    assert_eq!((s.completed, s.cancelled, s.reserved_units), (1, 1, 0));
}

#[test]
fn cancel_excludes_ready_and_blocked_members_at_the_boundary() {
    let mut c = core(8, 8, 8);
    for i in 1..=3 {
        submit(&mut c, i, 2).unwrap();
    }
    c.admit();
    iterate(&mut c, |h| {
        if h == 3 {
            StepResult::Blocked
        } else {
            StepResult::Continue
        }
    });
    c.cancel(h(1)).unwrap();
    c.cancel(h(3)).unwrap();
    c.consume_cancels();
    assert_eq!(ready_handles(&c), vec![2]);
    assert_eq!(c.snapshot().reserved_units, 2);
    assert_eq!(deliver_all(&mut c).len(), 2);
}

#[test]
fn close_escalates_never_downgrades_and_cancel_marks_all() {
    let mut c = core(8, 1, 8);
    submit(&mut c, 1, 1).unwrap();
    submit(&mut c, 2, 1).unwrap();
    c.admit();
    c.close(CloseMode::Drain);
    assert_eq!(submit(&mut c, 3, 1), Err(Error::Again), "closed");
    c.close(CloseMode::Cancel);
    c.close(CloseMode::Drain);
    assert_eq!(c.closed, Some(CloseMode::Cancel), "never downgraded");
    c.consume_cancels();
    assert_eq!(deliver_all(&mut c).len(), 2);
    assert!(c.finished());
}

#[test]
fn held_hand_ins_take_freed_slots_first() {
    let mut c = core(1, 1, 8);
    submit(&mut c, 1, 1).unwrap();
    c.hand_in(h(2), 1, 2);
    assert_eq!(c.snapshot().queued, 2, "held hand-ins count as queued");
    assert_eq!(c.check_submit(1), Err(Error::Again));
    c.admit();
    iterate(&mut c, |_| StepResult::Done);
    deliver_all(&mut c);
    assert_eq!(
        c.check_submit(1),
        Err(Error::Again),
        "held hand-in goes first"
    );
    c.admit();
    assert_eq!(ready_handles(&c), vec![2]);
}

#[test]
fn outstanding_work_fails_internal_or_aborted_on_exit() {
    let mut c = core(8, 1, 8);
    for i in 1..=3 {
        submit(&mut c, i, 1).unwrap();
    }
    c.admit();
    c.cancel(h(3)).unwrap();
    c.fail_all_outstanding();
    let got = deliver_all(&mut c);
    assert!(got.contains(&(1, Err(Error::Internal))));
    assert!(got.contains(&(2, Err(Error::Internal))));
    assert!(got.contains(&(3, Err(Error::Aborted))));
    assert_eq!(c.snapshot().reserved_units, 0);
}

#[test]
fn interrupted_delivery_is_retired_once() {
    let mut c = core(2, 1, 8);
    submit(&mut c, 1, 1).unwrap();
    c.admit();
    iterate(&mut c, |_| StepResult::Done);
    let (_, _, o) = c.pop_delivery().unwrap();
    assert_eq!(o, Ok(()));
    assert_eq!(
        c.snapshot().completed,
        0,
        "counters advance after delivery returns"
    );
    c.retire_delivery();
    c.retire_delivery();
    assert_eq!(c.snapshot().completed, 1, "retired exactly once");
}

#[test]
fn counters_saturate() {
    let mut c = core(2, 1, 8);
    c.stats.iterations = u64::MAX;
    c.stats.total_members = u64::MAX - 1;
    c.stats.rejections = u64::MAX;
    c.note_vector(5);
    c.note_rejection();
    let s = c.snapshot();
    assert_eq!(
        (s.iterations, s.total_members, s.rejections),
        (u64::MAX, u64::MAX, u64::MAX)
    );
}

#[test]
fn storage_arithmetic_is_checked() {
    let l = Limits {
        capacity: usize::MAX,
        max_active: 1,
        resource_capacity: 1,
        mt_queue_cap: 0,
    };
    assert_eq!(Core::<u32>::storage_bytes(&l), Err(Error::Range));
    let l = Limits {
        capacity: 4,
        max_active: 4,
        resource_capacity: 1,
        mt_queue_cap: usize::MAX,
    };
    assert_eq!(Core::<u32>::storage_bytes(&l), Err(Error::Range));
    let l = Limits {
        capacity: 4,
        max_active: 4,
        resource_capacity: 1,
        mt_queue_cap: 0,
    };
    assert!(Core::<u32>::storage_bytes(&l).unwrap() > 0);
}

#[test]
fn handles_are_monotonic_and_never_wrap() {
    let a = HandleAlloc::new().unwrap();
    let x = a.alloc().unwrap();
    let y = a.alloc().unwrap();
    assert!(y > x);
    a.set_last(u64::MAX - 1);
    assert_eq!(a.alloc().unwrap().get(), u64::MAX);
    assert_eq!(a.alloc(), Err(Error::Range));
    assert_eq!(a.alloc(), Err(Error::Range), "stays exhausted, never wraps");
    let b = HandleAlloc::new().unwrap();
    assert_ne!(b.alloc().unwrap(), x, "another group's space is disjoint");
}

/// Issue 12 item 3 (B-021, B-022): the fit test near `u64::MAX` never wraps.
/// A member holding every unit of a `u64::MAX` capacity keeps the next one
/// (charge 1) waiting; the sum `reserved + charge` overflowed before (a
/// panic in debug builds, both admitted in release with `reserved_units` 0).
#[test]
fn admission_near_u64_max_never_overflows() {
    let mut c = core(4, 4, u64::MAX);
    submit(&mut c, 1, u64::MAX).unwrap();
    submit(&mut c, 2, 1).unwrap();
    assert_eq!(c.admit(), 1, "only the whole-capacity member fits");
    let s = c.snapshot();
    assert_eq!((s.ready, s.queued, s.reserved_units), (1, 1, u64::MAX));
    assert_eq!(c.admit(), 0, "a second boundary admits nobody either");
    iterate(&mut c, |_| StepResult::Done);
    assert_eq!(c.admit(), 1, "the units came back");
    assert_eq!(c.snapshot().reserved_units, 1);
    // Near the top too: two charges whose sum exceeds u64::MAX.
    let mut c = core(4, 4, u64::MAX - 1);
    submit(&mut c, 1, u64::MAX - 2).unwrap();
    submit(&mut c, 2, 3).unwrap();
    assert_eq!(c.admit(), 1);
    assert_eq!(c.snapshot().reserved_units, u64::MAX - 2);
}
