//! `batch` layer: see docs/ARCHITECTURE.md. (Filled by its issue.)

pub mod placement;
pub mod router;

pub use placement::{LoopNodes, loop_for, loop_for_device, place};
pub use router::Router;
