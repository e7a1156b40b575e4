//! Shared helpers of the `dispatch_*` integration tests: the forced
//! schedules of the liveness proofs (D-06, D-07), each runnable under the
//! deterministic stepper or under `rt::Sim` with injected delays.
#![allow(dead_code)] // each test binary uses a subset

use std::cell::Cell;
use std::rc::Rc;

use xtc_dispatch::scenarios::retry_aba;
use xtc_dispatch::step::View;
use xtc_dispatch::{
    DeviceProfile, Escapes, Graph, Point, Probe, ProbePolicy, RunError, RunOpts, RunReport,
    Scheduler, Shape, SimOpts, StepOpts, TaskSpec,
};

/// One millisecond, ns.
pub const MS: u64 = 1_000_000;

/// Task window (ring slots) of the reclaim scenes.
pub const WINDOW: usize = 8;

/// Scheduler threads of the small profile.
pub const THREADS: usize = 3;

/// Which deterministic driver runs a forced schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// `Scheduler::run_stepped` (one poll per 100 ns step).
    Stepped,
    /// `Scheduler::run_sim` with `SimOpts::seeded` pacing (100 ns tick, up
    /// to 200 ns injected delay per pause).
    Sim,
}

/// Runs `g` on `s` under `driver` with `seed`, a step bound and an optional
/// policy.
pub fn drive(
    s: &Scheduler,
    g: &Graph,
    opts: RunOpts,
    driver: Driver,
    seed: u64,
    max_steps: u64,
    policy: Option<ProbePolicy>,
) -> Result<RunReport, RunError> {
    match driver {
        Driver::Stepped => s.run_stepped(
            g,
            opts,
            StepOpts {
                max_steps,
                policy,
                ..StepOpts::seeded(seed)
            },
        ),
        Driver::Sim => s.run_sim(
            g,
            opts,
            SimOpts {
                max_steps,
                policy,
                ..SimOpts::seeded(seed)
            },
        ),
    }
}

/// Task 0 faults after 50 µs (the run latches completed with an error);
/// task 1 is a short starter queued behind it (FIFO: task 0 is dispatched
/// first); task 2, after the starter, is a sync_start MIX cohort over every
/// cluster, so its drain keeps retrying while task 0 holds a core.
pub fn fault_during_drain(clusters: u32) -> Graph {
    let mut g = Graph::new();
    g.add(TaskSpec::new(Shape::Aiv, 1).lasting(50_000).failing());
    g.add(TaskSpec::new(Shape::Aiv, 1).lasting(2_000));
    g.add(
        TaskSpec::new(Shape::Mix, clusters)
            .sync()
            .after(&[1])
            .lasting(5_000),
    );
    g
}

/// The policy of the upstream hang: once the drain is pending, the thread Y
/// that owns the faulting task is held at its loop yield until the task has
/// finished on its core and a peer waits in the ack barrier; then Y retires
/// the fault, latches completed and leaves, while the peer is in the barrier.
pub fn exit_while_peer_in_barrier_policy() -> ProbePolicy {
    let mut owner: Option<usize> = None;
    let mut released = false;
    Box::new(move |v: &View<'_>, p: &Probe, pid: usize| {
        if owner.is_none() {
            owner = p.task_thread(0);
        }
        // Y runs freely until a drain is pending (it must retire the
        // starter if it runs it).
        if Some(pid) != owner || released || v.points[pid] != Point::Loop || p.drain_pending() <= 0
        {
            return true;
        }
        let peer_in_barrier = (0..THREADS).any(|q| q != pid && v.points[q] == Point::AckBarrier);
        released = p.task_finished_on_core(0) && peer_in_barrier;
        released
    })
}

/// [`exit_while_peer_in_barrier_policy`] over [`fault_during_drain`] with
/// `escapes`, 300 k steps.
pub fn exit_while_peer_in_barrier(
    escapes: Escapes,
    driver: Driver,
    seed: u64,
) -> Result<RunReport, RunError> {
    let opts = RunOpts {
        escapes,
        ..RunOpts::default()
    };
    exit_while_peer_in_barrier_with(opts, driver, seed)
}

/// As [`exit_while_peer_in_barrier`], with the whole `RunOpts`.
pub fn exit_while_peer_in_barrier_with(
    opts: RunOpts,
    driver: Driver,
    seed: u64,
) -> Result<RunReport, RunError> {
    let s = Scheduler::new(DeviceProfile::small()).unwrap();
    let g = fault_during_drain(s.profile().clusters as u32);
    let policy = exit_while_peer_in_barrier_policy();
    drive(&s, &g, opts, driver, seed, 300_000, Some(policy))
}

/// The retry-ABA policy: thread P passes the ack barrier of attempt A and is
/// parked before the election; the elected peer finds the holder's cluster
/// busy and resets (retry). P is released once the holder finished and both
/// peers wait in the next attempt's barrier. `exercised` is set when P was
/// parked and released after a retry.
pub fn retry_aba_policy(exercised: Rc<Cell<bool>>) -> ProbePolicy {
    let mut holder: Option<usize> = None;
    Box::new(move |v: &View<'_>, p: &Probe, pid: usize| {
        if holder.is_none() {
            holder = p.task_thread(0);
        }
        let Some(h) = holder else { return true };
        let parked = (h + 1) % THREADS;
        let retried = p.drain_retries() >= 1;
        // In the first attempt, peers wait before the election until P got
        // there too, so P is parked inside attempt A (not after its reset).
        if !retried
            && pid < THREADS
            && pid != parked
            && v.points[pid] == Point::BeforeElect
            && v.points[parked] != Point::BeforeElect
        {
            return false;
        }
        if pid == parked && !exercised.get() && v.points[pid] == Point::BeforeElect {
            let peers_waiting = (0..THREADS)
                .filter(|&q| q != parked)
                .all(|q| v.points[q] == Point::AckBarrier);
            let go = retried && p.task_completed(0) && peers_waiting;
            exercised.set(go);
            return go;
        }
        if pid == h && retried && v.points[pid] == Point::Loop && !p.task_completed(0) {
            return p.task_finished_on_core(0);
        }
        true
    })
}

/// The retry-ABA schedule over `scenarios::retry_aba` with generation tags
/// on or off, 300 k steps. Returns the result and whether the schedule was
/// exercised.
pub fn retry_aba_schedule(
    tags: bool,
    driver: Driver,
    seed: u64,
) -> (Result<RunReport, RunError>, bool) {
    let s = Scheduler::new(DeviceProfile::small()).unwrap();
    let g = retry_aba(s.profile().clusters);
    let exercised = Rc::new(Cell::new(false));
    let policy = retry_aba_policy(exercised.clone());
    let opts = RunOpts {
        generation_tags: tags,
        ..RunOpts::default()
    };
    let r = drive(&s, &g, opts, driver, seed, 300_000, Some(policy));
    (r, exercised.get())
}

/// The reclaim scene (D-08..D-13): `xtc_dispatch::scenarios::open_scope`.
pub fn open_scope_graph() -> Graph {
    xtc_dispatch::scenarios::open_scope()
}

/// The split barrier of the retry-ABA schedule without generation tags: the
/// stale thread won attempt A's election after the reset and waits for
/// staging (`StageDone`); its two peers wait for its ack of attempt A+1.
pub fn assert_split_barrier(h: &xtc_dispatch::step::Hang, seed: u64) {
    let pts: Vec<Point> = h
        .stuck
        .iter()
        .filter(|s| s.0 < THREADS)
        .map(|s| s.1)
        .collect();
    assert!(pts.contains(&Point::StageDone), "seed {seed}: {h:?}");
    assert_eq!(
        pts.iter().filter(|&&p| p == Point::AckBarrier).count(),
        2,
        "seed {seed}: {h:?}"
    );
}

/// One sync_start MIX cohort over every cluster: no single scheduler thread
/// owns all clusters, so it always goes through a drain.
pub fn whole_device_cohort(clusters: u32) -> Graph {
    let mut g = Graph::new();
    g.add(TaskSpec::new(Shape::Mix, clusters).sync().lasting(5_000));
    g
}

/// A peer stuck outside the drain: once a drain is pending, scheduler
/// thread `stuck` is never polled at its loop yield (nor before its first
/// poll) until the run completed, so it never reaches the ack barrier, yet
/// it has not left either. The others wait for its ack.
pub fn stuck_peer_policy(stuck: usize) -> ProbePolicy {
    Box::new(move |v: &View<'_>, p: &Probe, pid: usize| {
        let outside = matches!(v.points[pid], Point::Loop | Point::Start);
        pid != stuck || !outside || p.drain_pending() == 0 || p.completed()
    })
}

/// [`stuck_peer_policy`] over [`whole_device_cohort`] on the small profile
/// with `opts`, 300 k steps.
pub fn stuck_peer_in_drain(
    opts: RunOpts,
    driver: Driver,
    seed: u64,
    stuck: usize,
) -> Result<RunReport, RunError> {
    let s = Scheduler::new(DeviceProfile::small()).unwrap();
    let g = whole_device_cohort(s.profile().clusters as u32);
    drive(
        &s,
        &g,
        opts,
        driver,
        seed,
        300_000,
        Some(stuck_peer_policy(stuck)),
    )
}

/// The report of a run that a drain watchdog ended because `stuck` never
/// acked: `Internal`, a stall at the ack barrier naming only `stuck`, by a
/// thread other than it; the drain abandoned.
pub fn assert_stalled_on(r: &RunReport, stuck: usize, what: &str) {
    assert_eq!(r.fault, Some(xtc::Error::Internal), "{what}");
    let stall = r
        .drain_stall
        .as_ref()
        .unwrap_or_else(|| panic!("{what}: no stall"));
    assert_eq!(stall.point, Point::AckBarrier, "{what}: {stall}");
    assert_eq!(stall.waiting_for, vec![stuck], "{what}: {stall}");
    assert_ne!(stall.thread, stuck, "{what}: {stall}");
    assert!(stall.at_ns >= stall.since_ns, "{what}: {stall}");
    assert!(r.drains_abandoned >= 1, "{what}");
}
