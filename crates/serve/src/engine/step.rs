//! The engine thread's side: `engine_main` (the xtc loop that owns the
//! async batch group, the model and the KV ledger), the step that packs one
//! plan per iteration and collects tokens, and `complete` (KV blocks back,
//! the reply future set). Only this thread touches the group.

use super::*;

pub(super) fn engine_main(
    opts: EngineOpts,
    tok: Arc<Bpe>,
    metrics: Arc<ServeMetrics>,
    build: impl FnOnce() -> Result<Backend, BackendError>,
    ready: std::sync::mpsc::Sender<Result<Ready, EngineError>>,
) -> Result<usize, EngineError> {
    let setup = (|| -> Result<_, EngineError> {
        let backend = build()?;
        let lp = rt::Loop::new()?;
        let kv = KvLedger::new(opts.kv_blocks, opts.block_size)?;
        let calc = KvLedger::new(opts.kv_blocks, opts.block_size)?;
        Ok((backend, lp, kv, calc))
    })();
    let (backend, lp, kv, calc) = match setup {
        Ok(s) => s,
        Err(e) => {
            let msg = e.to_string();
            let _ = ready.send(Err(e));
            return Err(EngineError::Thread(msg));
        }
    };
    let describe = backend.describe();
    let decode_metrics = Rc::new(DecodeMetrics::new(opts.context));
    let gauges = Arc::new(Gauges::default());
    let sh = Rc::new(RefCell::new(EngineState {
        kv,
        backend,
        tok: tok.clone(),
        in_flight: None,
        metrics: metrics.clone(),
        decode: decode_metrics.clone(),
        gauges: gauges.clone(),
        group: None,
    }));
    let step = ServeStep {
        sh: sh.clone(),
        budget: opts.token_budget,
    };
    let sh_c = sh.clone();
    let gopts = AsyncOpts {
        capacity: opts.max_active,
        max_active: opts.max_active,
        resource_capacity: opts.kv_blocks as u64,
        exec_timeout: None,
        sched_class: None,
        mt_queue_cap: opts.max_queued.max(1),
    };
    let made = Group::create_async(&lp, gopts, step, move |h: Handle, job: Job, o| {
        complete(&sh_c, h, job, o)
    })
    .and_then(|g| g.remote().map(|r| (g, r)));
    let (group, remote) = match made {
        Ok(x) => x,
        Err(e) => {
            let _ = ready.send(Err(e.into()));
            return Err(EngineError::Batch(e));
        }
    };
    sh.borrow_mut().group = Some(group.clone());
    let (ctl_tx, ctl_rx) = rt::mailbox::<CloseMode>();
    let g = group.clone();
    let spawned = lp.spawn(async move {
        while let Ok(mode) = ctl_rx.recv().await {
            let _ = g.close(mode);
        }
        let _ = g.close(CloseMode::Drain); // every handle gone: stop anyway
    });
    if let Err(e) = spawned {
        let _ = ready.send(Err(e.into()));
        return Err(EngineError::Batch(e));
    }
    let handle = EngineHandle {
        remote,
        calc,
        opts,
        eos: tok.eos(),
        metrics,
        gauges,
        describe,
        registry: decode_metrics.registry(),
        ids: AtomicUsize::new(0),
    };
    let _ = ready.send(Ok((handle, ctl_tx)));
    let ran = lp.run();
    let leaked = {
        let mut s = sh.borrow_mut();
        s.sample();
        s.group = None;
        s.kv.used()
    };
    ran?;
    group.destroy()?;
    Ok(leaked)
}

/// The iteration in flight.
struct LaunchedStep {
    launched: bool,
    /// Prompt rows and decode rows of its plan.
    prefill: usize,
    decode: usize,
}

/// State of the engine loop (one thread: `RefCell`, never held across an
/// `.await`).
struct EngineState {
    kv: KvLedger,
    backend: Backend,
    tok: Arc<Bpe>,
    in_flight: Option<LaunchedStep>,
    metrics: Arc<ServeMetrics>,
    decode: Rc<DecodeMetrics>,
    gauges: Arc<Gauges>,
    group: Option<Group<Job>>,
}

impl EngineState {
    fn sample(&self) {
        self.gauges.kv_used.store(self.kv.used(), Ordering::SeqCst);
        self.gauges
            .kv_reserved
            .store(self.kv.reserved() as usize, Ordering::SeqCst);
        self.metrics.kv_blocks_used.set(self.kv.used() as i64);
        let Some(g) = &self.group else { return };
        let (st, a) = (g.stats(), g.async_stats());
        self.decode.record_group(&st, &a);
        let outstanding = self.gauges.outstanding.load(Ordering::SeqCst);
        let running = (st.ready + st.blocked) as usize;
        self.gauges.running.store(running, Ordering::SeqCst);
        self.decode.record_state(
            running,
            outstanding.saturating_sub(running),
            self.kv.used(),
            self.kv.capacity(),
        );
    }
}

struct ServeStep {
    sh: Rc<RefCell<EngineState>>,
    budget: usize,
}

impl AsyncStep<Job> for ServeStep {
    async fn submit(&mut self, items: &mut [Item<'_, Job>]) -> xtc::Result<Exec> {
        let now = Instant::now();
        let mut sh = self.sh.borrow_mut();
        let sh = &mut *sh;
        for it in items.iter_mut() {
            if it.request.seq.kv.is_pending() {
                if let Err(e) = sh.kv.admit(&mut it.request.seq.kv) {
                    sh.metrics.engine_errors.inc();
                    eprintln!("xtc serve: KV ledger: {e}");
                    return Err(Error::Internal);
                }
                let queue = now.saturating_duration_since(it.request.seq.timing.arrived);
                sh.metrics.queue_seconds.observe(queue.as_secs_f64());
            }
        }
        let mut seqs: Vec<&mut Sequence> = items.iter_mut().map(|i| &mut i.request.seq).collect();
        let plan = match seq::pack(&mut seqs, self.budget, &mut sh.kv, now) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("xtc serve: KV ledger: {e}");
                return Err(Error::Internal);
            }
        };
        let (prefill, decode) = seq::scheduled_rows(&seqs);
        let mut want_logits = false;
        for it in items.iter_mut() {
            let j = &mut *it.request;
            j.logits_row = j.seq.scheduled.is_some_and(|w| w.sample) && j.needs_logits();
            want_logits |= j.logits_row;
        }
        let launched = !plan.seqs.is_empty();
        sh.in_flight = Some(LaunchedStep {
            launched,
            prefill,
            decode,
        });
        if !launched {
            return Ok(Exec::Inline);
        }
        match sh.backend.launch(&plan, want_logits) {
            Ok(exec) => Ok(exec),
            Err(e) => {
                sh.in_flight = None;
                sh.metrics.engine_errors.inc();
                eprintln!("xtc serve: {e}");
                Err(Error::Internal)
            }
        }
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, Job>],
        results: &mut [StepResult],
        status: ExecStatus,
    ) -> xtc::Result<()> {
        let mut sh = self.sh.borrow_mut();
        let sh = &mut *sh;
        let fl = sh.in_flight.take();
        let launched = fl.as_ref().is_some_and(|f| f.launched);
        let rows = if launched {
            sh.backend.finish()
        } else {
            Ok(Rows::default())
        };
        let now = Instant::now();
        let mut generated = 0;
        let failed = match (status, rows) {
            (ExecStatus::Ok, Ok(rows)) => match apply_rows(sh, items, results, rows, now) {
                Ok(n) => {
                    generated = n;
                    None
                }
                Err(e) => Some(e),
            },
            (ExecStatus::Ok, Err(e)) => {
                eprintln!("xtc serve: {e}");
                sh.metrics.engine_errors.inc();
                Some(Error::Internal)
            }
            (ExecStatus::Failed(e), _) => Some(e),
            (ExecStatus::Timeout, _) => Some(Error::Again),
            (ExecStatus::Aborted, _) => Some(Error::Aborted),
        };
        if let Some(e) = failed {
            results.iter_mut().for_each(|r| *r = StepResult::Error(e));
        }
        if let Some(f) = fl {
            sh.decode.record_iteration(f.prefill, f.decode, generated);
        }
        sh.sample();
        Ok(())
    }
}

/// Samples, detokenizes and sends each member's new token; sets results;
/// returns the tokens generated.
fn apply_rows(
    sh: &mut EngineState,
    items: &mut [Item<'_, Job>],
    results: &mut [StepResult],
    rows: Rows,
    now: Instant,
) -> Result<usize, Error> {
    let mut tokens = rows.tokens;
    let mut logits = rows.logits;
    let mut k = 0;
    for it in items.iter_mut() {
        let j = &mut *it.request;
        if !j.seq.scheduled.is_some_and(|w| w.sample) {
            continue;
        }
        if j.logits_row {
            let Some(l) = logits.as_mut().and_then(|l| l.get_mut(k)) else {
                eprintln!("xtc serve: the model returned no logits for a sampled row");
                return Err(Error::Internal);
            };
            if let Some(eos) = j.eos
                && j.seq.generated.len() < j.min_tokens
                && let Some(x) = l.get_mut(eos as usize)
            {
                *x = f32::NEG_INFINITY;
            }
            if let Some(t) = tokens.get_mut(k) {
                *t = match &mut j.sampler {
                    Some(s) => s.sample(l),
                    None => argmax(l),
                };
            }
        }
        k += 1;
    }
    let before: Vec<usize> = items
        .iter()
        .map(|i| i.request.seq.generated.len())
        .collect();
    let outcomes = {
        let mut seqs: Vec<&mut Sequence> = items.iter_mut().map(|i| &mut i.request.seq).collect();
        match seq::apply(&mut seqs, &tokens, now) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("xtc serve: {e}");
                return Err(Error::Internal);
            }
        }
    };
    let mut generated = 0;
    for ((it, r), (o, b)) in items
        .iter_mut()
        .zip(results.iter_mut())
        .zip(outcomes.iter().zip(before))
    {
        let j = &mut *it.request;
        let mut done = *o == SeqOutcome::Done;
        let mut delta = Delta {
            text: String::new(),
            tokens: Vec::new(),
        };
        if j.seq.generated.len() > b {
            generated += 1;
            let t = *j.seq.generated.last().expect("one new token");
            let timing = &j.seq.timing;
            if b == 0 {
                if let Some(f) = timing.first_token {
                    sh.decode
                        .record_first_token(f.saturating_duration_since(timing.arrived));
                }
            } else if let Some(&gap) = timing.token_gaps.last() {
                sh.decode.record_token_gap(gap);
            }
            delta.tokens.push(t);
            // Stop strings end an answer only from `min_tokens` tokens on
            // (vLLM's rule; the end-of-sequence token is masked before).
            let piece = if j.seq.generated.len() >= j.min_tokens {
                j.detok.push(&sh.tok, t)
            } else {
                j.detok.push_unchecked(&sh.tok, t)
            };
            delta.text = piece.text;
            if piece.stopped.is_some() {
                j.stop = piece.stopped;
                j.finish = Some(FinishReason::Stop);
                done = true;
            } else if done {
                let eos_hit = j.eos.is_some() && j.eos == Some(t);
                j.finish = Some(if eos_hit {
                    FinishReason::Stop
                } else {
                    FinishReason::Length
                });
                delta.text.push_str(&j.detok.finish());
            }
        }
        let gone = j.tx.is_closed()
            || (!(delta.text.is_empty() && delta.tokens.is_empty())
                && match j.tx.try_send(delta) {
                    Ok(()) => false,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        // The client stopped reading: every buffer on the
                        // way to it is full (see the module doc).
                        j.stalled.store(true, Ordering::SeqCst);
                        sh.metrics.stalled.inc();
                        true
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => true,
                });
        *r = if gone {
            j.gone = true;
            StepResult::Error(Error::Aborted)
        } else if done {
            StepResult::Done
        } else {
            StepResult::Continue
        };
    }
    Ok(generated)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `complete`: frees the member's KV blocks, counts it, resolves its reply
/// future; dropping the job closes its channel.
fn complete(sh: &Rc<RefCell<EngineState>>, _h: Handle, mut job: Job, outcome: xtc::Result<()>) {
    let mut sh = sh.borrow_mut();
    let admitted = !job.seq.kv.is_pending();
    let phase = if !admitted {
        Phase::Queued
    } else if job.seq.is_prefill() {
        Phase::Prefill
    } else {
        Phase::Decode
    };
    if let Err(e) = sh.kv.free(&mut job.seq.kv) {
        eprintln!("xtc serve: KV ledger: {e}");
        sh.metrics.engine_errors.inc();
    }
    job.seq.timing.finished = Some(Instant::now());
    let s = &job.seq;
    let value = match outcome {
        Ok(()) => {
            let t = &s.timing;
            let l = RequestLatency::of(t, s.generated.len());
            let inference = t
                .admitted
                .zip(t.last_token)
                .map(|(a, last)| last.saturating_duration_since(a));
            let finish = job.finish.unwrap_or(FinishReason::Length);
            sh.decode.record_completed(&Completed {
                queue: l.queue,
                inference,
                e2e: l.e2e,
                tpot: l.tpot,
                prompt_tokens: s.prompt.len(),
                generated: s.generated.len(),
                stopped: finish == FinishReason::Stop,
            });
            let since =
                |x: Option<Instant>| x.map_or(0.0, |x| ms(x.saturating_duration_since(t.arrived)));
            let ttft = since(t.first_token);
            let last = since(t.last_token);
            let n = s.generated.len();
            Ok(Outcome {
                finish_reason: finish,
                stop: job.stop.take(),
                prompt_tokens: s.prompt.len(),
                completion_tokens: n,
                timings: Timings {
                    queue_ms: since(t.admitted),
                    ttft_ms: ttft,
                    decode_ms: last - ttft,
                    e2e_ms: last,
                    tpot_ms: if n > 1 {
                        (last - ttft) / (n - 1) as f64
                    } else {
                        0.0
                    },
                },
            })
        }
        Err(Error::Aborted) => {
            sh.decode.record_cancelled();
            sh.metrics.cancelled.get_or_create(&phase.label()).inc();
            Err(Error::Aborted)
        }
        Err(e) => {
            sh.decode.record_failed();
            Err(e)
        }
    };
    if let Some(f) = job.seq.timing.finished {
        let e2e = f
            .saturating_duration_since(job.seq.timing.arrived)
            .as_micros() as usize;
        let old = sh.gauges.mean_e2e_us.load(Ordering::Relaxed);
        let new = if old == 0 { e2e } else { (old * 7 + e2e) / 8 };
        sh.gauges.mean_e2e_us.store(new, Ordering::Relaxed);
    }
    // The gauges first, then the reply: a client that reads /metrics after
    // its reply sees its request gone (its KV blocks back, not outstanding).
    sh.gauges.outstanding.fetch_sub(1, Ordering::SeqCst);
    sh.sample();
    if let Some(p) = job.done.take() {
        p.set(value);
    }
}
