//! `batch` layer: see docs/ARCHITECTURE.md. (Filled by its issue.)

pub mod placement;
pub mod router;

pub use placement::{LoopNodes, loop_for, place};
pub use router::Router;
