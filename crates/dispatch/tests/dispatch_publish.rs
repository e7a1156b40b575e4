//! Batched publication on real threads (D-01..D-04, D-14 counts): one fence
//! per cross-task pop, one per task in per-task mode and in sync pops,
//! doorbell stores = prepared cores, exact outputs; plus the stress scene on
//! real threads. No timing is asserted (spans are reported by the bench).

use xtc_dispatch::scenarios::{decode_waves, sync_start_stress};
use xtc_dispatch::{DeviceProfile, PublishMode, RunOpts, RunReport, Scheduler, chrome_trace};

fn profile() -> DeviceProfile {
    // Real threads on a small shared machine: 2 scheduler threads, 6 clusters.
    DeviceProfile {
        sched_threads: 2,
        ..DeviceProfile::small()
    }
}

/// Options for runs on real threads on a shared machine: a watchdog a
/// thread descheduled for seconds does not trip.
fn patient() -> RunOpts {
    RunOpts {
        watchdog_ns: 60_000_000_000,
        ..RunOpts::default()
    }
}

fn run(mode: PublishMode) -> RunReport {
    let s = Scheduler::new(profile()).unwrap();
    let g = decode_waves(6, 8, 20_000);
    let opts = RunOpts {
        publish: mode,
        ..patient()
    };
    s.run_threads(&g, opts).unwrap()
}

#[test]
fn cross_task_pops_fence_once_and_per_task_pops_fence_per_task() {
    let cross = run(PublishMode::CrossTask);
    let per = run(PublishMode::PerTask);
    for r in [&cross, &per] {
        assert!(r.fault.is_none() && r.outputs_exact());
        // Every prepared core got exactly one doorbell store.
        let stores: u32 = r.pops.iter().map(|p| p.doorbells).sum();
        assert_eq!(stores as usize, r.events.len());
        assert_eq!(r.events.len(), r.outputs.len());
    }
    assert!(cross.pops.iter().all(|p| p.fences == 1));
    assert!(per.pops.iter().all(|p| p.fences == p.tasks));
    // The cross-task path engaged: some pops carried several tasks.
    assert!(cross.pops.iter().any(|p| p.tasks > 1));
    // The swimlane export holds one event per subtask.
    let v: serde_json::Value = serde_json::from_str(&chrome_trace(&cross.events)).unwrap();
    let slices = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .count();
    assert_eq!(slices, cross.events.len());
}

#[test]
fn stress_scene_on_real_threads() {
    let s = Scheduler::new(profile()).unwrap();
    for round in 0..3 {
        let r = s
            .run_threads(&sync_start_stress(6, round), patient())
            .unwrap();
        assert!(r.fault.is_none() && r.outputs_exact(), "round {round}");
        for p in r.pops.iter().filter(|p| p.sync) {
            assert_eq!(p.fences, p.tasks);
        }
    }
}
