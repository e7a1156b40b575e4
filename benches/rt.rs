//! Runtime speed (issue 2 targets on the 2-core build machine: `yield_now`
//! round trip <= 100 ns; cross-thread promise-set-to-wake <= 20 us median).
//!
//! - `spawn_run_empty`: spawn one empty process and `run` the loop until it
//!   has completed and left the table.
//! - `yield_round_trip`: one `yield_now().await` of a lone process (wake into
//!   the inbox, move to the ready set, pick, poll).
//! - `cross_thread_wake`: a promise set on another OS thread while the loop is
//!   parked in `epoll_wait`, to the awaiting process running again (eventfd
//!   wake, epoll return, poll); measured from just before `set` to the resume.

use criterion::{Criterion, criterion_group, criterion_main};
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};
use xtc::rt::{self, Loop, Promise, future_pair};

fn spawn_run_empty(c: &mut Criterion) {
    let lp = Loop::new().unwrap();
    c.bench_function("rt/spawn_run_empty", |b| {
        b.iter(|| {
            lp.spawn(async {}).unwrap();
            lp.run().unwrap();
        })
    });
}

fn yield_round_trip(c: &mut Criterion) {
    let lp = Loop::new().unwrap();
    c.bench_function("rt/yield_round_trip", |b| {
        b.iter_custom(|iters| {
            let took = Rc::new(Cell::new(Duration::ZERO));
            let t = took.clone();
            lp.spawn(async move {
                let start = Instant::now();
                for _ in 0..iters {
                    rt::yield_now().await;
                }
                t.set(start.elapsed());
            })
            .unwrap();
            lp.run().unwrap();
            took.get()
        })
    });
}

fn cross_thread_wake(c: &mut Criterion) {
    let lp = Loop::new().unwrap();
    let (to_setter, setter_rx) = crossbeam_channel::unbounded::<Promise<Instant>>();
    let setter = std::thread::spawn(move || {
        while let Ok(p) = setter_rx.recv() {
            p.set(Ok(Instant::now()));
        }
    });
    c.bench_function("rt/cross_thread_wake", |b| {
        b.iter_custom(|iters| {
            let total = Rc::new(Cell::new(Duration::ZERO));
            let (t, tx) = (total.clone(), to_setter.clone());
            lp.spawn(async move {
                for _ in 0..iters {
                    let (fut, promise) = future_pair::<Instant>();
                    tx.send(promise).unwrap();
                    let set_at = fut.await.unwrap();
                    t.set(t.get() + set_at.elapsed());
                }
            })
            .unwrap();
            lp.run().unwrap();
            total.get()
        })
    });
    drop(to_setter);
    setter.join().unwrap();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = spawn_run_empty, yield_round_trip, cross_thread_wake
}
criterion_main!(benches);
