//! The serving side of `decode`: the `xtc decode` job.
pub mod grouped;
pub mod job;
pub mod kv;
pub mod local;
pub mod report;
pub mod seq;
pub mod trace;
