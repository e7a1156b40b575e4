//! `cli` layer: the `xtc` command (`xtc probe`, `xtc decode`, ...).

use clap::{Parser, Subcommand};

pub mod decode;

/// `xtc`: bounded continuous batching for accelerator work.
#[derive(Debug, Parser)]
#[command(name = "xtc", version, about)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands of `xtc`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// KV-cache continuous batching of a replayed production trace (the main job).
    Decode(decode::DecodeArgs),
}

/// Entry point of the `xtc` binary; returns the process exit status.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match &cli.command {
        Command::Decode(args) => decode::run(args),
    }
}
