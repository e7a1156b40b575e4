//! # `rt`: the runtime substrate the batch engine stands on
//!
//! What this layer owns:
//!
//! - [`Loop`]: a single-threaded executor of *processes* (pinned `async`
//!   tasks, task cells from `async-task`). A process table whose [`Pid`]s are
//!   never reused, [`Loop::kill`], timers ([`sleep`], [`sleep_until`]),
//!   [`yield_now`], fd readiness ([`wait_readable`], epoll), wakes from other
//!   threads (an eventfd), scheduling classes ([`SchedClass`]) and a per-loop
//!   resource accountant ([`Budget`]).
//! - [`Sim`]: the deterministic simulator. Several loops in one OS thread, the
//!   next runnable process chosen by a seeded RNG, a virtual clock that jumps
//!   to the next timer, an event [`trace`](Sim::trace), a stall report that
//!   names the seed.
//! - [`future_pair`], the blocking pool ([`blocking_run`], [`BlockingPool`]),
//!   cross-loop mailboxes ([`mailbox`]) and the [`Executor`] (N loops on N
//!   carrier threads, each recording its NUMA node).
//! - [`sysfs`]: bounded, non-blocking attribute reads and the kernel's list
//!   format, which the executor's topology needs (and `accel` reuses): the
//!   runtime imports nothing above it and knows no devices.
//!
//! # Invariants
//!
//! 1. **Kill** (rt rule "kill drops a process at its next suspension point; exit
//!    hooks run exactly once"): [`Loop::kill`] closes the process's task cell.
//!    A parked process is scheduled once more so that the loop drops its future
//!    on its next turn; a process that kills itself is dropped when its current
//!    poll returns. The future is dropped exactly once, on the loop's thread,
//!    with [`Loop::current`] naming that loop, so `Drop` guards are the exit
//!    hooks and may spawn new processes (async finalizers). A process stays in
//!    the table (is [`alive`](Loop::is_alive), counts in
//!    [`n_procs`](Loop::n_procs)) until its future has been dropped (B-148:
//!    "absent from the table" is the quiescence test, not a hook flag). A
//!    process parked on a timer, a [`Future`], or fd readiness is woken to die
//!    (B-068, B-102).
//! 2. **No hidden polling thread, periodic wake, real clock read, or unseeded
//!    randomness** (B-155): a real loop blocks in `epoll_wait` with the nearest timer as
//!    its only timeout and is woken from other threads through its eventfd; a
//!    [`Sim`] loop never reads the real clock, never blocks and never starts a
//!    thread; its only randomness is the seeded RNG of its [`Sim`].
//! 3. **A physical thread identity is not a loop identity** (B-130): [`Loop::current`]
//!    reports the loop whose process is being polled (under [`Sim`] many loops
//!    share one thread), never a per-thread guess.
//! 4. **Has-run** (B-015): [`Loop::has_run`] becomes true at the first [`Loop::run`] or
//!    the first [`Sim::step`] that polls one of the loop's processes; layers
//!    above use it for "create only before the loop's first run or simulation
//!    step".
//! 5. Bad input (foreign or stale pid, foreign class, `run` from inside a loop,
//!    spawn on a stopped loop, bad fd) is an [`Error`](crate::Error), never a
//!    panic.

mod blocking;
mod budget;
mod class;
mod event_loop;
mod executor;
mod future_pair;
mod io;
mod mailbox;
mod proc_table;
mod sim;
pub mod sysfs;
mod timer;

pub use blocking::{BlockingPool, DEFAULT_BLOCKING_QUEUE, DEFAULT_BLOCKING_THREADS, blocking_run};
pub use budget::{Budget, Charge};
pub use class::{DEFAULT_WEIGHT, SchedClass};
pub use event_loop::Loop;
pub use executor::{Executor, Topology};
pub use future_pair::{Future, Promise, future_pair};
pub use io::{WaitReadable, wait_readable};
pub use mailbox::{Receiver, Recv, Sender, mailbox};
pub use sim::{SEED_ENV, Sim, SimStall, TraceEvent, TraceKind};
pub use timer::{Sleep, YieldNow, current_pid, now, sleep, sleep_until, yield_now};

use std::fmt;
use std::ops::Add;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A process id: the loop it belongs to and a per-loop sequence number that is
/// never reused (the first process of a loop has sequence 1).
///
/// Displayed as `loop.seq`. Killing a pid of another loop, or one that has
/// left the table, is `Inval` (rt rule on kill).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pid {
    loop_id: u64,
    seq: u64,
}

impl Pid {
    pub(crate) fn new(loop_id: LoopId, seq: u64) -> Pid {
        Pid {
            loop_id: loop_id.0,
            seq,
        }
    }

    /// The loop this process was spawned on.
    pub fn loop_id(self) -> LoopId {
        LoopId(self.loop_id)
    }

    /// The per-loop sequence number (1, 2, ...; deterministic under [`Sim`]).
    pub fn seq(self) -> u64 {
        self.seq
    }
}

impl fmt::Display for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.loop_id, self.seq)
    }
}

/// A loop's identity, unique within the OS process (never reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LoopId(u64);

impl LoopId {
    pub(crate) fn fresh() -> LoopId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        LoopId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The numeric value (1, 2, ... in creation order across the OS process).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for LoopId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "loop{}", self.0)
    }
}

/// A point on a loop's clock, in nanoseconds.
///
/// Real loops count from a process-wide epoch taken the first time any loop
/// reads the monotonic clock; [`Sim`] loops count virtual nanoseconds from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Instant(pub u64);

impl Instant {
    /// `self + d`, or `None` on overflow of the nanosecond counter.
    pub fn checked_add(self, d: Duration) -> Option<Instant> {
        let ns = u64::try_from(d.as_nanos()).ok()?;
        self.0.checked_add(ns).map(Instant)
    }

    /// `self + d`, clamped to the largest representable instant.
    pub fn saturating_add(self, d: Duration) -> Instant {
        self.checked_add(d).unwrap_or(Instant(u64::MAX))
    }

    /// The time from `earlier` to `self`, zero when `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// Nanoseconds on the loop's clock.
    pub fn as_nanos(self) -> u64 {
        self.0
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;

    /// Saturating: a deadline past the end of the clock is "never".
    fn add(self, d: Duration) -> Instant {
        self.saturating_add(d)
    }
}
