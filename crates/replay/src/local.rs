//! A single-threaded driver of the decode job without the batch engine.
//!
//! It applies the same rules as the decode group (FCFS admission by charge
//! under the KV capacity and `max_active` — here the KV ledger's own
//! [`KvLedger::fits`] / [`KvLedger::admit`] —, one packed plan per iteration,
//! members DONE at their output length, cancellation taking effect at the
//! next iteration boundary) in a plain loop that waits on each
//! [`Completion`](xtc_model::Completion) in the calling thread
//! ([`wait_here`](xtc_model::Completion::wait_here)) and blocks in
//! [`Model::finish`] instead of polling the fence. The tests use it as a
//! second, independent driver: both must produce the same tokens as the
//! reference.

use std::collections::VecDeque;
use std::time::Instant;

use crate::job::{
    Finished, IterRecord, JobError, JobOpts, Mode, Progress, RunOutput, Status, Workload,
    check_opts,
};
use xtc_kvbatch::kv::KvLedger;
use xtc_kvbatch::reject::rejection;
use xtc_kvbatch::seq::{self, DecodeSeq, Outcome, RequestSpec};
use xtc_model::Model;

struct State<'w> {
    opts: JobOpts,
    kv: KvLedger,
    start: Instant,
    arrivals: VecDeque<&'w RequestSpec>,
    queue: VecDeque<DecodeSeq>,
    active: Vec<DecodeSeq>,
    out: RunOutput,
}

/// Runs `wl` on `model` in the calling thread (see the module doc).
///
/// # Errors
/// [`JobError`] from the model or the bookkeeping.
pub fn run(
    model: &mut dyn Model,
    wl: &Workload,
    opts: &JobOpts,
    progress: &mut dyn FnMut(&Progress),
) -> Result<RunOutput, JobError> {
    check_opts(opts)?;
    let start = Instant::now();
    let mut st = State {
        opts: *opts,
        kv: KvLedger::new(opts.kv_blocks, opts.block_size)?,
        start,
        arrivals: wl.requests.iter().collect(),
        queue: VecDeque::new(),
        active: Vec::new(),
        out: RunOutput::new(opts.mode, model.describe(), opts.kv_blocks, start),
    };
    let seq_len = model.config().seq_len;
    let total = wl.requests.len();
    loop {
        st.arrive(seq_len);
        st.cancel()?;
        st.admit()?;
        if st.active.is_empty() {
            match st.next_event() {
                Some(at) => sleep_until(at),
                None => break,
            }
            continue;
        }
        st.iterate(model)?;
        progress(&st.progress(total));
    }
    st.out.wall = start.elapsed();
    st.out.kv_peak = st.kv.peak_used();
    st.out.kv_leaked = st.kv.used();
    Ok(st.out)
}

fn sleep_until(at: Instant) {
    std::thread::sleep(at.saturating_duration_since(Instant::now()));
}

impl State<'_> {
    fn arrive(&mut self, seq_len: usize) {
        let now = Instant::now();
        while let Some(spec) = self.arrivals.front().copied() {
            let at = self.start + spec.arrival;
            if at > now {
                break;
            }
            self.arrivals.pop_front();
            match rejection(spec, &self.kv, seq_len) {
                Some(r) => self.out.rejected.push(r),
                None => {
                    let kv = self.kv.account(spec.prompt.len(), spec.output_tokens);
                    let s = DecodeSeq::new(spec, kv, self.opts.stop_token, at);
                    self.queue.push_back(s);
                }
            }
        }
    }

    fn cancel(&mut self) -> Result<(), JobError> {
        let now = Instant::now();
        let mut i = 0;
        while i < self.active.len() {
            if seq::cancel_due(&self.active[i]) {
                let s = self.active.swap_remove(i);
                self.finish(s, Status::Cancelled, now)?;
            } else {
                i += 1;
            }
        }
        let (gone, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(seq::cancel_due);
        self.queue = keep.into();
        for mut s in gone {
            self.kv.free(&mut s.kv)?; // never admitted: closes the account
            self.out.finished.push(Finished {
                seq: s,
                status: Status::Cancelled,
            });
        }
        Ok(())
    }

    fn admit(&mut self) -> Result<(), JobError> {
        let max = self.opts.effective_max_active();
        if self.opts.mode == Mode::Static && !self.active.is_empty() {
            return Ok(());
        }
        while self.active.len() < max {
            let Some(s) = self.queue.front() else { break };
            if !self.kv.fits(&s.kv) {
                break;
            }
            let mut s = self.queue.pop_front().expect("front exists");
            self.kv.admit(&mut s.kv)?;
            self.active.push(s);
        }
        Ok(())
    }

    fn next_event(&self) -> Option<Instant> {
        self.arrivals.front().map(|s| self.start + s.arrival)
    }

    fn iterate(&mut self, model: &mut dyn Model) -> Result<(), JobError> {
        let t0 = Instant::now();
        let mut members: Vec<&mut DecodeSeq> = self.active.iter_mut().collect();
        let plan = seq::pack(&mut members, self.opts.token_budget, &mut self.kv, t0)?;
        let (prefill_tokens, decode_tokens) = seq::scheduled_rows(&members);
        // `finish` blocks until the device is done: no need to poll the fence here.
        model.launch(&plan)?.wait_here();
        let tokens = model.finish()?;
        let t1 = Instant::now();
        let outcomes = seq::apply(&mut members, &tokens, t1)?;
        self.out.iterations.push(IterRecord {
            start: t0 - self.start,
            dur: t1 - t0,
            ready: members.len(),
            scheduled: plan.seqs.len(),
            prefill_tokens,
            decode_tokens,
            kv_used: self.kv.used(),
        });
        let active = std::mem::take(&mut self.active);
        for (s, o) in active.into_iter().zip(outcomes) {
            match o {
                Outcome::Done => self.finish(s, Status::Done, t1)?,
                Outcome::Continue => self.active.push(s),
            }
        }
        Ok(())
    }

    fn finish(&mut self, mut s: DecodeSeq, status: Status, now: Instant) -> Result<(), JobError> {
        self.kv.free(&mut s.kv)?;
        s.timing.finished = Some(now);
        self.out.finished.push(Finished { seq: s, status });
        Ok(())
    }

    fn progress(&self, total: usize) -> Progress {
        Progress {
            done: self.out.finished.len() + self.out.rejected.len(),
            total,
            active: self.active.len(),
            generated: self
                .out
                .finished
                .iter()
                .map(|f| f.seq.generated.len())
                .sum::<usize>()
                + self.active.iter().map(|s| s.generated.len()).sum::<usize>(),
            elapsed: self.start.elapsed(),
        }
    }
}
