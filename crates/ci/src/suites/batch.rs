//! `xtc.batch.*`: batch groups (`xtc_batch(3)`) driving real device work.
//!
//! Every member is a row of logits and a countdown; each iteration runs
//! ONE command buffer for the whole ready vector (the `argmax` kernel over
//! one row per member, [`crate::Rig`]), and collect checks each
//! member's greedy token against the CPU reference before counting it down.
//! An async group awaits the submission's completion fd (`Exec::Fence`),
//! or, where a case must hold the operation in flight (cancel, timeout), an
//! eventfd the case signals itself after the device finished.
//!
//! - `sync.one_submission_per_iteration`: a synchronous group whose step
//!   submits and waits: submissions = iterations.
//! - `async.one_command_buffer_per_vector`: device timeline values advance
//!   by exactly one per iteration, each iteration saw the whole vector.
//! - `async.members_finish_independently`: members of different lengths
//!   leave at their own iteration while others are admitted (FCFS).
//! - `async.cancel_in_flight`: a cancel while the operation is outstanding
//!   fires the member's cancel hint and ends it `Aborted`; the rest finish.
//! - `async.exec_timeout`: a fence that outlives `exec_timeout` ends the
//!   iteration `Timeout`: unfinished members end `Again`.
//! - `async.close_drain` / `async.close_cancel`: close with DRAIN finishes
//!   every accepted member and refuses new ones; close with CANCEL aborts
//!   every member.
//! - `async.cross_loop_submit`: a thread submits through a `Remote`
//!   (the cross-loop admission ring); every request completes once.

use std::cell::RefCell;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::time::Duration;

use crate::case::{Case, CaseError, Ctx, Outcome, Suite, ensure};
use crate::rig::Rig;
use xtc::Error;
use xtc::accel::EventFence;
use xtc::batch::{
    AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Handle, Item, Step, StepResult,
    SyncOpts,
};
use xtc::rt::{self, Loop};
use xtc_model::cpu::f32_model;
use xtc_model::vulkan::ops::{Argmax, Variant};
use xtc_vk::Submission;

/// Registers the suite's cases.
pub fn cases(v: &mut Vec<Case>) {
    let s = Suite::Batch;
    v.push(Case::new(
        s,
        "xtc.batch.sync.one_submission_per_iteration",
        sync_group,
    ));
    v.push(Case::new(
        s,
        "xtc.batch.async.one_command_buffer_per_vector",
        one_buffer,
    ));
    v.push(Case::new(
        s,
        "xtc.batch.async.members_finish_independently",
        independent,
    ));
    v.push(Case::new(
        s,
        "xtc.batch.async.cancel_in_flight",
        cancel_in_flight,
    ));
    v.push(Case::new(s, "xtc.batch.async.exec_timeout", exec_timeout));
    v.push(Case::new(s, "xtc.batch.async.close_drain", close_drain));
    v.push(Case::new(s, "xtc.batch.async.close_cancel", close_cancel));
    v.push(Case::new(
        s,
        "xtc.batch.async.cross_loop_submit",
        cross_loop,
    ));
}

const VOCAB: usize = 257;
const MAX_ACTIVE: usize = 8;

/// One member: a logits row, its expected greedy token, iterations left.
#[derive(Debug)]
struct Req {
    id: usize,
    logits: Vec<f32>,
    want: u32,
    left: u32,
}

impl Req {
    fn new(id: usize, seed: u64, iterations: u32) -> Req {
        let mut rng = fastrand::Rng::with_seed(seed ^ (id as u64).wrapping_mul(0x9e37_79b9));
        let logits: Vec<f32> = (0..VOCAB).map(|_| rng.f32() * 16.0 - 8.0).collect();
        Req {
            id,
            want: f32_model::argmax(&logits),
            logits,
            left: iterations,
        }
    }
}

/// What the device step and the completions saw.
#[derive(Debug, Default)]
struct Log {
    /// Members of each submitted vector (by request id).
    vectors: Vec<Vec<usize>>,
    /// Timeline value of each submission.
    values: Vec<u64>,
    /// (request id, iteration index of its completion, outcome).
    done: Vec<(usize, usize, xtc::Result<()>)>,
    /// Cancel hints seen.
    hints: Vec<Handle>,
    /// Collect statuses.
    statuses: Vec<ExecStatus>,
    /// A wrong device result or protocol surprise.
    failure: Option<String>,
}

type SharedLog = Rc<RefCell<Log>>;

/// The device work of one iteration: one argmax row per member, ONE
/// command buffer.
struct Device {
    rig: Rig,
    log: SharedLog,
}

impl Device {
    fn new(ctx: &mut Ctx, log: &SharedLog) -> Result<Device, CaseError> {
        let kernels = ctx.kernels()?;
        let rig = Rig::new(
            kernels,
            [1, MAX_ACTIVE * VOCAB, 1, 1, MAX_ACTIVE],
            Variant::Cpu,
        )?;
        Ok(Device {
            rig,
            log: log.clone(),
        })
    }

    fn submit(&mut self, items: &[Item<'_, Req>]) -> xtc::Result<Submission> {
        for (i, it) in items.iter().enumerate() {
            self.rig
                .write(1, i * VOCAB, &it.request.logits)
                .map_err(Error::from)?;
        }
        let op = Argmax {
            n_rows: items.len() as u32,
            vocab: VOCAB as u32,
            logits_off: 0,
            out_off: 0,
        };
        let sub = self
            .rig
            .submit(|ops, rec| ops.run(rec, &op))
            .map_err(Error::from)?;
        let mut log = self.log.borrow_mut();
        log.vectors
            .push(items.iter().map(|i| i.request.id).collect());
        log.values.push(sub.value());
        Ok(sub)
    }

    /// Checks each member's token and counts it down (`Done` at 0).
    fn collect(&mut self, items: &mut [Item<'_, Req>], results: &mut [StepResult]) {
        let toks: Vec<u32> = match self.rig.read(4, 0, items.len()) {
            Ok(t) => t,
            Err(e) => {
                self.log.borrow_mut().failure.get_or_insert(e.to_string());
                results.fill(StepResult::Error(Error::Internal));
                return;
            }
        };
        for ((it, r), tok) in items.iter_mut().zip(results.iter_mut()).zip(toks) {
            let req = &mut *it.request;
            if tok != req.want {
                self.log.borrow_mut().failure.get_or_insert(format!(
                    "member {}: device token {tok}, reference {}",
                    req.id, req.want
                ));
                *r = StepResult::Error(Error::Internal);
                continue;
            }
            req.left -= 1;
            *r = if req.left == 0 {
                StepResult::Done
            } else {
                StepResult::Continue
            };
        }
    }
}

/// The one place this suite turns a completion fd into an `Exec` (the
/// engine's FENCE path): the engine holds a clone of the submission or
/// fence for the wait and drops it after collect; the step keeps its own.
fn fence_exec(fd: Rc<dyn AsFd>) -> Exec {
    Exec::Fence(fd)
}

/// How an async step hands its operation to the driver.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Await {
    /// The submission's completion fd.
    Device,
    /// An eventfd the case signals (the first iteration only; later ones
    /// use the device fd).
    Gate,
}

struct AsyncDevice {
    dev: Device,
    mode: Await,
    sub: Option<Rc<Submission>>,
    gate: Rc<EventFence>,
    gated: bool,
}

impl AsyncStep<Req> for AsyncDevice {
    async fn submit(&mut self, items: &mut [Item<'_, Req>]) -> xtc::Result<Exec> {
        let sub = Rc::new(self.dev.submit(items)?);
        let exec = if self.mode == Await::Gate && !self.gated {
            self.gated = true;
            fence_exec(self.gate.clone())
        } else {
            fence_exec(sub.clone())
        };
        self.sub = Some(sub);
        Ok(exec)
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, Req>],
        results: &mut [StepResult],
        status: ExecStatus,
    ) -> xtc::Result<()> {
        self.dev.log.borrow_mut().statuses.push(status);
        // The device work must be done before its buffers are reused.
        if let Some(sub) = self.sub.take() {
            sub.wait(None).map_err(Error::from)?;
        }
        match status {
            ExecStatus::Ok => self.dev.collect(items, results),
            // Timeout: unfinished members end `Again` (B-089); Aborted: all
            // end `Aborted` whatever is written (B-090).
            _ => results.fill(StepResult::Continue),
        }
        Ok(())
    }

    async fn cancel_hint(&mut self, h: Handle) {
        self.dev.log.borrow_mut().hints.push(h);
    }
}

struct SyncDevice {
    dev: Device,
}

impl Step<Req> for SyncDevice {
    async fn step(
        &mut self,
        items: &mut [Item<'_, Req>],
        results: &mut [StepResult],
    ) -> xtc::Result<()> {
        let sub = self.dev.submit(items)?;
        sub.wait(None).map_err(Error::from)?;
        self.dev.collect(items, results);
        Ok(())
    }
}

/// `Nosys` (built without `sched-policy`) is a skip, anything else a failure.
fn created<T>(r: xtc::Result<T>) -> Result<T, CaseError> {
    match r {
        Err(Error::Nosys) => Err(CaseError::Skip(
            "built without the sched-policy feature (batch API is Nosys)".into(),
        )),
        r => Ok(r?),
    }
}

fn completer(log: &SharedLog) -> impl FnMut(Handle, Req, xtc::Result<()>) + 'static {
    let log = log.clone();
    move |_h, req: Req, outcome| {
        let mut l = log.borrow_mut();
        let at = l.vectors.len();
        l.done.push((req.id, at, outcome));
    }
}

fn opts(capacity: usize, timeout: Option<Duration>, mt: usize) -> AsyncOpts {
    AsyncOpts {
        capacity,
        max_active: MAX_ACTIVE.min(capacity),
        resource_capacity: 1_000,
        exec_timeout: timeout,
        sched_class: None,
        mt_queue_cap: mt,
    }
}

struct Setup {
    lp: Loop,
    group: Group<Req>,
    log: SharedLog,
    gate: Rc<EventFence>,
}

fn async_group(ctx: &mut Ctx, o: AsyncOpts, mode: Await) -> Result<Setup, CaseError> {
    let log = SharedLog::default();
    let dev = Device::new(ctx, &log)?;
    let lp = Loop::new()?;
    let gate = Rc::new(EventFence::new()?);
    let step = AsyncDevice {
        dev,
        mode,
        sub: None,
        gate: gate.clone(),
        gated: false,
    };
    let group = created(Group::create_async(&lp, o, step, completer(&log)))?;
    Ok(Setup {
        lp,
        group,
        log,
        gate,
    })
}

fn submit(g: &Group<Req>, req: Req) -> Result<Handle, CaseError> {
    g.submit(req, 1)
        .map_err(|e| CaseError::Fail(format!("submit: {}", e.error)))
}

/// Runs the loop, then fails on any device-result failure the log holds.
fn finish(s: &Setup) -> Result<(), CaseError> {
    s.lp.run()?;
    if let Some(f) = s.log.borrow_mut().failure.take() {
        return Err(CaseError::Fail(f));
    }
    Ok(())
}

fn outcomes_ok(log: &Log, n: usize) -> Result<(), CaseError> {
    ensure(log.done.len() == n, || {
        format!("{} completions for {n} requests", log.done.len())
    })?;
    for (id, _, o) in &log.done {
        ensure(o.is_ok(), || format!("request {id} ended {o:?}"))?;
    }
    Ok(())
}

fn sync_group(ctx: &mut Ctx) -> Result<Outcome, CaseError> {
    let log = SharedLog::default();
    let dev = Device::new(ctx, &log)?;
    let lp = Loop::new()?;
    let o = SyncOpts {
        capacity: 16,
        max_active: MAX_ACTIVE,
        resource_capacity: 1_000,
        sched_class: None,
    };
    let g = created(Group::create(&lp, o, SyncDevice { dev }, completer(&log)))?;
    let seed = ctx.case_seed();
    for id in 0..12 {
        submit(&g, Req::new(id, seed, 1 + (id % 4) as u32))?;
    }
    g.close(CloseMode::Drain)?;
    lp.run()?;
    let l = log.borrow();
    if let Some(f) = &l.failure {
        return Err(CaseError::Fail(f.clone()));
    }
    outcomes_ok(&l, 12)?;
    let st = g.stats();
    ensure(st.iterations == l.vectors.len() as u64, || {
        format!(
            "{} iterations, {} submissions",
            st.iterations,
            l.vectors.len()
        )
    })?;
    Ok(Outcome::pass_with(format!(
        "{} iterations, one submission each",
        st.iterations
    )))
}

fn one_buffer(ctx: &mut Ctx) -> Result<Outcome, CaseError> {
    let s = async_group(ctx, opts(32, None, 0), Await::Device)?;
    let seed = ctx.case_seed();
    for id in 0..MAX_ACTIVE {
        submit(&s.group, Req::new(id, seed, 5))?;
    }
    s.group.close(CloseMode::Drain)?;
    finish(&s)?;
    let l = s.log.borrow();
    outcomes_ok(&l, MAX_ACTIVE)?;
    let st = s.group.stats();
    let ast = s.group.async_stats();
    ensure(
        l.vectors.len() == 5 && st.iterations == 5 && ast.offloads == 5,
        || {
            format!(
                "{} submissions, {} iterations, {} offloads for 5 iterations of {MAX_ACTIVE} members",
                l.vectors.len(),
                st.iterations,
                ast.offloads
            )
        },
    )?;
    ensure(l.vectors.iter().all(|v| v.len() == MAX_ACTIVE), || {
        format!(
            "vector sizes {:?}",
            l.vectors.iter().map(Vec::len).collect::<Vec<_>>()
        )
    })?;
    ensure(l.values.windows(2).all(|w| w[1] == w[0] + 1), || {
        format!(
            "timeline values {:?}: not one submission per iteration",
            l.values
        )
    })?;
    Ok(Outcome::pass_with(format!(
        "5 iterations of {MAX_ACTIVE} members, one command buffer each"
    )))
}

fn independent(ctx: &mut Ctx) -> Result<Outcome, CaseError> {
    let lengths = [1u32, 6, 3, 9, 2, 4, 7, 5, 1, 8, 2, 3];
    let s = async_group(ctx, opts(16, None, 0), Await::Device)?;
    let seed = ctx.case_seed();
    for (id, &n) in lengths.iter().enumerate() {
        submit(&s.group, Req::new(id, seed, n))?;
    }
    s.group.close(CloseMode::Drain)?;
    finish(&s)?;
    let l = s.log.borrow();
    outcomes_ok(&l, lengths.len())?;
    // Each member ran exactly its length, in consecutive iterations, and
    // completed right after its last one; FCFS admission.
    let mut first_seen = Vec::new();
    for (id, &n) in lengths.iter().enumerate() {
        let its: Vec<usize> = l
            .vectors
            .iter()
            .enumerate()
            .filter(|(_, v)| v.contains(&id))
            .map(|(i, _)| i)
            .collect();
        ensure(its.len() == n as usize, || {
            format!("member {id} ran {} iterations, not {n}", its.len())
        })?;
        ensure(its.windows(2).all(|w| w[1] == w[0] + 1), || {
            format!("member {id} left the vector and came back: {its:?}")
        })?;
        let (_, done_at, _) = l.done.iter().find(|d| d.0 == id).expect("counted");
        ensure(*done_at == its[its.len() - 1] + 1, || {
            format!(
                "member {id} completed after iteration {done_at}, ran until {}",
                its[its.len() - 1]
            )
        })?;
        first_seen.push(its[0]);
    }
    ensure(first_seen.windows(2).all(|w| w[0] <= w[1]), || {
        format!("admission not FCFS: first iterations {first_seen:?}")
    })?;
    let st = s.group.stats();
    ensure(st.max_vector == MAX_ACTIVE as u64, || {
        format!("largest vector {}", st.max_vector)
    })?;
    Ok(Outcome::pass_with(format!(
        "{} members over {} iterations",
        lengths.len(),
        st.iterations
    )))
}

fn cancel_in_flight(ctx: &mut Ctx) -> Result<Outcome, CaseError> {
    let s = async_group(ctx, opts(8, None, 0), Await::Gate)?;
    let seed = ctx.case_seed();
    let mut handles = Vec::new();
    for id in 0..4 {
        handles.push(submit(&s.group, Req::new(id, seed, 3))?);
    }
    let victim = handles[2];
    let (g, log, gate) = (s.group.clone(), s.log.clone(), s.gate.clone());
    let canceller = async move {
        // Wait until the first operation is outstanding (parked on the gate).
        while log.borrow().vectors.is_empty() {
            rt::yield_now().await;
        }
        let r = g.cancel(victim);
        if let Err(e) = r {
            log.borrow_mut().failure = Some(format!("cancel in flight: {e}"));
        }
        rt::sleep(Duration::from_millis(5)).await;
        // The device finished long ago; now the operation completes.
        let _ = gate.signal();
        let _ = g.close(CloseMode::Drain);
    };
    s.lp.spawn(canceller)?;
    finish(&s)?;
    let l = s.log.borrow();
    ensure(l.hints == vec![victim], || {
        format!("cancel hints {:?}, expected the victim's only", l.hints)
    })?;
    ensure(l.done.len() == 4, || {
        format!("{} completions", l.done.len())
    })?;
    for (id, _, o) in &l.done {
        let want = if *id == 2 {
            Err(Error::Aborted)
        } else {
            Ok(())
        };
        ensure(*o == want, || {
            format!("member {id} ended {o:?}, expected {want:?}")
        })?;
    }
    ensure(l.vectors.iter().skip(1).all(|v| !v.contains(&2)), || {
        format!("the cancelled member ran again: {:?}", l.vectors)
    })?;
    Ok(Outcome::pass_with(
        "cancel hint fired; the member ended Aborted, the rest finished",
    ))
}

fn exec_timeout(ctx: &mut Ctx) -> Result<Outcome, CaseError> {
    let s = async_group(
        ctx,
        opts(8, Some(Duration::from_millis(50)), 0),
        Await::Gate,
    )?;
    let seed = ctx.case_seed();
    for id in 0..3 {
        submit(&s.group, Req::new(id, seed, 2))?;
    }
    s.group.close(CloseMode::Drain)?;
    // The gate is never signalled: the first operation times out.
    finish(&s)?;
    let l = s.log.borrow();
    ensure(l.statuses.first() == Some(&ExecStatus::Timeout), || {
        format!("collect statuses {:?}", l.statuses)
    })?;
    ensure(l.done.len() == 3, || {
        format!("{} completions", l.done.len())
    })?;
    for (id, _, o) in &l.done {
        ensure(*o == Err(Error::Again), || {
            format!("member {id} ended {o:?}, not Again")
        })?;
    }
    let ast = s.group.async_stats();
    ensure(ast.offload_timeouts == 1, || {
        format!("offload_timeouts {}", ast.offload_timeouts)
    })?;
    Ok(Outcome::pass_with(
        "timed-out operation: members ended Again",
    ))
}

fn close_drain(ctx: &mut Ctx) -> Result<Outcome, CaseError> {
    let s = async_group(ctx, opts(16, None, 0), Await::Device)?;
    let seed = ctx.case_seed();
    for id in 0..10 {
        submit(&s.group, Req::new(id, seed, 1 + id as u32 % 3))?;
    }
    s.group.close(CloseMode::Drain)?;
    let refused = s.group.submit(Req::new(99, seed, 1), 1);
    ensure(
        matches!(&refused, Err(e) if e.error == Error::Again),
        || {
            format!(
                "submit after close(DRAIN): {:?}",
                refused.as_ref().map_err(|e| e.error)
            )
        },
    )?;
    finish(&s)?;
    let l = s.log.borrow();
    outcomes_ok(&l, 10)?;
    Ok(Outcome::pass_with(
        "every accepted member finished; new submits refused",
    ))
}

fn close_cancel(ctx: &mut Ctx) -> Result<Outcome, CaseError> {
    let s = async_group(ctx, opts(16, None, 0), Await::Device)?;
    let seed = ctx.case_seed();
    for id in 0..6 {
        submit(&s.group, Req::new(id, seed, 1_000))?;
    }
    let (g, log) = (s.group.clone(), s.log.clone());
    s.lp.spawn(async move {
        while log.borrow().vectors.len() < 3 {
            rt::sleep(Duration::from_micros(200)).await;
        }
        if let Err(e) = g.close(CloseMode::Cancel) {
            log.borrow_mut().failure = Some(format!("close(CANCEL): {e}"));
        }
    })?;
    finish(&s)?;
    let l = s.log.borrow();
    ensure(l.done.len() == 6, || {
        format!("{} completions", l.done.len())
    })?;
    for (id, _, o) in &l.done {
        ensure(*o == Err(Error::Aborted), || {
            format!("member {id} ended {o:?}")
        })?;
    }
    let st = s.group.stats();
    ensure(st.cancelled == 6, || format!("cancelled {}", st.cancelled))?;
    Ok(Outcome::pass_with(format!(
        "close(CANCEL) after {} iterations aborted all 6",
        st.iterations
    )))
}

fn cross_loop(ctx: &mut Ctx) -> Result<Outcome, CaseError> {
    const N: usize = 24;
    let s = async_group(ctx, opts(32, None, 64), Await::Device)?;
    let remote = created(s.group.remote())?;
    let seed = ctx.case_seed();
    let producer = std::thread::spawn(move || -> Result<(), CaseError> {
        for id in 0..N {
            let mut req = Req::new(id, seed, 2);
            loop {
                match remote.submit(req, 1) {
                    Ok(_) => break,
                    Err(e) if e.error == Error::Again => {
                        req = e.into_inner();
                        std::thread::sleep(Duration::from_micros(100));
                    }
                    Err(e) => {
                        return Err(CaseError::Fail(format!("submit_mt of {id}: {}", e.error)));
                    }
                }
            }
        }
        Ok(())
    });
    let (g, log) = (s.group.clone(), s.log.clone());
    s.lp.spawn(async move {
        let start = std::time::Instant::now();
        while log.borrow().done.len() < N && start.elapsed() < Duration::from_secs(30) {
            rt::sleep(Duration::from_millis(1)).await;
        }
        let _ = g.close(CloseMode::Drain);
    })?;
    finish(&s)?;
    producer
        .join()
        .map_err(|_| CaseError::Fail("the producer thread panicked".into()))??;
    let l = s.log.borrow();
    outcomes_ok(&l, N)?;
    let mut ids: Vec<usize> = l.done.iter().map(|d| d.0).collect();
    ids.sort_unstable();
    ensure(ids == (0..N).collect::<Vec<_>>(), || {
        format!("completed ids {ids:?}")
    })?;
    let ast = s.group.async_stats();
    ensure(ast.mt_queued == N as u64, || {
        format!("mt_queued {}", ast.mt_queued)
    })?;
    Ok(Outcome::pass_with(format!(
        "{N} requests from a thread, each completed once"
    )))
}
