//! `batch` layer: see docs/ARCHITECTURE.md. (Filled by its issue.)

// Cross-loop admission (issue 8): the lock-free ring, its pools and the loom facade.
pub(crate) mod ring;
mod sync_facade;
