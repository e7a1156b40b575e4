//! `cli` layer: the `xtc` command (`xtc probe`, `xtc decode`, ...).

/// Entry point of the `xtc` binary; returns the process exit status.
pub fn main() -> i32 {
    0
}
