//! `xtc-kvbatch`: KV-cache continuous batching of decode sequences, the
//! serving core both `xtc serve` (`xtc-serve`) and `xtc decode`
//! (`xtc-replay`) build on. It decides which tokens an iteration computes;
//! a model ([`xtc_model::Model`]) computes them.
//!
//! # What each module owns (bottom to top)
//! - [`kv`]: the ONE KV ledger, [`kv::KvLedger`]: a request's charge, its
//!   admission against the cache, the growth of its block table and the
//!   return of its blocks. Nothing else allocates or frees a KV block.
//! - [`seq`]: a member's sequence state ([`seq::DecodeSeq`], which carries its
//!   [`kv::KvAccount`]) and the pure iteration logic: [`seq::pack`] the ready
//!   vector into ONE [`BatchPlan`](xtc_model::BatchPlan) under the token
//!   budget, [`seq::apply`] the sampled tokens back.
//! - [`reject`]: the requests that can never fit (KV blocks, `seq_len`),
//!   refused before admission.
//! - [`latency`]: one request's latencies (queue, TTFT, TPOT, end-to-end)
//!   and the SLO it meets.
//! - [`metrics`]: Prometheus metrics of a run with vLLM's names and buckets
//!   (`xtc:time_to_first_token_seconds`, ...) and the batch group's
//!   statistics ([`metrics::DecodeMetrics`]).
//!
//! # Import rule
//! `xtc::batch`, `xtc::Error` and the join of `xtc_model` ([`Model`],
//! `Completion`, `BatchPlan`, `SeqWork`, `Config`, `DeviceError`); never
//! `xtc_vk` or the model's internals (`tests/layout.rs`).
//!
//! # Invariants
//! - The KV cache is never over-committed: a request's charge (the blocks its
//!   prompt and output may need) is reserved when it is admitted — by the
//!   group's FCFS admission with `resource_capacity` = the cache's blocks
//!   (B-036..B-040), mirrored by [`kv::KvLedger::admit`] — so growing an
//!   admitted member's block table never fails ([`kv`] states and tests the
//!   ledger's invariants).
//! - Every member that leaves — DONE, cancelled (before or after admission),
//!   failed — goes through [`kv::KvLedger::free`] exactly once; a run ends
//!   with no KV block held.
//!
//! [`Model`]: xtc_model::Model
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod kv;
pub mod latency;
pub mod metrics;
pub mod reject;
pub mod seq;
