//! Speed of the batch engine (figures go in docs/arch/batch.md):
//! - per member-iteration overhead of a synchronous group at 1, 32 and 256
//!   members, beside a bare loop calling the same step over a `Vec`
//!   (target: at most 3x the bare loop at 256 members);
//! - one submit → complete cycle (target: at most 300 ns);
//! - one INLINE and one FUTURE iteration at 32 members (the promise set from
//!   another thread);
//! - FENCE wake latency: eventfd written on another thread → collect entered
//!   (target: median at most 50 µs).

use std::cell::Cell;
use std::hint::black_box;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rustix::event::{EventfdFlags, eventfd};
use xtc::batch::{
    AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Handle, Item, StepResult, SyncOpts,
    step_fn,
};
use xtc::rt::{self, Loop, Promise};

/// The trivial step both sides run: count down, DONE at zero.
fn trivial(items: &mut [Item<'_, u64>], results: &mut [StepResult]) {
    for (it, r) in items.iter_mut().zip(results.iter_mut()) {
        *it.request -= 1;
        *r = if *it.request == 0 {
            StepResult::Done
        } else {
            StepResult::Continue
        };
    }
}

fn sync_opts(n: usize) -> SyncOpts {
    SyncOpts {
        capacity: n,
        max_active: n,
        resource_capacity: n as u64,
        sched_class: None,
    }
}

/// Runs `n` members for `iters` iterations each through a group.
fn engine_run(n: usize, iters: u64) -> Duration {
    let lp = Loop::new().unwrap();
    let step = step_fn(|items: &mut [Item<'_, u64>], res: &mut [StepResult]| {
        trivial(items, res);
        Ok(())
    });
    let g = Group::create(
        &lp,
        sync_opts(n),
        step,
        |_: Handle, _: u64, _: xtc::Result<()>| {},
    )
    .unwrap();
    for _ in 0..n {
        g.submit(iters.max(1), 1).unwrap();
    }
    g.close(CloseMode::Drain).unwrap();
    let t = Instant::now();
    lp.run().unwrap();
    let d = t.elapsed();
    g.destroy().unwrap();
    d
}

/// Reuses a vector's storage for another lifetime (keeps the allocation).
fn recycle<'a, 'b>(mut v: Vec<Item<'a, u64>>) -> Vec<Item<'b, u64>> {
    v.clear();
    v.into_iter().map(|_| unreachable!()).collect()
}

/// The same step over a plain `Vec`: rebuild the item vector (in reused
/// storage) and the result words each iteration, as any batcher must, then
/// drop the members that finished.
fn bare_run(n: usize, iters: u64) -> Duration {
    let mut reqs: Vec<(Handle, u64)> = (1..=n as u64)
        .map(|i| (Handle::new(i).unwrap(), iters.max(1)))
        .collect();
    let mut results = Vec::with_capacity(n);
    let mut buf: Vec<Item<'static, u64>> = Vec::with_capacity(n);
    let t = Instant::now();
    while !reqs.is_empty() {
        let mut items = recycle(std::mem::take(&mut buf));
        items.extend(reqs.iter_mut().map(|(h, r)| Item {
            handle: *h,
            request: r,
        }));
        results.clear();
        results.resize(items.len(), StepResult::Unset);
        trivial(&mut items, &mut results);
        buf = recycle(items);
        let mut i = 0;
        reqs.retain(|_| {
            i += 1;
            results[i - 1] == StepResult::Continue
        });
        black_box(&reqs);
    }
    t.elapsed()
}

fn member_iteration(c: &mut Criterion) {
    let mut grp = c.benchmark_group("member_iteration");
    for n in [1usize, 32, 256] {
        grp.throughput(Throughput::Elements(n as u64));
        grp.bench_with_input(BenchmarkId::new("group", n), &n, |b, &n| {
            b.iter_custom(|iters| engine_run(n, iters))
        });
        grp.bench_with_input(BenchmarkId::new("bare_vec", n), &n, |b, &n| {
            b.iter_custom(|iters| bare_run(n, iters))
        });
    }
    grp.finish();
}

/// `iters` submit → complete cycles of one request, driven by an owner process.
fn cycles(iters: u64) -> Duration {
    let lp = Loop::new().unwrap();
    let done = Rc::new(Cell::new(0u64));
    let d2 = done.clone();
    let step = step_fn(|_: &mut [Item<'_, u64>], res: &mut [StepResult]| {
        res.fill(StepResult::Done);
        Ok(())
    });
    let complete = move |_: Handle, _: u64, _: xtc::Result<()>| d2.set(d2.get() + 1);
    let g = Group::create(&lp, sync_opts(1), step, complete).unwrap();
    let g2 = g.clone();
    lp.spawn(async move {
        for i in 0..iters {
            g2.submit(i, 1).unwrap();
            while done.get() == i {
                rt::yield_now().await;
            }
        }
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    let t = Instant::now();
    lp.run().unwrap();
    t.elapsed()
}

fn submit_complete(c: &mut Criterion) {
    c.bench_function("submit_complete_cycle", |b| b.iter_custom(cycles));
}

/// An async app: INLINE, or FUTURE with the promise set on another thread.
struct Offload {
    future: bool,
    to_thread: crossbeam_channel::Sender<Promise<()>>,
}

impl AsyncStep<u64> for Offload {
    async fn submit(&mut self, _: &mut [Item<'_, u64>]) -> xtc::Result<Exec> {
        if !self.future {
            return Ok(Exec::Inline);
        }
        let (f, p) = rt::future_pair();
        self.to_thread.send(p).unwrap();
        Ok(Exec::Future(f))
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, u64>],
        res: &mut [StepResult],
        _: ExecStatus,
    ) -> xtc::Result<()> {
        trivial(items, res);
        Ok(())
    }
}

fn promise_setter() -> crossbeam_channel::Sender<Promise<()>> {
    let (tx, rx) = crossbeam_channel::unbounded::<Promise<()>>();
    std::thread::spawn(move || {
        for p in rx {
            p.set(Ok(()));
        }
    });
    tx
}

fn async_run(
    future: bool,
    n: usize,
    iters: u64,
    tx: &crossbeam_channel::Sender<Promise<()>>,
) -> Duration {
    let lp = Loop::new().unwrap();
    let o = AsyncOpts {
        capacity: n,
        max_active: n,
        resource_capacity: n as u64,
        exec_timeout: None,
        sched_class: None,
        mt_queue_cap: 0,
    };
    let app = Offload {
        future,
        to_thread: tx.clone(),
    };
    let g = Group::create_async(&lp, o, app, |_: Handle, _: u64, _: xtc::Result<()>| {}).unwrap();
    for _ in 0..n {
        g.submit(iters.max(1), 1).unwrap();
    }
    g.close(CloseMode::Drain).unwrap();
    let t = Instant::now();
    lp.run().unwrap();
    t.elapsed()
}

fn async_iteration(c: &mut Criterion) {
    let tx = promise_setter();
    let mut grp = c.benchmark_group("async_iteration_32");
    grp.bench_function("inline", |b| {
        b.iter_custom(|iters| async_run(false, 32, iters, &tx))
    });
    grp.bench_function("future_other_thread", |b| {
        b.iter_custom(|iters| async_run(true, 32, iters, &tx))
    });
    grp.finish();
}

/// FENCE: the signaller thread stamps the time and writes the eventfd; collect
/// adds the time from the stamp to its entry.
struct Fence {
    to_thread: crossbeam_channel::Sender<Arc<OwnedFd>>,
    stamp: Arc<std::sync::Mutex<Option<Instant>>>,
    current: Option<Arc<OwnedFd>>,
    total: Rc<Cell<Duration>>,
}

impl AsyncStep<u64> for Fence {
    async fn submit(&mut self, _: &mut [Item<'_, u64>]) -> xtc::Result<Exec> {
        let fd = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).unwrap());
        self.to_thread.send(fd.clone()).unwrap();
        self.current = Some(fd.clone());
        Ok(Exec::Fence(Rc::new(fd))) // `Arc<OwnedFd>` is `AsFd`
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, u64>],
        res: &mut [StepResult],
        _: ExecStatus,
    ) -> xtc::Result<()> {
        let at = Instant::now();
        let stamp = self
            .stamp
            .lock()
            .unwrap()
            .take()
            .expect("stamped before the write");
        self.total.set(self.total.get() + at.duration_since(stamp));
        self.current = None;
        trivial(items, res);
        Ok(())
    }
}

fn fence_latency(iters: u64) -> Duration {
    let stamp = Arc::new(std::sync::Mutex::new(None));
    let (tx, rx) = crossbeam_channel::unbounded::<Arc<OwnedFd>>();
    let s2 = stamp.clone();
    let th = std::thread::spawn(move || {
        for fd in rx {
            // Let the driver park on the fence first (most of the time).
            std::thread::sleep(Duration::from_micros(50));
            *s2.lock().unwrap() = Some(Instant::now());
            rustix::io::write(&*fd, &1u64.to_ne_bytes()).unwrap();
        }
    });
    let lp = Loop::new().unwrap();
    let total = Rc::new(Cell::new(Duration::ZERO));
    let app = Fence {
        to_thread: tx,
        stamp,
        current: None,
        total: total.clone(),
    };
    let o = AsyncOpts {
        capacity: 1,
        max_active: 1,
        resource_capacity: 1,
        exec_timeout: None,
        sched_class: None,
        mt_queue_cap: 0,
    };
    let g = Group::create_async(&lp, o, app, |_: Handle, _: u64, _: xtc::Result<()>| {}).unwrap();
    g.submit(iters.max(1), 1).unwrap();
    g.close(CloseMode::Drain).unwrap();
    lp.run().unwrap();
    g.destroy().unwrap();
    drop(g);
    drop(lp);
    th.join().unwrap();
    total.get()
}

fn fence_wake(c: &mut Criterion) {
    let mut grp = c.benchmark_group("fence_wake_latency");
    grp.sample_size(20);
    grp.bench_function("eventfd_other_thread_to_collect", |b| {
        b.iter_custom(fence_latency)
    });
    grp.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    targets = member_iteration, submit_complete, async_iteration, fence_wake
}
criterion_main!(benches);
