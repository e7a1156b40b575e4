//! What an `xtc decode` run is: a trace-replayed workload decoded with
//! KV-cache continuous batching — its options, its workload, what it observed
//! and why it failed. The drivers ([`crate::run`] on a batch group,
//! [`crate::local::run`] without one) import this module, never the reverse.
//!
//! A [`Workload`] is built from a trace ([`workload`]): arrivals, prompt
//! lengths and output lengths of its first rows, scaled for the device, with
//! seeded prompt tokens. A driver replays it against a [`Model`]: an arrival
//! process submits each request at its trace time with a charge of the KV
//! blocks it may need; FCFS admission under the KV cache's capacity and
//! `max_active` forms the ready vector; each iteration packs the ready vector
//! into ONE plan ([`xtc_kvbatch::seq::pack`]) under the token budget, the device
//! runs it, and members leave DONE at their output length (or cancelled).
//!
//! [`Mode`] selects the admission policy compared by `xtc decode --compare`:
//! continuous batching (a member joins as soon as there is room), static
//! batching (a batch is admitted only when the previous one fully finished)
//! and one request at a time.

use std::time::{Duration, Instant};

use crate::trace::{Scaling, Trace};
use xtc_kvbatch::kv::{KvError, KvLedger};
use xtc_kvbatch::reject::Rejected;
use xtc_kvbatch::seq::{DecodeSeq, RequestSpec, TokenCountMismatch};
use xtc_model::{DeviceError, Model};

/// Admission policy of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Continuous batching: members join and leave at every iteration.
    Continuous,
    /// Static batching: the next batch is admitted only when the previous
    /// one fully finished.
    Static,
    /// One request at a time (`max_active` = 1).
    OneAtATime,
}

impl Mode {
    /// The name printed in reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Continuous => "continuous",
            Mode::Static => "static",
            Mode::OneAtATime => "one-at-a-time",
        }
    }
}

/// Knobs of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobOpts {
    /// Admission policy.
    pub mode: Mode,
    /// Members in the ready vector at most (ignored for [`Mode::OneAtATime`]).
    pub max_active: usize,
    /// Blocks in the KV cache (the group's resource capacity).
    pub kv_blocks: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// Token rows per iteration (prefill chunks + decode tokens), >= 1.
    pub token_budget: usize,
    /// A token that ends a sequence early (EOS of a real model).
    pub stop_token: Option<u32>,
}

impl JobOpts {
    /// `max_active` as the policy applies it.
    pub fn effective_max_active(&self) -> usize {
        match self.mode {
            Mode::OneAtATime => 1,
            _ => self.max_active.max(1),
        }
    }
}

/// The requests of a run, sorted by arrival.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Requests in arrival order.
    pub requests: Vec<RequestSpec>,
}

/// Builds a workload from the first `n` rows of `trace` (fewer if the trace
/// is shorter): arrivals and lengths through `scaling`, prompt tokens drawn
/// from `seed` in `3..vocab_size` (ids 0-2 are llama2.c's special tokens when
/// the vocabulary is large enough), and a fraction `cancel_rate` of requests
/// cancelled by their client after a seeded number of generated tokens in
/// `0..output_tokens` (0: before the first token).
pub fn workload(
    trace: &Trace,
    n: usize,
    scaling: &Scaling,
    vocab_size: usize,
    seed: u64,
    cancel_rate: f64,
) -> Workload {
    let mut rng = fastrand::Rng::with_seed(seed);
    let lo = if vocab_size > 3 { 3 } else { 0 };
    let mut requests: Vec<RequestSpec> = trace
        .requests
        .iter()
        .take(n)
        .enumerate()
        .map(|(id, r)| {
            let r = scaling.apply(r);
            let prompt = (0..r.prompt_tokens)
                .map(|_| rng.u32(lo..vocab_size as u32))
                .collect();
            let cancel_after = (rng.f64() < cancel_rate).then(|| rng.usize(0..r.output_tokens));
            RequestSpec {
                id,
                arrival: r.arrival,
                prompt,
                output_tokens: r.output_tokens,
                cancel_after,
            }
        })
        .collect();
    requests.sort_by_key(|r| r.arrival);
    Workload { requests }
}

/// How a request left the run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Generated all its tokens (or its stop token).
    Done,
    /// Cancelled (`--cancel-rate`); its blocks were freed.
    Cancelled,
    /// Failed with this message.
    Failed(String),
}

/// A request that left the group (its KV account freed).
#[derive(Debug)]
pub struct Finished {
    /// Its final sequence state (generated tokens, timing).
    pub seq: DecodeSeq,
    /// How it ended.
    pub status: Status,
}

/// One iteration of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct IterRecord {
    /// Start, since the run started.
    pub start: Duration,
    /// Submit-to-collect duration.
    pub dur: Duration,
    /// Members in the ready vector.
    pub ready: usize,
    /// Members with work in the plan.
    pub scheduled: usize,
    /// Prefill token rows.
    pub prefill_tokens: usize,
    /// Decode token rows.
    pub decode_tokens: usize,
    /// KV blocks allocated after the iteration.
    pub kv_used: usize,
}

/// Everything a run observed (the report is computed from it).
#[derive(Debug)]
pub struct RunOutput {
    /// The policy run.
    pub mode: Mode,
    /// The model's description.
    pub device: String,
    /// Finished requests, in finishing order.
    pub finished: Vec<Finished>,
    /// Rejected requests.
    pub rejected: Vec<Rejected>,
    /// Iterations in order.
    pub iterations: Vec<IterRecord>,
    /// When the run started (arrival times are relative to it).
    pub started: Instant,
    /// Run wall time.
    pub wall: Duration,
    /// KV blocks in the cache.
    pub kv_capacity: usize,
    /// Most KV blocks allocated at once.
    pub kv_peak: usize,
    /// KV blocks still allocated at the end (0 unless there is a leak).
    pub kv_leaked: usize,
}

impl RunOutput {
    /// The record of a run of `mode` on `device` over a cache of `kv_capacity`
    /// blocks, started at `started`, before anything happened.
    pub fn new(mode: Mode, device: String, kv_capacity: usize, started: Instant) -> Self {
        RunOutput {
            mode,
            device,
            finished: Vec::new(),
            rejected: Vec::new(),
            iterations: Vec::new(),
            started,
            wall: Duration::ZERO,
            kv_capacity,
            kv_peak: 0,
            kv_leaked: 0,
        }
    }
}

/// Live figures handed to the progress callback after every iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Requests finished or rejected so far.
    pub done: usize,
    /// Requests in the workload.
    pub total: usize,
    /// Members in the last ready vector.
    pub active: usize,
    /// Tokens generated so far.
    pub generated: usize,
    /// Time since the run started.
    pub elapsed: Duration,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The device model failed.
    #[error(transparent)]
    Model(#[from] DeviceError),
    /// The KV ledger refused an operation (a bug).
    #[error(transparent)]
    Kv(#[from] KvError),
    /// The device returned the wrong number of tokens.
    #[error(transparent)]
    Tokens(#[from] TokenCountMismatch),
    /// The batch engine refused an operation. `Nosys` says the binary was
    /// built without the `sched-policy` feature (B-005).
    #[error("batch group: {0}{hint}", hint = nosys_hint(*.0))]
    Batch(#[from] xtc::Error),
    /// Options that cannot run.
    #[error("invalid options: {0}")]
    Opts(String),
}

impl JobError {
    /// The batch engine's code for this failure, as the batch driver returns
    /// it from its step (the run's error itself is this `JobError`):
    /// [`JobError::Batch`] keeps the engine's own code; a model's
    /// [`DeviceError::OutOfMemory`] is `Nomem` and
    /// [`DeviceError::Unsupported`] is `Nosys`; everything else (a lost
    /// device, a failed model, the ledger, the token count, the options) is
    /// `Internal`.
    pub fn engine_code(&self) -> xtc::Error {
        match self {
            JobError::Batch(c) => *c,
            JobError::Model(DeviceError::OutOfMemory(_)) => xtc::Error::Nomem,
            JobError::Model(DeviceError::Unsupported(_)) => xtc::Error::Nosys,
            _ => xtc::Error::Internal,
        }
    }
}

/// What `Nosys` from the batch engine means for a run: the batch API is
/// compiled out (B-005), so the fix is a rebuild, not a retry.
fn nosys_hint(e: xtc::Error) -> &'static str {
    match e {
        xtc::Error::Nosys => {
            ": this xtc was built without the `sched-policy` feature (the batch API is \
             compiled out); rebuild it with default features (`cargo build --release`)"
        }
        _ => "",
    }
}

/// Checks options against the model.
///
/// # Errors
/// [`JobError::Opts`] naming the bad option.
pub fn check_opts(opts: &JobOpts) -> Result<(), JobError> {
    if opts.token_budget == 0 {
        return Err(JobError::Opts("--token-budget must be at least 1".into()));
    }
    if opts.max_active == 0 {
        return Err(JobError::Opts("--max-active must be at least 1".into()));
    }
    KvLedger::new(opts.kv_blocks, opts.block_size)?;
    Ok(())
}

/// The device model shared by the job's step and the caller (one loop).
pub type SharedModel = std::rc::Rc<std::cell::RefCell<dyn Model>>;

/// Wraps a model for [`crate::run`].
pub fn shared(model: impl Model + 'static) -> SharedModel {
    std::rc::Rc::new(std::cell::RefCell::new(model))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 12: a build without `sched-policy` said only "batch group: not
    /// supported (XTC_E_NOSYS)".
    #[test]
    fn nosys_names_the_missing_feature() {
        let m = JobError::Batch(xtc::Error::Nosys).to_string();
        assert!(m.contains("XTC_E_NOSYS"), "{m}");
        assert!(
            m.contains("built without the `sched-policy` feature"),
            "{m}"
        );
        let other = JobError::Batch(xtc::Error::Inval).to_string();
        assert!(!other.contains("sched-policy"), "{other}");
    }
}
