//! Yield points and the deterministic stepper.
//!
//! Every spin of the dispatch protocol (the scheduler loop, each drain wait,
//! the core host, the blocked orchestrator) awaits [`Yielder::pause`] with a
//! [`Point`] naming where it spins. The same `async` code then runs two ways:
//! - **real threads**: `pause` is `thread::yield_now()` and returns at once
//!   (each process is driven by `futures_lite::future::block_on` on its own
//!   OS thread);
//! - **stepped**: [`Stepper`] holds every process as a future on one thread,
//!   polls one process per step (chosen by a seeded RNG among those a
//!   [`Policy`] allows), advances a virtual clock by a fixed tick per step,
//!   and detects hangs by bound (no real clock, no real hang in CI).
//!
//! The stepper is ours rather than `rt::Sim` so the dispatch proofs do not
//! depend on the `rt` branch's timing; the design is the same (seeded choice
//! of a runnable process, virtual time, a stall report).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

/// Where a process is parked (its last yield point).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Point {
    /// Not started, or running between yield points.
    Start = 0,
    /// The scheduler loop's end-of-iteration yield.
    Loop,
    /// Drain: waiting for `pending` to leave the initialising sentinel (-1).
    Sentinel,
    /// Drain: the ack barrier.
    AckBarrier,
    /// Drain: between the ack barrier and the election (stall injection point).
    BeforeElect,
    /// Drain: a non-elected thread waiting for go / the end of the drain.
    Follower,
    /// Drain: the elected worker waiting for every thread's staging.
    StageDone,
    /// Core host between polls of its cores.
    CoreHost,
    /// Orchestrator blocked on task-window credit.
    OrchBlocked,
    /// Orchestrator between submissions.
    Orch,
    /// Process finished.
    Done,
}

impl Point {
    fn from_u8(v: u8) -> Point {
        use Point::*;
        [
            Start,
            Loop,
            Sentinel,
            AckBarrier,
            BeforeElect,
            Follower,
            StageDone,
            CoreHost,
            OrchBlocked,
            Orch,
            Done,
        ]
        .get(v as usize)
        .copied()
        .unwrap_or(Start)
    }

    /// True for the spin points inside the drain protocol.
    pub fn in_drain(self) -> bool {
        matches!(
            self,
            Point::Sentinel
                | Point::AckBarrier
                | Point::BeforeElect
                | Point::Follower
                | Point::StageDone
        )
    }
}

/// The clock of a run: real (`std::time::Instant`) or virtual (advanced by
/// the stepper). Values are nanoseconds since the run started.
#[derive(Clone, Debug)]
pub enum Clock {
    /// Monotonic time since the given instant.
    Real(std::time::Instant),
    /// Virtual time, advanced only by [`Stepper`].
    Virtual(Arc<AtomicU64>),
}

impl Clock {
    /// Nanoseconds since the run started.
    pub fn now_ns(&self) -> u64 {
        match self {
            Clock::Real(t0) => t0.elapsed().as_nanos() as u64,
            Clock::Virtual(v) => v.load(Ordering::Relaxed),
        }
    }

    /// True for a virtual clock (stepped run).
    pub fn is_virtual(&self) -> bool {
        matches!(self, Clock::Virtual(_))
    }
}

/// A process's yield handle: records its [`Point`] and yields.
#[derive(Clone, Debug)]
pub struct Yielder {
    stepped: bool,
    point: Arc<AtomicU8>,
}

impl Yielder {
    /// A yielder for a real thread (`pause` = `thread::yield_now`).
    pub fn real() -> Yielder {
        Yielder {
            stepped: false,
            point: Arc::new(AtomicU8::new(0)),
        }
    }

    /// Where this process last yielded.
    pub fn point(&self) -> Point {
        Point::from_u8(self.point.load(Ordering::Relaxed))
    }

    /// Marks the process finished (for stepper reports).
    pub fn done(&self) {
        self.point.store(Point::Done as u8, Ordering::Relaxed);
    }

    /// One yield point: records `at`, then yields to the OS (real) or to the
    /// stepper (stepped: returns `Pending` once).
    pub fn pause(&self, at: Point) -> Pause {
        self.point.store(at as u8, Ordering::Relaxed);
        if !self.stepped {
            std::hint::spin_loop();
            std::thread::yield_now();
        }
        Pause {
            yielded: !self.stepped,
        }
    }
}

/// Future returned by [`Yielder::pause`].
#[derive(Debug)]
pub struct Pause {
    yielded: bool,
}

impl Future for Pause {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            Poll::Ready(())
        } else {
            self.yielded = true;
            Poll::Pending
        }
    }
}

/// What a [`Policy`] sees before each step.
pub struct View<'a> {
    /// Steps taken so far.
    pub step: u64,
    /// Virtual time, ns.
    pub now_ns: u64,
    /// Each process's last yield point (index = process id).
    pub points: &'a [Point],
}

/// A schedule constraint: `allow(view, pid)` says whether process `pid` may
/// be polled now. Tests use it to park a thread at a chosen point.
pub type Policy<'p> = Box<dyn FnMut(&View<'_>, usize) -> bool + 'p>;

/// Why a stepped run did not finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hang {
    /// Seed of the schedule.
    pub seed: u64,
    /// Step at which the bound was hit.
    pub step: u64,
    /// Virtual time then, ns.
    pub now_ns: u64,
    /// Every unfinished process and where it spins.
    pub stuck: Vec<(usize, Point)>,
}

/// Deterministic single-thread driver of a set of processes.
pub struct Stepper<'p> {
    procs: Vec<(Pin<Box<dyn Future<Output = ()> + 'p>>, Yielder, bool)>,
    rng: fastrand::Rng,
    seed: u64,
    clock: Arc<AtomicU64>,
    tick_ns: u64,
    policy: Option<Policy<'p>>,
}

impl<'p> Stepper<'p> {
    /// A stepper with a seeded RNG and a virtual clock advancing `tick_ns` per step.
    pub fn new(seed: u64, tick_ns: u64) -> Stepper<'p> {
        Stepper {
            procs: Vec::new(),
            rng: fastrand::Rng::with_seed(seed),
            seed,
            clock: Arc::new(AtomicU64::new(0)),
            tick_ns: tick_ns.max(1),
            policy: None,
        }
    }

    /// The virtual clock processes must read.
    pub fn clock(&self) -> Clock {
        Clock::Virtual(self.clock.clone())
    }

    /// A yielder for the next process to [`spawn`](Self::spawn).
    pub fn yielder(&self) -> Yielder {
        Yielder {
            stepped: true,
            point: Arc::new(AtomicU8::new(0)),
        }
    }

    /// Adds a process (process id = order of spawning).
    pub fn spawn(&mut self, y: Yielder, f: impl Future<Output = ()> + 'p) {
        self.procs.push((Box::pin(f), y, false));
    }

    /// Installs a schedule constraint.
    pub fn set_policy(&mut self, p: Policy<'p>) {
        self.policy = Some(p);
    }

    /// Runs until every process finished, or `max_steps` steps (then a [`Hang`]
    /// report: the harness detects the hang instead of hanging). A step in
    /// which the policy allows no live process also ends in a `Hang`.
    pub fn run(&mut self, max_steps: u64) -> Result<u64, Hang> {
        let mut cx = Context::from_waker(Waker::noop());
        let mut live: Vec<usize> = Vec::new();
        for step in 0..max_steps {
            let points: Vec<Point> = self.procs.iter().map(|p| p.1.point()).collect();
            let view = View {
                step,
                now_ns: self.clock.load(Ordering::Relaxed),
                points: &points,
            };
            live.clear();
            for (i, p) in self.procs.iter().enumerate() {
                let ok = self.policy.as_mut().is_none_or(|pol| pol(&view, i));
                if !p.2 && ok {
                    live.push(i);
                }
            }
            if live.is_empty() {
                if self.procs.iter().all(|p| p.2) {
                    return Ok(step);
                }
                return Err(self.hang(step));
            }
            let pid = live[self.rng.usize(..live.len())];
            let proc = &mut self.procs[pid];
            if proc.0.as_mut().poll(&mut cx).is_ready() {
                proc.2 = true;
                proc.1.done();
            }
            self.clock.fetch_add(self.tick_ns, Ordering::Relaxed);
        }
        if self.procs.iter().all(|p| p.2) {
            return Ok(max_steps);
        }
        Err(self.hang(max_steps))
    }

    fn hang(&self, step: u64) -> Hang {
        Hang {
            seed: self.seed,
            step,
            now_ns: self.clock.load(Ordering::Relaxed),
            stuck: self
                .procs
                .iter()
                .enumerate()
                .filter(|(_, p)| !p.2)
                .map(|(i, p)| (i, p.1.point()))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn same_seed_same_interleaving_and_hangs_are_reported() {
        let order = |seed| {
            let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
            let mut s = Stepper::new(seed, 1);
            for id in 0..3 {
                let (y, l) = (s.yielder(), log.clone());
                s.spawn(y.clone(), async move {
                    for _ in 0..4 {
                        l.borrow_mut().push(id);
                        y.pause(Point::Loop).await;
                    }
                });
            }
            s.run(1000).unwrap();
            log.take()
        };
        assert_eq!(order(7), order(7));
        let flag = Cell::new(false);
        let mut s = Stepper::new(1, 10);
        let y = s.yielder();
        let flag = &flag;
        s.spawn(y.clone(), async move {
            while !flag.get() {
                y.pause(Point::AckBarrier).await;
            }
        });
        let h = s.run(50).unwrap_err();
        assert_eq!(h.stuck, vec![(0, Point::AckBarrier)]);
        assert_eq!(h.now_ns, 500);
    }
}
