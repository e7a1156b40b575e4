//! `dispatch`: batched doorbell publication on an emulated NPU.
//!
//! Implements the batched-publish design note (its rules D-01..D-15, mapped
//! to their tests in `tests/CLAUSES.md`); `docs/arch/dispatch.md` is the
//! layer's chapter.
//!
//! # Design memo
//!
//! **Device** ([`emu`], [`profile`]). A profile (`devices/npu-*.json`) gives
//! clusters (1 AIC + 2 AIV cores each) and scheduler threads (cluster `ci`
//! belongs to thread `ci % threads`). A `memmap2` region holds, per core, a
//! doorbell line, a separate status line (`cond`: ACK = token, FIN = token |
//! bit 31) and two descriptors selected by token parity. Emulated cores are
//! non-blocking state machines; one host process polls all of them.
//!
//! **Publication** ([`publish`], D-01..D-05). A scheduler thread pops up to
//! |idle units| ready tasks of one shape, claims blocks, prepares every
//! claimed core (descriptor + tracker), then publishes: ONE release fence and
//! every doorbell store per pop (cross-task), or one per task (per-task, and
//! always for a pop carrying a sync_start task: the exclusion). Pending
//! handles are flushed before drain entry.
//!
//! **Drain** ([`drain`], D-05..D-07). A sync_start cohort that one thread
//! cannot place stops normal dispatch: threads ack a barrier, one is elected,
//! checks global capacity (retry if short), then every thread stages its own
//! idle units. Attempts carry generation tags so a stale thread cannot mix two
//! attempts; every drain spin escapes on the run's completed latch, and one
//! that waits past the watchdog budget (a peer stuck, not gone) ends the run
//! with a [`DrainStall`] naming the spin and the peers it waits for.
//!
//! **Watermark** ([`watermark`], [`reclaim`], D-08..D-13). The last-task-alive
//! head is published every K = 16 advances; a consumer stalled 10 ms requests
//! a publication, thread 0 force-publishes and acks from every iteration;
//! contention goes to a deferred mask only idle loops drain; deadlock
//! verdicts use acknowledged heads only.
//!
//! **Execution** ([`step`]). Every spin is a yield point
//! ([`step::Yielder::pause`]), so the same `async` protocol runs on real
//! threads (metrics, [`Scheduler::run_threads`]), under the seeded
//! [`step::Stepper`] with virtual time ([`Scheduler::run_stepped`]), and under
//! the crate's simulator [`xtc::rt::Sim`] with seeded injected delays
//! ([`Scheduler::run_sim`]: one Sim loop per modelled OS thread). The two
//! deterministic drivers make the liveness proofs (hangs are detected by a
//! step bound and reported with the seed and each process's [`Point`]).
//!
//! **Integration** ([`npu_step`]). [`NpuStep`] is a `batch::AsyncStep`: each
//! iteration's ready vector becomes one graph on the device service thread,
//! which resolves an `Exec::Future` when the run completed.
//!
//! **Not modelled**: the pending (pre-loaded second) slot of a core, early
//! dispatch, multiple rings, the overflow spill of per-thread local buffers.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod drain;
pub mod emu;
pub mod metrics;
pub mod npu_step;
pub mod profile;
pub mod publish;
pub mod reclaim;
pub mod scenarios;
pub mod scheduler;
mod state;
pub mod step;
pub mod task;
pub mod watermark;

pub use metrics::{PopRecord, Summary, chrome_trace};
pub use npu_step::{NpuDevice, NpuStep, NpuWork};
pub use profile::DeviceProfile;
pub use scheduler::{Probe, ProbePolicy, Scheduler, SimOpts, StepOpts};
pub use state::PublishHandle;
pub use step::{Hang, Point};
pub use task::{
    DrainStall, Escapes, FenceCountError, Graph, OrchStep, PublishMode, RunError, RunOpts,
    RunReport, Shape, Stall, StallEnd, TaskSpec,
};
