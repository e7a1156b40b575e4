//! The dispatch protocol under the crate's simulator `rt::Sim` with seeded
//! injected delays (`Scheduler::run_sim`): every scheduler thread, the core
//! host and the orchestrator is an `rt` process on its own Sim loop, each
//! pause sleeps a tick plus a seeded delay, the Sim's seeded pick decides the
//! interleaving, and time is the Sim's virtual clock. A hang is detected by
//! the step bound (`RunError::Hang`, naming the seed), never a real hang.
//! Every failure message names its seed.

mod dispatch_support;

use dispatch_support::{
    Driver, MS, THREADS, WINDOW, assert_split_barrier, assert_stalled_on,
    exit_while_peer_in_barrier, exit_while_peer_in_barrier_with, fault_during_drain,
    open_scope_graph, retry_aba_schedule, stuck_peer_in_drain,
};
use xtc::Error;
use xtc::rt::TraceKind;
use xtc_dispatch::scenarios::{decode_waves, sync_start_stress};
use xtc_dispatch::{
    DeviceProfile, Escapes, Graph, Point, PublishMode, RunError, RunOpts, RunReport, Scheduler,
    Shape, SimOpts, StallEnd, StepOpts, TaskSpec,
};

fn small() -> Scheduler {
    Scheduler::new(DeviceProfile::small()).unwrap()
}

/// D-01/D-02/D-04 counts: every prepared core got exactly one doorbell
/// store; a cross-task pop without a sync_start task fences once, a pop
/// carrying one fences per task, a drain staging fences once.
fn assert_publication_counts(r: &RunReport, mode: PublishMode, seed: u64) {
    let stores: u32 = r.pops.iter().map(|p| p.doorbells).sum();
    assert_eq!(stores as usize, r.events.len(), "seed {seed}");
    assert_eq!(r.events.len(), r.outputs.len(), "seed {seed}");
    for p in &r.pops {
        let want = if p.drain {
            1
        } else if p.sync || mode == PublishMode::PerTask {
            p.tasks
        } else {
            1
        };
        assert_eq!(p.fences, want, "seed {seed}: {p:?}");
    }
}

/// Pacing profiles `(tick_ns, max_delay_ns)`: lock-step rounds (no
/// injected delay), the default jitter, and heavy skew (a pause may last up
/// to 20 µs, the length of the longest subtask, so threads drift apart).
const PROFILES: [(u64, u64); 3] = [(100, 0), (100, 200), (100, 20_000)];

#[test]
fn sync_start_stress_under_sim_100_seeds_no_hang_exact_outputs() {
    let s = small();
    for (tick_ns, max_delay_ns) in PROFILES {
        let (mut drains, mut retries, mut sync_pops, mut multi) = (0, 0, 0, 0);
        for seed in 0..100u64 {
            let g = sync_start_stress(s.profile().clusters, seed);
            let so = SimOpts {
                tick_ns,
                max_delay_ns,
                ..SimOpts::seeded(seed)
            };
            let r = s
                .run_sim(&g, RunOpts::default(), so)
                .unwrap_or_else(|e| panic!("seed {seed} delay {max_delay_ns}: {e:?}"));
            assert_eq!(r.fault, None, "seed {seed} delay {max_delay_ns}");
            assert!(
                r.outputs_exact(),
                "seed {seed} delay {max_delay_ns}: an output slot is wrong"
            );
            assert_publication_counts(&r, PublishMode::CrossTask, seed);
            drains += r.summary.drains;
            retries += r.summary.drain_retries;
            sync_pops += r.pops.iter().filter(|p| p.sync).count();
            multi += r.pops.iter().filter(|p| !p.sync && p.tasks > 1).count();
        }
        eprintln!(
            "sim stress (tick {tick_ns} ns, delay <= {max_delay_ns} ns): drains {drains} \
             retries {retries} sync pops {sync_pops} multi-task pops {multi}"
        );
        // 12 MIX drains per run at least (block_num 3 > the 2 clusters one
        // thread owns), retries, sync pops on the per-task path, and normal
        // pops of several tasks on the cross-task path.
        assert!(drains >= 100 * 12, "delay {max_delay_ns}: drains {drains}");
        assert!(
            retries > 0 && sync_pops > 0,
            "delay {max_delay_ns}: retries {retries} sync {sync_pops}"
        );
        assert!(
            multi > 0,
            "delay {max_delay_ns}: the cross-task path never engaged"
        );
    }
}

#[test]
fn cross_task_and_per_task_publication_counts_under_sim() {
    let s = small();
    for seed in 0..4u64 {
        for mode in [PublishMode::CrossTask, PublishMode::PerTask] {
            let opts = RunOpts {
                publish: mode,
                ..RunOpts::default()
            };
            let r = s
                .run_sim(&decode_waves(6, 8, 20_000), opts, SimOpts::seeded(seed))
                .unwrap_or_else(|e| panic!("seed {seed} {mode:?}: {e:?}"));
            assert!(
                r.fault.is_none() && r.outputs_exact(),
                "seed {seed} {mode:?}"
            );
            assert_publication_counts(&r, mode, seed);
            assert!(
                r.pops.iter().any(|p| p.tasks > 1),
                "seed {seed} {mode:?}: no pop carried several tasks"
            );
        }
    }
}

fn traced(s: &Scheduler, seed: u64, sched_seed: u64) -> RunReport {
    let g = sync_start_stress(s.profile().clusters, seed);
    let so = SimOpts {
        keep_trace: true,
        ..SimOpts::seeded(sched_seed)
    };
    s.run_sim(&g, RunOpts::default(), so)
        .unwrap_or_else(|e| panic!("seed {sched_seed}: {e:?}"))
}

/// The order in which processes were polled (loop index = process id).
fn poll_order(r: &RunReport) -> Vec<usize> {
    r.sim_trace
        .iter()
        .filter(|e| e.kind == TraceKind::Poll)
        .map(|e| e.loop_idx)
        .collect()
}

#[test]
fn same_seed_same_schedule_different_seeds_differ() {
    let s = small();
    let a = traced(&s, 5, 21);
    let b = traced(&s, 5, 21);
    assert!(!a.sim_trace.is_empty());
    assert_eq!(a.sim_trace, b.sim_trace, "seed 21: the trace differs");
    assert_eq!(a.events, b.events, "seed 21: core events differ");
    assert_eq!(a.pops, b.pops, "seed 21: pops differ");
    assert_eq!(a.end_ns, b.end_ns, "seed 21");
    // The same graph under other seeds: other interleavings, same outputs.
    let mut orders = vec![poll_order(&a)];
    for seed in 22..26 {
        let c = traced(&s, 5, seed);
        assert!(c.outputs_exact(), "seed {seed}");
        let o = poll_order(&c);
        assert!(
            !orders.contains(&o),
            "seed {seed}: same interleaving as another seed"
        );
        orders.push(o);
    }
}

#[test]
fn without_completed_escapes_the_barrier_hang_is_detected_under_sim() {
    for seed in 0..12 {
        match exit_while_peer_in_barrier(Escapes::NONE, Driver::Sim, seed) {
            Err(RunError::Hang(h)) => {
                assert_eq!(h.seed, seed);
                // Only scheduler threads remain, all spinning in the ack barrier.
                assert!(!h.stuck.is_empty(), "seed {seed}: {h:?}");
                assert!(
                    h.stuck
                        .iter()
                        .all(|&(pid, pt)| pid < THREADS && pt == Point::AckBarrier),
                    "seed {seed}: {h:?}"
                );
            }
            other => panic!("seed {seed}: expected a detected hang, got {other:?}"),
        }
    }
}

#[test]
fn with_completed_escapes_the_same_schedule_ends_under_sim() {
    for seed in 0..12 {
        let r = exit_while_peer_in_barrier(Escapes::ALL, Driver::Sim, seed)
            .unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
        assert_eq!(r.fault, Some(Error::Internal), "seed {seed}");
        assert!(
            r.drains_abandoned >= 1,
            "seed {seed}: the escape was not exercised"
        );
    }
}

#[test]
fn each_escape_alone_is_what_saves_the_barrier_under_sim() {
    let seed = 11;
    let only_barrier = Escapes {
        ack_barrier: true,
        ..Escapes::NONE
    };
    let r = exit_while_peer_in_barrier(only_barrier, Driver::Sim, seed);
    assert!(r.is_ok(), "seed {seed}: {r:?}");
    let all_but_barrier = Escapes {
        ack_barrier: false,
        ..Escapes::ALL
    };
    let r = exit_while_peer_in_barrier(all_but_barrier, Driver::Sim, seed);
    assert!(matches!(r, Err(RunError::Hang(_))), "seed {seed}: {r:?}");
}

#[test]
fn injected_delays_alone_find_the_escape_less_hang() {
    // No forced schedule: the fault latches completed while the cohort's
    // drain keeps retrying, and the Sim's seeded interleavings with
    // injected delays put a peer in the ack barrier often enough.
    let s = small();
    let g = fault_during_drain(s.profile().clusters as u32);
    let mut hangs = 0;
    for seed in 0..16 {
        for escapes in [Escapes::NONE, Escapes::ALL] {
            let opts = RunOpts {
                escapes,
                ..RunOpts::default()
            };
            let so = SimOpts {
                max_delay_ns: 2_000,
                max_steps: 50_000,
                ..SimOpts::seeded(seed)
            };
            match (escapes == Escapes::ALL, s.run_sim(&g, opts, so)) {
                (true, r) => {
                    let r = r.unwrap_or_else(|e| panic!("seed {seed}: hang with escapes: {e:?}"));
                    assert_eq!(r.fault, Some(Error::Internal), "seed {seed}");
                }
                (false, Err(RunError::Hang(h))) => {
                    assert_eq!(h.seed, seed);
                    assert!(
                        h.stuck
                            .iter()
                            .all(|&(pid, pt)| pid < THREADS && pt == Point::AckBarrier),
                        "seed {seed}: {h:?}"
                    );
                    hangs += 1;
                }
                (false, Ok(r)) => assert_eq!(r.fault, Some(Error::Internal), "seed {seed}"),
                (false, Err(e)) => panic!("seed {seed}: {e:?}"),
            }
        }
    }
    eprintln!("unforced, escapes off: {hangs}/16 seeds hang (detected)");
    assert!(hangs >= 1, "no seed found the hang");
}

#[test]
fn the_watchdog_sees_drain_spins_under_sim() {
    // D-13 and beyond (issue 12): a watchdog far shorter than the virtual
    // time the escape-less hang lasted ends it with a drain stall at the
    // ack barrier, naming the one thread that left.
    let opts = RunOpts {
        escapes: Escapes::NONE,
        watchdog_ns: 200_000,
        ..RunOpts::default()
    };
    let seed = 4;
    let r = exit_while_peer_in_barrier_with(opts, Driver::Sim, seed)
        .unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
    assert_eq!(r.fault, Some(Error::Internal), "seed {seed}");
    let stall = r.drain_stall.expect("a drain stall");
    assert_eq!(stall.point, Point::AckBarrier, "seed {seed}: {stall}");
    assert_eq!(stall.waiting_for.len(), 1, "seed {seed}: {stall}");
    assert_ne!(stall.waiting_for[0], stall.thread, "seed {seed}: {stall}");
}

/// Issue 12 under `rt::Sim` with injected delays: a peer held outside the
/// drain (never acks, never leaves) ends the run with a drain stall at the
/// ack barrier naming it, on every seed.
#[test]
fn a_stuck_peer_ends_the_run_with_a_drain_stall_under_sim() {
    let opts = RunOpts {
        watchdog_ns: 200_000,
        ..RunOpts::default()
    };
    for seed in 0..12 {
        let stuck = (seed as usize + 1) % THREADS;
        let r = stuck_peer_in_drain(opts.clone(), Driver::Sim, seed, stuck)
            .unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
        assert_stalled_on(&r, stuck, &format!("seed {seed}"));
    }
}

#[test]
fn retry_aba_without_generation_tags_splits_the_barrier_under_sim() {
    for seed in 0..12 {
        let (r, exercised) = retry_aba_schedule(false, Driver::Sim, seed);
        assert!(
            exercised,
            "seed {seed}: not exercised, the retry never happened"
        );
        match r {
            Err(RunError::Hang(h)) => {
                assert_eq!(h.seed, seed);
                assert_split_barrier(&h, seed);
            }
            other => panic!("seed {seed}: expected a detected split barrier, got {other:?}"),
        }
    }
}

#[test]
fn retry_aba_with_generation_tags_completes_under_sim() {
    for seed in 0..12 {
        let (r, exercised) = retry_aba_schedule(true, Driver::Sim, seed);
        assert!(
            exercised,
            "seed {seed}: not exercised, the retry never happened"
        );
        let r = r.unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
        assert!(r.fault.is_none() && r.outputs_exact(), "seed {seed}");
        assert!(r.summary.drain_retries >= 1, "seed {seed}");
    }
}

fn reclaim_run(handshake: bool, seed: u64) -> RunReport {
    let s = small();
    let opts = RunOpts {
        window: Some(WINDOW),
        handshake,
        ..RunOpts::default()
    };
    let so = SimOpts {
        tick_ns: 1_000,
        max_delay_ns: 500,
        max_steps: 2_000_000,
        ..SimOpts::seeded(seed)
    };
    s.run_sim(&open_scope_graph(), opts, so)
        .unwrap_or_else(|e| panic!("seed {seed}: {e:?}"))
}

#[test]
fn reclaim_with_handshake_acked_about_10ms_into_the_stall_under_sim() {
    for seed in 0..3 {
        let r = reclaim_run(true, seed);
        assert!(r.fault.is_none() && r.outputs_exact(), "seed {seed}");
        let st = r
            .stalls
            .iter()
            .find(|s| s.task == WINDOW)
            .unwrap_or_else(|| panic!("seed {seed}: task 8 never stalled"));
        assert_eq!(st.how, StallEnd::Acked, "seed {seed}: {st:?}");
        let waited = st.end_ns - st.start_ns;
        assert!((10 * MS..11 * MS).contains(&waited), "seed {seed}: {st:?}");
        assert!(
            r.stalls.iter().all(|s| s.how != StallEnd::Backstop),
            "seed {seed}"
        );
    }
}

#[test]
fn reclaim_without_handshake_stalls_until_the_backstop_under_sim() {
    let seed = 1;
    let r = reclaim_run(false, seed);
    assert!(r.fault.is_none() && r.outputs_exact(), "seed {seed}");
    let st = r
        .stalls
        .iter()
        .find(|s| s.task == WINDOW)
        .unwrap_or_else(|| panic!("seed {seed}: task 8 never stalled"));
    assert_eq!(st.how, StallEnd::Backstop, "seed {seed}: {st:?}");
    assert!(st.end_ns - st.start_ns >= 100 * MS, "seed {seed}: {st:?}");
}

#[test]
fn deadlock_verdict_only_from_an_acknowledged_head_under_sim() {
    // D-12: a scope larger than the window. The published head equals the
    // scope's first task from the start of the stall, but only the acked
    // head at ~10 ms gives the verdict; without the handshake, no verdict.
    let s = small();
    let mut g = Graph::new();
    g.open_scope();
    for _ in 0..WINDOW + 2 {
        g.add(TaskSpec::new(Shape::Aiv, 1).lasting(2_000));
    }
    g.close_scope();
    for (handshake, verdicts) in [(true, 1), (false, 0)] {
        let seed = 2;
        let opts = RunOpts {
            window: Some(WINDOW),
            handshake,
            ..RunOpts::default()
        };
        let so = SimOpts {
            tick_ns: 1_000,
            max_delay_ns: 500,
            ..SimOpts::seeded(seed)
        };
        let r = s
            .run_sim(&g, opts, so)
            .unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
        assert_eq!(r.fault, Some(Error::Range), "seed {seed}");
        assert_eq!(r.verdicts, verdicts, "seed {seed} handshake {handshake}");
        let end = if handshake {
            10 * MS..20 * MS
        } else {
            100 * MS..u64::MAX
        };
        assert!(end.contains(&r.end_ns), "seed {seed}: {}", r.end_ns);
    }
}

#[test]
fn abandoned_drain_state_is_reset_before_the_next_run_under_sim() {
    // D-07: after a Sim run abandoned its drain (the fault latched while
    // the cohort's drain was pending), the next Sim run on the same device
    // passes the stress scene exactly.
    let s = small();
    let seed = 3;
    let r = exit_while_peer_in_barrier_on(&s, Escapes::ALL, seed);
    assert_eq!(r.fault, Some(Error::Internal), "seed {seed}");
    assert!(r.drains_abandoned >= 1, "seed {seed}");
    let r = s
        .run_sim(
            &sync_start_stress(6, seed),
            RunOpts::default(),
            SimOpts::seeded(seed),
        )
        .unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
    assert!(r.fault.is_none() && r.outputs_exact(), "seed {seed}");
}

fn exit_while_peer_in_barrier_on(s: &Scheduler, escapes: Escapes, seed: u64) -> RunReport {
    let opts = RunOpts {
        escapes,
        ..RunOpts::default()
    };
    let g = fault_during_drain(s.profile().clusters as u32);
    let policy = dispatch_support::exit_while_peer_in_barrier_policy();
    dispatch_support::drive(s, &g, opts, Driver::Sim, seed, 300_000, Some(policy))
        .unwrap_or_else(|e| panic!("seed {seed}: {e:?}"))
}

#[test]
fn bad_graphs_and_concurrent_runs_are_refused_under_sim() {
    let s = std::sync::Arc::new(small());
    let mut bad = Graph::new();
    bad.add(TaskSpec::new(Shape::Mix, s.profile().clusters as u32 + 1).sync());
    assert_eq!(
        s.run_sim(&bad, RunOpts::default(), SimOpts::seeded(0))
            .err(),
        Some(RunError::Invalid(Error::Inval))
    );
    // A policy runs inside the Sim run: another run of the same scheduler
    // is refused with Again, by every driver.
    let inner = s.clone();
    let refused = std::rc::Rc::new(std::cell::Cell::new(None));
    let r2 = refused.clone();
    let policy: xtc_dispatch::ProbePolicy = Box::new(move |_, _, _| {
        if r2.get().is_none() {
            let sim = inner.run_sim(&Graph::new(), RunOpts::default(), SimOpts::seeded(1));
            let stepped = inner.run_stepped(&Graph::new(), RunOpts::default(), StepOpts::seeded(1));
            let threads = inner.run_threads(&Graph::new(), RunOpts::default());
            let again = Some(RunError::Invalid(Error::Again));
            r2.set(Some(
                sim.err() == again && stepped.err() == again && threads.err() == Some(Error::Again),
            ));
        }
        true
    });
    let mut g = Graph::new();
    g.add(TaskSpec::new(Shape::Aic, 1));
    let so = SimOpts {
        policy: Some(policy),
        ..SimOpts::seeded(0)
    };
    let r = s.run_sim(&g, RunOpts::default(), so).unwrap();
    assert!(r.outputs_exact());
    assert_eq!(refused.get(), Some(true));
    // Free again afterwards.
    let r = s
        .run_sim(&g, RunOpts::default(), SimOpts::seeded(0))
        .unwrap();
    assert!(r.outputs_exact());
}
