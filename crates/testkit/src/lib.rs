//! Test support for the workspace's own tests (`publish = false`): what two
//! or more crates' tests share lives here, instead of `#[path]` includes of
//! another crate's test files.
//!
//! - [`layout`]: the import-rule checker of the layout tests (which layer
//!   or module each path in a source file names).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod layout;
