//! The suites: each module registers its cases with a `cases(&mut Vec<Case>)`
//! function (see the parent module's "Adding cases").

pub mod batch;
pub mod decode;
pub mod dispatch;
pub mod fence;
pub mod kernels;
pub mod perf;
pub mod selftest;
pub mod smollm;
