//! [`Sim`]: the deterministic simulator.
//!
//! Several loops share ONE OS thread and one virtual clock. Each
//! [`step`](Sim::step) moves every loop's woken processes into its ready set,
//! then picks one runnable process with the seeded RNG (a class with
//! probability proportional to its weight, a process within it uniformly) and
//! polls it with its own loop current. When nothing is runnable the clock
//! jumps to the earliest armed timer of any loop and those timers fire; time
//! never advances otherwise. The simulator never reads the real clock, never
//! starts a thread, never blocks; fd readiness is not reachable (`Nosys`).
//!
//! Determinism: pids are per-loop sequence numbers and loops are named by their
//! index in the `Sim`, so the same seed and the same program give the same
//! [`trace`](Sim::trace). Wakes from other OS threads (a promise set by a pool
//! thread) are outside the simulation's control and break this guarantee.

use super::event_loop::{CurrentGuard, Loop};
use super::{Instant, Pid};
use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::Rc;

/// What happened at one trace point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceKind {
    /// A process was spawned.
    Spawn,
    /// A process was polled (or, once killed, dropped).
    Poll,
    /// A process was killed.
    Kill,
    /// A process left the table (its future was dropped).
    Exit,
    /// The virtual clock jumped to this event's time (loop 0, seq 0).
    Jump,
}

/// One simulator event: virtual time, loop index in the `Sim`, pid sequence
/// number on that loop, and what happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceEvent {
    /// Virtual time of the event.
    pub at: Instant,
    /// Index of the loop in its `Sim` (creation order, from 0).
    pub loop_idx: usize,
    /// The process's [`Pid::seq`].
    pub seq: u64,
    /// The event.
    pub kind: TraceKind,
}

/// State the loops of one `Sim` share: clock, RNG, trace.
pub(crate) struct SimCore {
    clock: Cell<u64>,
    rng: RefCell<fastrand::Rng>,
    trace: RefCell<Vec<TraceEvent>>,
}

impl SimCore {
    pub(crate) fn now(&self) -> Instant {
        Instant(self.clock.get())
    }

    pub(crate) fn record(&self, kind: TraceKind, loop_idx: usize, seq: u64) {
        self.trace.borrow_mut().push(TraceEvent {
            at: self.now(),
            loop_idx,
            seq,
            kind,
        });
    }
}

/// The simulator's report when processes remain but none can progress (no
/// runnable process, no armed timer): a deadlock, or a wait on something the
/// simulation cannot reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimStall {
    /// The seed of the run (rerun with it to reproduce).
    pub seed: u64,
    /// Virtual time of the stall.
    pub at: Instant,
    /// The processes still in the tables.
    pub pending: Vec<Pid>,
}

impl fmt::Display for SimStall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "simulation stalled (seed {}) at {} ns: {} process(es) wait and none can progress:",
            self.seed,
            self.at.0,
            self.pending.len()
        )?;
        for p in &self.pending {
            write!(f, " {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SimStall {}

/// The environment variable that overrides a test's seed ([`Sim::from_env`]).
pub const SEED_ENV: &str = "XTC_SEED";

/// `XTC_SEED` parsed (decimal or `0x` hex), or `default` when it is unset.
fn seed_from_env(default: u64) -> u64 {
    let Some(text) = std::env::var_os(SEED_ENV) else {
        return default;
    };
    let t = text.to_string_lossy();
    parse_seed(&t).unwrap_or_else(|| panic!("{SEED_ENV}={t:?} is not a u64 seed"))
}

/// A seed as `XTC_SEED` spells it: decimal or `0x` hex, spaces around ignored.
fn parse_seed(text: &str) -> Option<u64> {
    let t = text.trim();
    match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => t.parse().ok(),
    }
}

/// A deterministic simulator (see the module docs).
pub struct Sim {
    seed: u64,
    core: Rc<SimCore>,
    loops: RefCell<Vec<Loop>>,
}

impl fmt::Debug for Sim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sim")
            .field("seed", &self.seed)
            .field("now", &self.now())
            .field("loops", &self.loops.borrow().len())
            .finish()
    }
}

impl Sim {
    /// A simulator whose every choice derives from `seed`; virtual time 0.
    pub fn new(seed: u64) -> Sim {
        Sim {
            seed,
            core: Rc::new(SimCore {
                clock: Cell::new(0),
                rng: RefCell::new(fastrand::Rng::with_seed(seed)),
                trace: RefCell::new(Vec::new()),
            }),
            loops: RefCell::new(Vec::new()),
        }
    }

    /// A simulator seeded from the environment variable [`SEED_ENV`]
    /// (`XTC_SEED`, decimal or `0x` hex) when it is set, else from `default`:
    /// a test names its own seed and a failure replays under another without
    /// an edit (`XTC_SEED=7 cargo test -p xtc --test batch_sync name`; a
    /// stall report names the seed it ran).
    ///
    /// # Panics
    /// When `XTC_SEED` is set but is not a `u64` (a replay that silently
    /// ran another seed would mislead).
    pub fn from_env(default: u64) -> Sim {
        Sim::new(seed_from_env(default))
    }

    /// A new loop of this simulator (unlimited budget). The `Sim` keeps it alive.
    pub fn new_loop(&self) -> Loop {
        self.new_loop_with_budget(u64::MAX)
    }

    /// A new loop whose resource accountant allows `bytes`.
    pub fn new_loop_with_budget(&self, bytes: u64) -> Loop {
        let mut loops = self.loops.borrow_mut();
        let lp = Loop::new_sim(self.core.clone(), loops.len(), bytes);
        loops.push(lp.clone());
        lp
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The virtual clock (starts at 0; moves only by jumps to timers).
    pub fn now(&self) -> Instant {
        self.core.now()
    }

    /// Every event so far (spawn, poll, kill, exit, clock jump).
    pub fn trace(&self) -> Vec<TraceEvent> {
        self.core.trace.borrow().clone()
    }

    /// Polls one runnable process chosen by the seeded RNG; when none is
    /// runnable, first jumps the clock to the earliest armed timer. Returns
    /// false when nothing can progress (no runnable process, no timer).
    pub fn step(&self) -> bool {
        let loops = self.loops.borrow().clone();
        loops.iter().for_each(Loop::drain_inbox);
        if total_weight(&loops) == 0 && !self.jump(&loops) {
            return false;
        }
        let total = total_weight(&loops);
        if total == 0 {
            return true;
        }
        let ticket = self.core.rng.borrow_mut().u64(0..total);
        self.run_ticket(&loops, ticket);
        true
    }

    /// Jumps the clock to the earliest timer and fires what is due; false if
    /// no timer is armed.
    fn jump(&self, loops: &[Loop]) -> bool {
        let next = loops
            .iter()
            .filter_map(|l| l.inner().timers.borrow().next_deadline())
            .min();
        let Some(at) = next else {
            return false;
        };
        if at.0 > self.core.clock.get() {
            self.core.clock.set(at.0);
        }
        self.core.record(TraceKind::Jump, 0, 0);
        for l in loops {
            l.fire_timers(self.now());
        }
        true
    }

    fn run_ticket(&self, loops: &[Loop], mut ticket: u64) {
        for lp in loops {
            let w = lp.inner().ready.borrow().weight_sum();
            if ticket >= w {
                ticket -= w;
                continue;
            }
            let core = &self.core;
            let r = lp
                .inner()
                .ready
                .borrow_mut()
                .take_weighted(ticket, |n| core.rng.borrow_mut().usize(0..n));
            if let Some(r) = r {
                lp.mark_run();
                let _current = CurrentGuard::enter(lp);
                lp.run_one(r);
            }
            return;
        }
    }

    /// Steps until nothing can progress.
    ///
    /// # Errors
    /// [`SimStall`] (naming the seed and the waiting pids) when processes
    /// remain in some loop's table.
    pub fn run_until_idle(&self) -> Result<(), SimStall> {
        while self.step() {}
        self.check_idle()
    }

    /// Steps at most `max_steps` times; `Ok(true)` if it became idle, `Ok(false)`
    /// if the step limit was reached first (a livelock guard for tests).
    ///
    /// # Errors
    /// As [`run_until_idle`](Sim::run_until_idle).
    pub fn run_steps(&self, max_steps: u64) -> Result<bool, SimStall> {
        for _ in 0..max_steps {
            if !self.step() {
                return self.check_idle().map(|()| true);
            }
        }
        Ok(false)
    }

    fn check_idle(&self) -> Result<(), SimStall> {
        let pending: Vec<Pid> = self.loops.borrow().iter().flat_map(Loop::pids).collect();
        if pending.is_empty() {
            Ok(())
        } else {
            Err(SimStall {
                seed: self.seed,
                at: self.now(),
                pending,
            })
        }
    }
}

fn total_weight(loops: &[Loop]) -> u64 {
    loops
        .iter()
        .map(|l| l.inner().ready.borrow().weight_sum())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::parse_seed;

    #[test]
    fn seeds_parse_as_decimal_or_hex() {
        assert_eq!(parse_seed("142"), Some(142));
        assert_eq!(parse_seed(" 0x8e\n"), Some(142));
        assert_eq!(parse_seed("0X8E"), Some(142));
        assert_eq!(parse_seed("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_seed(""), None);
        assert_eq!(parse_seed("-1"), None);
        assert_eq!(parse_seed("seven"), None);
    }
}
