//! `batch` layer: see docs/ARCHITECTURE.md. (Filled by its issue.)

// Cross-loop admission (issue 8): the lock-free ring, its pools and the loom facade.
#[allow(dead_code)] // until the group integrates it (issue 8, phase 2)
mod remote;
#[doc(hidden)]
pub mod ring; // public only for benches/ring.rs (bench_support)
mod sync_facade;
