//! # xtc: bounded continuous batching for accelerator work
//!
//! Requests are admitted first-come-first-served under a resource charge into a
//! [`batch::Group`]; every iteration hands the whole *ready vector* to one step
//! or one device operation; members finish independently. This crate is the
//! engine of the manual page `xtc_batch(3)` and depends on no Vulkan, model,
//! HTTP or command-line crate. Its modules, bottom to top (see
//! `docs/ARCHITECTURE.md`):
//!
//! - [`rt`]: the runtime substrate (loops, processes, kill and exit hooks,
//!   timers, fd readiness, futures/promises, blocking pool, executor, the
//!   deterministic simulator [`rt::Sim`]).
//! - [`accel`]: render/accel node discovery, sync_file and eventfd fences.
//! - [`batch`]: the manual page `xtc_batch(3)`: synchronous and asynchronous
//!   groups, cross-loop admission, placement helpers, router.
//!
//! The layers above it are crates of the same workspace: `xtc-trace` (the
//! Chrome trace / Perfetto writer), `xtc-dispatch` (batched doorbell
//! publication on an emulated NPU), `xtc-vk` (Vulkan compute through `ash`),
//! `xtc-model` (GGUF models on Vulkan and the CPU), `xtc-kvbatch` (the
//! KV-cache continuous-batching core), `xtc-replay` (`xtc decode`),
//! `xtc-serve` (`xtc serve`), `xtc-ci` (the device-in-the-loop CI runner) and `xtc-cli` (the `xtc`
//! command); `xtc-capi` is the C ABI of this crate.
//!
//! Clause ids (B-xxx) in these docs are sentences of the contract
//! `xtc_batch(3)`; its C ABI as built (the `xtc-capi` workspace crate,
//! `include/xtc_batch.h`) is the manual page `docs/man/xtc_batch.3`, and
//! `tests/CLAUSES.md` maps each id to the tests (Rust and C) that check it.
//!
//! Ownership rule: a group owns each submitted request `R` from submit until it
//! hands it back by value to `complete`; a failed submit hands it back in the
//! error.
//!
//! # A synchronous group on a loop: submit, iterate, complete
//!
//! Three requests, each counting down to zero; every iteration hands the
//! whole ready vector to the step, members leave DONE independently, and
//! `complete` gets each request back by value:
//!
//! ```
//! use std::cell::RefCell;
//! use std::rc::Rc;
//!
//! use xtc::batch::{CloseMode, Group, Item, StepResult, SyncOpts, step_fn};
//! use xtc::rt::Loop;
//!
//! # fn main() -> xtc::Result<()> {
//! let lp = Loop::new()?;
//! let finished = Rc::new(RefCell::new(Vec::new()));
//! let f = finished.clone();
//! let vectors = Rc::new(RefCell::new(Vec::new()));
//! let v = vectors.clone();
//! // The step: one iteration of every member of the ready vector at once.
//! let step = step_fn(move |items: &mut [Item<'_, u32>], results: &mut [StepResult]| {
//!     v.borrow_mut().push(items.len());
//!     for (item, result) in items.iter_mut().zip(results.iter_mut()) {
//!         *item.request -= 1;
//!         *result = if *item.request == 0 {
//!             StepResult::Done
//!         } else {
//!             StepResult::Continue
//!         };
//!     }
//!     Ok(())
//! });
//! let opts = SyncOpts {
//!     capacity: 8,          // waiting + active requests
//!     max_active: 4,        // members of a ready vector at most
//!     resource_capacity: 2, // units the active members may reserve together
//!     sched_class: None,
//! };
//! // `complete`: exactly once per accepted submit, with the request by value.
//! let group = Group::create(&lp, opts, step, move |_handle, left: u32, outcome: xtc::Result<()>| {
//!     f.borrow_mut().push((left, outcome));
//! })?;
//! for iterations in [3, 1, 2] {
//!     // A charge of 1 unit each: at most 2 requests are admitted at once.
//!     group.submit(iterations, 1).map_err(|e| e.error)?;
//! }
//! group.close(CloseMode::Drain)?; // no more submits; accepted work finishes
//! lp.run()?; // the group's driver iterates until it is drained
//! group.destroy()?;
//! assert_eq!(finished.borrow().len(), 3);
//! assert!(finished.borrow().iter().all(|(left, outcome)| *left == 0 && outcome.is_ok()));
//! // FCFS admission under the charge: [3, 1] first, 2 joins when 1 leaves.
//! assert_eq!(vectors.borrow()[0], 2);
//! assert_eq!(vectors.borrow().iter().sum::<usize>(), 3 + 1 + 2);
//! # Ok(())
//! # }
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod accel;
pub mod batch;
pub mod error;
pub mod rt;

pub use error::{Error, Result};
