//! The serving side of `decode`: a trace-replayed workload decoded with
//! KV-cache continuous batching on any [`Model`] (`xtc decode`).
//!
//! # What each module owns (bottom to top)
//! - [`trace`]: request traces in the Azure LLM inference trace schema (an
//!   embedded CC-BY-4.0 slice is the default workload) and their scaling.
//! - [`kv`]: the ONE KV ledger, [`kv::KvLedger`]: a request's charge, its
//!   admission against the cache, the growth of its block table and the
//!   return of its blocks. Nothing else allocates or frees a KV block.
//! - [`seq`]: a member's sequence state ([`seq::DecodeSeq`], which carries its
//!   [`kv::KvAccount`]) and the pure iteration logic: [`seq::pack`] the ready
//!   vector into ONE [`BatchPlan`](crate::BatchPlan) under the token
//!   budget, [`seq::apply`] the sampled tokens back.
//! - [`job`]: what a run is — options ([`job::JobOpts`], [`job::Mode`]), the
//!   workload from a trace, the rejection of requests that can never fit,
//!   what a run observed ([`job::RunOutput`]) and why it failed
//!   ([`job::JobError`]). No driver: the drivers import it, never the reverse.
//! - [`batch_driver`]: the run on one async batch group ([`run`], the `xtc decode`
//!   driver): the step (submit packs and launches, collect applies), the
//!   completion of a member, the arrival process, the canceller; and the ONE
//!   place a model's [`Completion`](crate::Completion) becomes the
//!   engine's [`Exec`](xtc::batch::Exec).
//! - [`local`]: the same rules without the batch engine, in a plain loop (the
//!   second driver the tests cross-check the group against).
//! - [`latency`]: per-request latencies (queue, TTFT, TPOT, inter-token,
//!   end-to-end), their distributions ([`latency::LatencyStats`], from an
//!   HdrHistogram) and the SLO a request meets or misses.
//! - [`metrics`]: Prometheus metrics of a run with vLLM's names and buckets
//!   (`xtc:time_to_first_token_seconds`, ...) and the batch group's
//!   statistics ([`metrics::DecodeMetrics`], updated by
//!   [`batch_driver::run_with_metrics`]).
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
//! writer), `xtc::Error` and the join items of
//! [`crate`] ([`Model`], `Completion`, `BatchPlan`, `SeqWork`,
//! `Config`, `DeviceError`); never `xtc_vk` or `decode::model`
//! (`tests/layout.rs`).
//!
//! # Invariants
//! - The KV cache is never over-committed: a request's charge (the blocks its
//!   prompt and output may need) is reserved when it is admitted — by the
//!   group's FCFS admission with `resource_capacity` = the cache's blocks
//!   (B-036..B-040), mirrored by [`kv::KvLedger::admit`]; by the ledger
//!   itself in the local driver — so growing an admitted member's block table
//!   never fails ([`kv`] states and tests the ledger's invariants).
//! - Every member that leaves — DONE, cancelled (before or after admission),
//!   failed — goes through [`kv::KvLedger::free`] exactly once; a run ends
//!   with no KV block held ([`job::RunOutput::kv_leaked`] is 0; anything else
//!   is a bug the command reports).
//! - Both drivers apply the same rules to the same workload and produce the
//!   same tokens as decoding each request alone (`crates/decode/tests/decode_job.rs`).
//!
//! [`Model`]: crate::Model

pub mod batch_driver;
pub mod job;
pub mod kv;
pub mod latency;
pub mod local;
pub mod metrics;
pub mod prompts;
pub mod report;
pub mod run_config;
pub mod seq;
pub mod sweep;
pub mod trace;

pub use batch_driver::{run, run_with_metrics};
