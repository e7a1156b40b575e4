//! # xtc: bounded continuous batching for accelerator work
//!
//! Requests are admitted first-come-first-served under a resource charge into a
//! [`batch::Group`]; every iteration hands the whole *ready vector* to one step
//! or one device operation; members finish independently. The layers, bottom to
//! top (see `docs/ARCHITECTURE.md`):
//!
//! - [`rt`]: the runtime substrate (loops, processes, kill and exit hooks,
//!   timers, fd readiness, futures/promises, blocking pool, executor, the
//!   deterministic simulator [`rt::Sim`]).
//! - [`batch`]: the manual page `xtc_batch(3)`: synchronous and asynchronous
//!   groups, cross-loop admission, placement helpers, router.
//! - [`accel`]: render/accel node discovery, sync_file and eventfd fences.
//! - [`vk`]: Vulkan compute through `ash` (lavapipe is the embedded default).
//! - [`dispatch`]: batched doorbell publication on an emulated NPU.
//! - [`decode`]: the KV-cache continuous-batching decode workload.
//! - [`cli`]: the `xtc` command.
//! - [`trace_event`]: the one Chrome trace / Perfetto JSON writer (decode and
//!   dispatch exports).
//!
//! Ownership rule: a group owns each submitted request `R` from submit until it
//! hands it back by value to `complete`; a failed submit hands it back in the
//! error.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod accel;
pub mod batch;
pub mod cli;
pub mod decode;
pub mod dispatch;
pub mod error;
pub mod rt;
pub mod trace_event;
pub mod vk;

pub use error::{Error, Result};
