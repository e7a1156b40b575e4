//! Yield points and the deterministic drivers: the stepper and the `rt::Sim` driver.
//!
//! Every spin of the dispatch protocol (the scheduler loop, each drain wait,
//! the core host, the blocked orchestrator) awaits [`Yielder::pause`] with a
//! [`Point`] naming where it spins. The same `async` code then runs three
//! ways, and the three drivers differ only in how a process is spawned and
//! in what `pause` does:
//! - **real threads** ([`Yielder::real`]): `pause` is `thread::yield_now()`
//!   and returns at once (each process is driven by
//!   `futures_lite::future::block_on` on its own OS thread; real clock);
//! - **stepped** ([`Stepper`]): every process is a future on one thread,
//!   polled one per step (chosen by a seeded RNG among those a [`Policy`]
//!   allows); `pause` returns `Pending` once; a virtual clock advances a
//!   fixed tick per step; a hang is the step bound (no real clock, no real
//!   hang in CI);
//! - **`rt::Sim`** ([`SimDriver`]): every process is an `rt` process on its
//!   own loop of one [`xtc::rt::Sim`] (a loop per modelled OS thread);
//!   `pause` is [`xtc::rt::sleep`] for one tick plus a seeded injected
//!   delay, so the Sim's seeded pick of the next runnable process, and its
//!   virtual clock jumping to the next timer, decide the interleaving. The
//!   run's [`Clock::Virtual`] is set to the Sim's virtual time
//!   ([`xtc::rt::now`]) at the start of every poll of a process. A
//!   [`Policy`] is applied per poll: a process it disallows keeps pausing
//!   (sleeping a drawn delay) without running its body. A hang is the step
//!   bound, reported as the same [`Hang`].
//!
//! The [`Stepper`] is kept beside the Sim driver: it is the cheaper one (one
//! poll per tick, no timers) and the original liveness proofs use its exact
//! schedules; the Sim driver re-runs the same proofs on the crate's own
//! simulator with injected delays (`crates/dispatch/tests/dispatch_sim.rs`).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use xtc::rt;

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

/// The clock of a run: real (`std::time::Instant`) or virtual. Values are
/// nanoseconds since the run started.
#[derive(Clone, Debug)]
pub enum Clock {
    /// Monotonic time since the given instant (real-thread runs).
    Real(std::time::Instant),
    /// Virtual time, ns: advanced by [`Stepper`] a tick per step, or set by
    /// [`SimDriver`] to the `rt::Sim`'s virtual time at the start of every
    /// poll of a process (the Sim's clock starts at 0 with the run, so no
    /// offset is needed). After a run it holds the time of the last poll.
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

    /// True for a virtual clock (stepped or Sim run).
    pub fn is_virtual(&self) -> bool {
        matches!(self, Clock::Virtual(_))
    }
}

/// How a [`Yielder`] yields.
#[derive(Clone, Debug)]
enum Mode {
    /// `thread::yield_now`, then ready.
    Real,
    /// `Pending` once (the [`Stepper`] polls again when it picks the process).
    Stepped,
    /// `rt::sleep` of a drawn delay (the [`SimDriver`]).
    Sim(Rc<Pace>),
}

/// The injected delays of one Sim-driven process: every pause sleeps
/// `tick_ns + d` virtual ns, `d` uniform in `0..=max_delay_ns` from a
/// seeded RNG (so a schedule is reproducible from its seed).
#[derive(Debug)]
struct Pace {
    tick_ns: u64,
    max_delay_ns: u64,
    rng: RefCell<fastrand::Rng>,
}

impl Pace {
    fn draw(&self) -> Duration {
        let extra = if self.max_delay_ns == 0 {
            0
        } else {
            self.rng.borrow_mut().u64(0..=self.max_delay_ns)
        };
        Duration::from_nanos(self.tick_ns.saturating_add(extra))
    }
}

/// A process's yield handle: records its [`Point`] and yields the way its
/// driver needs (see the [module docs](self)). Cheap to clone; a clone
/// shares the recorded point (and, under the Sim driver, the delay RNG).
/// `Yielder` and [`Pause`] are `!Send` (the Sim mode holds an `Rc` and an
/// `rt::Sleep`): a driver creates each process's yielder and future on the
/// thread that polls it, as [`Scheduler::run_threads`] does inside each
/// spawned thread.
///
/// [`Scheduler::run_threads`]: super::Scheduler::run_threads
#[derive(Clone, Debug)]
pub struct Yielder {
    mode: Mode,
    point: Arc<AtomicU8>,
}

impl Yielder {
    /// A yielder for a real thread (`pause` = `thread::yield_now`).
    pub fn real() -> Yielder {
        Yielder::with_mode(Mode::Real)
    }

    fn with_mode(mode: Mode) -> Yielder {
        Yielder {
            mode,
            point: Arc::new(AtomicU8::new(0)),
        }
    }

    /// Where this process last yielded.
    pub fn point(&self) -> Point {
        Point::from_u8(self.point.load(Ordering::Relaxed))
    }

    /// Marks the process finished (for hang reports).
    pub fn done(&self) {
        self.point.store(Point::Done as u8, Ordering::Relaxed);
    }

    /// One yield point: records `at`, then yields to the OS (real: returns
    /// ready), to the stepper (stepped: `Pending` once), or to the `rt::Sim`
    /// (Sim: sleeps `tick + injected delay` of virtual time).
    ///
    /// # Panics
    /// A Sim-mode pause polled outside an `rt` loop (it cannot happen under
    /// [`SimDriver`], which polls every process from a Sim step).
    pub fn pause(&self, at: Point) -> Pause {
        self.point.store(at as u8, Ordering::Relaxed);
        let state = match &self.mode {
            Mode::Real => {
                std::hint::spin_loop();
                std::thread::yield_now();
                PauseState::Ready
            }
            Mode::Stepped => PauseState::Once,
            Mode::Sim(pace) => PauseState::Sleep(rt::sleep(pace.draw())),
        };
        Pause { state }
    }
}

enum PauseState {
    Ready,
    Once,
    Sleep(rt::Sleep),
}

/// Future returned by [`Yielder::pause`].
pub struct Pause {
    state: PauseState,
}

impl std::fmt::Debug for Pause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self.state {
            PauseState::Ready => "ready",
            PauseState::Once => "once",
            PauseState::Sleep(_) => "sleep",
        };
        f.debug_struct("Pause").field("state", &s).finish()
    }
}

impl Future for Pause {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.state {
            PauseState::Ready => Poll::Ready(()),
            PauseState::Once => {
                self.state = PauseState::Ready;
                Poll::Pending
            }
            PauseState::Sleep(s) => Pin::new(s).poll(cx),
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
/// be polled now. Tests use it to park a thread at a chosen point. The
/// [`Stepper`] asks it for every process before each step; the
/// [`SimDriver`] asks it for the process the Sim is about to poll.
pub type Policy<'p> = Box<dyn FnMut(&View<'_>, usize) -> bool + 'p>;

/// Why a stepped or Sim run did not finish (the harness detected a hang).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hang {
    /// Seed of the schedule.
    pub seed: u64,
    /// Step at which the bound was hit (Sim: polls of dispatch processes).
    pub step: u64,
    /// Virtual time then, ns.
    pub now_ns: u64,
    /// Every unfinished process (its id) and where it spins.
    pub stuck: Vec<(usize, Point)>,
}

/// A process of the stepper: its future, its yielder, and whether it finished.
type Proc<'p> = (Pin<Box<dyn Future<Output = ()> + 'p>>, Yielder, bool);

/// Deterministic single-thread driver of a set of processes.
pub struct Stepper<'p> {
    procs: Vec<Proc<'p>>,
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
        Yielder::with_mode(Mode::Stepped)
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

/// What [`SimDriver`]'s processes share: their points, the policy, the
/// poll count and the run's clock. One thread only (the Sim's).
struct Gate {
    points: RefCell<Vec<Arc<AtomicU8>>>,
    policy: RefCell<Option<Policy<'static>>>,
    steps: Cell<u64>,
    clock: Arc<AtomicU64>,
}

impl Gate {
    fn points(&self) -> Vec<Point> {
        self.points
            .borrow()
            .iter()
            .map(|p| Point::from_u8(p.load(Ordering::Relaxed)))
            .collect()
    }

    fn allows(&self, step: u64, now_ns: u64, pid: usize) -> bool {
        let mut pol = self.policy.borrow_mut();
        let Some(pol) = pol.as_mut() else {
            return true;
        };
        let points = self.points();
        pol(
            &View {
                step,
                now_ns,
                points: &points,
            },
            pid,
        )
    }
}

/// One Sim-driven process: sets the run's clock, applies the policy, then
/// polls the process body. A disallowed poll sleeps a drawn delay instead.
struct Gated<F> {
    pid: usize,
    body: Pin<Box<F>>,
    wait: Option<rt::Sleep>,
    gate: Rc<Gate>,
    pace: Rc<Pace>,
    point: Arc<AtomicU8>,
}

impl<F: Future<Output = ()>> Future for Gated<F> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let step = this.gate.steps.get();
        this.gate.steps.set(step + 1);
        let now = rt::now().as_nanos();
        this.gate.clock.store(now, Ordering::Relaxed);
        if let Some(w) = this.wait.as_mut() {
            if Pin::new(w).poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.wait = None;
        }
        if !this.gate.allows(step, now, this.pid) {
            let mut w = rt::sleep(this.pace.draw());
            // The delay is at least 1 ns: the sleep arms a timer.
            if Pin::new(&mut w).poll(cx).is_pending() {
                this.wait = Some(w);
            }
            return Poll::Pending;
        }
        let r = this.body.as_mut().poll(cx);
        if r.is_ready() {
            this.point.store(Point::Done as u8, Ordering::Relaxed);
        }
        r
    }
}

/// The `rt::Sim` driver of a set of processes (see the [module docs](self)):
/// process `pid` (spawn order) runs on loop `pid` of one [`rt::Sim`] seeded
/// with `seed`; each of its pauses sleeps `tick_ns` plus an injected delay
/// uniform in `0..=max_delay_ns` virtual ns, drawn from an RNG seeded from
/// `seed` and the process's yielder rank. Same seed and same processes give
/// the same [`trace`](SimDriver::trace).
pub struct SimDriver {
    sim: rt::Sim,
    seed: u64,
    tick_ns: u64,
    max_delay_ns: u64,
    yielders: u64,
    gate: Rc<Gate>,
}

impl std::fmt::Debug for SimDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDriver")
            .field("seed", &self.seed)
            .field("tick_ns", &self.tick_ns)
            .field("max_delay_ns", &self.max_delay_ns)
            .field("procs", &self.gate.points.borrow().len())
            .finish()
    }
}

impl SimDriver {
    /// A driver over a fresh `rt::Sim::new(seed)`; `tick_ns` (clamped to at
    /// least 1) is the shortest pause, `max_delay_ns` the largest injected
    /// extra delay per pause, both virtual ns.
    pub fn new(seed: u64, tick_ns: u64, max_delay_ns: u64) -> SimDriver {
        SimDriver {
            sim: rt::Sim::new(seed),
            seed,
            tick_ns: tick_ns.max(1),
            max_delay_ns,
            yielders: 0,
            gate: Rc::new(Gate {
                points: RefCell::new(Vec::new()),
                policy: RefCell::new(None),
                steps: Cell::new(0),
                clock: Arc::new(AtomicU64::new(0)),
            }),
        }
    }

    /// The run's clock: virtual ns, the Sim's time as of the latest poll.
    pub fn clock(&self) -> Clock {
        Clock::Virtual(self.gate.clock.clone())
    }

    /// A Sim-mode yielder for the next process to [`spawn`](Self::spawn);
    /// its delay RNG is seeded from the driver's seed and the number of
    /// yielders made before it.
    pub fn yielder(&mut self) -> Yielder {
        let rank = self.yielders;
        self.yielders += 1;
        let rng_seed = self
            .seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(rank.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ 0x5851_F42D);
        Yielder::with_mode(Mode::Sim(Rc::new(Pace {
            tick_ns: self.tick_ns,
            max_delay_ns: self.max_delay_ns,
            rng: RefCell::new(fastrand::Rng::with_seed(rng_seed)),
        })))
    }

    /// Spawns `f` as process `pid` (= spawn order, returned) on a new loop
    /// of the Sim; `y` must come from [`yielder`](Self::yielder) (its point
    /// feeds policies and hang reports, its delays pace disallowed polls).
    ///
    /// # Errors
    /// [`xtc::Error::Inval`] for a yielder of another driver; those of
    /// [`rt::Loop::spawn`] (none on a fresh Sim loop with the default budget).
    pub fn spawn(
        &mut self,
        y: Yielder,
        f: impl Future<Output = ()> + 'static,
    ) -> xtc::Result<usize> {
        let Mode::Sim(pace) = &y.mode else {
            return Err(xtc::Error::Inval);
        };
        let pid = self.gate.points.borrow().len();
        let lp = self.sim.new_loop();
        lp.spawn(Gated {
            pid,
            body: Box::pin(f),
            wait: None,
            gate: self.gate.clone(),
            pace: pace.clone(),
            point: y.point.clone(),
        })?;
        self.gate.points.borrow_mut().push(y.point.clone());
        Ok(pid)
    }

    /// Installs a schedule constraint, asked before each poll of a process.
    pub fn set_policy(&mut self, p: Policy<'static>) {
        *self.gate.policy.borrow_mut() = Some(p);
    }

    /// Runs the Sim until every process finished (`Ok(polls)`), or for at
    /// most `max_steps` Sim steps (then a [`Hang`]: the harness detects the
    /// hang instead of hanging). A Sim that can make no progress (no
    /// runnable process and no timer; cannot happen while every pause arms a
    /// timer) is reported as a `Hang` too.
    pub fn run(&mut self, max_steps: u64) -> Result<u64, Hang> {
        match self.sim.run_steps(max_steps) {
            Ok(true) => Ok(self.gate.steps.get()),
            Ok(false) | Err(_) => Err(Hang {
                seed: self.seed,
                step: self.gate.steps.get(),
                now_ns: self.sim.now().as_nanos(),
                stuck: self
                    .gate
                    .points()
                    .into_iter()
                    .enumerate()
                    .filter(|(_, p)| *p != Point::Done)
                    .collect(),
            }),
        }
    }

    /// The Sim's event trace so far ([`rt::Sim::trace`]: loop index = pid).
    pub fn trace(&self) -> Vec<rt::TraceEvent> {
        self.sim.trace()
    }

    /// The Sim's seed.
    pub fn seed(&self) -> u64 {
        self.seed
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

    #[test]
    fn sim_driver_same_seed_same_trace_clock_policy_and_hang() {
        // Three processes each log 4 pauses; the Sim's trace and the log
        // order repeat for a seed; the clock reads the Sim's virtual time.
        let order = |seed| {
            let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
            let mut d = SimDriver::new(seed, 100, 50);
            let clock = d.clock();
            for id in 0..3 {
                let (y, l, c) = (d.yielder(), log.clone(), clock.clone());
                d.spawn(y.clone(), async move {
                    for _ in 0..4 {
                        l.borrow_mut().push((id, c.now_ns()));
                        assert_eq!(c.now_ns(), rt::now().as_nanos());
                        y.pause(Point::Loop).await;
                    }
                })
                .unwrap();
            }
            let polls = d.run(1000).unwrap();
            assert_eq!(polls, 15, "4 pauses + the final poll, per process");
            (log.take(), d.trace())
        };
        let (a, ta) = order(7);
        assert_eq!((a.clone(), ta), order(7));
        assert_ne!(a, order(8).0);
        // Pauses last 100..=150 ns: each process's 4th entry is at 300..=450.
        for id in 0..3 {
            let t: Vec<u64> = a.iter().filter(|e| e.0 == id).map(|e| e.1).collect();
            assert_eq!(t[0], 0);
            assert!((300..=450).contains(&t[3]), "{t:?}");
        }
        // A policy that never allows process 0 past its first pause: its
        // body keeps waiting; the bound reports where it spins.
        let mut d = SimDriver::new(3, 10, 0);
        let y = d.yielder();
        d.spawn(y.clone(), async move {
            loop {
                y.pause(Point::AckBarrier).await;
            }
        })
        .unwrap();
        d.set_policy(Box::new(|v, _| v.points[0] == Point::Start));
        let h = d.run(50).unwrap_err();
        assert_eq!(h.seed, 3);
        assert_eq!(h.stuck, vec![(0, Point::AckBarrier)]);
        assert_eq!(h.step, 50);
        assert_eq!(h.now_ns, 490);
        // A yielder of another driver is refused.
        assert_eq!(d.spawn(Yielder::real(), async {}), Err(xtc::Error::Inval));
    }
}
