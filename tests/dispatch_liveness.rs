//! Deterministic liveness proofs of the drain protocol (D-06, D-07): the
//! completed-latch escapes, and generation tags against the retry ABA.
//! Each schedule is forced by a policy over the seeded stepper; a hang is
//! detected by the step bound, never by a real hang.

use std::cell::Cell;
use std::rc::Rc;

use xtc::Error;
use xtc::dispatch::scenarios::{retry_aba, sync_start_stress};
use xtc::dispatch::{
    DeviceProfile, Escapes, Graph, Point, RunError, RunOpts, RunReport, Scheduler, Shape, StepOpts,
    TaskSpec,
};

const THREADS: usize = 3;

/// Task 0 faults after 50 µs (the run latches completed with an error);
/// task 1 is a sync_start MIX cohort over every cluster, so its drain keeps
/// retrying while task 0 holds a core.
fn fault_during_drain(clusters: u32) -> Graph {
    let mut g = Graph::new();
    g.add(TaskSpec::new(Shape::Aiv, 1).lasting(50_000).failing());
    g.add(TaskSpec::new(Shape::Mix, clusters).sync().lasting(5_000));
    g
}

/// The schedule of the upstream hang: the thread Y that owns the faulting
/// task is held at its loop yield until the task has finished on its core
/// and a peer waits in the ack barrier; then Y retires the fault, latches
/// completed and leaves, while the peer is in the barrier.
fn exit_while_peer_in_barrier(escapes: Escapes) -> Result<RunReport, RunError> {
    let s = Scheduler::new(DeviceProfile::small()).unwrap();
    let g = fault_during_drain(s.profile().clusters as u32);
    let mut owner: Option<usize> = None;
    let mut released = false;
    let policy = Box::new(
        move |v: &xtc::dispatch::step::View<'_>, p: &xtc::dispatch::Probe, pid: usize| {
            if owner.is_none() {
                owner = p.task_thread(0);
            }
            if Some(pid) != owner || released || v.points[pid] != Point::Loop {
                return true;
            }
            let peer_in_barrier =
                (0..THREADS).any(|q| q != pid && v.points[q] == Point::AckBarrier);
            released = p.task_finished_on_core(0) && peer_in_barrier;
            released
        },
    );
    let opts = RunOpts {
        escapes,
        ..RunOpts::default()
    };
    let so = StepOpts {
        max_steps: 300_000,
        policy: Some(policy),
        ..StepOpts::seeded(11)
    };
    s.run_stepped(&g, opts, so)
}

#[test]
fn without_completed_escapes_the_barrier_hangs_and_is_detected() {
    match exit_while_peer_in_barrier(Escapes::NONE) {
        Err(RunError::Hang(h)) => {
            // Only scheduler threads remain, all spinning in the ack barrier.
            assert!(!h.stuck.is_empty());
            assert!(
                h.stuck
                    .iter()
                    .all(|&(pid, pt)| pid < THREADS && pt == Point::AckBarrier),
                "{h:?}"
            );
        }
        other => panic!("expected a detected hang, got {other:?}"),
    }
}

#[test]
fn with_completed_escapes_the_same_schedule_ends() {
    let r = exit_while_peer_in_barrier(Escapes::ALL).expect("no hang with escapes");
    assert_eq!(r.fault, Some(Error::Internal));
    assert!(r.drains_abandoned >= 1, "the escape was not exercised");
}

#[test]
fn each_escape_alone_is_what_saves_the_barrier() {
    // Only the ack-barrier escape matters in this schedule: switching the
    // others off still ends; switching it off hangs.
    let only_barrier = Escapes {
        ack_barrier: true,
        ..Escapes::NONE
    };
    assert!(exit_while_peer_in_barrier(only_barrier).is_ok());
    let all_but_barrier = Escapes {
        ack_barrier: false,
        ..Escapes::ALL
    };
    assert!(matches!(
        exit_while_peer_in_barrier(all_but_barrier),
        Err(RunError::Hang(_))
    ));
}

#[test]
fn abandoned_drain_state_is_reset_before_the_next_run() {
    // D-07: after a run abandoned its drain, the next run on the same device
    // passes the stress scene with exact outputs.
    let s = Scheduler::new(DeviceProfile::small()).unwrap();
    let g = fault_during_drain(6);
    let r = s
        .run_stepped(&g, RunOpts::default(), StepOpts::seeded(3))
        .unwrap();
    assert_eq!(r.fault, Some(Error::Internal));
    let r = s
        .run_stepped(
            &sync_start_stress(6, 1),
            RunOpts::default(),
            StepOpts::seeded(1),
        )
        .unwrap();
    assert!(r.fault.is_none() && r.outputs_exact());
}

/// The retry-ABA schedule: thread P passes the ack barrier of attempt A and is
/// parked before the election; the elected peer finds the holder's cluster
/// busy and resets (retry). P is released once the holder finished and both
/// peers wait in the next attempt's barrier. Returns the result and whether
/// the schedule was exercised (P parked and released after a retry).
fn retry_aba_schedule(tags: bool) -> (Result<RunReport, RunError>, bool) {
    let s = Scheduler::new(DeviceProfile::small()).unwrap();
    let g = retry_aba(s.profile().clusters);
    let exercised = Rc::new(Cell::new(false));
    let ex = exercised.clone();
    let mut holder: Option<usize> = None;
    let policy = Box::new(
        move |v: &xtc::dispatch::step::View<'_>, p: &xtc::dispatch::Probe, pid: usize| {
            if holder.is_none() {
                holder = p.task_thread(0);
            }
            let Some(h) = holder else { return true };
            let parked = (h + 1) % THREADS;
            let retried = p.drain_retries() >= 1;
            if pid == parked && !ex.get() && v.points[pid] == Point::BeforeElect {
                let peers_waiting = (0..THREADS)
                    .filter(|&q| q != parked)
                    .all(|q| v.points[q] == Point::AckBarrier);
                let go = retried && p.task_completed(0) && peers_waiting;
                ex.set(go);
                return go;
            }
            if pid == h && retried && v.points[pid] == Point::Loop && !p.task_completed(0) {
                return p.task_finished_on_core(0);
            }
            true
        },
    );
    let opts = RunOpts {
        generation_tags: tags,
        ..RunOpts::default()
    };
    let so = StepOpts {
        max_steps: 300_000,
        policy: Some(policy),
        ..StepOpts::seeded(5)
    };
    (s.run_stepped(&g, opts, so), exercised.get())
}

#[test]
fn retry_aba_without_generation_tags_splits_the_barrier() {
    let (r, exercised) = retry_aba_schedule(false);
    assert!(exercised, "not exercised: the retry never happened");
    match r {
        Err(RunError::Hang(h)) => {
            let pts: Vec<Point> = h
                .stuck
                .iter()
                .filter(|s| s.0 < THREADS)
                .map(|s| s.1)
                .collect();
            // The stale thread won attempt A's election after the reset and
            // waits for staging; its peers wait for its ack of attempt A+1.
            assert!(pts.contains(&Point::StageDone), "{h:?}");
            assert_eq!(
                pts.iter().filter(|&&p| p == Point::AckBarrier).count(),
                2,
                "{h:?}"
            );
        }
        other => panic!("expected a detected split barrier, got {other:?}"),
    }
}

#[test]
fn retry_aba_with_generation_tags_completes() {
    let (r, exercised) = retry_aba_schedule(true);
    assert!(exercised, "not exercised: the retry never happened");
    let r = r.expect("no hang with generation tags");
    assert!(r.fault.is_none() && r.outputs_exact());
    assert!(r.summary.drain_retries >= 1);
}
