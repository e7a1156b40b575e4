//! Shared state of one run: tasks, ready queues, core trackers, completion.
//!
//! # Who touches what
//!
//! - `trackers[t]` (a `Mutex`, never held across a yield point): scheduler
//!   thread `t` in its dispatch and completion phases; during a drain every
//!   thread stages only its own tracker, and the elected worker only *reads*
//!   peers' trackers (`count_global_available`).
//! - `ready[shape]`: any scheduler thread (pop batch, re-push), and the
//!   completion path / orchestrator (push). A sync_start task held by a
//!   drain is in no queue.
//! - `TaskRt::next_block`: CAS-claimed block ranges (a re-pushed SPMD task can
//!   be claimed by several threads).
//! - `completed`: the run's latch; set once (all tasks done, or a fatal
//!   error); every loop and every drain spin reads it (D-06).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::drain::DrainState;
use super::emu::{COND_FIN, Desc, Regs, next_token};
use super::metrics::Metrics;
use super::profile::{CORES_PER_CLUSTER, DeviceProfile};
use super::step::Clock;
use super::task::{DrainStall, OrchStep, RunOpts, Shape, Stall, TaskSpec};
use super::watermark::Watermark;
use xtc::Error;

/// A prepared core: the doorbell store still to issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishHandle {
    /// Core whose doorbell to ring.
    pub core: usize,
    /// Token to store.
    pub token: u32,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Running {
    pub task: usize,
    pub token: u32,
}

/// One scheduler thread's view of its cores (3 per owned cluster).
#[derive(Debug)]
pub(crate) struct Tracker {
    pub clusters: Vec<usize>,
    pub running: Vec<Option<Running>>,
    pub last_token: Vec<u32>,
}

impl Tracker {
    fn new(clusters: Vec<usize>, cores: usize) -> Tracker {
        Tracker {
            clusters,
            running: vec![None; cores],
            last_token: vec![0; cores],
        }
    }

    /// Dispatchable units for `shape`: for AIC and AIV one idle core each, for
    /// MIX one fully idle cluster. A unit is `(first core, core count)`.
    pub fn idle_units(&self, shape: Shape) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        for &ci in self.clusters.iter().rev() {
            let b = ci * CORES_PER_CLUSTER;
            let idle = |c: usize| self.running[c].is_none();
            match shape {
                Shape::Aic if idle(b) => v.push((b, 1)),
                Shape::Aiv => v.extend((b + 1..b + 3).filter(|&c| idle(c)).map(|c| (c, 1))),
                Shape::Mix if (b..b + 3).all(idle) => v.push((b, 3)),
                _ => {}
            }
        }
        v
    }

    /// True when any owned core runs a task.
    pub fn any_running(&self) -> bool {
        self.running.iter().any(Option::is_some)
    }
}

/// Per-task run state.
#[derive(Debug)]
pub(crate) struct TaskRt {
    pub spec: TaskSpec,
    pub out_base: usize,
    pub total_sub: u32,
    pub fanin: AtomicU32,
    pub next_block: AtomicU32,
    pub done_sub: AtomicU32,
    pub completed: AtomicBool,
    pub scope_open: AtomicBool,
    pub fanout: Mutex<(bool, Vec<usize>)>,
}

/// The run: everything the scheduler threads, the core host and the
/// orchestrator share.
pub(crate) struct RunState {
    pub prof: DeviceProfile,
    pub opts: RunOpts,
    pub regs: Arc<Regs>,
    pub clock: Clock,
    pub tasks: Vec<TaskRt>,
    pub script: Vec<OrchStep>,
    pub out: Vec<AtomicU64>,
    pub ready: [Mutex<VecDeque<usize>>; 3],
    pub trackers: Vec<Mutex<Tracker>>,
    pub completed: AtomicBool,
    pub fault: Mutex<Option<Error>>,
    pub done_tasks: AtomicUsize,
    pub submitted: AtomicUsize,
    pub orch_done: AtomicBool,
    pub drain: DrainState,
    pub wm: Watermark,
    pub m: Metrics,
    pub stalls: Mutex<Vec<Stall>>,
    /// The first drain spin that waited past the watchdog budget.
    pub drain_stall: Mutex<Option<DrainStall>>,
    pub verdicts: AtomicU32,
}

/// Expected output of subtask `sub` of block `block` of `task`.
pub(crate) fn expected_value(task: usize, block: u32, sub: u32) -> u64 {
    ((task as u64 + 1) << 32) | u64::from(block * 3 + sub + 1)
}

impl RunState {
    pub fn new(
        prof: DeviceProfile,
        opts: RunOpts,
        regs: Arc<Regs>,
        clock: Clock,
        script: Vec<OrchStep>,
    ) -> RunState {
        let mut tasks = Vec::new();
        let mut out_len = 0usize;
        for s in &script {
            if let OrchStep::Task(spec) = s {
                let total_sub = spec.block_num * spec.shape.subtasks();
                tasks.push(TaskRt {
                    spec: spec.clone(),
                    out_base: out_len,
                    total_sub,
                    fanin: AtomicU32::new(spec.deps.len() as u32 + 1),
                    next_block: AtomicU32::new(0),
                    done_sub: AtomicU32::new(0),
                    completed: AtomicBool::new(false),
                    scope_open: AtomicBool::new(false),
                    fanout: Mutex::new((false, Vec::new())),
                });
                out_len += total_sub as usize;
            }
        }
        let trackers = (0..prof.sched_threads)
            .map(|t| Mutex::new(Tracker::new(prof.clusters_of(t), prof.cores())))
            .collect();
        regs.reset();
        RunState {
            drain: DrainState::new(prof.sched_threads),
            wm: Watermark::new(opts.watermark_k),
            out: (0..out_len).map(|_| AtomicU64::new(0)).collect(),
            ready: Default::default(),
            trackers,
            completed: AtomicBool::new(false),
            fault: Mutex::new(None),
            done_tasks: AtomicUsize::new(0),
            submitted: AtomicUsize::new(0),
            orch_done: AtomicBool::new(false),
            m: Metrics::default(),
            stalls: Mutex::new(Vec::new()),
            drain_stall: Mutex::new(None),
            verdicts: AtomicU32::new(0),
            prof,
            opts,
            regs,
            clock,
            tasks,
            script,
        }
    }

    pub fn now(&self) -> u64 {
        self.clock.now_ns()
    }

    pub fn is_completed(&self) -> bool {
        self.completed.load(Ordering::Acquire)
    }

    /// Latches the run as failed (first error wins) and completed.
    pub fn latch_fatal(&self, e: Error) {
        self.fault.lock().unwrap().get_or_insert(e);
        self.completed.store(true, Ordering::Release);
    }

    /// Latches completion when the orchestrator is done and every submitted
    /// task completed.
    pub fn maybe_finish(&self) {
        if self.orch_done.load(Ordering::Acquire)
            && self.done_tasks.load(Ordering::Acquire) == self.submitted.load(Ordering::Acquire)
        {
            self.completed.store(true, Ordering::Release);
        }
    }

    /// Expected value of every output slot.
    pub fn expected(&self) -> Vec<u64> {
        let mut v = vec![0; self.out.len()];
        for (id, t) in self.tasks.iter().enumerate() {
            if t.spec.fail {
                continue;
            }
            for b in 0..t.spec.block_num {
                for s in 0..t.spec.shape.subtasks() {
                    v[t.out_base + (b * t.spec.shape.subtasks() + s) as usize] =
                        expected_value(id, b, s);
                }
            }
        }
        v
    }

    pub fn push_ready(&self, task: usize) {
        let q = self.tasks[task].spec.shape.index();
        self.ready[q].lock().unwrap().push_back(task);
    }

    pub fn pop_batch(&self, shape: Shape, max: usize) -> Vec<usize> {
        let mut q = self.ready[shape.index()].lock().unwrap();
        let n = max.min(q.len());
        q.drain(..n).collect()
    }

    /// Orchestrator: makes task `id` known; ready at once when its fan-in is done.
    pub fn submit(&self, id: usize, in_scope: bool) {
        let t = &self.tasks[id];
        t.scope_open.store(in_scope, Ordering::Relaxed);
        for &d in &t.spec.deps {
            let mut fo = self.tasks[d].fanout.lock().unwrap();
            if fo.0 {
                t.fanin.fetch_sub(1, Ordering::AcqRel);
            } else {
                fo.1.push(id);
            }
        }
        self.submitted.fetch_add(1, Ordering::AcqRel);
        if t.fanin.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.push_ready(id);
        }
    }

    /// A slot of the task window is consumed: completed and out of any open scope.
    pub fn consumed(&self, i: u64) -> bool {
        let t = &self.tasks[i as usize];
        t.completed.load(Ordering::Acquire) && !t.scope_open.load(Ordering::Acquire)
    }

    pub fn submitted_u64(&self) -> u64 {
        self.submitted.load(Ordering::Acquire) as u64
    }

    /// Claims up to `n` blocks of `task` (CAS on `next_block`); returns `(start, count)`.
    pub fn claim(&self, task: usize, n: u32) -> (u32, u32) {
        let t = &self.tasks[task];
        let bn = t.spec.block_num;
        let mut cur = t.next_block.load(Ordering::Acquire);
        loop {
            let take = n.min(bn.saturating_sub(cur));
            if take == 0 {
                return (cur, 0);
            }
            match t.next_block.compare_exchange(
                cur,
                cur + take,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return (cur, take),
                Err(v) => cur = v,
            }
        }
    }

    /// Prepares one core for subtask (`task`, `block`, core's sub slot):
    /// next token, descriptor into the parity buffer, tracker updated before
    /// publication. Returns the handle to publish.
    pub fn prepare(
        &self,
        tr: &mut Tracker,
        core: usize,
        task: usize,
        block: u32,
        pop: u32,
    ) -> PublishHandle {
        let t = &self.tasks[task];
        let sub = if t.spec.shape == Shape::Mix {
            (core % CORES_PER_CLUSTER) as u32
        } else {
            0
        };
        let token = next_token(tr.last_token[core]);
        tr.last_token[core] = token;
        let desc = Desc {
            task: task as u32,
            block_idx: block,
            sub,
            pop,
            out_index: (t.out_base + (block * t.spec.shape.subtasks() + sub) as usize) as u64,
            value: expected_value(task, block, sub),
            duration_ns: t.spec.duration_ns,
            fail: t.spec.fail,
        };
        self.regs.write_desc(core, token, &desc);
        self.cost(self.prof.prepare_ns);
        tr.running[core] = Some(Running { task, token });
        PublishHandle { core, token }
    }

    /// Busy-waits a cost knob (real-thread runs only).
    pub fn cost(&self, ns: u64) {
        if ns == 0 || self.clock.is_virtual() {
            return;
        }
        let end = self.now() + ns;
        while self.now() < end {
            std::hint::spin_loop();
        }
    }

    /// Phase 1: polls `cond` of thread `t`'s running cores, retires finished
    /// subtasks, completes tasks. Returns true when anything retired.
    pub fn poll_completions(&self, t: usize) -> bool {
        let mut retired = Vec::new();
        {
            let mut tr = self.trackers[t].lock().unwrap();
            for c in 0..tr.running.len() {
                let Some(r) = tr.running[c] else { continue };
                if self.regs.cond(c) != r.token | COND_FIN {
                    continue;
                }
                tr.running[c] = None;
                if self.regs.fault(c) == r.token {
                    self.latch_fatal(Error::Internal);
                }
                retired.push(r.task);
            }
        }
        for &task in &retired {
            let tk = &self.tasks[task];
            if tk.done_sub.fetch_add(1, Ordering::AcqRel) + 1 == tk.total_sub {
                self.complete_task(task);
            }
        }
        !retired.is_empty()
    }

    fn complete_task(&self, task: usize) {
        let t = &self.tasks[task];
        let fanout = {
            let mut fo = t.fanout.lock().unwrap();
            fo.0 = true;
            std::mem::take(&mut fo.1)
        };
        t.completed.store(true, Ordering::Release);
        for c in fanout {
            if self.tasks[c].fanin.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.push_ready(c);
            }
        }
        let _ = self
            .wm
            .advance(|i| self.consumed(i), self.submitted_u64(), false);
        self.done_tasks.fetch_add(1, Ordering::AcqRel);
        self.maybe_finish();
    }

    /// D-05 check at drain entry: every core the tracker counts as running
    /// already holds its token in the doorbell; violations are counted.
    pub fn check_published(&self, tr: &Tracker) {
        let unpublished = tr
            .running
            .iter()
            .enumerate()
            .filter(|(c, r)| r.is_some_and(|r| self.regs.doorbell(*c) != r.token))
            .count();
        self.m
            .c
            .unpublished_at_drain
            .fetch_add(unpublished as u64, Ordering::Relaxed);
    }

    /// Idle cores/clusters for `shape` summed over every tracker.
    pub fn count_global_available(&self, shape: Shape) -> usize {
        self.trackers
            .iter()
            .map(|tr| tr.lock().unwrap().idle_units(shape).len())
            .sum()
    }

    /// Scheduler thread whose cores run a subtask of `task`, if any.
    pub fn task_thread(&self, task: usize) -> Option<usize> {
        self.trackers.iter().position(|tr| {
            tr.lock()
                .unwrap()
                .running
                .iter()
                .flatten()
                .any(|r| r.task == task)
        })
    }

    /// True when some core running `task` has written FIN (not yet retired).
    pub fn task_finished_on_core(&self, task: usize) -> bool {
        self.trackers.iter().any(|tr| {
            tr.lock().unwrap().running.iter().enumerate().any(|(c, r)| {
                r.is_some_and(|r| r.task == task && self.regs.cond(c) == r.token | COND_FIN)
            })
        })
    }
}
