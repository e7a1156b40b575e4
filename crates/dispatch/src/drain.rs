//! sync_start drain mode: stop the world, ack barrier, election, cohort
//! staging (D-05..D-07, D-13).
//!
//! # Fields, and who may touch them
//!
//! - `pending`: 0 idle, -1 initialising (sentinel), `> 0` the held cohort's
//!   `block_num`. CAS 0 → -1 by the entering thread (`DrainState::enter`),
//!   release-stored to `block_num` after the rest is set, and to 0 only by the
//!   elected worker at the end of the drain. While `pending != 0` no thread
//!   runs normal dispatch (anti-starvation).
//! - `task`: the held cohort (in no ready queue while held).
//! - `attempt`: generation, bumped at entry, on every retry and at the end.
//! - `acks[t]`, `done[t]`: written by thread `t` only. With generation tags
//!   they hold the attempt they belong to; without, just 1 (a plain mask that
//!   a retry clears).
//! - `elected`: election word. Tagged: `attempt << 8 | (winner + 1)`, free =
//!   `attempt << 8`, so a stale thread's CAS for an old attempt fails
//!   (the retry-ABA fix); untagged: 0 or `winner + 1`.
//! - `go`: the elected worker's "stage now" for the attempt.
//!
//! - `enterer`: the thread that entered the drain (for stall reports).
//!
//! Every spin (sentinel, ack barrier, follower wait, stage-done wait) is a
//! yield point and returns once the run's completed latch is set (D-06); each
//! escape has a test-only switch in [`Escapes`](super::Escapes). Abandoning is
//! safe (D-07): the held task is moot under teardown, and the drain state
//! belongs to the run, rebuilt for the next one.
//!
//! # Drain watchdog (beyond the design note)
//!
//! The escapes cover a peer that *left* (the run completed). A peer that is
//! merely stuck (never reaches the barrier, never stages, never ends the
//! drain) used to hang the run forever, and the scheduler loop's watchdog
//! cannot see inside a drain spin. So every spin also times itself: one that
//! has waited longer than the run's `watchdog_ns` records a
//! [`DrainStall`] naming its spin point and the peers it
//! waits for (the first stall of a run wins), latches the run failed
//! (`Internal`, as the loop watchdog does) and abandons the drain; its peers
//! then leave by the completed escape, or by their own watchdog when the
//! escapes are switched off.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};

use super::publish::stage_own;
use super::state::RunState;
use super::step::{Point, Yielder};
use super::task::DrainStall;
use xtc::Error;

const NO_TASK: usize = usize::MAX;
const NO_THREAD: usize = usize::MAX;

/// When a drain spin started, for the drain watchdog.
#[derive(Clone, Copy)]
struct Spin {
    point: Point,
    since_ns: u64,
}

impl Spin {
    fn start(sh: &RunState, point: Point) -> Spin {
        Spin {
            point,
            since_ns: sh.now(),
        }
    }

    /// Whether this spin has waited past the run's watchdog budget.
    fn overdue(self, sh: &RunState) -> bool {
        sh.now().saturating_sub(self.since_ns) > sh.opts.watchdog_ns
    }

    /// Ends the run: records the stall (the run's first wins), latches the
    /// run failed and abandons the drain.
    fn give_up(self, sh: &RunState, t: usize, attempt: u64, waiting_for: Vec<usize>) {
        let stall = DrainStall {
            thread: t,
            point: self.point,
            waiting_for,
            attempt,
            since_ns: self.since_ns,
            at_ns: sh.now(),
        };
        sh.drain_stall.lock().unwrap().get_or_insert(stall);
        sh.latch_fatal(Error::Internal);
        abandon(sh);
    }
}

/// Drain coordination state of one run.
#[derive(Debug)]
pub(crate) struct DrainState {
    pub pending: AtomicI64,
    task: AtomicUsize,
    attempt: AtomicU64,
    elected: AtomicU64,
    go: AtomicU64,
    acks: Vec<AtomicU64>,
    done: Vec<AtomicU64>,
    started_ns: AtomicU64,
    enterer: AtomicUsize,
}

impl DrainState {
    pub fn new(threads: usize) -> DrainState {
        DrainState {
            pending: AtomicI64::new(0),
            task: AtomicUsize::new(NO_TASK),
            attempt: AtomicU64::new(1),
            elected: AtomicU64::new(1 << 8),
            go: AtomicU64::new(0),
            acks: (0..threads).map(|_| AtomicU64::new(0)).collect(),
            done: (0..threads).map(|_| AtomicU64::new(0)).collect(),
            started_ns: AtomicU64::new(0),
            enterer: AtomicUsize::new(NO_THREAD),
        }
    }

    /// Current attempt (generation).
    pub fn attempt(&self) -> u64 {
        self.attempt.load(Ordering::Acquire)
    }

    /// Thread `t` holds `task` and starts a drain for `block_num` blocks;
    /// false when another drain is active (the caller re-pushes the task).
    pub fn enter(&self, sh: &RunState, t: usize, task: usize, block_num: u32) -> bool {
        if self
            .pending
            .compare_exchange(0, -1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        self.enterer.store(t, Ordering::Relaxed);
        self.task.store(task, Ordering::Relaxed);
        let a = self.attempt.fetch_add(1, Ordering::AcqRel) + 1;
        self.clear_round();
        self.elected.store(free(sh, a), Ordering::Relaxed);
        self.started_ns.store(sh.now(), Ordering::Relaxed);
        sh.m.c.drains.fetch_add(1, Ordering::Relaxed);
        self.pending.store(i64::from(block_num), Ordering::Release);
        true
    }

    fn clear_round(&self) {
        for v in self.acks.iter().chain(&self.done) {
            v.store(0, Ordering::Relaxed);
        }
        self.go.store(0, Ordering::Relaxed);
    }

    fn all(&self, v: &[AtomicU64], sh: &RunState, a: u64) -> bool {
        v.iter().all(|x| x.load(Ordering::Acquire) == tok(sh, a))
    }

    /// The threads whose word in `v` is not yet that of attempt `a`.
    fn missing(&self, v: &[AtomicU64], sh: &RunState, a: u64) -> Vec<usize> {
        (0..v.len())
            .filter(|&q| v[q].load(Ordering::Acquire) != tok(sh, a))
            .collect()
    }

    /// The elected worker of the current election word, if one won.
    fn winner(&self) -> Vec<usize> {
        match self.elected.load(Ordering::Acquire) & 0xff {
            0 => Vec::new(),
            w => vec![w as usize - 1],
        }
    }

    /// The thread that entered the drain (the sentinel's owner), if known.
    fn entering(&self) -> Vec<usize> {
        match self.enterer.load(Ordering::Relaxed) {
            NO_THREAD => Vec::new(),
            t => vec![t],
        }
    }

    /// A reset happened since attempt `a` (tagged: the attempt moved on;
    /// untagged: our ack bit was cleared / the election word was cleared).
    fn reset_since(&self, sh: &RunState, t: usize, a: u64, follower: bool) -> bool {
        if sh.opts.generation_tags {
            self.attempt() != a
        } else if follower {
            self.elected.load(Ordering::Acquire) == 0
        } else {
            self.acks[t].load(Ordering::Acquire) == 0
        }
    }
}

fn tok(sh: &RunState, a: u64) -> u64 {
    if sh.opts.generation_tags { a } else { 1 }
}

fn free(sh: &RunState, a: u64) -> u64 {
    if sh.opts.generation_tags { a << 8 } else { 0 }
}

/// Called from the scheduler loop while `pending != 0`.
pub(crate) async fn handle_drain(sh: &RunState, t: usize, y: &Yielder) {
    let d = &sh.drain;
    let esc = sh.opts.escapes;
    // Sentinel wait.
    let spin = Spin::start(sh, Point::Sentinel);
    loop {
        let p = d.pending.load(Ordering::Acquire);
        if p == 0 {
            return;
        }
        if p > 0 {
            break;
        }
        if esc.sentinel && sh.is_completed() {
            return abandon(sh);
        }
        if spin.overdue(sh) {
            return spin.give_up(sh, t, d.attempt(), d.entering());
        }
        y.pause(Point::Sentinel).await;
    }
    let a = d.attempt();
    d.acks[t].store(tok(sh, a), Ordering::Release);
    // Ack barrier.
    let spin = Spin::start(sh, Point::AckBarrier);
    loop {
        if esc.ack_barrier && sh.is_completed() {
            return abandon(sh);
        }
        if d.pending.load(Ordering::Acquire) == 0 || d.reset_since(sh, t, a, false) {
            return;
        }
        if d.all(&d.acks, sh, a) {
            break;
        }
        if spin.overdue(sh) {
            return spin.give_up(sh, t, a, d.missing(&d.acks, sh, a));
        }
        y.pause(Point::AckBarrier).await;
    }
    // Stall injection point: the retry-ABA window.
    y.pause(Point::BeforeElect).await;
    let mine = free(sh, a) | (t as u64 + 1);
    if d.elected
        .compare_exchange(free(sh, a), mine, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        elected(sh, t, a, y).await
    } else {
        follower(sh, t, a, y).await
    }
}

fn abandon(sh: &RunState) {
    sh.m.c.drains_abandoned.fetch_add(1, Ordering::Relaxed);
}

async fn elected(sh: &RunState, t: usize, a: u64, y: &Yielder) {
    let d = &sh.drain;
    let task = d.task.load(Ordering::Acquire);
    if task == NO_TASK {
        d.elected.store(free(sh, a), Ordering::Release);
        return;
    }
    let spec = &sh.tasks[task].spec;
    if sh.count_global_available(spec.shape) < spec.block_num as usize {
        // Retry: every thread returns to its loop, retires completions, and
        // re-enters a fresh ack round; the task stays held.
        sh.m.c.drain_retries.fetch_add(1, Ordering::Relaxed);
        if sh.opts.generation_tags {
            d.elected.store(free(sh, a + 1), Ordering::Relaxed);
            d.attempt.store(a + 1, Ordering::Release);
        } else {
            d.acks.iter().for_each(|x| x.store(0, Ordering::Relaxed));
            d.elected.store(0, Ordering::Release);
        }
        return;
    }
    d.go.store(tok(sh, a), Ordering::Release);
    stage_own(sh, t, task);
    d.done[t].store(tok(sh, a), Ordering::Release);
    let spin = Spin::start(sh, Point::StageDone);
    loop {
        if sh.opts.escapes.stage_done && sh.is_completed() {
            return abandon(sh);
        }
        if d.all(&d.done, sh, a) {
            break;
        }
        if spin.overdue(sh) {
            return spin.give_up(sh, t, a, d.missing(&d.done, sh, a));
        }
        y.pause(Point::StageDone).await;
    }
    // End of the drain: publish everything, then release the world.
    d.task.store(NO_TASK, Ordering::Relaxed);
    d.clear_round();
    let a2 = d.attempt.fetch_add(1, Ordering::AcqRel) + 1;
    d.elected.store(free(sh, a2), Ordering::Relaxed);
    let stw = sh.now() - d.started_ns.load(Ordering::Relaxed);
    sh.m.c.stw_ns.fetch_add(stw, Ordering::Relaxed);
    d.pending.store(0, Ordering::Release);
}

async fn follower(sh: &RunState, t: usize, a: u64, y: &Yielder) {
    let d = &sh.drain;
    let mut staged = false;
    let spin = Spin::start(sh, Point::Follower);
    loop {
        if sh.opts.escapes.follower && sh.is_completed() {
            return abandon(sh);
        }
        if spin.overdue(sh) {
            // Waiting for the elected worker's go, then for it to end the
            // drain (which waits for every thread's staging).
            return spin.give_up(sh, t, a, d.winner());
        }
        if d.pending.load(Ordering::Acquire) == 0 || d.reset_since(sh, t, a, true) {
            return;
        }
        if !staged && d.go.load(Ordering::Acquire) == tok(sh, a) {
            let task = d.task.load(Ordering::Acquire);
            if task != NO_TASK {
                stage_own(sh, t, task);
            }
            d.done[t].store(tok(sh, a), Ordering::Release);
            staged = true;
        }
        y.pause(Point::Follower).await;
    }
}
