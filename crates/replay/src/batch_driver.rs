//! The decode job on one async batch group (the `xtc decode` driver).
//!
//! One [`rt::Loop`] per run holds:
//! - the group (`Group::create_async`), whose request value is a
//!   [`DecodeSeq`] and whose resource is the KV cache: `resource_capacity` =
//!   KV blocks, a request's charge = the blocks it may need, so FCFS
//!   admission never over-commits the cache (B-036..B-040);
//! - `DecodeStep`: `submit` records the charges of newly admitted members in
//!   the KV ledger, packs the frozen ready vector into ONE plan and launches
//!   it on the model; the model's [`Completion`] becomes the engine's [`Exec`]
//!   here and nowhere else (`exec_for`): a fence → `Exec::Fence` (the
//!   completion's fd is kept open until `collect` returns, B-066, B-067), host
//!   work → `Exec::Blocking` on the blocking pool, ready → `Exec::Inline`;
//!   `collect` reads the sampled tokens and ends each member DONE at its
//!   output length, else CONTINUE (B-058..B-105);
//! - `complete`: frees the member's KV account through the ledger (DONE, or
//!   `XTC_E_ABORTED` after a cancel: consumed at the next boundary, so within
//!   one iteration; a member cancelled before admission frees nothing);
//! - the arrival process, which submits each request at its trace time (or,
//!   for static batching, a whole batch once the previous one finished) and
//!   then closes the group with DRAIN;
//! - the canceller, which calls `Group::cancel` for members whose client
//!   stopped reading (`--cancel-rate`): mutators are refused with
//!   `XTC_E_DEADLK` inside `collect`, so `collect` mails the handle instead.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::time::Instant;

use crate::job::{
    Finished, IterRecord, JobError, JobOpts, Mode, Progress, RunOutput, SharedModel, Status,
    Workload, check_opts,
};
use xtc::Error;
use xtc::batch::{
    AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Handle, Item, StepResult,
};
use xtc::rt;
use xtc_kvbatch::kv::{KvError, KvLedger};
use xtc_kvbatch::latency::RequestLatency;
use xtc_kvbatch::metrics::{Completed, DecodeMetrics};
use xtc_kvbatch::reject::{RejectReason, Rejected, rejection};
use xtc_kvbatch::seq::{self, DecodeSeq, Outcome, RequestSpec};
use xtc_model::Completion;

/// The iteration in flight (between submit and collect).
struct LaunchedIteration {
    t0: Instant,
    ready: usize,
    scheduled: usize,
    prefill: usize,
    decode: usize,
    launched: bool,
    /// The completion's fence, open until `collect` returns (B-067).
    fence: Option<Rc<dyn AsFd>>,
}

/// The ONE place a model's [`Completion`] becomes the engine's [`Exec`]. A
/// fence goes to the engine as a clone of the completion's shared fd (the
/// engine drops it after `collect` returns), while `keep` holds the job's own
/// clone until then (B-066, B-067); a host job runs on the blocking pool and
/// leaves its own failure to `finish`.
fn exec_for(c: Completion, keep: &mut Option<Rc<dyn AsFd>>) -> Exec {
    match c {
        Completion::Ready => Exec::Inline,
        Completion::Fence(fd) => {
            *keep = Some(fd.clone());
            Exec::Fence(fd)
        }
        Completion::Host(job) => Exec::Blocking(Box::new(move || {
            job();
            Ok(()) // the model's own error, if any, comes out of finish()
        })),
    }
}

/// State shared by the step, `complete` and the processes (one loop: plain
/// `RefCell`, never borrowed across an `.await`).
struct JobState {
    kv: KvLedger,
    out: RunOutput,
    start: Instant,
    total: usize,
    accounted: usize,
    generated: usize,
    active: usize,
    in_flight: Option<LaunchedIteration>,
    progress: Box<dyn FnMut(&Progress)>,
    error: Option<JobError>,
    cancel_tx: Option<rt::Sender<Handle>>,
    outstanding: usize,
    batch_done: Option<rt::Promise<()>>,
    /// Metrics to update as the run goes (`None`: none kept).
    metrics: Option<Rc<DecodeMetrics>>,
    /// The group, for its statistics (taken out when the loop returns, which
    /// breaks the group -> step -> shared -> group cycle).
    group: Option<Group<DecodeSeq>>,
    /// The workload's arrival times, ascending (for the waiting requests
    /// the static arrival process holds before it submits them).
    arrivals: Vec<std::time::Duration>,
    /// Requests submitted to the group so far.
    submitted: usize,
}

impl JobState {
    /// Records the first failure; returns the code the engine gets.
    fn fail(&mut self, e: JobError) -> Error {
        let code = e.engine_code();
        self.error.get_or_insert(e);
        code
    }

    fn account(&mut self, n: usize) {
        self.accounted += n;
        if self.accounted >= self.total {
            self.cancel_tx = None; // ends the canceller
        }
    }

    /// Samples the batch group's statistics and the serving gauges into the
    /// metrics, if any are kept.
    fn sample(&self) {
        let (Some(m), Some(g)) = (&self.metrics, &self.group) else {
            return;
        };
        let (st, a) = (g.stats(), g.async_stats());
        m.record_group(&st, &a);
        // Arrived but not yet submitted (static batching holds them) or in
        // the group's queue.
        let now = self.start.elapsed();
        let arrived = self.arrivals.partition_point(|&a| a <= now);
        let held = arrived.saturating_sub(self.submitted + self.out.rejected.len());
        m.record_state(
            (st.ready + st.blocked) as usize,
            st.queued as usize + held,
            self.kv.used(),
            self.kv.capacity(),
        );
    }

    fn progress(&mut self) {
        let p = Progress {
            done: self.accounted,
            total: self.total,
            active: self.active,
            generated: self.generated,
            elapsed: self.start.elapsed(),
        };
        (self.progress)(&p);
    }
}

/// The group's async step: one packed plan per iteration.
struct DecodeStep {
    model: SharedModel,
    sh: Rc<RefCell<JobState>>,
    budget: usize,
}

fn members<'a>(items: &'a mut [Item<'_, DecodeSeq>]) -> Vec<&'a mut DecodeSeq> {
    items.iter_mut().map(|i| &mut *i.request).collect()
}

impl AsyncStep<DecodeSeq> for DecodeStep {
    async fn submit(&mut self, items: &mut [Item<'_, DecodeSeq>]) -> xtc::Result<Exec> {
        let t0 = Instant::now();
        let mut ms = members(items);
        let mut sh = self.sh.borrow_mut();
        let plan = match admit_new(&mut ms, &mut sh.kv)
            .and_then(|()| seq::pack(&mut ms, self.budget, &mut sh.kv, t0))
        {
            Ok(p) => p,
            Err(e) => return Err(sh.fail(e.into())),
        };
        let (prefill, decode) = seq::scheduled_rows(&ms);
        let launched = !plan.seqs.is_empty();
        sh.active = ms.len();
        sh.in_flight = Some(LaunchedIteration {
            t0,
            ready: ms.len(),
            scheduled: plan.seqs.len(),
            prefill,
            decode,
            launched,
            fence: None,
        });
        if !launched {
            return Ok(Exec::Inline);
        }
        match self.model.borrow_mut().launch(&plan) {
            Ok(c) => {
                let fl = sh.in_flight.as_mut().expect("set above");
                Ok(exec_for(c, &mut fl.fence))
            }
            Err(e) => {
                sh.in_flight = None;
                Err(sh.fail(e.into()))
            }
        }
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, DecodeSeq>],
        results: &mut [StepResult],
        status: ExecStatus,
    ) -> xtc::Result<()> {
        let fl = self.sh.borrow_mut().in_flight.take();
        let launched = fl.as_ref().is_some_and(|f| f.launched);
        // finish() also waits when the fence did not fire (timeout, abort):
        // the device may still be running and owns the plan's buffers.
        let tokens = if launched {
            self.model.borrow_mut().finish()
        } else {
            Ok(Vec::new())
        };
        let t1 = Instant::now();
        let mut sh = self.sh.borrow_mut();
        let handles: Vec<Handle> = items.iter().map(|i| i.handle).collect();
        let mut ms = members(items);
        let before: Vec<usize> = ms.iter().map(|s| s.generated.len()).collect();
        let failed = match (status, tokens) {
            (ExecStatus::Ok, Ok(t)) => match seq::apply(&mut ms, &t, t1) {
                Ok(outcomes) => {
                    set_results(results, &outcomes);
                    sh.generated += t.len();
                    if let Some(m) = &sh.metrics {
                        observe_tokens(m, &ms, &before);
                    }
                    None
                }
                Err(e) => Some(sh.fail(e.into())),
            },
            (ExecStatus::Ok, Err(e)) => Some(sh.fail(e.into())),
            (ExecStatus::Failed(e), _) => Some(e),
            (ExecStatus::Timeout, _) => Some(Error::Again),
            (ExecStatus::Aborted, _) => Some(Error::Aborted),
        };
        if let Some(e) = failed {
            results.iter_mut().for_each(|r| *r = StepResult::Error(e));
        }
        for (s, h) in ms.iter_mut().zip(handles) {
            if failed.is_none() && seq::cancel_due(s) {
                s.cancel_after = None; // asked once
                if let Some(tx) = &sh.cancel_tx {
                    let _ = tx.send(h);
                }
            }
        }
        if let Some(f) = fl {
            let (kv_used, start) = (sh.kv.used(), f.t0 - sh.start);
            sh.out.iterations.push(IterRecord {
                start,
                dur: t1 - f.t0,
                ready: f.ready,
                scheduled: f.scheduled,
                prefill_tokens: f.prefill,
                decode_tokens: f.decode,
                kv_used,
            });
            if let Some(m) = &sh.metrics {
                let generated = ms
                    .iter()
                    .zip(&before)
                    .map(|(s, b)| s.generated.len() - b)
                    .sum();
                m.record_iteration(f.prefill, f.decode, generated);
            }
        }
        sh.sample();
        sh.progress();
        Ok(())
    }
}

/// Observes each new first token (TTFT) and token gap of `members`, which
/// had `before[i]` tokens before this iteration.
fn observe_tokens(m: &DecodeMetrics, members: &[&mut DecodeSeq], before: &[usize]) {
    for (s, &b) in members.iter().zip(before) {
        if s.generated.len() <= b {
            continue;
        }
        let t = &s.timing;
        if b == 0 {
            if let Some(f) = t.first_token {
                m.record_first_token(f.saturating_duration_since(t.arrived));
            }
        } else if let Some(&gap) = t.token_gaps.last() {
            m.record_token_gap(gap);
        }
    }
}

/// Records in the ledger the charges of the members the group admitted since
/// the last iteration (the group reserved them under the same capacity).
fn admit_new(members: &mut [&mut DecodeSeq], kv: &mut KvLedger) -> Result<(), KvError> {
    members
        .iter_mut()
        .filter(|s| s.kv.is_pending())
        .try_for_each(|s| kv.admit(&mut s.kv))
}

fn set_results(results: &mut [StepResult], outcomes: &[Outcome]) {
    for (r, o) in results.iter_mut().zip(outcomes) {
        *r = match o {
            Outcome::Done => StepResult::Done,
            Outcome::Continue => StepResult::Continue,
        };
    }
}

/// `complete`: frees the member's KV account and records how it ended.
fn complete(sh: &Rc<RefCell<JobState>>, mut s: DecodeSeq, outcome: xtc::Result<()>) {
    let mut sh = sh.borrow_mut();
    if let Err(e) = sh.kv.free(&mut s.kv) {
        sh.fail(e.into());
    }
    s.timing.finished = Some(Instant::now());
    let status = match outcome {
        Ok(()) => Status::Done,
        Err(Error::Aborted) => Status::Cancelled,
        Err(e) => Status::Failed(e.to_string()),
    };
    if let Some(m) = &sh.metrics {
        record_completion(m, &s, &status);
    }
    sh.out.finished.push(Finished { seq: s, status });
    sh.outstanding = sh.outstanding.saturating_sub(1);
    if sh.outstanding == 0
        && let Some(p) = sh.batch_done.take()
    {
        p.set(Ok(()));
    }
    sh.account(1);
}

/// A completed, cancelled or failed member, into the metrics.
fn record_completion(m: &DecodeMetrics, s: &DecodeSeq, status: &Status) {
    match status {
        Status::Done => {
            let t = &s.timing;
            let l = RequestLatency::of(t, s.generated.len());
            let inference = t
                .admitted
                .zip(t.last_token)
                .map(|(a, last)| last.saturating_duration_since(a));
            let stopped = s.stop_token.is_some() && s.generated.last() == s.stop_token.as_ref();
            m.record_completed(&Completed {
                queue: l.queue,
                inference,
                e2e: l.e2e,
                tpot: l.tpot,
                prompt_tokens: s.prompt.len(),
                generated: s.generated.len(),
                stopped,
            });
        }
        Status::Cancelled => m.record_cancelled(),
        Status::Failed(_) => m.record_failed(),
    }
}

/// Runs `wl` on `model` under `opts` with one async batch group on a fresh
/// loop (the `xtc decode` driver, also `serve::run`), calling `progress`
/// after every iteration, and returns what the run observed.
///
/// # Example: the decode job on the toy model
///
/// Twelve requests of the embedded Azure trace, lengths scaled down, all
/// arriving at once, continuously batched under a KV cache of 64 blocks;
/// every request generates what it asked for, as decoding it alone would,
/// and the report gives the figures:
///
/// ```
/// use xtc_model::adapters::{ToyModel, toy_reference};
/// use xtc_replay::job::{self, JobOpts, Mode, Status};
/// use xtc_replay::report::Report;
/// use xtc_replay::trace::{self, Scaling};
///
/// let scaling = Scaling {
///     time_scale: 1e9, // every arrival at once
///     prompt_div: 32,
///     output_div: 8,
///     max_prompt: 32,
///     max_output: 32,
/// };
/// let wl = job::workload(&trace::embedded(), 12, &scaling, 100, 1, 0.0);
/// let opts = JobOpts {
///     mode: Mode::Continuous,
///     max_active: 8,
///     kv_blocks: 64,
///     block_size: 4,
///     token_budget: 16,
///     stop_token: None,
/// };
/// let model = job::shared(ToyModel::new(100, opts.kv_blocks, opts.block_size));
/// let out = xtc_replay::run(&model, &wl, &opts, Box::new(|_| {})).unwrap();
/// assert_eq!(out.finished.len(), 12);
/// for f in &out.finished {
///     assert_eq!(f.status, Status::Done);
///     let spec = wl.requests.iter().find(|r| r.id == f.seq.id).unwrap();
///     assert_eq!(f.seq.generated, toy_reference(&spec.prompt, spec.output_tokens, 100));
/// }
/// assert_eq!(out.kv_leaked, 0, "every block came back");
/// let report = Report::from_run(&out, wl.requests.len());
/// assert_eq!(report.requests.completed, 12);
/// assert!(report.iterations.max_ready_members <= 8);
/// assert!(report.latency.ttft.p50_ms <= report.latency.ttft.p99_ms);
/// ```
///
/// # Errors
/// [`JobError`]: bad options, the loop or group refusing, a model failure,
/// a KV ledger refusal (a bug).
pub fn run(
    model: &SharedModel,
    wl: &Workload,
    opts: &JobOpts,
    progress: Box<dyn FnMut(&Progress)>,
) -> Result<RunOutput, JobError> {
    run_with_metrics(model, wl, opts, progress, None)
}

/// [`run`], updating `metrics` as the run goes: after every iteration and
/// every submit (the group's statistics, running and waiting requests, KV
/// use, tokens per iteration, first tokens and token gaps), at every
/// completion and rejection, and once more after the last completion.
///
/// # Errors
/// As [`run`].
pub fn run_with_metrics(
    model: &SharedModel,
    wl: &Workload,
    opts: &JobOpts,
    progress: Box<dyn FnMut(&Progress)>,
    metrics: Option<Rc<DecodeMetrics>>,
) -> Result<RunOutput, JobError> {
    check_opts(opts)?;
    let lp = rt::Loop::new()?;
    let start = Instant::now();
    let rt_start = lp.now();
    let (cancel_tx, cancel_rx) = rt::mailbox::<Handle>();
    let sh = Rc::new(RefCell::new(JobState {
        kv: KvLedger::new(opts.kv_blocks, opts.block_size)?,
        out: RunOutput::new(opts.mode, model.borrow().describe(), opts.kv_blocks, start),
        start,
        total: wl.requests.len(),
        accounted: 0,
        generated: 0,
        active: 0,
        in_flight: None,
        progress,
        error: None,
        cancel_tx: Some(cancel_tx),
        outstanding: 0,
        batch_done: None,
        metrics,
        group: None,
        arrivals: wl.requests.iter().map(|r| r.arrival).collect(),
        submitted: 0,
    }));
    let step = DecodeStep {
        model: model.clone(),
        sh: sh.clone(),
        budget: opts.token_budget,
    };
    let sh_c = sh.clone();
    let max_active = opts.effective_max_active();
    let gopts = AsyncOpts {
        capacity: wl.requests.len().max(max_active),
        max_active,
        resource_capacity: opts.kv_blocks as u64,
        exec_timeout: None,
        sched_class: None,
        mt_queue_cap: 0,
    };
    let group = Group::create_async(
        &lp,
        gopts,
        step,
        move |_h: Handle, s: DecodeSeq, o: xtc::Result<()>| complete(&sh_c, s, o),
    )?;
    sh.borrow_mut().group = Some(group.clone());
    let arrivals = Arrivals {
        group: group.clone(),
        sh: sh.clone(),
        specs: wl.requests.clone(),
        opts: *opts,
        seq_len: model.borrow().config().seq_len,
        start,
        rt_start,
    };
    lp.spawn(arrivals.run())?;
    let g = group.clone();
    lp.spawn(async move {
        while let Ok(h) = cancel_rx.recv().await {
            let _ = g.cancel(h); // Inval when it already ended: nothing to do
        }
    })?;
    let ran = lp.run();
    {
        let mut sh = sh.borrow_mut();
        sh.sample(); // the final figures, after the last completion
        sh.group = None;
    }
    ran?;
    group.destroy()?;
    drop(group);
    finish(sh, start)
}

fn finish(sh: Rc<RefCell<JobState>>, start: Instant) -> Result<RunOutput, JobError> {
    let mut sh = sh.borrow_mut();
    if let Some(e) = sh.error.take() {
        return Err(e);
    }
    let empty = RunOutput::new(sh.out.mode, String::new(), 0, start);
    let mut out = std::mem::replace(&mut sh.out, empty);
    out.wall = start.elapsed();
    out.kv_peak = sh.kv.peak_used();
    out.kv_leaked = sh.kv.used();
    Ok(out)
}

/// The arrival process: replays the workload's arrival times.
struct Arrivals {
    group: Group<DecodeSeq>,
    sh: Rc<RefCell<JobState>>,
    specs: Vec<RequestSpec>,
    opts: JobOpts,
    seq_len: usize,
    start: Instant,
    rt_start: rt::Instant,
}

impl Arrivals {
    async fn run(self) {
        let mut queue: VecDeque<DecodeSeq> = VecDeque::new();
        let mut next = 0;
        loop {
            if self.opts.mode == Mode::Static {
                next = self.pull_due(&mut queue, next);
                if queue.is_empty() {
                    let Some(spec) = self.specs.get(next) else {
                        break;
                    };
                    rt::sleep_until(self.rt_start + spec.arrival).await;
                    continue;
                }
                self.static_batch(&mut queue).await;
            } else {
                let Some(spec) = self.specs.get(next) else {
                    break;
                };
                next += 1;
                rt::sleep_until(self.rt_start + spec.arrival).await;
                if let Some(s) = self.admit(spec) {
                    self.submit(s);
                }
            }
        }
        let _ = self.group.close(CloseMode::Drain);
    }

    /// Queues every request from `next` on whose arrival time has passed;
    /// returns the new `next`.
    fn pull_due(&self, queue: &mut VecDeque<DecodeSeq>, mut next: usize) -> usize {
        let now = Instant::now();
        while let Some(spec) = self.specs.get(next) {
            if self.start + spec.arrival > now {
                break;
            }
            queue.extend(self.admit(spec));
            next += 1;
        }
        next
    }

    /// A request as its member value, or `None` when it can never fit (recorded).
    fn admit(&self, spec: &RequestSpec) -> Option<DecodeSeq> {
        let mut sh = self.sh.borrow_mut();
        if let Some(r) = rejection(spec, &sh.kv, self.seq_len) {
            if let Some(m) = &sh.metrics {
                m.record_rejected(r.kind);
            }
            sh.out.rejected.push(r);
            sh.account(1);
            return None;
        }
        let kv = sh.kv.account(spec.prompt.len(), spec.output_tokens);
        Some(DecodeSeq::new(
            spec,
            kv,
            self.opts.stop_token,
            self.start + spec.arrival,
        ))
    }

    fn submit(&self, s: DecodeSeq) {
        let (charge, cancel_now) = (s.kv.charge(), s.cancel_after == Some(0));
        self.sh.borrow_mut().outstanding += 1;
        match self.group.submit(s, charge) {
            Ok(h) if cancel_now => {
                self.sh.borrow_mut().submitted += 1;
                let _ = self.group.cancel(h);
            }
            Ok(_) => {
                let mut sh = self.sh.borrow_mut();
                sh.submitted += 1;
                sh.sample();
            }
            Err(e) => {
                let mut sh = self.sh.borrow_mut();
                sh.outstanding -= 1;
                if let Some(m) = &sh.metrics {
                    m.record_rejected(RejectReason::Submit);
                }
                let id = e.into_inner().id;
                let reason = format!("request {id} rejected by the group: submit failed");
                sh.out.rejected.push(Rejected {
                    id,
                    kind: RejectReason::Submit,
                    need: 0,
                    limit: 0,
                    reason,
                });
                sh.account(1);
            }
        }
    }

    /// Static batching: submit up to `max_active` queued requests that fit
    /// the cache together, then wait until every one of them completed.
    async fn static_batch(&self, queue: &mut VecDeque<DecodeSeq>) {
        let cap = self.opts.kv_blocks as u64;
        let mut blocks = 0;
        let n = queue
            .iter()
            .take(self.opts.effective_max_active())
            .take_while(|s| {
                blocks += s.kv.charge();
                blocks <= cap
            })
            .count();
        let (done, promise) = rt::future_pair::<()>();
        self.sh.borrow_mut().batch_done = Some(promise);
        queue.drain(..n).for_each(|s| self.submit(s));
        if self.sh.borrow().outstanding > 0 {
            let _ = done.await;
        } else {
            self.sh.borrow_mut().batch_done = None;
        }
    }
}
