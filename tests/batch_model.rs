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

struct App {
    m: M,
    rng: Rng,
    group: Rc<RefCell<Option<Group<Req>>>>,
    blocking: bool,
    timeout: bool,
    /// Cross-loop flavour: FUTURE operations resolved by timer processes.
    mt: bool,
    /// A real eventfd handed as the FENCE (the simulator cannot wait on it).
    fence: Rc<dyn AsFd>,
}

impl App {
    /// A FUTURE operation resolved at a random virtual time by a timer
    /// process (cross-loop flavour): Ok, failed, dropped, or (with an exec
    /// timeout) never.
    fn timed_future(&mut self) -> Exec {
        let (f, p) = rt::future_pair();
        let slot = Rc::new(RefCell::new(Some(p)));
        self.m.borrow_mut().op_promise = Some(slot.clone());
        let delay = Duration::from_micros(self.rng.u64(0..30));
        let fate = self.rng.u32(0..100);
        let (m, timeout) = (self.m.clone(), self.timeout);
        let lp = Loop::current().expect("submit runs on the owner loop");
        lp.spawn(async move {
            rt::sleep(delay).await;
            let Some(p) = slot.borrow_mut().take() else {
                return; // the test thread resolved it early
            };
            match fate {
                0..80 => p.set(Ok(())),
                80..88 => p.set(Err(Error::Nomem)),
                88..94 => drop(p),
                _ if timeout => m.borrow_mut().consumed_check.push(p), // never
                _ => p.set(Ok(())),
            }
        })
        .expect("timer process");
        Exec::Future(f)
    }

    /// Yields 0..=2 times and probes a mutator, which must be `Deadlk`.
    async fn dawdle(&mut self) {
        if let Some(g) = self.group.borrow().clone()
            && self.rng.u32(0..4) == 0
        {
            let e = g.close(CloseMode::Drain);
            if e != Err(Error::Deadlk) {
                self.m
                    .borrow_mut()
                    .fail(format!("mutator in a callback gave {e:?}"));
            }
        }
        for _ in 0..self.rng.u32(0..3) {
            rt::yield_now().await;
        }
    }
}

/// An eventfd for FENCE operations (B-070: `Nosys` under Sim).
fn fence() -> Rc<dyn AsFd> {
    let flags = rustix::event::EventfdFlags::CLOEXEC;
    Rc::new(rustix::event::eventfd(0, flags).expect("eventfd"))
}

fn handles(items: &[Item<'_, Req>]) -> Vec<Handle> {
    items.iter().map(|i| i.handle).collect()
}

impl Step<Req> for App {
    async fn step(
        &mut self,
        items: &mut [Item<'_, Req>],
        results: &mut [StepResult],
    ) -> xtc::Result<()> {
        let _cb = InCb::enter(&self.m);
        let hs = handles(items);
        self.m.borrow_mut().on_vector(&hs);
        self.dawdle().await;
        if self.rng.u32(0..30) == 0 {
            return Err(Error::Nomem);
        }
        self.m.borrow_mut().choose(&mut self.rng, &hs, results);
        Ok(())
    }
}

impl AsyncStep<Req> for App {
    async fn submit(&mut self, items: &mut [Item<'_, Req>]) -> xtc::Result<Exec> {
        let _cb = InCb::enter(&self.m);
        let hs = handles(items);
        {
            let mut m = self.m.borrow_mut();
            m.on_vector(&hs);
            if m.inflight.is_some() {
                m.fail("submit while an operation is outstanding".into());
            }
        }
        self.dawdle().await;
        let pick = self.rng.u32(0..100);
        if pick < 4 {
            return Err(Error::Nomem);
        }
        self.m.borrow_mut().offloads += 1;
        self.m.borrow_mut().inflight = Some(hs);
        Ok(match pick {
            4..30 => Exec::Inline,
            30..34 => Exec::Fence(self.fence.clone()), // Nosys under Sim (B-070)
            34..45 if self.blocking => {
                let fail = self.rng.u32(0..5) == 0;
                Exec::Blocking(Box::new(
                    move || if fail { Err(Error::Range) } else { Ok(()) },
                ))
            }
            _ if self.mt => self.timed_future(),
            _ => {
                let (f, p) = rt::future_pair();
                self.m.borrow_mut().promises.push(p);
                Exec::Future(f)
            }
        })
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, Req>],
        results: &mut [StepResult],
        status: ExecStatus,
    ) -> xtc::Result<()> {
        let _cb = InCb::enter(&self.m);
        let hs = handles(items);
        {
            let mut m = self.m.borrow_mut();
            match m.inflight.take() {
                Some(v) if v == hs => {}
                other => m.fail(format!("collect of {hs:?} but outstanding {other:?}")),
            }
            m.op_promise = None;
            match status {
                ExecStatus::Timeout => m.timeouts += 1,
                ExecStatus::Failed(_) => m.errors += 1,
                _ => {}
            }
            if matches!(
                status,
                ExecStatus::Aborted | ExecStatus::Failed(Error::Aborted)
            ) {
                m.aborted_op.extend(hs.iter().copied());
            }
            if status == ExecStatus::Timeout && !self.timeout {
                m.fail("timeout without exec_timeout".into());
            }
        }
        self.dawdle().await;
        if self.rng.u32(0..40) == 0 {
            return Err(Error::Range);
        }
        self.m.borrow_mut().choose(&mut self.rng, &hs, results);
        Ok(())
    }

    async fn cancel_hint(&mut self, h: Handle) {
        let _cb = InCb::enter(&self.m);
        {
            let mut m = self.m.borrow_mut();
            let inflight = m.inflight.as_ref().is_some_and(|v| v.contains(&h));
            if !inflight || !m.hinted.insert(h) {
                m.fail(format!("hint for {h}: in flight {inflight}, or twice"));
            }
        }
        self.dawdle().await;
    }
}

struct Sink {
    m: M,
    rng: Rng,
}

impl Complete<Req> for Sink {
    async fn complete(&mut self, h: Handle, r: Req, o: xtc::Result<()>) {
        let _cb = InCb::enter(&self.m);
        {
            let mut m = self.m.borrow_mut();
            if m.req_of.get(&h) != Some(&r) {
                m.fail(format!("{h} came back with request {r}"));
            }
            m.outcomes.entry(h).or_default().push(o);
        }
        for _ in 0..self.rng.u32(0..2) {
            rt::yield_now().await;
        }
    }
}

/// The client: random mutator calls, then drain or cancel. In the
/// cross-loop flavour it stops after the random calls (the test thread then
/// checks liveness and closes), often with a stale or unknown-handle cancel
/// as the owner's last action (issue 12: that must not wedge admission).
async fn client(seed: u64, lp: Loop, g: Group<Req>, m: M, units: u64, mt: bool) {
    let mut rng = Rng::with_seed(seed ^ 0x5eed);
    let mut last: Option<Handle> = None;
    let mut next_req = 0u64;
    for _ in 0..rng.usize(10..120) {
        op(&mut rng, &lp, &g, &m, units, &mut last, &mut next_req).await;
        if rng.u32(0..10) < 7 {
            rt::yield_now().await;
        }
    }
    if mt {
        if rng.bool() {
            while m.borrow().in_cb > 0 {
                rt::yield_now().await; // a callback is suspended: Deadlk
            }
            stale_cancel(&mut rng, &g, &m).await;
            m.borrow_mut().stale_last = true;
        }
        m.borrow_mut().client_done = true;
        return;
    }
    // Drain (resuming every live member) or cancel; escalate in the end.
    if rng.bool() {
        retry(&g, &m, CloseMode::Drain).await;
        for _ in 0..30 {
            if !lp.is_alive(g.driver_pid()) {
                return;
            }
            let live: Vec<Handle> = m.borrow().accepted.iter().map(|a| a.0).collect();
            for h in live {
                let _ = g.resume(h);
            }
            rt::sleep(Duration::from_micros(rng.u64(1..20))).await;
        }
    }
    retry(&g, &m, CloseMode::Cancel).await;
}

async fn retry(g: &Group<Req>, m: &M, mode: CloseMode) {
    loop {
        let in_cb = m.borrow().in_cb > 0;
        let r = g.close(mode);
        check_deadlk(m, in_cb, r);
        if r.is_ok() {
            if mode == CloseMode::Cancel {
                m.borrow_mut().close_cancel = true;
            }
            return;
        }
        rt::yield_now().await;
    }
}

fn check_deadlk(m: &M, in_cb: bool, r: xtc::Result<()>) {
    if in_cb != (r == Err(Error::Deadlk)) {
        m.borrow_mut()
            .fail(format!("callback in flight {in_cb} but mutator gave {r:?}"));
    }
}

async fn op(
    rng: &mut Rng,
    lp: &Loop,
    g: &Group<Req>,
    m: &M,
    units: u64,
    last: &mut Option<Handle>,
    next_req: &mut u64,
) {
    let in_cb = m.borrow().in_cb > 0;
    match rng.u32(0..100) {
        0..50 => {
            let charge = match rng.u32(0..20) {
                0 => 0,
                1 => units + 1,
                _ => rng.u64(1..=units),
            };
            // Consecutive unless cross-loop hand-ins took numbers between.
            let guess = match m.borrow().via_ring.is_empty() {
                true => last.map_or(0, |h| h.get() + 1),
                false => 0,
            };
            *next_req += 1;
            let r = g.submit(*next_req, charge);
            let mut mm = m.borrow_mut();
            match r {
                Ok(h) => {
                    if last.is_some_and(|l| h <= l) {
                        mm.fail(format!("handle {h} not above {last:?}"));
                    }
                    if guess != 0 && h.get() != guess {
                        mm.fail(format!("handle {h} skipped from {guess}"));
                    }
                    *last = Some(h);
                    mm.accepted.push((h, charge));
                    mm.charge.insert(h, charge);
                    mm.req_of.insert(h, *next_req);
                    if in_cb {
                        mm.fail("submit accepted during a callback".into());
                    }
                }
                Err(e) => {
                    if in_cb != (e.error == Error::Deadlk) {
                        mm.fail(format!(
                            "callback in flight {in_cb}, submit gave {:?}",
                            e.error
                        ));
                    }
                    if e.error != Error::Deadlk {
                        mm.rejections += 1;
                    }
                }
            }
        }
        50..60 => {
            let Some(h) = pick(rng, m) else { return };
            let r = g.cancel(h);
            check_deadlk(m, in_cb, r.and(Ok(())));
            let mut mm = m.borrow_mut();
            let delivered = mm.outcomes.contains_key(&h);
            match r {
                Ok(()) if delivered => mm.fail(format!("cancel of notified {h} accepted")),
                Ok(()) => {
                    mm.cancelled.insert(h);
                    if mm.inflight.as_ref().is_some_and(|v| v.contains(&h)) {
                        mm.cancel_outstanding.insert(h);
                    }
                }
                Err(Error::Inval) if !delivered => mm.fail(format!("cancel of live {h} refused")),
                _ => {}
            }
        }
        60..63 if !m.borrow().via_ring.is_empty() || rng.bool() => {
            stale_cancel(rng, g, m).await;
        }
        60..80 => {
            let Some(h) = pick(rng, m) else { return };
            let r = g.resume(h);
            check_deadlk(m, in_cb, r);
            if r.is_ok() && m.borrow().outcomes.contains_key(&h) {
                m.borrow_mut()
                    .fail(format!("resume of notified {h} accepted"));
            }
        }
        80..82 => {
            let mode = if rng.bool() {
                CloseMode::Drain
            } else {
                CloseMode::Cancel
            };
            let r = g.close(mode);
            check_deadlk(m, in_cb, r);
            if r.is_ok() && mode == CloseMode::Cancel {
                let mut mm = m.borrow_mut();
                mm.close_cancel = true;
                let outstanding = mm.inflight.clone().unwrap_or_default();
                mm.cancel_outstanding.extend(outstanding);
            }
        }
        82..83 if rng.bool() => {
            if lp.kill(g.driver_pid()).is_ok() {
                m.borrow_mut().killed = true;
            }
        }
        86..93 => rt::sleep(Duration::from_micros(rng.u64(1..30))).await,
        _ => rt::yield_now().await,
    }
}

/// An owner cancel of a handle with no live request: one already notified
/// (stale) or one never issued (unknown); both are `Inval` (B-050).
async fn stale_cancel(rng: &mut Rng, g: &Group<Req>, m: &M) {
    let notified: Vec<Handle> = m.borrow().outcomes.keys().copied().collect();
    let h = match (notified.is_empty(), rng.bool()) {
        (false, true) => notified[rng.usize(0..notified.len())],
        _ => {
            let top = m.borrow().accepted.iter().map(|a| a.0.get()).max();
            Handle::new(top.unwrap_or(1) + 1_000_000).expect("nonzero")
        }
    };
    let in_cb = m.borrow().in_cb > 0;
    let r = g.cancel(h);
    check_deadlk(m, in_cb, r);
    if !in_cb && r != Err(Error::Inval) {
        m.borrow_mut()
            .fail(format!("cancel of stale or unknown {h} gave {r:?}"));
    }
}

fn pick(rng: &mut Rng, m: &M) -> Option<Handle> {
    let mm = m.borrow();
    if mm.accepted.is_empty() {
        return None;
    }
    Some(mm.accepted[rng.usize(0..mm.accepted.len())].0)
}

/// A device resolving promises late, early, failed, dropped or never.
async fn device(seed: u64, lp: Loop, g: Group<Req>, m: M, timeout: bool) {
    let mut rng = Rng::with_seed(seed ^ 0xde71ce);
    while lp.is_alive(g.driver_pid()) || lp.is_alive(g.finalizer_pid()) {
        rt::sleep(Duration::from_micros(rng.u64(0..15))).await;
        let p = m.borrow_mut().promises.pop();
        let Some(p) = p else { continue };
        match rng.u32(0..100) {
            0..75 => p.set(Ok(())),
            75..82 => p.set(Err(Error::Nomem)),
            82..90 => drop(p),
            _ if timeout => m.borrow_mut().consumed_check.push(p), // never
            _ => p.set(Ok(())),
        }
    }
}

/// Coverage totals over all seeds of one flavour (printed by the test).
#[derive(Default, Debug)]
struct Cover {
    accepted: usize,
    ok: u64,
    cancelled: u64,
    failed: u64,
    kills: usize,
    offloads: u64,
    timeouts: u64,
    errors: u64,
    hints: usize,
    blocking_seeds: usize,
}

fn run_seed(seed: u64, is_async: bool, cover: &mut Cover) {
    let mut rng = Rng::with_seed(seed);
    let sim = Sim::new(seed);
    let lp = sim.new_loop();
    let capacity = rng.usize(1..8);
    let max_active = rng.usize(1..=capacity);
    let units = rng.u64(1..10);
    let m: M = Rc::new(RefCell::new(Model {
        units,
        max_active,
        ..Model::default()
    }));
    let slot = Rc::new(RefCell::new(None));
    let timeout = is_async && rng.bool();
    let blocking = is_async && rng.u32(0..8) == 0;
    let app = App {
        m: m.clone(),
        rng: Rng::with_seed(seed ^ 1),
        group: slot.clone(),
        blocking,
        timeout,
        mt: false,
        fence: fence(),
    };
    let sink = Sink {
        m: m.clone(),
        rng: Rng::with_seed(seed ^ 2),
    };
    let g = if is_async {
        let t = timeout.then(|| Duration::from_micros(rng.u64(1..40)));
        let o = AsyncOpts {
            capacity,
            max_active,
            resource_capacity: units,
            exec_timeout: t,
            sched_class: None,
            mt_queue_cap: 0,
        };
        Group::create_async(&lp, o, app, sink).unwrap()
    } else {
        let o = SyncOpts {
            capacity,
            max_active,
            resource_capacity: units,
            sched_class: None,
        };
        Group::create(&lp, o, app, sink).unwrap()
    };
    *slot.borrow_mut() = Some(g.clone());
    lp.spawn(client(seed, lp.clone(), g.clone(), m.clone(), units, false))
        .unwrap();
    if is_async {
        lp.spawn(device(seed, lp.clone(), g.clone(), m.clone(), timeout))
            .unwrap();
    }
    loop {
        while sim.step() {
            if g.stats().reserved_units > units {
                m.borrow_mut()
                    .fail("reserved_units above resource_capacity".into());
            }
        }
        if lp.n_procs() == 0 {
            break;
        }
        assert!(
            blocking,
            "seed {seed}: sim stalled with {} processes",
            lp.n_procs()
        );
        std::thread::yield_now(); // a pool thread is running a BLOCKING closure
    }
    *slot.borrow_mut() = None;
    final_checks(&g, &m);
    g.destroy()
        .unwrap_or_else(|e| panic!("seed {seed}: destroy {e:?}"));
    let (s, a, mm) = (g.stats(), g.async_stats(), m.borrow());
    cover.accepted += mm.accepted.len();
    (cover.ok, cover.cancelled, cover.failed) = (
        cover.ok + s.completed,
        cover.cancelled + s.cancelled,
        cover.failed + s.failed,
    );
    cover.kills += usize::from(mm.killed);
    (cover.offloads, cover.timeouts, cover.errors) = (
        cover.offloads + a.offloads,
        cover.timeouts + a.offload_timeouts,
        cover.errors + a.offload_errors,
    );
    cover.hints += mm.hinted.len();
    cover.blocking_seeds += usize::from(blocking);
    drop(mm);
    let v = &m.borrow().violations;
    assert!(
        v.is_empty(),
        "seed {seed} ({}; replay with XTC_MODEL_SEED={seed}): {v:#?}",
        if is_async { "async" } else { "sync" }
    );
}

fn final_checks(g: &Group<Req>, m: &M) {
    let mut mm = m.borrow_mut();
    let accepted = mm.accepted.clone();
    let (mut ok, mut ab, mut failed) = (0, 0, 0);
    for (h, _) in &accepted {
        let os = mm.outcomes.get(h).cloned().unwrap_or_default();
        if os.len() != 1 {
            mm.fail(format!("{h}: {} completions", os.len()));
            continue;
        }
        match os[0] {
            Ok(()) => ok += 1,
            Err(Error::Aborted) => {
                ab += 1;
                let why = mm.cancelled.contains(h)
                    || mm.cancelled_mt.contains(h)
                    || mm.close_cancel
                    || mm.killed
                    || mm.aborted_op.contains(h);
                if !why {
                    mm.fail(format!("{h} Aborted without a cancel"));
                }
            }
            Err(e) => {
                failed += 1;
                if e == Error::Internal && !mm.unset.contains(h) && !mm.killed {
                    mm.fail(format!("{h} Internal without UNSET or kill"));
                }
            }
        }
    }
    if mm.outcomes.len() != accepted.len() {
        mm.fail("completion for a handle never accepted".into());
    }
    let s = g.stats();
    let want = (
        ok,
        ab,
        failed,
        mm.rejections,
        mm.vectors,
        mm.members,
        mm.max_vector,
    );
    let got = (
        s.completed,
        s.cancelled,
        s.failed,
        s.rejections,
        s.iterations,
        s.total_members,
        s.max_vector,
    );
    if want != got {
        mm.fail(format!("stats {got:?} != model {want:?}"));
    }
    if (s.queued, s.ready, s.blocked, s.reserved_units) != (0, 0, 0, 0) {
        mm.fail(format!("gauges not zero at the end: {s:?}"));
    }
    let a = g.async_stats();
    if (a.offloads, a.offload_timeouts, a.offload_errors) != (mm.offloads, mm.timeouts, mm.errors) {
        let msg = format!(
            "async stats {a:?} vs model {} {} {}",
            mm.offloads, mm.timeouts, mm.errors
        );
        mm.fail(msg);
    }
    if mm.inflight.is_some() {
        mm.fail("an operation was never collected".into());
    }
    let kept = std::mem::take(&mut mm.consumed_check);
    if kept.iter().any(|p| !p.is_abandoned()) {
        mm.fail("a FUTURE was not consumed (still held by the engine)".into());
    }
    // A cancel accepted while the operation was outstanding is consumed at
    // its completion boundary, whichever path carried it (B-093, B-094).
    let mut outstanding: Vec<Handle> = mm.cancel_outstanding.iter().copied().collect();
    outstanding.sort_unstable();
    for h in outstanding {
        let os = mm.outcomes.get(&h).cloned().unwrap_or_default();
        if os != [Err(Error::Aborted)] {
            mm.fail(format!("{h}: cancelled while outstanding, ended {os:?}"));
        }
        if !mm.hinted.contains(&h) {
            mm.fail(format!("{h}: cancelled while outstanding, never hinted"));
        }
    }
    let ring = mm.via_ring.len() as u64;
    if ring > 0 && (a.mt_queued, a.mt_rejections) != (ring, mm.mt_refused) {
        let msg = format!(
            "mt stats ({}, {}) vs model ({ring}, {})",
            a.mt_queued, a.mt_rejections, mm.mt_refused
        );
        mm.fail(msg);
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

/// Which `Remote` call [`remote_op`] makes.
#[derive(Clone, Copy, PartialEq)]
enum RemoteOp {
    Submit,
    Cancel,
    Resume,
    /// Resolve the outstanding FUTURE operation now (a device finishing).
    Resolve,
}

impl RemoteOp {
    fn random(rng: &mut Rng) -> RemoteOp {
        match rng.u32(0..100) {
            0..45 => RemoteOp::Submit,
            45..75 => RemoteOp::Cancel,
            75..93 => RemoteOp::Resume,
            _ => RemoteOp::Resolve,
        }
    }
}

/// Whether the group's driver and finalizer are in the process table.
#[derive(Clone, Copy)]
struct Alive {
    driver: bool,
    finalizer: bool,
}

impl Alive {
    fn of(g: &Group<Req>) -> Alive {
        let lp = g.owner_loop();
        Alive {
            driver: lp.is_alive(g.driver_pid()),
            finalizer: lp.is_alive(g.finalizer_pid()),
        }
    }
}

/// The calls a plain thread or another loop can make, checked against the
/// model. Controls are accepted while the driver runs, and after a kill
/// until the finalizer finished; `Inval` once the driver is gone (B-143).
fn remote_op(rng: &mut Rng, op: RemoteOp, r: &Remote<Req>, m: &M, units: u64, alive: Alive) {
    m.borrow_mut().remote_calls += 1;
    match op {
        RemoteOp::Submit => {
            let charge = match rng.u32(0..20) {
                0 => 0,
                1 => units + 1,
                _ => rng.u64(1..=units),
            };
            let req = (1 << 40) + m.borrow().remote_calls;
            let res = r.submit(req, charge);
            let mut mm = m.borrow_mut();
            match res {
                Ok(h) => {
                    if mm.accepted.iter().any(|a| a.0 >= h) {
                        mm.fail(format!("hand-in {h} not above every issued handle"));
                    }
                    if charge == 0 || charge > units {
                        mm.fail(format!("hand-in with charge {charge} accepted"));
                    }
                    mm.accepted.push((h, charge));
                    mm.charge.insert(h, charge);
                    mm.req_of.insert(h, req);
                    mm.via_ring.insert(h);
                }
                Err(e) => {
                    let bad = charge == 0 || charge > units;
                    match e.error {
                        Error::Range if bad => {}
                        Error::Again if !bad => {}
                        other => mm.fail(format!("submit_mt (charge {charge}) gave {other:?}")),
                    }
                    if e.into_inner() != req {
                        mm.fail("a refused hand-in's request came back changed".into());
                    }
                    mm.mt_refused += 1;
                }
            }
        }
        RemoteOp::Cancel | RemoteOp::Resume => {
            let target = {
                let mm = m.borrow();
                let inflight = mm.inflight.clone().unwrap_or_default();
                if op == RemoteOp::Cancel && !inflight.is_empty() && rng.bool() {
                    Some(inflight[rng.usize(0..inflight.len())])
                } else if rng.u32(0..8) == 0 {
                    None // a handle never issued
                } else {
                    drop(mm);
                    pick(rng, m)
                }
            };
            let h = target.unwrap_or_else(|| Handle::new(u64::MAX - 7).expect("nonzero"));
            let res = match op {
                RemoteOp::Cancel => r.cancel(h),
                _ => r.resume(h),
            };
            let mut mm = m.borrow_mut();
            match res {
                Ok(()) if target.is_none() => mm.fail(format!("control of unknown {h} accepted")),
                Ok(()) if !alive.driver && !alive.finalizer => {
                    mm.fail(format!("control of {h} after the driver"))
                }
                Ok(()) if op == RemoteOp::Cancel => {
                    mm.cancelled_mt.insert(h);
                    let outstanding = mm.inflight.as_ref().is_some_and(|v| v.contains(&h));
                    if outstanding {
                        mm.cancel_outstanding.insert(h);
                        if rng.bool() {
                            // The operation finishes before the driver runs
                            // again (issue 12 item 1).
                            drop(mm);
                            resolve_now(m);
                        }
                    }
                }
                Ok(()) => {}
                Err(Error::Again) => mm.mt_refused += 1,
                Err(Error::Inval) if target.is_none() || !alive.driver => {}
                Err(e) => mm.fail(format!(
                    "control of {h} (driver alive {}) gave {e:?}",
                    alive.driver
                )),
            }
        }
        RemoteOp::Resolve => resolve_now(m),
    }
}

/// Resolves the outstanding FUTURE operation at once (if its timer has not).
fn resolve_now(m: &M) {
    let slot = m.borrow().op_promise.clone();
    let p = slot.and_then(|s| s.borrow_mut().take());
    if let Some(p) = p {
        m.borrow_mut().early += 1;
        p.set(Ok(()));
    }
}

/// A process of another loop making `Remote` calls (a cross-loop fiber).
async fn peer(seed: u64, r: Remote<Req>, m: M, units: u64, g: Group<Req>) {
    let mut rng = Rng::with_seed(seed ^ 0x9ee7);
    for _ in 0..rng.usize(0..40) {
        let op = RemoteOp::random(&mut rng);
        remote_op(&mut rng, op, &r, &m, units, Alive::of(&g));
        if rng.bool() {
            rt::yield_now().await;
        } else {
            rt::sleep(Duration::from_micros(rng.u64(1..20))).await;
        }
    }
}

/// Coverage totals of the cross-loop flavour.
#[derive(Default, Debug)]
struct MtCover {
    seeds: usize,
    hand_ins: usize,
    remote_calls: u64,
    cancel_outstanding: usize,
    early_resolves: u64,
    stale_last: usize,
    liveness_rounds: usize,
    aborted: u64,
    hints: usize,
    kills: usize,
}

/// Steps `sim` until nothing can progress, checking the resource bound.
fn quiesce(sim: &Sim, g: &Group<Req>, m: &M, units: u64) {
    for _ in 0..5_000_000 {
        if !sim.step() {
            return;
        }
        if g.stats().reserved_units > units {
            m.borrow_mut()
                .fail("reserved_units above resource_capacity".into());
        }
    }
    m.borrow_mut().fail("the simulation never quiesced".into());
}

fn run_mt_seed(seed: u64, cover: &mut MtCover) {
    let mut rng = Rng::with_seed(seed);
    let sim = Sim::new(seed);
    let lp = sim.new_loop();
    let other = sim.new_loop();
    let capacity = rng.usize(1..8);
    let max_active = rng.usize(1..=capacity);
    let units = rng.u64(1..10);
    let mt_queue_cap = rng.usize(1..6);
    let timeout = rng.u32(0..3) == 0;
    let m: M = Rc::new(RefCell::new(Model {
        units,
        max_active,
        ..Model::default()
    }));
    let slot = Rc::new(RefCell::new(None));
    let app = App {
        m: m.clone(),
        rng: Rng::with_seed(seed ^ 1),
        group: slot.clone(),
        blocking: false,
        timeout,
        mt: true,
        fence: fence(),
    };
    let sink = Sink {
        m: m.clone(),
        rng: Rng::with_seed(seed ^ 2),
    };
    let o = AsyncOpts {
        capacity,
        max_active,
        resource_capacity: units,
        exec_timeout: timeout.then(|| Duration::from_micros(rng.u64(1..40))),
        sched_class: None,
        mt_queue_cap,
    };
    let g = Group::create_async(&lp, o, app, sink).unwrap();
    *slot.borrow_mut() = Some(g.clone());
    let r = g.remote().unwrap();
    let driver = g.driver_pid();
    lp.spawn(client(seed, lp.clone(), g.clone(), m.clone(), units, true))
        .unwrap();
    let peer_r = r.clone();
    other
        .spawn(peer(seed, peer_r, m.clone(), units, g.clone()))
        .unwrap();
    // Random phase: the test thread calls the remote between steps.
    let mut trng = Rng::with_seed(seed ^ 0x7e57);
    for _ in 0..5_000_000 {
        if m.borrow().client_done {
            break;
        }
        if !sim.step() {
            m.borrow_mut().fail("the client stalled".into());
            break;
        }
        if g.stats().reserved_units > units {
            m.borrow_mut()
                .fail("reserved_units above resource_capacity".into());
        }
        if trng.u32(0..5) == 0 {
            let op = RemoteOp::random(&mut trng);
            remote_op(&mut trng, op, &r, &m, units, Alive::of(&g));
        }
    }
    // Liveness: no owner action from here on. More hand-ins, then every
    // accepted request must complete; the test thread only resumes members
    // (a blocked one needs it) through the remote.
    for _ in 0..trng.usize(0..6) {
        remote_op(&mut trng, RemoteOp::Submit, &r, &m, units, Alive::of(&g));
    }
    let mut live = Vec::new();
    let mut rounds = 0;
    for _ in 0..200 {
        quiesce(&sim, &g, &m, units);
        rounds += 1;
        live = {
            let mm = m.borrow();
            mm.accepted
                .iter()
                .map(|a| a.0)
                .filter(|h| !mm.outcomes.contains_key(h))
                .collect()
        };
        if live.is_empty() || !lp.is_alive(driver) {
            break;
        }
        for h in &live {
            // Every control record may be in use: let the driver drain them.
            for _ in 0..100 {
                if m.borrow().outcomes.contains_key(h) {
                    break; // completed meanwhile
                }
                match r.resume(*h) {
                    Ok(()) => break,
                    Err(Error::Again) => m.borrow_mut().mt_refused += 1,
                    Err(Error::Inval) if !lp.is_alive(driver) => break,
                    Err(e) => m.borrow_mut().fail(format!("resume_mt of live {h}: {e:?}")),
                }
                quiesce(&sim, &g, &m, units);
            }
        }
    }
    if !live.is_empty() {
        m.borrow_mut().fail(format!(
            "liveness: {live:?} accepted but never completed with the driver able to run"
        ));
    }
    // Close through the owner, finish, check.
    let (g2, m2) = (g.clone(), m.clone());
    let mode = if trng.bool() {
        CloseMode::Drain
    } else {
        CloseMode::Cancel
    };
    lp.spawn(async move { retry(&g2, &m2, mode).await })
        .unwrap();
    quiesce(&sim, &g, &m, units);
    if lp.n_procs() + other.n_procs() != 0 {
        m.borrow_mut().fail(format!(
            "{} processes left after close",
            lp.n_procs() + other.n_procs()
        ));
    }
    *slot.borrow_mut() = None;
    final_checks(&g, &m);
    if m.borrow().violations.is_empty() {
        g.destroy()
            .unwrap_or_else(|e| panic!("seed {seed}: destroy {e:?}"));
    }
    let mm = m.borrow();
    cover.seeds += 1;
    cover.hand_ins += mm.via_ring.len();
    cover.remote_calls += mm.remote_calls;
    cover.cancel_outstanding += mm.cancel_outstanding.len();
    cover.early_resolves += mm.early;
    cover.stale_last += usize::from(mm.stale_last);
    cover.liveness_rounds += rounds;
    cover.aborted += g.stats().cancelled;
    cover.hints += mm.hinted.len();
    cover.kills += usize::from(mm.killed);
    let v = &mm.violations;
    assert!(
        v.is_empty(),
        "seed {seed} (cross-loop; replay with XTC_MODEL_SEED={seed}): {v:#?}"
    );
}
