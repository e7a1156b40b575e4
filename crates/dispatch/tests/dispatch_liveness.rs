//! Deterministic liveness proofs of the drain protocol (D-06, D-07): the
//! completed-latch escapes, generation tags against the retry ABA, and the
//! drain watchdog against a stuck peer (issue 12; also on real threads).
//! Each schedule is forced by a policy over the seeded stepper; a hang is
//! detected by the step bound, never by a real hang. The policies live in
//! `dispatch_support` and are re-run under `rt::Sim` in `dispatch_sim.rs`.

mod dispatch_support;

use dispatch_support::{
    Driver, THREADS, assert_split_barrier, assert_stalled_on,
    exit_while_peer_in_barrier as exit_while, exit_while_peer_in_barrier_with, fault_during_drain,
    retry_aba_schedule as retry_aba_with, stuck_peer_in_drain, whole_device_cohort,
};
use xtc::Error;
use xtc_dispatch::scenarios::sync_start_stress;
use xtc_dispatch::{
    DeviceProfile, Escapes, Graph, Point, RunError, RunOpts, RunReport, Scheduler, Shape, StepOpts,
    TaskSpec,
};

/// The schedule of the upstream hang (see `dispatch_support`), stepped.
fn exit_while_peer_in_barrier(escapes: Escapes, seed: u64) -> Result<RunReport, RunError> {
    exit_while(escapes, Driver::Stepped, seed)
}

/// The retry-ABA schedule (see `dispatch_support`), stepped.
fn retry_aba_schedule(tags: bool, seed: u64) -> (Result<RunReport, RunError>, bool) {
    retry_aba_with(tags, Driver::Stepped, seed)
}

#[test]
fn without_completed_escapes_the_barrier_hangs_and_is_detected() {
    for seed in 0..12 {
        match exit_while_peer_in_barrier(Escapes::NONE, seed) {
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
            other => panic!("seed {seed}: expected a detected hang, got {other:?}"),
        }
    }
}

#[test]
fn with_completed_escapes_the_same_schedule_ends() {
    for seed in 0..12 {
        let r = exit_while_peer_in_barrier(Escapes::ALL, seed).expect("no hang with escapes");
        assert_eq!(r.fault, Some(Error::Internal));
        assert!(
            r.drains_abandoned >= 1,
            "seed {seed}: the escape was not exercised"
        );
    }
}

#[test]
fn each_escape_alone_is_what_saves_the_barrier() {
    // Only the ack-barrier escape matters in this schedule: switching the
    // others off still ends; switching it off hangs.
    let only_barrier = Escapes {
        ack_barrier: true,
        ..Escapes::NONE
    };
    assert!(exit_while_peer_in_barrier(only_barrier, 11).is_ok());
    let all_but_barrier = Escapes {
        ack_barrier: false,
        ..Escapes::ALL
    };
    assert!(matches!(
        exit_while_peer_in_barrier(all_but_barrier, 11),
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

#[test]
fn retry_aba_without_generation_tags_splits_the_barrier() {
    for seed in 0..12 {
        let (r, exercised) = retry_aba_schedule(false, seed);
        assert!(exercised, "not exercised: the retry never happened");
        match r {
            Err(RunError::Hang(h)) => {
                assert_split_barrier(&h, seed);
            }
            other => panic!("expected a detected split barrier, got {other:?}"),
        }
    }
}

#[test]
fn retry_aba_with_generation_tags_completes() {
    for seed in 0..12 {
        let (r, exercised) = retry_aba_schedule(true, seed);
        assert!(
            exercised,
            "seed {seed}: not exercised, the retry never happened"
        );
        let r = r.expect("no hang with generation tags");
        assert!(r.fault.is_none() && r.outputs_exact());
        assert!(r.summary.drain_retries >= 1);
    }
}

#[test]
fn watchdog_latches_a_stalled_dispatch_loop() {
    // A task running far past the watchdog: the owning thread sees no
    // progress while it runs a task, and latches Internal.
    let s = Scheduler::new(DeviceProfile::small()).unwrap();
    let mut g = Graph::new();
    g.add(TaskSpec::new(Shape::Aic, 1).lasting(5_000_000));
    let opts = RunOpts {
        watchdog_ns: 1_000_000,
        ..RunOpts::default()
    };
    let r = s
        .run_stepped(&g, opts.clone(), StepOpts::seeded(1))
        .unwrap();
    assert_eq!(r.fault, Some(Error::Internal));
    assert!(
        r.end_ns >= 1_000_000 && r.end_ns < 5_000_000,
        "{}",
        r.end_ns
    );
    // The same watchdog does not fire on a run that keeps progressing.
    let r = s
        .run_stepped(&sync_start_stress(6, 2), opts, StepOpts::seeded(2))
        .unwrap();
    assert!(r.fault.is_none() && r.outputs_exact());
}

#[test]
fn the_watchdog_sees_drain_spins() {
    // D-13 went further (issue 12): the escape-less barrier of the upstream
    // hang, which the design note's loop watchdog cannot see, now ends with
    // a drain stall once a spin has waited past the budget: the peers in
    // the barrier name the thread that left.
    let opts = RunOpts {
        escapes: Escapes::NONE,
        watchdog_ns: 200_000,
        ..RunOpts::default()
    };
    let r = exit_while_peer_in_barrier_with(opts, Driver::Stepped, 4).expect("no hang");
    assert_eq!(r.fault, Some(Error::Internal));
    let stall = r.drain_stall.expect("a drain stall");
    assert_eq!(stall.point, Point::AckBarrier, "{stall}");
    assert_eq!(stall.waiting_for.len(), 1, "{stall}");
    assert!(stall.waiting_for[0] < THREADS && stall.waiting_for[0] != stall.thread);
}

/// Issue 12: a peer that never reaches the ack barrier, neither completed
/// nor gone (held at its loop yield by the policy), used to hang the run
/// forever. The barrier's spin now gives up after the watchdog budget: the
/// run ends `Internal` with a stall naming the barrier and that peer. With
/// the default (2 s) budget the same schedule runs into the step bound, so
/// it is the drain watchdog that ends it.
#[test]
fn a_stuck_peer_ends_the_run_with_a_drain_stall() {
    let opts = RunOpts {
        watchdog_ns: 200_000,
        ..RunOpts::default()
    };
    for seed in 0..12 {
        let stuck = (seed as usize) % THREADS;
        let r = stuck_peer_in_drain(opts.clone(), Driver::Stepped, seed, stuck)
            .unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
        assert_stalled_on(&r, stuck, &format!("seed {seed}"));
    }
    match stuck_peer_in_drain(RunOpts::default(), Driver::Stepped, 1, 1) {
        Err(RunError::Hang(h)) => assert!(
            h.stuck
                .iter()
                .any(|&(pid, pt)| pid != 1 && pt == Point::AckBarrier),
            "{h:?}"
        ),
        other => panic!("expected the step bound, got {other:?}"),
    }
}

/// The same on real OS threads: scheduler thread 1 gets stuck (the
/// `RunOpts::stuck_peer` test hook) once the whole-device cohort's drain is
/// pending; the run returns with the stall instead of hanging.
#[test]
fn a_stuck_peer_on_real_threads_ends_the_run_with_a_drain_stall() {
    let s = Scheduler::new(DeviceProfile::small()).unwrap();
    let g = whole_device_cohort(s.profile().clusters as u32);
    let opts = RunOpts {
        watchdog_ns: 500_000_000,
        stuck_peer: Some(1),
        ..RunOpts::default()
    };
    let r = s.run_threads(&g, opts).unwrap();
    assert_stalled_on(&r, 1, "real threads");
    // The device and the scheduler are fine for the next run.
    let patient = RunOpts {
        watchdog_ns: 60_000_000_000,
        ..RunOpts::default()
    };
    let r = s.run_threads(&g, patient).unwrap();
    assert!(r.fault.is_none() && r.outputs_exact() && r.drain_stall.is_none());
}
