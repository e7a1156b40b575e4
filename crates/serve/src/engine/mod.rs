//! The engine thread: one xtc loop that owns the async batch group, the
//! model ([`Backend`]) and the KV ledger, as `xtc decode` does, reached from
//! the HTTP side ONLY through [`Remote`] (`submit_mt`, `cancel_mt`).
//!
//! # A request's path
//! 1. HTTP thread: [`EngineHandle::submit`] checks the request can ever fit
//!    (prompt + `max_tokens` against the context and the KV cache: refused
//!    before any work), charges it its KV blocks for prompt + `max_tokens`
//!    and hands a [`Job`] to `submit_mt`. A full admission ring (or a closed
//!    group) answers [`Refused::Busy`] / [`Refused::Closed`] at once: the
//!    queue of accepted-but-unadmitted requests is bounded by
//!    `mt_queue_cap`, never unbounded.
//! 2. Engine loop, each iteration: newly admitted members get their charge
//!    in the ledger; the ready vector is packed into ONE plan
//!    ([`seq::pack`]: decode rows first, then chunked prefill under the
//!    token budget) and launched; `collect` samples (greedy on the device,
//!    or on the host from the logits with the request's seeded sampler),
//!    detokenizes, matches stop strings, and sends each new piece of text
//!    through the request's bounded channel ([`Delta`]).
//! 3. `complete` frees the member's KV blocks and resolves the request's
//!    reply future ([`rt::future_pair`]) with its [`Outcome`] (or the error:
//!    `Aborted` for a cancel). Dropping the job then closes the channel.
//!
//! # Cancellation
//! The HTTP side holds a [`CancelGuard`]: dropped before the outcome (client
//! gone, wherever the request is: on the ring, held, waiting, prefill,
//! decode), it calls `cancel_mt`; the engine applies it at the next
//! boundary, so the blocks return within one iteration. Independently,
//! `collect` ends a member whose channel is closed (receiver dropped) or
//! full (a client that stopped reading: the buffer is bounded; the
//! ticket's `stalled` flag says so) with `Aborted`. Cancellations are
//! counted by the phase the request was in.
//!
//! How far a client that stops reading can fall behind, bounded at every
//! hop: the channel's `stream_buffer` deltas, hyper's write queue (at most
//! 16 writes, one SSE event each), the socket's send buffer
//! ([`crate::SEND_BUFFER_BYTES`]) and the client's own receive buffer.
//! Once they are full the SSE body is no longer polled, the channel fills
//! and the next token cancels the request.
//!
//! No tokio type enters `batch` or `rt`: the channel is the request's own
//! field, the group only carries it.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::backend::{Backend, BackendError, Rows};
use crate::metrics::{Phase, ServeMetrics};
use crate::text::Detokenizer;
use xtc::Error;
use xtc::batch::{
    AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Handle, Item, Remote, StepResult,
};
use xtc::rt;
use xtc_kvbatch::kv::{KvError, KvLedger};
use xtc_kvbatch::latency::RequestLatency;
use xtc_kvbatch::metrics::{Completed, DecodeMetrics};
use xtc_kvbatch::seq::{self, Outcome as SeqOutcome, RequestSpec, Sequence};
use xtc_model::text::bpe::Bpe;
use xtc_model::text::sampling::{Sampler, SamplingParams, argmax};

mod step;

use step::engine_main;

/// Sizes of the engine (the `xtc serve` options of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOpts {
    /// Members of the ready vector at most (requests decoded together).
    pub max_active: usize,
    /// Requests accepted but not yet admitted at most (the admission ring,
    /// `mt_queue_cap`): beyond it a submit is refused ([`Refused::Busy`]).
    pub max_queued: usize,
    /// KV cache blocks.
    pub kv_blocks: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// Token rows per iteration at most (decode rows + prefill chunks).
    pub token_budget: usize,
    /// Positions per sequence at most (prompt + output - 1).
    pub context: usize,
    /// Deltas a request's channel holds before the client counts as not
    /// reading (then it is cancelled).
    pub stream_buffer: usize,
}

/// What one request asks the engine to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    /// Prompt token ids (non-empty, each below the vocabulary size).
    pub prompt: Vec<u32>,
    /// Tokens to generate at most (>= 1).
    pub max_tokens: usize,
    /// Sampling settings (temperature 0: greedy).
    pub sampling: SamplingParams,
    /// Stop strings (matched across token boundaries; not part of the text).
    pub stop: Vec<String>,
    /// Keep generating past the end-of-sequence token.
    pub ignore_eos: bool,
    /// Neither the end-of-sequence token (its logit is masked) nor a stop
    /// string ends the answer before this many tokens.
    pub min_tokens: usize,
    /// A non-streaming request: its deltas are read by the server's own
    /// future, never by a slow client, so its channel holds every delta
    /// (`max_tokens + 1`, one a step and the last) instead of
    /// `--stream-buffer`, and it is never cancelled as stalled however
    /// briefly that future waits for a worker thread.
    pub whole: bool,
}

/// A piece of a request's answer, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    /// Text now complete (no split UTF-8 character, no possible stop-string
    /// prefix); may be empty.
    pub text: String,
    /// Tokens generated since the previous delta.
    pub tokens: Vec<u32>,
}

/// Why a request finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_tokens` generated.
    Length,
    /// The end-of-sequence token or a stop string.
    Stop,
}

impl FinishReason {
    /// OpenAI's name: `length` or `stop`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
        }
    }
}

/// Server-measured times of one request, milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Timings {
    /// Submit to admission (first iteration that ran it).
    pub queue_ms: f64,
    /// Submit to the first generated token.
    pub ttft_ms: f64,
    /// First to last generated token.
    pub decode_ms: f64,
    /// Submit to the last generated token.
    pub e2e_ms: f64,
    /// Mean time per output token after the first (0 with one token).
    pub tpot_ms: f64,
}

/// How a request ended well (the reply future's value).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Outcome {
    /// `length` or `stop`.
    #[serde(skip)]
    pub finish_reason: FinishReason,
    /// The stop string that ended it, if one did.
    pub stop: Option<String>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (the end-of-sequence token included when it ended
    /// the answer).
    pub completion_tokens: usize,
    /// Times measured by the server.
    pub timings: Timings,
}

/// Why [`EngineHandle::submit`] refused a request (nothing ran).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Prompt + `max_tokens` would pass the context length.
    #[error(
        "this model's context is {context} positions, but the request needs {prompt} prompt + {max_tokens} output tokens ({need} positions)"
    )]
    Context {
        /// Positions available per sequence.
        context: usize,
        /// Prompt tokens.
        prompt: usize,
        /// `max_tokens`.
        max_tokens: usize,
        /// Positions needed (prompt + max_tokens - 1).
        need: usize,
    },
    /// Prompt + `max_tokens` need more KV blocks than the cache has.
    #[error(
        "the request needs {need} KV blocks (prompt + max_tokens) but the KV cache has {capacity}"
    )]
    KvCache {
        /// Blocks needed.
        need: u64,
        /// Blocks in the cache.
        capacity: usize,
    },
    /// The admission ring is full: retry later.
    #[error(
        "the server is at capacity ({queued} requests accepted and not yet finished); retry later"
    )]
    Busy {
        /// Requests accepted and not yet finished.
        queued: usize,
    },
    /// The engine is closed (draining or stopped).
    #[error("the server is shutting down")]
    Closed,
}

/// A request accepted by the engine: its handle, its deltas, its outcome.
#[derive(Debug)]
pub struct Ticket {
    /// The engine's handle of the request.
    pub handle: Handle,
    /// The answer's pieces, in order; closed after the last one.
    pub deltas: mpsc::Receiver<Delta>,
    /// The outcome (`Err(Aborted)` when cancelled, another error for an
    /// engine failure).
    pub outcome: rt::Future<Outcome>,
    /// Cancels the request when dropped before [`CancelGuard::disarm`].
    pub guard: CancelGuard,
    /// When it was submitted.
    pub submitted: Instant,
    /// Set by the engine when it cancelled the request because its channel
    /// was full: the client stopped reading (the outcome is then
    /// `Err(Aborted)`).
    pub stalled: Arc<AtomicBool>,
}

/// Cancels its request through `cancel_mt` when dropped, unless disarmed
/// (the outcome arrived). Safe in any phase: "a cancel is never lost", and
/// one for a completed request costs nothing.
#[derive(Debug)]
pub struct CancelGuard {
    remote: Remote<Job>,
    handle: Handle,
    armed: bool,
    metrics: Arc<ServeMetrics>,
}

impl CancelGuard {
    /// The request finished: dropping the guard no longer cancels.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.metrics.disconnects.inc();
        // `Again` only while every control record is in use: the driver
        // drains them at its next boundary, so a short back-off suffices.
        for i in 0..2000u32 {
            match self.remote.cancel(self.handle) {
                Err(Error::Again) => {
                    if i < 10 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
                _ => return,
            }
        }
    }
}

/// Engine-side gauges the HTTP side reads (health, `Retry-After`, tests).
#[derive(Debug, Default)]
pub struct Gauges {
    /// Requests accepted and not yet completed.
    pub outstanding: AtomicUsize,
    /// KV blocks allocated now.
    pub kv_used: AtomicUsize,
    /// KV blocks reserved by admitted requests.
    pub kv_reserved: AtomicUsize,
    /// Members of the last ready vector.
    pub running: AtomicUsize,
    /// Moving average of requests' submit-to-finish time, microseconds
    /// (for `Retry-After`).
    pub mean_e2e_us: AtomicUsize,
}

impl Gauges {
    /// Seconds a refused client should wait before retrying: the time the
    /// requests ahead of it take to drain through `max_active` slots, from
    /// the recent mean request time; 1 to 60.
    pub fn retry_after_s(&self, max_active: usize) -> u64 {
        let mean = self.mean_e2e_us.load(Ordering::Relaxed) as f64 / 1e6;
        let ahead = self.outstanding.load(Ordering::Relaxed) as f64;
        let s = (mean * ahead / max_active.max(1) as f64).ceil();
        (s as u64).clamp(1, 60)
    }
}

/// A group member: a request's sequence state and its way back.
pub struct Job {
    seq: Sequence,
    sampler: Option<Sampler>,
    eos: Option<u32>,
    min_tokens: usize,
    detok: Detokenizer,
    tx: mpsc::Sender<Delta>,
    done: Option<rt::Promise<Outcome>>,
    finish: Option<FinishReason>,
    stop: Option<String>,
    /// This iteration's sampled row needs the logits (set at launch).
    logits_row: bool,
    /// Set by collect when the client is gone (channel closed or full).
    gone: bool,
    /// Shared with the [`Ticket`]: set when the channel was full.
    stalled: Arc<AtomicBool>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("prompt", &self.seq.prompt.len())
            .field("generated", &self.seq.generated.len())
            .finish_non_exhaustive()
    }
}

impl Job {
    fn needs_logits(&self) -> bool {
        self.sampler.is_some() || (self.eos.is_some() && self.seq.generated.len() < self.min_tokens)
    }
}

/// The HTTP side's way into the engine: `Send + Sync`, cheap to share.
#[derive(Debug)]
pub struct EngineHandle {
    remote: Remote<Job>,
    calc: KvLedger,
    opts: EngineOpts,
    eos: u32,
    metrics: Arc<ServeMetrics>,
    /// Engine-side gauges.
    pub gauges: Arc<Gauges>,
    /// The model and device, in words.
    pub describe: String,
    /// The run's decode metrics (`xtc:` names, as `xtc decode`'s).
    pub registry: Arc<prometheus_client::registry::Registry>,
    ids: AtomicUsize,
}

impl EngineHandle {
    /// The engine's sizes.
    pub fn opts(&self) -> &EngineOpts {
        &self.opts
    }

    /// KV blocks a request of `prompt` + `max_tokens` tokens is charged.
    pub fn charge_for(&self, prompt: usize, max_tokens: usize) -> u64 {
        self.calc.charge_for(prompt, max_tokens)
    }

    /// Checks that a request of `prompt` + `max_tokens` tokens can ever run.
    ///
    /// # Errors
    /// [`Refused::Context`] or [`Refused::KvCache`].
    pub fn check_fits(&self, prompt: usize, max_tokens: usize) -> Result<u64, Refused> {
        let need = prompt.saturating_add(max_tokens).saturating_sub(1);
        if need > self.opts.context {
            return Err(Refused::Context {
                context: self.opts.context,
                prompt,
                max_tokens,
                need,
            });
        }
        let charge = self.charge_for(prompt, max_tokens);
        if charge > self.opts.kv_blocks as u64 {
            return Err(Refused::KvCache {
                need: charge,
                capacity: self.opts.kv_blocks,
            });
        }
        Ok(charge)
    }

    /// Hands `req` to the engine (`submit_mt`).
    ///
    /// # Errors
    /// [`Refused`]: it can never fit, the ring is full, the engine closed.
    /// Nothing ran then.
    pub fn submit(&self, req: GenRequest) -> Result<Ticket, Refused> {
        let charge = self.check_fits(req.prompt.len(), req.max_tokens)?;
        let submitted = Instant::now();
        let spec = RequestSpec {
            id: self.ids.fetch_add(1, Ordering::Relaxed),
            arrival: Duration::ZERO,
            prompt: req.prompt,
            output_tokens: req.max_tokens,
            cancel_after: None,
        };
        let eos = (!req.ignore_eos).then_some(self.eos);
        let acct = self.calc.account(spec.prompt.len(), spec.output_tokens);
        debug_assert_eq!(acct.charge(), charge);
        let seq = Sequence::new(&spec, acct, eos, submitted);
        let sampler = (req.sampling.temperature > 0.0)
            .then(|| Sampler::new(req.sampling).ok())
            .flatten();
        let cap = if req.whole {
            req.max_tokens.saturating_add(1)
        } else {
            self.opts.stream_buffer
        };
        let (tx, rx) = mpsc::channel(cap.clamp(1, 1 << 24));
        let (future, promise) = rt::future_pair();
        let stalled = Arc::new(AtomicBool::new(false));
        let job = Job {
            seq,
            sampler,
            eos,
            min_tokens: req.min_tokens,
            detok: Detokenizer::new(req.stop),
            tx,
            done: Some(promise),
            finish: None,
            stop: None,
            logits_row: false,
            gone: false,
            stalled: stalled.clone(),
        };
        self.gauges.outstanding.fetch_add(1, Ordering::SeqCst);
        match self.remote.submit(job, charge) {
            Ok(handle) => Ok(Ticket {
                handle,
                deltas: rx,
                outcome: future,
                guard: CancelGuard {
                    remote: self.remote.clone(),
                    handle,
                    armed: true,
                    metrics: self.metrics.clone(),
                },
                submitted,
                stalled,
            }),
            Err(e) => {
                let queued = self.gauges.outstanding.fetch_sub(1, Ordering::SeqCst) - 1;
                let mut job = e.request;
                job.done = None; // no completion will come: drop the promise unset
                Err(match e.error {
                    Error::Range => Refused::KvCache {
                        need: charge,
                        capacity: self.opts.kv_blocks,
                    },
                    Error::Again if self.closed() => Refused::Closed,
                    _ => Refused::Busy { queued },
                })
            }
        }
    }

    fn closed(&self) -> bool {
        self.metrics.closing.load(Ordering::SeqCst)
    }
}

/// Failures of the engine thread.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model could not be loaded or failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The loop or the group refused (bad sizes, no memory).
    #[error("batch engine: {0}")]
    Batch(#[from] Error),
    /// The KV ledger refused (bad sizes, or a bug).
    #[error("KV ledger: {0}")]
    Kv(#[from] KvError),
    /// The engine thread could not start or died.
    #[error("engine thread: {0}")]
    Thread(String),
}

/// The running engine: its handle, its thread and its close control.
#[derive(Debug)]
pub struct Engine {
    /// The HTTP side's way in.
    pub handle: Arc<EngineHandle>,
    control: Option<rt::Sender<CloseMode>>,
    thread: Option<std::thread::JoinHandle<Result<usize, EngineError>>>,
}

impl Engine {
    /// Starts the engine thread: `build` makes the model there (opening the
    /// device in that thread), then the loop, the group (`mt_queue_cap` =
    /// `max_queued`) and the KV ledger; returns once the engine serves.
    ///
    /// # Errors
    /// [`EngineError`]: the model, the loop, the group or the ledger refused.
    pub fn start(
        opts: EngineOpts,
        tok: Arc<Bpe>,
        metrics: Arc<ServeMetrics>,
        build: impl FnOnce() -> Result<Backend, BackendError> + Send + 'static,
    ) -> Result<Engine, EngineError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let m = metrics.clone();
        let thread = std::thread::Builder::new()
            .name("xtc-engine".into())
            .spawn(move || engine_main(opts, tok, m, build, ready_tx))
            .map_err(|e| EngineError::Thread(e.to_string()))?;
        match ready_rx.recv() {
            Ok(Ok(h)) => Ok(Engine {
                handle: Arc::new(h.0),
                control: Some(h.1),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(EngineError::Thread(match thread.join() {
                Ok(Err(e)) => e.to_string(),
                _ => "it exited before it was ready".into(),
            })),
        }
    }

    /// `close(mode)` on the engine's loop: DRAIN stops admission and lets
    /// accepted requests finish; CANCEL also cancels them. Idempotent; DRAIN
    /// may be escalated to CANCEL.
    pub fn close(&self, mode: CloseMode) {
        self.handle.metrics.closing.store(true, Ordering::SeqCst);
        if let Some(c) = &self.control {
            let _ = c.send(mode);
        }
    }

    /// Closes with DRAIN (if not closed yet), waits until the engine thread
    /// ends, and returns the KV blocks still allocated then (0 unless a bug
    /// leaked some).
    ///
    /// # Errors
    /// The engine thread's failure.
    pub fn join(mut self) -> Result<usize, EngineError> {
        self.close(CloseMode::Drain);
        drop(self.control.take()); // ends the control process
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(EngineError::Thread("the engine thread panicked".into())),
            None => Ok(0),
        }
    }
}

type Ready = (EngineHandle, rt::Sender<CloseMode>);
