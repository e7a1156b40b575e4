//! `xtc-replay`, the benchmark behind `xtc decode`: a trace-replayed
//! workload decoded with KV-cache continuous batching on any [`Model`], on
//! the serving core of `xtc-kvbatch` (its KV ledger, sequences, latency and
//! metrics), and the reports of a run.
//!
//! # What each module owns (bottom to top)
//! - [`trace`]: request traces in the Azure LLM inference trace schema (an
//!   embedded CC-BY-4.0 slice is the default workload) and their scaling.
//! - [`job`]: what a run is — options ([`job::JobOpts`], [`job::Mode`]), the
//!   workload from a trace, the rejection of requests that can never fit,
//!   what a run observed ([`job::RunOutput`]) and why it failed
//!   ([`job::JobError`]). No driver: the drivers import it, never the reverse.
//! - [`batch_driver`]: the run on one async batch group ([`run`], the `xtc decode`
//!   driver): the step (submit packs and launches, collect applies), the
//!   completion of a member, the arrival process, the canceller; and the ONE
//!   place a model's [`Completion`](xtc_model::Completion) becomes the
//!   engine's [`Exec`](xtc::batch::Exec).
//! - [`local`]: the same rules without the batch engine, in a plain loop (the
//!   second driver the tests cross-check the group against).
//! - [`latency`]: the distributions of the per-request latencies
//!   ([`latency::LatencyStats`], from an HdrHistogram) and SLO attainment.
//! - [`calibrate`]: the device's iteration cost fitted to timed plans
//!   (`xtc calibrate`).
//! - [`prompts`]: real-text prompts (windows of a tokenized text) for a workload.
//! - [`run_config`]: what produced a report ([`run_config::RunConfig`]:
//!   trace, scaling, seed, model, KV cache, limits, device, SLO).
//! - [`sweep`]: capacity under an SLO (`--sweep`): per-rate points, each
//!   policy's capacity and the capacity ratios; table, CSV, SVG plot.
//! - [`report`]: the figures of a run (text, JSON with a schema version,
//!   per-request records, `--compare`, Chrome trace).
//!
//! # Import rule
//! `xtc::batch`, `xtc::rt`, `xtc_trace` (the Chrome trace
//! writer), `xtc::Error`, `xtc_kvbatch` and the join of `xtc_model`
//! ([`Model`], `Completion`, `BatchPlan`, `SeqWork`, `Config`,
//! `DeviceError`); never `xtc_vk` or the model's internals
//! (`tests/layout.rs`).
//!
//! # Invariants
//! - The KV cache is never over-committed: a request's charge (the blocks its
//!   prompt and output may need) is reserved when it is admitted — by the
//!   group's FCFS admission with `resource_capacity` = the cache's blocks
//!   (B-036..B-040), mirrored by [`KvLedger::admit`](xtc_kvbatch::kv::KvLedger::admit); by the ledger
//!   itself in the local driver — so growing an admitted member's block table
//!   never fails (`xtc_kvbatch::kv` states and tests the ledger's invariants).
//! - Every member that leaves — DONE, cancelled (before or after admission),
//!   failed — goes through [`KvLedger::free`](xtc_kvbatch::kv::KvLedger::free) exactly once; a run ends
//!   with no KV block held ([`job::RunOutput::kv_leaked`] is 0; anything else
//!   is a bug the command reports).
//! - Both drivers apply the same rules to the same workload and produce the
//!   same tokens as decoding each request alone (`crates/replay/tests/decode_job.rs`).
//!
//! [`Model`]: xtc_model::Model
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod batch_driver;
pub mod calibrate;
pub mod job;
pub mod latency;
pub mod local;
pub mod prompts;
pub mod report;
pub mod run_config;
pub mod sweep;
pub mod trace;

pub use batch_driver::{run, run_with_metrics};
