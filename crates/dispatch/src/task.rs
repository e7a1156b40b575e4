//! The dispatch vocabulary: what a run is given and what it reports. Task
//! shapes and graphs ([`Shape`], [`TaskSpec`], [`OrchStep`], [`Graph`]), run
//! options ([`RunOpts`], [`PublishMode`], [`Escapes`]), what a run reports
//! ([`RunReport`], [`Stall`], [`DrainStall`]) and why it did not
//! ([`RunError`]). Plain data: the scheduler, the shared state and the
//! drain, publish and reclaim paths all speak it, none of them is imported
//! here (the scheduler file used to hold it, which tied them in a circle).

use serde::Serialize;

use super::emu::CoreEvent;
use super::metrics::{PopRecord, Summary};
use super::step::{Hang, Point};
use super::watermark::{PUBLISH_INTERVAL_K, REQUEST_AFTER_NS};
use xtc::Error;

/// Task shape: which cores of a cluster one SPMD block uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Shape {
    /// One AIC (cube) core per block.
    Aic,
    /// One AIV (vector) core per block.
    Aiv,
    /// A whole cluster per block: AIC + AIV0 + AIV1 (3 subtasks).
    Mix,
}

impl Shape {
    /// Subtasks (cores) per block: 3 for MIX, else 1.
    pub fn subtasks(self) -> u32 {
        if self == Shape::Mix { 3 } else { 1 }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// One task of a graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSpec {
    /// Shape of each block.
    pub shape: Shape,
    /// SPMD blocks (`>= 1`).
    pub block_num: u32,
    /// All blocks must start together (drain mode when one thread cannot
    /// place them; rejected at submit when the device cannot, D-15).
    pub sync_start: bool,
    /// Task ids this task waits for (each smaller than its own id).
    pub deps: Vec<usize>,
    /// Emulated run time of each subtask, ns.
    pub duration_ns: u64,
    /// Test hook: the kernel faults (the run latches a fatal error).
    pub fail: bool,
}

impl TaskSpec {
    /// A task of `block_num` blocks of `shape`, 1 µs each, no dependencies.
    pub fn new(shape: Shape, block_num: u32) -> TaskSpec {
        TaskSpec {
            shape,
            block_num,
            sync_start: false,
            deps: Vec::new(),
            duration_ns: 1000,
            fail: false,
        }
    }

    /// Marks the task sync_start.
    pub fn sync(mut self) -> TaskSpec {
        self.sync_start = true;
        self
    }

    /// Sets the dependencies.
    pub fn after(mut self, deps: &[usize]) -> TaskSpec {
        self.deps = deps.to_vec();
        self
    }

    /// Sets the subtask run time, ns.
    pub fn lasting(mut self, ns: u64) -> TaskSpec {
        self.duration_ns = ns;
        self
    }

    /// Makes the kernel fault (test hook).
    pub fn failing(mut self) -> TaskSpec {
        self.fail = true;
        self
    }
}

/// One orchestrator action, in submission order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrchStep {
    /// Submit a task (its id is its rank among the `Task` steps).
    Task(TaskSpec),
    /// Open a scope: tasks submitted until the matching close stay alive
    /// (not reclaimable) until the close.
    OpenScope,
    /// Close the innermost open scope.
    CloseScope,
}

/// A task graph as the orchestrator submits it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Graph {
    pub(crate) steps: Vec<OrchStep>,
    tasks: usize,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Appends a task; returns its id.
    pub fn add(&mut self, t: TaskSpec) -> usize {
        self.steps.push(OrchStep::Task(t));
        self.tasks += 1;
        self.tasks - 1
    }

    /// Appends a scope open.
    pub fn open_scope(&mut self) {
        self.steps.push(OrchStep::OpenScope);
    }

    /// Appends a scope close.
    pub fn close_scope(&mut self) {
        self.steps.push(OrchStep::CloseScope);
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.tasks
    }

    /// True without tasks.
    pub fn is_empty(&self) -> bool {
        self.tasks == 0
    }
}

/// Publication mode of normal (non-sync) pops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PublishMode {
    /// One fence per task of the pop (D-01).
    PerTask,
    /// One fence per pop (D-02).
    CrossTask,
}

/// The completed-latch escapes of the drain spins (D-06). All on by default;
/// turning one off is a test-only switch that re-creates the upstream hang.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Escapes {
    /// Sentinel wait (`pending == -1`).
    pub sentinel: bool,
    /// Ack barrier.
    pub ack_barrier: bool,
    /// Non-elected wait.
    pub follower: bool,
    /// Elected worker's wait for every thread's staging.
    pub stage_done: bool,
}

impl Escapes {
    /// Every escape on (the shipped protocol).
    pub const ALL: Escapes = Escapes {
        sentinel: true,
        ack_barrier: true,
        follower: true,
        stage_done: true,
    };
    /// Every escape off (test only).
    pub const NONE: Escapes = Escapes {
        sentinel: false,
        ack_barrier: false,
        follower: false,
        stage_done: false,
    };
}

/// Options of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOpts {
    /// Publication of normal pops (default cross-task).
    pub publish: PublishMode,
    /// D-04 exclusion: pops carrying a sync_start task flush per task.
    pub sync_exclusion: bool,
    /// D-06 escapes.
    pub escapes: Escapes,
    /// Generation-tagged drain attempts (the retry-ABA fix).
    pub generation_tags: bool,
    /// Task window (ring slots) of the orchestrator; `None` = unbounded.
    pub window: Option<usize>,
    /// D-09/D-10 pressure handshake.
    pub handshake: bool,
    /// Watermark publication interval K (D-08).
    pub watermark_k: u64,
    /// Consumer wait before requesting publication, ns (D-09).
    pub request_after_ns: u64,
    /// Consumer backstop, ns: after it the orchestrator reads the scheduler's
    /// local head directly (and fails with [`Error::Range`] if still stuck).
    pub backstop_ns: u64,
    /// Watchdog budget, ns. The scheduler loop: no progress for this long
    /// while this thread runs a task (or nobody does while tasks remain)
    /// latches [`Error::Internal`]. A drain spin (sentinel, ack barrier,
    /// follower, stage-done) that has waited this long ends the run the
    /// same way and reports a [`DrainStall`] naming the spin and the peers
    /// it waits for (the design note's loop watchdog cannot see inside a
    /// drain; this one does).
    pub watchdog_ns: u64,
    /// Test hook: this scheduler thread gets stuck (keeps yielding at its
    /// loop point, taking no further part) once a drain is pending, until
    /// the run completes. It stands for a peer that never reaches the ack
    /// barrier without having left (descheduled, stuck elsewhere). `None`
    /// (the default) in every real run.
    pub stuck_peer: Option<usize>,
}

impl Default for RunOpts {
    fn default() -> RunOpts {
        RunOpts {
            publish: PublishMode::CrossTask,
            sync_exclusion: true,
            escapes: Escapes::ALL,
            generation_tags: true,
            window: None,
            handshake: true,
            watermark_k: PUBLISH_INTERVAL_K,
            request_after_ns: REQUEST_AFTER_NS,
            backstop_ns: 100_000_000,
            watchdog_ns: 2_000_000_000,
            stuck_peer: None,
        }
    }
}

/// How a blocked orchestrator got its credit back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum StallEnd {
    /// A normal (batched) publication.
    Published,
    /// An acknowledged forced publication (the handshake).
    Acked,
    /// The backstop read the scheduler-local head.
    Backstop,
}

/// One orchestrator stall on task-window credit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Stall {
    /// Task that waited for a slot.
    pub task: usize,
    /// Stall start, ns.
    pub start_ns: u64,
    /// Stall end, ns.
    pub end_ns: u64,
    /// How it ended.
    pub how: StallEnd,
}

/// A drain spin that waited longer than the run's watchdog budget
/// ([`RunOpts::watchdog_ns`]) and ended the run (with [`Error::Internal`]):
/// where it spun and for whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainStall {
    /// The scheduler thread whose spin gave up.
    pub thread: usize,
    /// The spin: [`Point::Sentinel`] (waiting for the entering thread to
    /// finish initialising), [`Point::AckBarrier`], [`Point::Follower`]
    /// (waiting for the elected worker's go and the end of the drain) or
    /// [`Point::StageDone`] (the elected worker waiting for staging).
    pub point: Point,
    /// The scheduler threads it was waiting for: the entering thread (sentinel),
    /// those whose ack (barrier) or staging (stage-done) had not arrived, the
    /// elected worker (follower).
    pub waiting_for: Vec<usize>,
    /// The drain attempt (generation) it waited in.
    pub attempt: u64,
    /// When the spin started, ns on the run's clock.
    pub since_ns: u64,
    /// When it gave up, ns on the run's clock.
    pub at_ns: u64,
}

impl std::fmt::Display for DrainStall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "drain stall: scheduler thread {} waited at {:?} (attempt {}) from {} ns to {} ns for thread(s) {:?}",
            self.thread, self.point, self.attempt, self.since_ns, self.at_ns, self.waiting_for
        )
    }
}

/// Everything a run produced.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// Final value of every output slot.
    pub outputs: Vec<u64>,
    /// Expected value of every slot.
    pub expected: Vec<u64>,
    /// Fatal error latched by the run (kernel fault, watchdog, deadlock verdict).
    pub fault: Option<Error>,
    /// Every pop's record.
    pub pops: Vec<PopRecord>,
    /// Every finished subtask.
    pub events: Vec<CoreEvent>,
    /// Summary figures.
    pub summary: Summary,
    /// Orchestrator stalls on window credit.
    pub stalls: Vec<Stall>,
    /// Watermark (publications, local advances).
    pub watermark: (u64, u64),
    /// Structural deadlock verdicts (from acknowledged heads only, D-12).
    pub verdicts: u32,
    /// Drains abandoned under the completed latch (or by the drain watchdog).
    pub drains_abandoned: u64,
    /// The drain spin that ended the run by waiting past the watchdog
    /// budget, if one did (then `fault` is `Internal`).
    pub drain_stall: Option<DrainStall>,
    /// Run's end time, ns.
    pub end_ns: u64,
    /// Output slots of each task.
    pub task_slots: Vec<std::ops::Range<usize>>,
    /// Each task completed without a kernel fault.
    pub task_completed_ok: Vec<bool>,
    /// The `rt::Sim` event trace of a [`Scheduler::run_sim`](crate::Scheduler::run_sim) run with
    /// [`SimOpts::keep_trace`](crate::SimOpts::keep_trace) (loop index = process id); empty otherwise.
    pub sim_trace: Vec<xtc::rt::TraceEvent>,
}

impl RunReport {
    /// True when task `id` completed without a fault and each of its output
    /// slots holds exactly its expected value (false for unknown ids).
    pub fn task_exact(&self, id: usize) -> bool {
        match (self.task_slots.get(id), self.task_completed_ok.get(id)) {
            (Some(r), Some(&ok)) => ok && self.outputs[r.clone()] == self.expected[r.clone()],
            _ => false,
        }
    }

    /// True when every output slot holds exactly its expected value.
    pub fn outputs_exact(&self) -> bool {
        self.outputs == self.expected
    }

    /// The store fences of every pop (D-02, D-04): exactly one for a pop
    /// without a sync_start task and for a drain pop; one per dispatched
    /// task for a pop carrying a sync_start task.
    ///
    /// # Errors
    /// [`FenceCountError`] naming the first pop that breaks the rule.
    pub fn check_fence_counts(&self) -> std::result::Result<(), FenceCountError> {
        for p in &self.pops {
            let due = if p.sync && !p.drain { p.tasks } else { 1 };
            if p.fences != due {
                return Err(FenceCountError {
                    due,
                    pop: p.clone(),
                });
            }
        }
        Ok(())
    }
}

/// A pop whose store fences break D-02/D-04 ([`RunReport::check_fence_counts`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} store fences where {due} were due: {pop:?}", pop.fences)]
pub struct FenceCountError {
    /// The fences the rule asks of this pop.
    pub due: u32,
    /// The pop, with the fences it issued.
    pub pop: PopRecord,
}

/// Why a run did not produce a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError {
    /// The graph or options were rejected before the run.
    Invalid(Error),
    /// A stepped or Sim run hit its step bound: the harness detected a hang
    /// (the report names the seed and where each unfinished process spins).
    Hang(Hang),
}

impl From<Error> for RunError {
    fn from(e: Error) -> RunError {
        RunError::Invalid(e)
    }
}
