//! Dispatch benchmarks: wall time of a decode-like graph on real threads with
//! per-task vs cross-task publication (a2a3 profile, one scheduler thread),
//! and the scheduler's CPU cost on the stepped sync_start stress scene.
//! The span figures (D-14) come from `cargo run --example npu_dispatch`.

use criterion::{Criterion, criterion_group, criterion_main};
use xtc_dispatch::scenarios::{decode_waves, sync_start_stress};
use xtc_dispatch::{DeviceProfile, PublishMode, RunOpts, Scheduler, StepOpts};

fn publication(c: &mut Criterion) {
    let prof = DeviceProfile {
        sched_threads: 1,
        ..DeviceProfile::a2a3()
    };
    let s = Scheduler::new(prof).unwrap();
    let g = decode_waves(10, 24, 20_000);
    let mut grp = c.benchmark_group("decode_waves_10x24");
    grp.sample_size(10);
    for (name, mode) in [
        ("per_task", PublishMode::PerTask),
        ("cross_task", PublishMode::CrossTask),
    ] {
        grp.bench_function(name, |b| {
            b.iter(|| {
                let opts = RunOpts {
                    publish: mode,
                    ..RunOpts::default()
                };
                let r = s.run_threads(&g, opts).unwrap();
                assert!(r.outputs_exact());
            })
        });
    }
    grp.finish();
}

fn stepped_stress(c: &mut Criterion) {
    let s = Scheduler::new(DeviceProfile::small()).unwrap();
    let g = sync_start_stress(6, 1);
    let mut grp = c.benchmark_group("stepped");
    grp.sample_size(10);
    grp.bench_function("sync_start_stress_54", |b| {
        b.iter(|| {
            let r = s
                .run_stepped(&g, RunOpts::default(), StepOpts::seeded(1))
                .unwrap();
            assert!(r.outputs_exact());
        })
    });
    grp.finish();
}

criterion_group!(benches, publication, stepped_stress);
criterion_main!(benches);
