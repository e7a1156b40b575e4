//! sync_start stress (D-15), starvation, handle bounds (D-03), admission, and
//! the per-pop fence counts (D-02/D-04) under the deterministic stepper.

use xtc::Error;
use xtc_dispatch::scenarios::{starvation, sync_start_stress};
use xtc_dispatch::{
    DeviceProfile, Graph, RunError, RunOpts, RunReport, Scheduler, Shape, StepOpts, TaskSpec,
};

fn small() -> Scheduler {
    Scheduler::new(DeviceProfile::small()).unwrap()
}

/// D-02/D-04: cross-task pops without sync_start have exactly one fence;
/// pops carrying a sync_start task have one fence per dispatched task.
fn assert_fence_counts(r: &RunReport) {
    if let Err(e) = r.check_fence_counts() {
        panic!("{e}");
    }
}

#[test]
fn sync_start_stress_100_rounds_no_hang_exact_outputs() {
    let s = small();
    let (mut drains, mut retries, mut sync_pops) = (0, 0, 0);
    for round in 0..100u64 {
        let g = sync_start_stress(s.profile().clusters, round);
        assert_eq!(g.len(), 54);
        let r = s
            .run_stepped(&g, RunOpts::default(), StepOpts::seeded(round))
            .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        assert_eq!(r.fault, None, "round {round}");
        assert!(r.outputs_exact(), "round {round}: an output slot is wrong");
        assert_fence_counts(&r);
        drains += r.summary.drains;
        retries += r.summary.drain_retries;
        sync_pops += r.pops.iter().filter(|p| p.sync).count();
    }
    // The scene exercises what it is built for: 12 MIX drains per run at
    // least (block_num 3 > the 2 clusters one thread owns), retries, and
    // sync pops on the per-task path.
    eprintln!("stress: drains {drains} retries {retries} sync pops {sync_pops}");
    assert!(drains >= 100 * 12, "drains {drains}");
    assert!(
        retries > 0 && sync_pops > 0,
        "retries {retries} sync pops {sync_pops}"
    );
}

#[test]
fn stress_passes_on_the_a2a3_profile_too() {
    let s = Scheduler::new(DeviceProfile::a2a3()).unwrap();
    for round in 0..3u64 {
        let g = sync_start_stress(24, round);
        let r = s
            .run_stepped(&g, RunOpts::default(), StepOpts::seeded(round))
            .unwrap();
        assert!(r.fault.is_none() && r.outputs_exact());
        assert_fence_counts(&r);
    }
}

#[test]
fn sync_cohorts_are_not_starved_by_normal_waves() {
    let s = small();
    let (g, sync) = starvation(s.profile().clusters);
    for seed in 0..10 {
        let r = s
            .run_stepped(&g, RunOpts::default(), StepOpts::seeded(seed))
            .unwrap();
        assert!(r.fault.is_none() && r.outputs_exact());
        let blocks = |task: usize| {
            r.events
                .iter()
                .filter(|e| e.desc.task as usize == task)
                .map(|e| (e.start_ns, e.end_ns))
                .collect::<Vec<_>>()
        };
        let last_normal_start = r
            .events
            .iter()
            .filter(|e| !sync.contains(&(e.desc.task as usize)))
            .map(|e| e.start_ns)
            .max()
            .unwrap();
        for &t in &sync {
            let b = blocks(t);
            let last_start = b.iter().map(|x| x.0).max().unwrap();
            let first_end = b.iter().map(|x| x.1).min().unwrap();
            // Every block of the cohort ran at the same time (one drain) ...
            assert!(last_start < first_end, "seed {seed} task {t}: {b:?}");
            // ... and it started before the normal waves ran out.
            assert!(
                last_start < last_normal_start,
                "seed {seed}: task {t} starved"
            );
        }
    }
}

#[test]
fn handles_per_flush_stay_within_clusters_times_3() {
    let s = small();
    let c = s.profile().clusters as u32;
    let mut g = Graph::new();
    // spmd_batch_dispatch_oob: two whole-device MIX tasks back to back, plus
    // a burst of single-block tasks.
    g.add(TaskSpec::new(Shape::Mix, 2 * c));
    g.add(TaskSpec::new(Shape::Mix, 2 * c));
    for _ in 0..40 {
        g.add(TaskSpec::new(Shape::Aiv, 1));
    }
    for seed in 0..5 {
        let r = s
            .run_stepped(&g, RunOpts::default(), StepOpts::seeded(seed))
            .unwrap();
        assert!(r.outputs_exact());
        let max = r.pops.iter().map(|p| p.max_flush).max().unwrap();
        assert!(max as usize <= s.profile().clusters * 3, "max {max}");
        assert!(max >= 3, "the bound was not approached: {max}");
    }
}

#[test]
fn bad_graphs_are_rejected_at_submit() {
    let s = small();
    let c = s.profile().clusters as u32;
    let reject = |t: TaskSpec| {
        let mut g = Graph::new();
        g.add(t);
        s.run_stepped(&g, RunOpts::default(), StepOpts::seeded(0))
            .err()
    };
    let inval = Some(RunError::Invalid(Error::Inval));
    assert_eq!(reject(TaskSpec::new(Shape::Mix, c + 1).sync()), inval);
    assert_eq!(reject(TaskSpec::new(Shape::Aiv, 2 * c + 1).sync()), inval);
    assert_eq!(reject(TaskSpec::new(Shape::Aic, 0)), inval);
    assert_eq!(reject(TaskSpec::new(Shape::Aic, 1).after(&[0])), inval);
    // Fits exactly: accepted (and runs).
    assert!(reject(TaskSpec::new(Shape::Aiv, 2 * c).sync()).is_none());
    let mut g = Graph::new();
    g.close_scope();
    assert_eq!(s.validate(&g), Err(Error::Inval));
    let opts = RunOpts {
        window: Some(0),
        ..RunOpts::default()
    };
    assert!(s.run_threads(&Graph::new(), opts).is_err());
}

#[test]
fn drain_entry_flushes_prepared_cores_even_without_the_exclusion() {
    // D-05: with the sync_start exclusion off, a pop's earlier tasks are
    // still only prepared when a later sync task enters drain; the flush
    // before entry must publish them. D-04 off also shows in the counts:
    // such pops then have one fence, not one per task.
    let s = small();
    let opts = RunOpts {
        sync_exclusion: false,
        ..RunOpts::default()
    };
    let (mut drains, mut multi) = (0, 0);
    for round in 0..30u64 {
        let g = sync_start_stress(s.profile().clusters, round);
        let r = s
            .run_stepped(&g, opts.clone(), StepOpts::seeded(round))
            .unwrap();
        assert!(r.fault.is_none() && r.outputs_exact());
        assert_eq!(r.summary.unpublished_at_drain, 0);
        assert!(r.pops.iter().all(|p| !p.sync && p.fences == 1));
        drains += r.summary.drains;
        multi += r.pops.iter().filter(|p| p.tasks > 1).count();
    }
    assert!(drains > 0 && multi > 0);
}

#[test]
fn a_second_run_during_a_run_is_refused() {
    let s = std::sync::Arc::new(small());
    let inner = s.clone();
    let refused = std::rc::Rc::new(std::cell::Cell::new(None));
    let r2 = refused.clone();
    let policy: xtc_dispatch::ProbePolicy = Box::new(move |_, _, _| {
        if r2.get().is_none() {
            let again = inner.run_stepped(&Graph::new(), RunOpts::default(), StepOpts::seeded(0));
            r2.set(Some(again.err() == Some(RunError::Invalid(Error::Again))));
            let threads = inner.run_threads(&Graph::new(), RunOpts::default());
            assert_eq!(threads.err(), Some(Error::Again));
        }
        true
    });
    let mut g = Graph::new();
    g.add(TaskSpec::new(Shape::Aic, 1));
    let so = StepOpts {
        policy: Some(policy),
        ..StepOpts::seeded(0)
    };
    assert!(
        s.run_stepped(&g, RunOpts::default(), so)
            .unwrap()
            .outputs_exact()
    );
    assert_eq!(refused.get(), Some(true));
    // Free again afterwards (real threads on a shared machine: a patient
    // watchdog).
    let patient = RunOpts {
        watchdog_ns: 60_000_000_000,
        ..RunOpts::default()
    };
    assert!(s.run_threads(&g, patient).unwrap().outputs_exact());
}
