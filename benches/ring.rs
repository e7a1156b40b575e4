//! Admission ring speed (issue 8 targets): an uncontended `submit_mt` hand-in
//! (claim a record, stamp a handle, push) should take at most 50 ns, and two
//! producer threads together should get at least 10 M hand-ins/s drained by
//! one consumer: the ring alone, and through a real group's owner loop
//! (drain, admit, iterate, complete) with producers that back off as the
//! rustdoc says (and, for comparison, producers that spin).
//!
//! `cargo bench --bench ring` (figures go to docs/arch/ring.md).

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use xtc::batch::ring::bench_support::admission;
use xtc::batch::{AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Item, StepResult};
use xtc::rt::{self, Loop};

/// Hand-ins timed per chunk; the consumer drains between chunks, untimed.
const CHUNK: u64 = 256;

fn uncontended_submit(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring");
    g.throughput(Throughput::Elements(1));
    g.bench_function("submit_mt_uncontended", |b| {
        let (producer, mut consumer) = admission(CHUNK as usize);
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(CHUNK);
                let start = Instant::now();
                for i in 0..n {
                    assert!(producer.submit(black_box(i)));
                }
                timed += start.elapsed();
                assert_eq!(consumer.drain() as u64, n);
                left -= n;
            }
            timed
        });
    });
    g.finish();
}

fn two_producers_drained(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring");
    g.throughput(Throughput::Elements(1));
    g.bench_function("two_producers_drained", |b| {
        b.iter_custom(|iters| {
            let (producer, mut consumer) = admission(1024);
            let go = Arc::new(AtomicBool::new(false));
            let per = iters.div_ceil(2);
            let producers: Vec<_> = (0..2)
                .map(|_| {
                    let (p, go) = (producer.clone(), go.clone());
                    thread::spawn(move || {
                        while !go.load(Ordering::Acquire) {
                            std::hint::spin_loop();
                        }
                        for i in 0..per {
                            while !p.submit(i) {
                                thread::yield_now();
                            }
                        }
                    })
                })
                .collect();
            let start = Instant::now();
            go.store(true, Ordering::Release);
            let mut drained = 0;
            while drained < 2 * per {
                match consumer.drain() {
                    0 => thread::yield_now(),
                    n => drained += n as u64,
                }
            }
            let elapsed = start.elapsed();
            for p in producers {
                p.join().unwrap();
            }
            elapsed
        });
    });
    g.finish();
}

/// One INLINE operation per iteration; every member is DONE at once.
struct Done;

impl AsyncStep<u64> for Done {
    async fn submit(&mut self, _: &mut [Item<'_, u64>]) -> xtc::Result<Exec> {
        Ok(Exec::Inline)
    }
    async fn collect(
        &mut self,
        _: &mut [Item<'_, u64>],
        results: &mut [StepResult],
        _: ExecStatus,
    ) -> xtc::Result<()> {
        results.fill(StepResult::Done);
        Ok(())
    }
}

/// How a producer waits after `Again` (the ring or the SUBMIT pool is full).
#[derive(Clone, Copy)]
enum Backoff {
    /// The rustdoc's guidance (B-114, B-115): sleep 20 µs, doubling to 1 ms.
    Sleep,
    /// Spin with `thread::yield_now`: on 2 cores the two producers then take
    /// CPU time from the owner loop they wait for.
    Yield,
}

/// End to end through a real group: two producer threads `submit_mt` while
/// the owner loop drains, admits, runs one INLINE iteration per vector and
/// completes (the whole engine, not only the ring); with the documented
/// back-off and with spinning producers.
fn two_producers_through_a_group(c: &mut Criterion) {
    for (name, backoff) in [
        ("group_two_producers_completed", Backoff::Sleep),
        ("group_two_producers_completed_spinning", Backoff::Yield),
    ] {
        through_a_group(c, name, backoff);
    }
}

fn through_a_group(c: &mut Criterion, name: &str, backoff: Backoff) {
    let mut g = c.benchmark_group("ring");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let per = iters.div_ceil(2).max(1);
            let lp = Loop::new().unwrap();
            let opts = AsyncOpts {
                capacity: 1024,
                max_active: 1024,
                resource_capacity: 1024,
                mt_queue_cap: 1024,
                ..AsyncOpts::default()
            };
            let done = std::rc::Rc::new(std::cell::Cell::new(0u64));
            let d = done.clone();
            let group =
                Group::create_async(&lp, opts, Done, move |_, _, _| d.set(d.get() + 1)).unwrap();
            let remote = group.remote().unwrap();
            let producers: Vec<_> = (0..2)
                .map(|_| {
                    let r = remote.clone();
                    thread::spawn(move || {
                        for i in 0..per {
                            let mut v = i;
                            let mut pause = Duration::from_micros(20);
                            while let Err(e) = r.submit(v, 1) {
                                v = e.into_inner();
                                match backoff {
                                    Backoff::Sleep => {
                                        thread::sleep(pause);
                                        pause = (pause * 2).min(Duration::from_millis(1));
                                    }
                                    Backoff::Yield => thread::yield_now(),
                                }
                            }
                        }
                    })
                })
                .collect();
            let g2 = group.clone();
            lp.spawn(async move {
                while done.get() < 2 * per {
                    rt::sleep(Duration::from_micros(200)).await;
                }
                g2.close(CloseMode::Drain).unwrap();
            })
            .unwrap();
            let start = Instant::now();
            lp.run().unwrap();
            let elapsed = start.elapsed();
            for p in producers {
                p.join().unwrap();
            }
            group.destroy().unwrap();
            elapsed
        });
    });
    g.finish();
}

criterion_group!(
    benches,
    uncontended_submit,
    two_producers_drained,
    two_producers_through_a_group
);
criterion_main!(benches);
