//! The dispatch scheduler: the scheduler loop, the orchestrator, and the
//! three drivers (task graphs, run options and reports, the vocabulary they
//! run on, are in [`super::task`]): real threads ([`Scheduler::run_threads`],
//! metrics), the deterministic stepper ([`Scheduler::run_stepped`]) and the
//! crate's simulator `rt::Sim` with injected delays ([`Scheduler::run_sim`]).
//!
//! The process set is defined once (scheduler threads `0..sched_threads`,
//! then the core host, then the orchestrator; that order is the process id
//! policies and [`Hang`] reports use). The drivers differ only in how each
//! process is spawned (an OS thread, a stepper future, an `rt` process on its
//! own Sim loop) and in what [`Yielder::pause`] does (see [`super::step`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::drain::handle_drain;
use super::emu::{CoreStep, EmuCore, Regs};
use super::metrics::summarize;
use super::profile::DeviceProfile;
use super::publish::dispatch_ready;
use super::state::RunState;
use super::step::{Clock, Hang, Point, Policy, SimDriver, Stepper, View, Yielder};
use super::task::{Graph, OrchStep, RunError, RunOpts, RunReport, Shape};
use xtc::{Error, Result};

/// Read-only view of a stepped or Sim run for schedule policies.
pub struct Probe(Arc<RunState>);

impl Probe {
    /// Drain retries so far.
    pub fn drain_retries(&self) -> u64 {
        self.0.m.c.drain_retries.load(Ordering::Relaxed)
    }
    /// The drain's `pending` word (0 idle, -1 initialising, > 0 block_num).
    pub fn drain_pending(&self) -> i64 {
        self.0.drain.pending.load(Ordering::Acquire)
    }
    /// True once `task` completed (retired by its owner).
    pub fn task_completed(&self, task: usize) -> bool {
        self.0.tasks[task].completed.load(Ordering::Acquire)
    }
    /// Scheduler thread whose cores run `task` now.
    pub fn task_thread(&self, task: usize) -> Option<usize> {
        self.0.task_thread(task)
    }
    /// True when a core running `task` wrote FIN (not yet retired).
    pub fn task_finished_on_core(&self, task: usize) -> bool {
        self.0.task_finished_on_core(task)
    }
    /// True once the run's completed latch is set.
    pub fn completed(&self) -> bool {
        self.0.is_completed()
    }
}

/// A schedule constraint of a stepped or Sim run: `(view, probe, pid) ->
/// may poll pid`. Process ids: scheduler threads `0..sched_threads`, then
/// the core host, then the orchestrator. Under [`Scheduler::run_stepped`] it
/// is asked for every process before each step; under [`Scheduler::run_sim`]
/// for the process about to be polled (a disallowed one keeps pausing
/// without running its body). Either way a forced schedule is expressed the
/// same way (D-06/D-07 proofs).
pub type ProbePolicy = Box<dyn FnMut(&View<'_>, &Probe, usize) -> bool>;

/// Options of a stepped run.
pub struct StepOpts {
    /// Schedule seed.
    pub seed: u64,
    /// Virtual ns per step.
    pub tick_ns: u64,
    /// Step bound: reaching it is a detected hang.
    pub max_steps: u64,
    /// Optional schedule constraint.
    pub policy: Option<ProbePolicy>,
}

impl StepOpts {
    /// Seeded, 100 ns per step, 5 M steps, no policy.
    pub fn seeded(seed: u64) -> StepOpts {
        StepOpts {
            seed,
            tick_ns: 100,
            max_steps: 5_000_000,
            policy: None,
        }
    }
}

/// Options of a run under `rt::Sim` ([`Scheduler::run_sim`]).
///
/// Every pause of a process sleeps `tick_ns + d` virtual ns, `d` uniform in
/// `0..=max_delay_ns` from an RNG seeded by `seed` (and the process id), so
/// the injected delays are part of the reproducible schedule; the Sim
/// itself (its pick of the next runnable process) is seeded with `seed` too.
pub struct SimOpts {
    /// Seed of the Sim and of the injected delays.
    pub seed: u64,
    /// Shortest pause, virtual ns (clamped to at least 1).
    pub tick_ns: u64,
    /// Largest injected extra delay per pause, virtual ns (0 = none).
    pub max_delay_ns: u64,
    /// Step bound (Sim steps = polls of a process): reaching it without
    /// every process finished is a detected hang, [`RunError::Hang`].
    pub max_steps: u64,
    /// Optional schedule constraint (the same type as [`StepOpts::policy`]).
    pub policy: Option<ProbePolicy>,
    /// Copy the Sim's event trace into [`RunReport::sim_trace`].
    pub keep_trace: bool,
}

impl SimOpts {
    /// Seeded, 100 ns tick, up to 200 ns injected delay per pause, 2 M
    /// steps, no policy, no trace kept.
    pub fn seeded(seed: u64) -> SimOpts {
        SimOpts {
            seed,
            tick_ns: 100,
            max_delay_ns: 200,
            max_steps: 2_000_000,
            policy: None,
            keep_trace: false,
        }
    }
}

/// The scheduler of one emulated device. One run at a time: the register
/// region is reset at the start of each run.
pub struct Scheduler {
    prof: DeviceProfile,
    regs: Arc<Regs>,
    busy: std::sync::Mutex<()>,
}

impl Scheduler {
    /// Maps the device's register region. Errors: [`Error::Inval`] for an
    /// invalid profile, [`Error::Nomem`] when the mapping fails.
    pub fn new(prof: DeviceProfile) -> Result<Scheduler> {
        prof.validate()?;
        let regs = Arc::new(Regs::new(prof.cores())?);
        Ok(Scheduler {
            prof,
            regs,
            busy: std::sync::Mutex::new(()),
        })
    }

    /// The device profile.
    pub fn profile(&self) -> &DeviceProfile {
        &self.prof
    }

    /// Admission check of a graph (the orchestrator's submit rule).
    ///
    /// Errors ([`Error::Inval`]): `block_num == 0`; a sync_start task with
    /// `block_num` above the device limit (clusters for MIX/AIC, AIV cores for
    /// AIV: the cohort could never start together); a dependency on a task
    /// not submitted before it; unbalanced scopes.
    pub fn validate(&self, g: &Graph) -> Result<()> {
        let mut id = 0;
        let mut depth = 0i64;
        for s in &g.steps {
            match s {
                OrchStep::Task(t) => {
                    let limit = match t.shape {
                        Shape::Aiv => 2 * self.prof.clusters,
                        _ => self.prof.clusters,
                    } as u32;
                    if t.block_num == 0
                        || (t.sync_start && t.block_num > limit)
                        || t.deps.iter().any(|&d| d >= id)
                    {
                        return Err(Error::Inval);
                    }
                    id += 1;
                }
                OrchStep::OpenScope => depth += 1,
                OrchStep::CloseScope => {
                    depth -= 1;
                    if depth < 0 {
                        return Err(Error::Inval);
                    }
                }
            }
        }
        if depth == 0 {
            Ok(())
        } else {
            Err(Error::Inval)
        }
    }

    fn shared(&self, g: &Graph, opts: RunOpts, clock: Clock) -> Result<Arc<RunState>> {
        self.validate(g)?;
        if opts.window == Some(0) || opts.watermark_k == 0 {
            return Err(Error::Inval);
        }
        Ok(Arc::new(RunState::new(
            self.prof.clone(),
            opts,
            self.regs.clone(),
            clock,
            g.steps.clone(),
        )))
    }

    /// Runs `g` on real OS threads: one per scheduler thread, one core host
    /// for every emulated core, one orchestrator (the calling thread). Metrics
    /// are meaningful here.
    /// Errors: [`Error::Inval`] for a rejected graph or options,
    /// [`Error::Again`] while another run of this scheduler is in progress.
    pub fn run_threads(&self, g: &Graph, opts: RunOpts) -> Result<RunReport> {
        let _run = self.busy.try_lock().map_err(|_| Error::Again)?;
        let sh = self.shared(g, opts, Clock::Real(std::time::Instant::now()))?;
        let procs = processes(&self.prof);
        let (&orch, rest) = procs.split_last().expect("the orchestrator");
        std::thread::scope(|s| {
            for &p in rest {
                let sh = sh.clone();
                s.spawn(move || block_on(run_proc(sh, p, Yielder::real())));
            }
            block_on(run_proc(sh.clone(), orch, Yielder::real()));
        });
        Ok(report(&sh))
    }

    /// Runs `g` under the deterministic stepper: every process is a future
    /// polled one step at a time in a seeded order, time is virtual, and a
    /// hang is reported as [`RunError::Hang`] when `max_steps` is reached.
    /// A rejected graph is `RunError::Invalid(Inval)`; a concurrent run of
    /// this scheduler is `RunError::Invalid(Again)`.
    pub fn run_stepped(
        &self,
        g: &Graph,
        opts: RunOpts,
        so: StepOpts,
    ) -> std::result::Result<RunReport, RunError> {
        let _run = self.busy.try_lock().map_err(|_| Error::Again)?;
        let mut st = Stepper::new(so.seed, so.tick_ns);
        let sh = self.run_driven(&mut st, g, opts, so.policy, so.max_steps)?;
        drop(st);
        Ok(report(&sh))
    }

    /// Runs `g` under the crate's deterministic simulator [`xtc::rt::Sim`]
    /// seeded with `so.seed`: each process (every scheduler thread, the core
    /// host, the orchestrator) is an `rt` process on its own Sim loop (loops
    /// model the OS threads); every [`Yielder::pause`] sleeps
    /// `so.tick_ns` plus a seeded injected delay (`0..=so.max_delay_ns`), so
    /// the Sim's seeded pick among runnable processes and its virtual clock
    /// (jumping to the next timer) decide the interleaving. The run's clock
    /// is the Sim's virtual time, ns from the start of the run. `so.policy`
    /// forces schedules as under the stepper (a disallowed process keeps
    /// pausing). This is how the liveness proofs (D-06, D-07), the stress
    /// scene (D-15) and the reclaim handshake (D-09, D-13) are re-made with
    /// injected delays.
    ///
    /// Errors: a rejected graph or options is `RunError::Invalid(Inval)`; a
    /// concurrent run of this scheduler is `RunError::Invalid(Again)`;
    /// reaching `so.max_steps` Sim steps with a process unfinished is
    /// [`RunError::Hang`] (seed, step, virtual time, each unfinished
    /// process's [`Point`]).
    pub fn run_sim(
        &self,
        g: &Graph,
        opts: RunOpts,
        so: SimOpts,
    ) -> std::result::Result<RunReport, RunError> {
        let _run = self.busy.try_lock().map_err(|_| Error::Again)?;
        let mut d = SimDriver::new(so.seed, so.tick_ns, so.max_delay_ns);
        let sh = self.run_driven(&mut d, g, opts, so.policy, so.max_steps)?;
        let mut r = report(&sh);
        if so.keep_trace {
            r.sim_trace = d.trace();
        }
        Ok(r)
    }

    /// The shared body of the deterministic drivers: spawns every process
    /// on `d`, installs the policy, runs to completion or the bound.
    fn run_driven<D: Driver>(
        &self,
        d: &mut D,
        g: &Graph,
        opts: RunOpts,
        policy: Option<ProbePolicy>,
        max_steps: u64,
    ) -> std::result::Result<Arc<RunState>, RunError> {
        let sh = self.shared(g, opts, d.clock())?;
        for p in processes(&self.prof) {
            let y = d.yielder();
            d.spawn(y.clone(), run_proc(sh.clone(), p, y))?;
        }
        if let Some(mut pol) = policy {
            let probe = Probe(sh.clone());
            d.set_policy(Box::new(move |v, pid| pol(v, &probe, pid)));
        }
        d.run(max_steps).map_err(RunError::Hang)?;
        Ok(sh)
    }
}

/// What the deterministic drivers provide (the real-thread driver spawns OS
/// threads instead).
trait Driver {
    fn clock(&self) -> Clock;
    fn yielder(&mut self) -> Yielder;
    fn spawn(
        &mut self,
        y: Yielder,
        f: impl std::future::Future<Output = ()> + 'static,
    ) -> Result<()>;
    fn set_policy(&mut self, p: Policy<'static>);
    fn run(&mut self, max_steps: u64) -> std::result::Result<u64, Hang>;
}

impl Driver for Stepper<'static> {
    fn clock(&self) -> Clock {
        Stepper::clock(self)
    }
    fn yielder(&mut self) -> Yielder {
        Stepper::yielder(self)
    }
    fn spawn(
        &mut self,
        y: Yielder,
        f: impl std::future::Future<Output = ()> + 'static,
    ) -> Result<()> {
        Stepper::spawn(self, y, f);
        Ok(())
    }
    fn set_policy(&mut self, p: Policy<'static>) {
        Stepper::set_policy(self, p)
    }
    fn run(&mut self, max_steps: u64) -> std::result::Result<u64, Hang> {
        Stepper::run(self, max_steps)
    }
}

impl Driver for SimDriver {
    fn clock(&self) -> Clock {
        SimDriver::clock(self)
    }
    fn yielder(&mut self) -> Yielder {
        SimDriver::yielder(self)
    }
    fn spawn(
        &mut self,
        y: Yielder,
        f: impl std::future::Future<Output = ()> + 'static,
    ) -> Result<()> {
        SimDriver::spawn(self, y, f).map(|_| ())
    }
    fn set_policy(&mut self, p: Policy<'static>) {
        SimDriver::set_policy(self, p)
    }
    fn run(&mut self, max_steps: u64) -> std::result::Result<u64, Hang> {
        SimDriver::run(self, max_steps)
    }
}

/// One process of a run.
#[derive(Debug, Clone, Copy)]
enum Proc {
    /// Scheduler thread `t`.
    Sched(usize),
    /// The host of every emulated core.
    CoreHost,
    /// The orchestrator.
    Orch,
}

/// Every process of a run, in process-id order.
fn processes(prof: &DeviceProfile) -> Vec<Proc> {
    (0..prof.sched_threads)
        .map(Proc::Sched)
        .chain([Proc::CoreHost, Proc::Orch])
        .collect()
}

async fn run_proc(sh: Arc<RunState>, p: Proc, y: Yielder) {
    match p {
        Proc::Sched(t) => sched_loop(sh, t, y).await,
        Proc::CoreHost => core_host(sh, y).await,
        Proc::Orch => orchestrator(sh, y).await,
    }
}

fn block_on(f: impl std::future::Future<Output = ()>) {
    futures_lite::future::block_on(f)
}

fn report(sh: &RunState) -> RunReport {
    let pops = sh.m.pops.lock().unwrap().clone();
    let events = sh.m.events.lock().unwrap().clone();
    let summary = summarize(&pops, &events, &sh.m.c);
    RunReport {
        outputs: sh.out.iter().map(|v| v.load(Ordering::Acquire)).collect(),
        expected: sh.expected(),
        fault: *sh.fault.lock().unwrap(),
        stalls: sh.stalls.lock().unwrap().clone(),
        watermark: sh.wm.counts(),
        verdicts: sh.verdicts.load(Ordering::Relaxed),
        drains_abandoned: sh.m.c.drains_abandoned.load(Ordering::Relaxed),
        drain_stall: sh.drain_stall.lock().unwrap().clone(),
        end_ns: sh.now(),
        task_slots: sh
            .tasks
            .iter()
            .map(|t| t.out_base..t.out_base + t.total_sub as usize)
            .collect(),
        task_completed_ok: sh
            .tasks
            .iter()
            .map(|t| t.completed.load(Ordering::Acquire) && !t.spec.fail)
            .collect(),
        pops,
        events,
        summary,
        sim_trace: Vec::new(),
    }
}

/// One scheduler thread: completion, drain, dispatch, watermark duties,
/// watchdog. Leaves the instant the completed latch is seen.
async fn sched_loop(sh: Arc<RunState>, t: usize, y: Yielder) {
    let mut last_progress = sh.now();
    loop {
        if sh.is_completed() {
            break;
        }
        let mut progress = sh.poll_completions(t);
        if sh.is_completed() {
            break;
        }
        if sh.drain.pending.load(Ordering::Acquire) != 0 {
            if sh.opts.stuck_peer == Some(t) {
                // Test hook: a peer stuck outside the drain until the run ends.
                while !sh.is_completed() {
                    y.pause(Point::Loop).await;
                }
                break;
            }
            handle_drain(&sh, t, &y).await;
            last_progress = sh.now();
            y.pause(Point::Loop).await;
            continue;
        }
        let (p, _) = dispatch_ready(&sh, t);
        progress |= p;
        if t == 0 {
            // D-10: productive and idle iterations alike.
            progress |= sh.service_requests();
        }
        if progress {
            last_progress = sh.now();
        } else {
            // D-11: only idle loops drain the deferred mask.
            let _ = sh.wm.drain_deferred(|i| sh.consumed(i), sh.submitted_u64());
            sh.maybe_finish();
            if sh.now() - last_progress > sh.opts.watchdog_ns && sh.watchdog_should_fire(t) {
                sh.latch_fatal(Error::Internal);
            }
        }
        y.pause(Point::Loop).await;
    }
    y.done();
}

/// The host of every emulated core: polls each core once per iteration.
async fn core_host(sh: Arc<RunState>, y: Yielder) {
    let mut cores: Vec<EmuCore> = (0..sh.prof.cores()).map(EmuCore::new).collect();
    let mut done = Vec::new();
    while !sh.is_completed() {
        for c in &mut cores {
            if let CoreStep::Finished(ev) = c.poll(&sh.regs, &sh.out, || sh.now()) {
                done.push(ev);
            }
        }
        if !done.is_empty() {
            sh.m.events.lock().unwrap().append(&mut done);
        }
        y.pause(Point::CoreHost).await;
    }
    y.done();
}

/// The orchestrator: submits the graph in order, waiting for task-window
/// credit (the published watermark) with the pressure handshake.
async fn orchestrator(sh: Arc<RunState>, y: Yielder) {
    let mut id = 0usize;
    let mut scopes: Vec<usize> = Vec::new();
    for step in sh.script.clone() {
        match step {
            OrchStep::OpenScope => scopes.push(id),
            OrchStep::CloseScope => {
                let from = scopes.pop().unwrap_or(0);
                if scopes.is_empty() {
                    // The outermost scope closed: its tasks become reclaimable.
                    for t in &sh.tasks[from..id] {
                        t.scope_open.store(false, Ordering::Release);
                    }
                    sh.wm.defer();
                }
            }
            OrchStep::Task(_) => {
                if !sh.wait_credit(id, scopes.first().copied(), &y).await {
                    break;
                }
                sh.submit(id, !scopes.is_empty());
                id += 1;
                if sh.clock.is_virtual() {
                    // Stepped and Sim runs interleave every submission; a
                    // real orchestrator submits while it has credit.
                    y.pause(Point::Orch).await;
                }
            }
        }
    }
    sh.orch_done.store(true, Ordering::Release);
    sh.maybe_finish();
    y.done();
}
