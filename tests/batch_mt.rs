//! Cross-loop admission on real loops: `Remote` (submit_mt, cancel_mt,
//! resume_mt) from plain threads, held hand-ins, close ordering with racing
//! producers, stale controls, and the threaded stress of issue 8.

mod batch_support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use batch_support::sync_opts;
use crossbeam_channel::{Sender, unbounded};
use xtc::Error;
use xtc::batch::{
    AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Handle, Item, Remote, StepResult,
};
use xtc::rt::{self, Loop};

/// What a job does when it is in a vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// DONE after `n` iterations.
    Run(u32),
    /// BLOCKED on its first iteration (its producer is told and resumes it).
    BlockResume,
    /// BLOCKED on its first iteration (its producer is told and cancels it).
    BlockCancel,
}

/// What the driver tells a producer.
#[derive(Debug)]
enum Note {
    Blocked(Handle),
    Done(Handle, Result<(), Error>),
}

#[derive(Debug)]
struct Job {
    kind: Kind,
    blocked_once: bool,
    notify: Option<Sender<Note>>,
}

fn job(kind: Kind, notify: Option<Sender<Note>>) -> Job {
    Job {
        kind,
        blocked_once: false,
        notify,
    }
}

/// An async step with INLINE operations: a plain synchronous step in an
/// mt-enabled async group (B-108).
struct Jobs;

impl AsyncStep<Job> for Jobs {
    async fn submit(&mut self, _items: &mut [Item<'_, Job>]) -> xtc::Result<Exec> {
        Ok(Exec::Inline)
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, Job>],
        results: &mut [StepResult],
        status: ExecStatus,
    ) -> xtc::Result<()> {
        assert_eq!(status, ExecStatus::Ok);
        for (it, r) in items.iter_mut().zip(results.iter_mut()) {
            *r = visit(it.handle, it.request);
        }
        Ok(())
    }
}

fn visit(h: Handle, job: &mut Job) -> StepResult {
    match job.kind {
        Kind::Run(0 | 1) => StepResult::Done,
        Kind::Run(n) => {
            job.kind = Kind::Run(n - 1);
            StepResult::Continue
        }
        Kind::BlockResume | Kind::BlockCancel if !job.blocked_once => {
            job.blocked_once = true;
            if let Some(tx) = &job.notify {
                let _ = tx.send(Note::Blocked(h));
            }
            StepResult::Blocked
        }
        Kind::BlockResume | Kind::BlockCancel => StepResult::Done,
    }
}

/// Every completion, by handle value, in delivery order.
type Completions = Arc<Mutex<Vec<(u64, Result<(), Error>)>>>;

fn mt_opts(capacity: usize, mt_queue_cap: usize) -> AsyncOpts {
    AsyncOpts {
        capacity,
        max_active: capacity,
        resource_capacity: 100,
        exec_timeout: None,
        sched_class: None,
        mt_queue_cap,
    }
}

fn group(lp: &Loop, capacity: usize, mt_queue_cap: usize) -> (Group<Job>, Completions) {
    let done: Completions = Arc::default();
    let d = done.clone();
    let complete = move |h: Handle, job: Job, out: Result<(), Error>| {
        d.lock().unwrap().push((h.get(), out));
        if let Some(tx) = job.notify {
            let _ = tx.send(Note::Done(h, out));
        }
    };
    let g = Group::create_async(lp, mt_opts(capacity, mt_queue_cap), Jobs, complete).unwrap();
    (g, done)
}

/// Retries `f` while it answers `Again`, yielding the CPU, then sleeping
/// from 20 µs doubling to 1 ms (the rustdoc's back-off).
fn retry<T>(mut f: impl FnMut() -> Result<T, Error>) -> Result<T, Error> {
    let mut pause = Duration::from_micros(20);
    for attempt in 0u32.. {
        match f() {
            Err(Error::Again) if attempt < 8 => thread::yield_now(),
            Err(Error::Again) => {
                thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
            other => return other,
        }
    }
    unreachable!()
}

#[test]
fn remote_is_nosys_without_mt_queue_cap_and_on_sync_groups() {
    let lp = Loop::new().unwrap();
    let (g, _) = group(&lp, 2, 0);
    assert_eq!(g.remote().unwrap_err(), Error::Nosys);
    let step = xtc::batch::step_fn(|_: &mut [Item<'_, u32>], _: &mut [StepResult]| Ok(()));
    let sync = Group::create(&lp, sync_opts(2, 2, 1), step, |_, _, _| {}).unwrap();
    assert_eq!(sync.remote().unwrap_err(), Error::Nosys);
    assert_eq!(sync.async_stats(), Default::default());
    g.close(CloseMode::Drain).unwrap();
    sync.close(CloseMode::Drain).unwrap();
    lp.run().unwrap();
}

/// B-109: the ring and both record pools are charged through the loop's
/// resource accountant at create; a budget that cannot hold them is `Nomem`
/// and publishes nothing.
#[test]
fn mt_ring_and_pools_are_charged_at_create() {
    let used = |cap: usize| {
        let lp = Loop::new().unwrap();
        let (g, _) = group(&lp, 4, cap);
        let used = lp.budget().used();
        g.close(CloseMode::Drain).unwrap();
        lp.run().unwrap();
        g.destroy().unwrap();
        assert_eq!(lp.budget().used(), 0, "destroy releases the charge");
        used
    };
    let (none, small, big) = (used(0), used(16), used(1024));
    assert!(none < small && small < big, "{none} < {small} < {big}");
    // 2 * 1024 ring slots of a Job-sized record at least.
    assert!(big - none >= 2 * 1024 * std::mem::size_of::<Job>() as u64);
    let lp = Loop::with_budget(small).unwrap();
    let err = Group::create_async(&lp, mt_opts(4, 1024), Jobs, |_, _, _| {}).unwrap_err();
    assert_eq!(err, Error::Nomem);
    assert_eq!(
        (lp.budget().used(), lp.n_procs()),
        (0, 0),
        "nothing published"
    );
}

#[test]
fn remote_is_send_sync_clone() {
    fn check<T: Send + Sync + Clone + 'static>() {}
    check::<Remote<Job>>();
    check::<Remote<u64>>();
}

/// Hand-ins from threads (while the owner loop runs, with back-off on
/// `Again`) are admitted at boundaries; every handle completes once on the
/// driver loop; counters match.
#[test]
fn submit_mt_from_threads_completes_each_handle_once() {
    let lp = Loop::new().unwrap();
    let (g, done) = group(&lp, 4, 8);
    let remote = g.remote().unwrap();
    let producers: Vec<_> = (0..3)
        .map(|_| {
            let r = remote.clone();
            thread::spawn(move || {
                (0..50)
                    .map(|i| {
                        retry(|| {
                            r.submit(job(Kind::Run(i % 3), None), 1)
                                .map_err(|e| e.error)
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap()
            })
        })
        .collect();
    // Close from an owner process once every hand-in completed.
    let g2 = g.clone();
    let d2 = done.clone();
    lp.spawn(async move {
        while d2.lock().unwrap().len() < 150 {
            rt::yield_now().await;
        }
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    lp.run().unwrap();
    let handles: Vec<Handle> = producers
        .into_iter()
        .flat_map(|p| p.join().unwrap())
        .collect();
    let done = done.lock().unwrap();
    let got: HashSet<u64> = done.iter().map(|d| d.0).collect();
    let want: HashSet<u64> = handles.iter().map(|h| h.get()).collect();
    assert_eq!((done.len(), got.len()), (150, 150), "exactly once each");
    assert_eq!(got, want);
    assert!(done.iter().all(|d| d.1.is_ok()));
    let (s, a) = (g.stats(), g.async_stats());
    assert_eq!((s.completed, s.cancelled, s.failed), (150, 0, 0));
    assert_eq!(a.mt_queued, 150);
    g.destroy().unwrap();
    assert_eq!(
        remote.submit(job(Kind::Run(1), None), 1).unwrap_err().error,
        Error::Again
    );
    assert_eq!(remote.cancel(handles[0]), Err(Error::Inval));
}

/// B-141: once close has returned, submit_mt is `Again` without a handle;
/// cancel_mt stays accepted while the driver runs and is `Inval` after.
#[test]
fn close_refuses_submit_mt_and_controls_end_with_the_driver() {
    let lp = Loop::new().unwrap();
    let (g, done) = group(&lp, 2, 2);
    let remote = g.remote().unwrap();
    let h = remote.submit(job(Kind::BlockCancel, None), 1).unwrap();
    g.close(CloseMode::Drain).unwrap();
    let refused = remote.submit(job(Kind::Run(1), None), 1).unwrap_err();
    assert_eq!(refused.error, Error::Again);
    let r2 = remote.clone();
    let g2 = g.clone();
    lp.spawn(async move {
        // The blocked hand-in keeps the drain going until it is cancelled.
        while g2.stats().blocked == 0 {
            rt::yield_now().await;
        }
        r2.cancel(h).unwrap();
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(*done.lock().unwrap(), vec![(h.get(), Err(Error::Aborted))]);
    assert_eq!(remote.cancel(h), Err(Error::Inval), "driver finished");
    assert_eq!(remote.resume(h), Err(Error::Inval));
    let a = g.async_stats();
    assert_eq!((a.mt_queued, a.mt_rejections), (1, 1));
    g.destroy().unwrap();
}

/// B-112: with every slot BLOCKED and every SUBMIT record held, cancel_mt and
/// resume_mt still go through (their own pool) and the group progresses.
#[test]
fn all_blocked_behind_held_hand_ins_can_be_resumed_and_cancelled_from_a_thread() {
    let lp = Loop::new().unwrap();
    let (g, done) = group(&lp, 2, 2);
    let remote = g.remote().unwrap();
    let (tx, rx) = unbounded();
    let blocked: Vec<_> = (0..2)
        .map(|_| {
            remote
                .submit(job(Kind::BlockResume, Some(tx.clone())), 1)
                .unwrap()
        })
        .collect();
    let g2 = g.clone();
    let d2 = done.clone();
    lp.spawn(async move {
        while d2.lock().unwrap().len() < 4 {
            rt::yield_now().await;
        }
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    let r = remote.clone();
    let helper = thread::spawn(move || {
        // Both slots BLOCKED: fill the SUBMIT pool with two held hand-ins.
        let mut seen = Vec::new();
        while seen.len() < 2 {
            if let Note::Blocked(h) = rx.recv().unwrap() {
                seen.push(h);
            }
        }
        let held: Vec<_> = (0..2)
            .map(|_| retry(|| r.submit(job(Kind::Run(1), None), 1).map_err(|e| e.error)).unwrap())
            .collect();
        assert_eq!(
            r.submit(job(Kind::Run(1), None), 1).unwrap_err().error,
            Error::Again
        );
        retry(|| r.resume(seen[0])).unwrap();
        retry(|| r.cancel(seen[1])).unwrap();
        held
    });
    lp.run().unwrap();
    let held = helper.join().unwrap();
    let mut outcomes: HashMap<u64, Result<(), Error>> = HashMap::new();
    for (h, o) in done.lock().unwrap().iter() {
        assert!(outcomes.insert(*h, *o).is_none());
    }
    assert_eq!(outcomes[&blocked[0].get()], Ok(()));
    assert_eq!(outcomes[&blocked[1].get()], Err(Error::Aborted));
    assert!(held.iter().all(|h| outcomes[&h.get()] == Ok(())));
    g.destroy().unwrap();
}

/// Regression: a stale cancel for a completed handle cannot affect a later
/// request (handles are never reused; nothing is kept for the stale one).
#[test]
fn stale_cancel_for_a_completed_handle_cannot_affect_a_later_request() {
    let lp = Loop::new().unwrap();
    let (g, done) = group(&lp, 1, 2);
    let remote = g.remote().unwrap();
    let first = remote.submit(job(Kind::Run(1), None), 1).unwrap();
    let (r, g2, d2) = (remote.clone(), g.clone(), done.clone());
    lp.spawn(async move {
        while d2.lock().unwrap().is_empty() {
            rt::yield_now().await;
        }
        for _ in 0..10 {
            // The client-disconnect race: accepted, then discarded.
            while r.cancel(first) == Err(Error::Again) {
                rt::yield_now().await; // two control records: let the driver drain
            }
        }
        assert_eq!(
            g2.cancel(first),
            Err(Error::Inval),
            "stale for the owner too"
        );
        let later = r.submit(job(Kind::Run(2), None), 1).unwrap();
        assert!(later > first);
        while d2.lock().unwrap().len() < 2 {
            rt::yield_now().await;
        }
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    lp.run().unwrap();
    let done = done.lock().unwrap();
    assert_eq!(done.len(), 2);
    assert_eq!(done[0], (first.get(), Ok(())));
    assert_eq!(done[1].1, Ok(()), "the later request ran to DONE");
    assert_ne!(done[1].0, first.get());
    g.destroy().unwrap();
}

/// B-052: an owner-loop cancel of an mt handle not admitted yet (still on the
/// ring) cancels it: it never runs.
#[test]
fn owner_cancel_of_an_unadmitted_mt_handle_never_runs_it() {
    let lp = Loop::new().unwrap();
    let (g, done) = group(&lp, 1, 4);
    let remote = g.remote().unwrap();
    let (tx, rx) = unbounded();
    let h = remote.submit(job(Kind::BlockResume, Some(tx)), 1).unwrap();
    g.cancel(h).unwrap(); // pre-run setup: the hand-in is still on the ring
    g.close(CloseMode::Drain).unwrap();
    lp.run().unwrap();
    assert_eq!(*done.lock().unwrap(), vec![(h.get(), Err(Error::Aborted))]);
    assert!(
        matches!(rx.try_recv(), Ok(Note::Done(..))),
        "it was never in a vector (no Blocked note first)"
    );
    g.destroy().unwrap();
}

/// Under `rt::Sim` (deterministic, one thread): a process of another loop
/// submits through a `Remote` and awaits reply futures; every seed ends with
/// all twenty answers and no stall.
#[test]
fn remote_between_sim_loops_with_reply_futures() {
    use std::cell::Cell;
    use std::rc::Rc;
    for seed in 0..20 {
        let sim = rt::Sim::new(seed);
        let (owner, other) = (sim.new_loop(), sim.new_loop());
        let complete = |_: Handle, (x, p): (u64, rt::Promise<u64>), o: Result<(), Error>| {
            p.set(o.map(|()| x + 1));
        };
        struct Once;
        impl AsyncStep<(u64, rt::Promise<u64>)> for Once {
            async fn submit(
                &mut self,
                _: &mut [Item<'_, (u64, rt::Promise<u64>)>],
            ) -> xtc::Result<Exec> {
                Ok(Exec::Inline)
            }
            async fn collect(
                &mut self,
                _: &mut [Item<'_, (u64, rt::Promise<u64>)>],
                results: &mut [StepResult],
                _: ExecStatus,
            ) -> xtc::Result<()> {
                results.fill(StepResult::Done);
                Ok(())
            }
        }
        let g = Group::create_async(&owner, mt_opts(2, 2), Once, complete).unwrap();
        let remote = g.remote().unwrap();
        let answered = Rc::new(Cell::new(0));
        let a2 = answered.clone();
        other
            .spawn(async move {
                for x in 0..20u64 {
                    let (f, p) = rt::future_pair();
                    let mut req = (x, p);
                    loop {
                        match remote.submit(req, 1) {
                            Ok(_) => break,
                            Err(e) => {
                                assert_eq!(e.error, Error::Again);
                                req = e.into_inner();
                                rt::yield_now().await;
                            }
                        }
                    }
                    assert_eq!(f.await.unwrap(), x + 1);
                    a2.set(a2.get() + 1);
                }
            })
            .unwrap();
        let (g2, a3) = (g.clone(), answered.clone());
        owner
            .spawn(async move {
                while a3.get() < 20 {
                    rt::yield_now().await;
                }
                g2.close(CloseMode::Drain).unwrap();
            })
            .unwrap();
        if let Err(stall) = sim.run_until_idle() {
            panic!("seed {seed}: {stall}");
        }
        assert_eq!(
            (answered.get(), g.stats().completed),
            (20, 20),
            "seed {seed}"
        );
        g.destroy().unwrap();
    }
}

/// An operation that only ends when the cancel hint fires.
struct Hinted {
    promise: Option<rt::Promise<()>>,
    launched: Sender<Handle>,
    hints: Arc<Mutex<Vec<Handle>>>,
}

impl AsyncStep<u32> for Hinted {
    async fn submit(&mut self, items: &mut [Item<'_, u32>]) -> xtc::Result<Exec> {
        let (f, p) = rt::future_pair();
        self.promise = Some(p);
        for it in items.iter() {
            self.launched.send(it.handle).unwrap();
        }
        Ok(Exec::Future(f))
    }
    async fn collect(
        &mut self,
        _: &mut [Item<'_, u32>],
        results: &mut [StepResult],
        _: ExecStatus,
    ) -> xtc::Result<()> {
        results.fill(StepResult::Done);
        Ok(())
    }
    async fn cancel_hint(&mut self, h: Handle) {
        self.hints.lock().unwrap().push(h);
        if let Some(p) = self.promise.take() {
            p.set(Ok(()));
        }
    }
}

/// B-094 with cancel_mt: a cross-loop cancel of an in-flight member wakes the
/// driver's wait, fires the hint once, and the member ends `Aborted` after
/// collect.
#[test]
fn cancel_mt_of_an_in_flight_member_fires_its_hint() {
    let lp = Loop::new().unwrap();
    let (launched, rx) = unbounded();
    let hints = Arc::new(Mutex::new(Vec::new()));
    let step = Hinted {
        promise: None,
        launched,
        hints: hints.clone(),
    };
    let done: Completions = Arc::default();
    let d = done.clone();
    let complete =
        move |h: Handle, _: u32, o: Result<(), Error>| d.lock().unwrap().push((h.get(), o));
    let g = Group::create_async(&lp, mt_opts(1, 2), step, complete).unwrap();
    let remote = g.remote().unwrap();
    let h = remote.submit(7, 1).unwrap();
    let canceller = thread::spawn(move || {
        assert_eq!(rx.recv().unwrap(), h, "the operation is outstanding");
        retry(|| remote.cancel(h)).unwrap();
    });
    let (g2, d2) = (g.clone(), done.clone());
    lp.spawn(async move {
        while d2.lock().unwrap().is_empty() {
            rt::yield_now().await;
        }
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    lp.run().unwrap();
    canceller.join().unwrap();
    assert_eq!(*hints.lock().unwrap(), vec![h]);
    assert_eq!(*done.lock().unwrap(), vec![(h.get(), Err(Error::Aborted))]);
    g.destroy().unwrap();
}

#[path = "batch_mt/stress.rs"]
mod stress;
