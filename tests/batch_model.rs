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
//! `XTC_MODEL_SEEDS=n` runs n seeds per flavour (default 2,000 sync and
//! 2,000 async); every violation names its seed.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::Duration;

use fastrand::Rng;
use xtc::Error;
use xtc::batch::{
    AsyncOpts, AsyncStep, CloseMode, Complete, Exec, ExecStatus, Group, Handle, Item, Step,
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
            if self.appeared.contains(h) {
                continue;
            }
            // FCFS: every older live request that was not cancelled has been
            // admitted already (appeared before or in this vector).
            let older: Vec<Handle> = self
                .accepted
                .iter()
                .map(|a| a.0)
                .take_while(|o| o < h)
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
}

impl App {
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
            30..34 => Exec::Fence(0),
            34..45 if self.blocking => {
                let fail = self.rng.u32(0..5) == 0;
                Exec::Blocking(Box::new(
                    move || if fail { Err(Error::Range) } else { Ok(()) },
                ))
            }
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

/// The client: random mutator calls, then drain or cancel.
async fn client(seed: u64, lp: Loop, g: Group<Req>, m: M, units: u64) {
    let mut rng = Rng::with_seed(seed ^ 0x5eed);
    let mut last: Option<Handle> = None;
    let mut next_req = 0u64;
    for _ in 0..rng.usize(10..120) {
        op(&mut rng, &lp, &g, &m, units, &mut last, &mut next_req).await;
        if rng.u32(0..10) < 7 {
            rt::yield_now().await;
        }
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
            let guess = last.map_or(0, |h| h.get() + 1);
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
                }
                Err(Error::Inval) if !delivered => mm.fail(format!("cancel of live {h} refused")),
                _ => {}
            }
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
                m.borrow_mut().close_cancel = true;
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
    lp.spawn(client(seed, lp.clone(), g.clone(), m.clone(), units))
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
        "seed {seed} ({}): {v:#?}",
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
}

fn seeds() -> u64 {
    std::env::var("XTC_MODEL_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

#[test]
fn model_sync_groups() {
    let mut cover = Cover::default();
    for seed in 0..seeds() {
        run_seed(seed, false, &mut cover);
    }
    eprintln!("sync model coverage: {cover:?}");
    assert!(cover.ok > 0 && cover.cancelled > 0 && cover.failed > 0 && cover.kills > 0);
}

#[test]
fn model_async_groups() {
    let mut cover = Cover::default();
    for seed in 0..seeds() {
        run_seed(1_000_000 + seed, true, &mut cover);
    }
    eprintln!("async model coverage: {cover:?}");
    assert!(cover.timeouts > 0 && cover.errors > 0 && cover.hints > 0 && cover.kills > 0);
}
