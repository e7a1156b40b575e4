//! Model-based randomized test of sync and async groups under `rt::Sim`.
//!
//! Each seed: a group with random limits; a client issues random submits
//! (some charges invalid), cancels, resumes, closes (both modes, escalation),
//! maybe a driver kill; callbacks pick random results, yield, probe mutators. Async seeds mix INLINE, FUTURE (resolved late, early, failed,
//! dropped or never), BLOCKING and FENCE (`Nosys` under Sim) operations with
//! an optional exec timeout. After the run the model checks: exactly one
//! completion per accepted submit; FCFS admission; reserved units and active
//! members within limits; strictly increasing handles; counters consistent
//! with what was seen; no member in a vector after its cancel was recorded;
//! collect exactly once per operation with the same vector; every FUTURE
//! consumed; mutators `Deadlk` exactly while a callback is in flight.
//!
//! The cross-loop flavour (`model_mt_groups`) runs async groups with an
//! admission ring: owner-loop submits, cancels (of live, stale and unknown
//! handles) and resumes interleave with `Remote` submits, cancels and
//! resumes, called from the test thread between simulator steps (as a plain
//! OS thread would) and from a process of a second loop; FUTURE operations
//! complete at random virtual times (a timer process each), and the test
//! thread sometimes completes one early, right after a cancel_mt of its
//! member. Besides the checks above (FCFS among owner submits only: a
//! hand-in waits on the ring until a boundary), it checks that a cancel
//! accepted (owner, cross-loop or close) while the member's operation was
//! outstanding ends it `Aborted` with one hint, and liveness: after the
//! owner's last action (often a stale or unknown-handle cancel), every
//! accepted request reaches its one completion with no further owner action
//! (the test thread only hands in more work and `Remote::resume`s blocked
//! members).
//!
//! `XTC_MODEL_SEEDS=n` runs n seeds per flavour (default 2,000 sync, 2,000
//! async and 1,000 cross-loop); `XTC_MODEL_SEED=s` replays the one seed `s`
//! (as printed by a failure, flavour offset included) in every flavour.
//! Every violation names its seed.
//!
//! Layout: the model ([`Model`]), the seeds and the three tests are here; the
//! group under test (step and sink) in `batch_model/app.rs`, the client and
//! device processes in `batch_model/client.rs`, one sync or async seed and
//! the final checks in `batch_model/run.rs`, the cross-loop flavour in
//! `batch_model/mt.rs`.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::rc::Rc;
use std::time::Duration;

use fastrand::Rng;
use xtc::Error;
use xtc::batch::{
    AsyncOpts, AsyncStep, CloseMode, Complete, Exec, ExecStatus, Group, Handle, Item, Remote, Step,
    StepResult, SyncOpts,
};
use xtc::rt::{self, Loop, Promise, Sim};

#[path = "batch_model/app.rs"]
mod app;
#[path = "batch_model/client.rs"]
mod client;
#[path = "batch_model/mt.rs"]
mod mt;
#[path = "batch_model/run.rs"]
mod run;

use app::*;
use client::*;
use mt::*;
use run::*;

type Req = u64; // a serial number, checked when the request comes back

#[derive(Default)]
struct Model {
    units: u64,
    max_active: usize,
    /// Accepted submits in order: handle, charge.
    accepted: Vec<(Handle, u64)>,
    charge: HashMap<Handle, u64>,
    req_of: HashMap<Handle, Req>,
    outcomes: HashMap<Handle, Vec<Result<(), Error>>>,
    appeared: HashSet<Handle>,
    cancelled: HashSet<Handle>,
    close_cancel: bool,
    killed: bool,
    /// Handles whose last result word was UNSET (Internal is legitimate).
    unset: HashSet<Handle>,
    /// Handles that went through an op ending ABORTED or Failed(Aborted).
    aborted_op: HashSet<Handle>,
    in_cb: u32,
    vectors: u64,
    members: u64,
    max_vector: u64,
    rejections: u64,
    offloads: u64,
    timeouts: u64,
    errors: u64,
    /// The vector of the outstanding operation (async).
    inflight: Option<Vec<Handle>>,
    /// Cross-loop flavour: handles issued by `Remote::submit`.
    via_ring: HashSet<Handle>,
    /// Cancels accepted by `Remote::cancel` (recorded when drained, so not
    /// in `cancelled`: a vector may still hold the member).
    cancelled_mt: HashSet<Handle>,
    /// Members whose cancel (owner, cross-loop or close) was accepted while
    /// their operation was outstanding: each must end `Aborted`, hinted.
    cancel_outstanding: HashSet<Handle>,
    /// The outstanding FUTURE operation's promise (cross-loop flavour): its
    /// timer process, or the test thread, takes and resolves it.
    op_promise: Option<Rc<RefCell<Option<Promise<()>>>>>,
    /// Cross-loop flavour: the client's random phase is over.
    client_done: bool,
    /// Cross-loop flavour: the owner's last action was a stale cancel.
    stale_last: bool,
    /// Cross-loop flavour: `Remote` calls made.
    remote_calls: u64,
    /// Refused `Remote` calls (`Again`, or `Range` for a submit).
    mt_refused: u64,
    /// Operations the test thread resolved early (right after a cancel_mt).
    early: u64,
    hinted: HashSet<Handle>,
    promises: Vec<Promise<()>>,
    consumed_check: Vec<Promise<()>>,
    violations: Vec<String>,
}

type M = Rc<RefCell<Model>>;

impl Model {
    fn fail(&mut self, msg: String) {
        if self.violations.len() < 20 {
            self.violations.push(msg);
        }
    }

    fn live(&self, h: Handle) -> bool {
        self.charge.contains_key(&h) && !self.outcomes.contains_key(&h)
    }

    /// Checks a new ready vector (step or async submit).
    fn on_vector(&mut self, hs: &[Handle]) {
        self.vectors += 1;
        self.members += hs.len() as u64;
        self.max_vector = self.max_vector.max(hs.len() as u64);
        for h in hs {
            if self.cancelled.contains(h) {
                self.fail(format!("{h} in a vector after its cancel was recorded"));
            }
            if self.outcomes.contains_key(h) {
                self.fail(format!("{h} in a vector after its completion"));
            }
        }
        let this: HashSet<Handle> = hs.iter().copied().collect();
        for h in hs {
            if self.appeared.contains(h) || self.via_ring.contains(h) {
                continue;
            }
            // FCFS: every older live request that was not cancelled has been
            // admitted already (appeared before or in this vector).
            let older: Vec<Handle> = self
                .accepted
                .iter()
                .map(|a| a.0)
                .take_while(|o| o < h)
                .filter(|o| !self.via_ring.contains(o))
                .collect();
            for o in older {
                let passed = !self.appeared.contains(&o) && !this.contains(&o);
                if passed && self.live(o) && !self.cancelled.contains(&o) && !self.close_cancel {
                    self.fail(format!("{h} admitted before older {o}"));
                }
            }
        }
        self.appeared.extend(hs.iter().copied());
        let active: Vec<Handle> = self
            .appeared
            .iter()
            .filter(|h| self.live(**h))
            .copied()
            .collect();
        let units: u64 = active.iter().map(|h| self.charge[h]).sum();
        if units > self.units || active.len() > self.max_active {
            self.fail(format!(
                "{} active members with {units} units over the limits",
                active.len()
            ));
        }
    }

    fn choose(&mut self, rng: &mut Rng, hs: &[Handle], results: &mut [StepResult]) {
        for (h, r) in hs.iter().zip(results.iter_mut()) {
            *r = match rng.u32(0..100) {
                0..45 => StepResult::Continue,
                45..70 => StepResult::Done,
                70..82 => StepResult::Blocked,
                82..92 => StepResult::Error(Error::Range),
                _ => StepResult::Unset,
            };
            if *r == StepResult::Unset {
                self.unset.insert(*h);
            } else {
                self.unset.remove(h);
            }
        }
    }
}

/// Marks a callback in flight in the model; cleared even when a kill drops it.
struct InCb(M);

impl InCb {
    fn enter(m: &M) -> InCb {
        m.borrow_mut().in_cb += 1;
        InCb(m.clone())
    }
}

impl Drop for InCb {
    fn drop(&mut self) {
        self.0.borrow_mut().in_cb -= 1;
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The seeds of a flavour: `base..base + n` (`XTC_MODEL_SEEDS=n`, default
/// `default`), or only `XTC_MODEL_SEED` when set (a replay; the coverage
/// assertions are skipped then).
fn seeds(base: u64, default: u64) -> (Vec<u64>, bool) {
    match env_u64("XTC_MODEL_SEED") {
        Some(one) => (vec![one], true),
        None => {
            let n = env_u64("XTC_MODEL_SEEDS").unwrap_or(default);
            ((base..base + n).collect(), false)
        }
    }
}

#[test]
fn model_sync_groups() {
    let mut cover = Cover::default();
    let (seeds, replay) = seeds(0, 2000);
    for seed in seeds {
        run_seed(seed, false, &mut cover);
    }
    eprintln!("sync model coverage: {cover:?}");
    assert!(replay || cover.ok > 0 && cover.cancelled > 0 && cover.failed > 0 && cover.kills > 0);
}

#[test]
fn model_async_groups() {
    let mut cover = Cover::default();
    let (seeds, replay) = seeds(1_000_000, 2000);
    for seed in seeds {
        run_seed(seed, true, &mut cover);
    }
    eprintln!("async model coverage: {cover:?}");
    assert!(replay || cover.timeouts > 0 && cover.errors > 0 && cover.hints > 0 && cover.kills > 0);
}

/// Cross-loop admission mixed with owner calls and racing completions
/// (issue 12): exactly once, cancels accepted while outstanding end
/// `Aborted`, and liveness with no owner action. 1,000 seeds by default.
#[test]
fn model_mt_groups() {
    let mut cover = MtCover::default();
    let (seeds, replay) = seeds(2_000_000, 1000);
    for seed in seeds {
        run_mt_seed(seed, &mut cover);
    }
    eprintln!("cross-loop model coverage: {cover:?}");
    assert!(
        replay
            || cover.hand_ins > 0
                && cover.cancel_outstanding > 0
                && cover.early_resolves > 0
                && cover.kills > 0
                && cover.aborted > 0
    );
}
