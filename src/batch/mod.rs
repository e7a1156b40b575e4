//! `batch` layer: see docs/ARCHITECTURE.md. (Filled by its issue.)

// Cross-loop admission (issue 8): the lock-free ring, its pools and the loom facade.
#[doc(hidden)]
pub mod ring; // public only for benches/ring.rs (bench_support)
mod sync_facade;
