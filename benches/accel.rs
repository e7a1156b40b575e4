//! accel figures: probe over a fixture tree, fence wait/signal costs,
//! placement and routing. Run: `cargo bench --bench accel`.

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use xtc::accel::{self, EventFence, SyncFile};
use xtc::batch::{Router, place};

fn probe(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("devices/amd-two-render");
    c.bench_function("probe_in amd-two-render (2 nodes)", |b| {
        b.iter(|| accel::probe_in(black_box(&root)).unwrap())
    });
}

fn fences(c: &mut Criterion) {
    let pending = SyncFile::from_fd(EventFence::new().unwrap().try_clone_fd().unwrap());
    c.bench_function("SyncFile::wait(0) pending (one poll)", |b| {
        b.iter(|| pending.wait(Some(Duration::ZERO)).unwrap())
    });
    c.bench_function("EventFence new+signal+wait+drop", |b| {
        b.iter(|| {
            let f = EventFence::new().unwrap();
            f.signal().unwrap();
            f.wait(None).unwrap()
        })
    });
}

fn placement(c: &mut Criterion) {
    let nodes = [
        Some(0),
        Some(1),
        Some(2),
        Some(3),
        Some(0),
        Some(1),
        Some(2),
        Some(3),
    ];
    c.bench_function("place (8 loops, 4 nodes)", |b| {
        b.iter(|| place(black_box(Some(3)), black_box(&nodes), 4))
    });
    let r = Router::new((0..16u32).collect::<Vec<_>>()).unwrap();
    let mut key = 0u64;
    c.bench_function("Router::route (16 groups)", |b| {
        b.iter(|| {
            key = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
            *r.route(black_box(key))
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    targets = probe, fences, placement
}
criterion_main!(benches);
