//! `cli` layer: the `xtc` command.
//!
//! One file per subcommand; this file only declares the subcommands and
//! dispatches. To add one (e.g. `xtc decode`): a module with an `Args` struct
//! and `run(&Args, &mut dyn Write) -> i32`, a variant below, and its match arm.
#![deny(unsafe_code)]
#![warn(missing_docs)]

use std::ffi::OsString;
use std::io::Write;

use clap::{Parser, Subcommand};

pub mod calibrate;
pub mod ci;
pub mod decode;
pub mod device;
pub mod generate;
pub mod metrics_server;
pub mod out_file;
pub mod perplexity;
pub mod probe;
pub mod serve;
pub mod tokenizer;

/// `xtc`: bounded continuous batching for accelerator work.
#[derive(Debug, Parser)]
#[command(name = "xtc", version, about)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once per process; boxing would buy nothing"
)]
pub enum Command {
    /// List render and accel nodes: driver, PCI address, NUMA node, and the
    /// executor loop each would be placed on.
    Probe(probe::ProbeArgs),
    /// KV-cache continuous batching of a replayed production trace (the main
    /// job): a llama-style model on the default Vulkan device.
    Decode(decode::DecodeArgs),
    /// Measure the GGUF model's iteration cost on a device (fixed, per token
    /// row, per KV position read): a least-squares fit over designed
    /// iterations, written as JSON for `xtc decode --toy-cost FILE`.
    Calibrate(calibrate::CalibrateArgs),
    /// One chat turn with the GGUF model (SmolLM2-135M-Instruct) on the
    /// default Vulkan device (or the CPU reference), streamed as tokens come;
    /// tokens/s on stderr.
    Generate(generate::GenerateArgs),
    /// Mean negative log-likelihood and perplexity of the GGUF model over a
    /// text file.
    Perplexity(perplexity::PerplexityArgs),
    /// An OpenAI-compatible HTTP server (completions, chat, streaming,
    /// tokenize, metrics) on the batch engine with the GGUF model.
    Serve(serve::ServeArgs),
    /// The GGUF model's tokenizer as a Hugging Face tokenizer directory
    /// (`xtc tokenizer export DIR`), for load clients such as aiperf.
    Tokenizer(tokenizer::TokenizerArgs),
    /// Device-in-the-loop CI: suites of kernel, fence, batch, dispatch,
    /// decode and perf cases in child processes, judged against baselines.
    Ci(ci::CiArgs),
}

/// Entry point of the `xtc` binary; returns the process exit status.
pub fn main() -> i32 {
    run(std::env::args_os(), &mut std::io::stdout().lock())
}

/// Parses `args` (program name first) and runs the subcommand, writing its
/// report to `out`. Usage errors print clap's message and give status 2 (3
/// for `xtc ci`, whose 2 means "only improvements");
/// `--help`/`--version` print and give 0.
pub fn run<I, T>(args: I, out: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // `xtc ci run` gives 2 to "only improvements": its usage errors are 3.
            let ci = args.get(1).is_some_and(|a| a == "ci");
            return if ci && e.use_stderr() {
                xtc_ci::status::EXIT_USAGE
            } else {
                e.exit_code()
            };
        }
    };
    // A process that saw a Vulkan validation error exits with status 1
    // (`vk::fail_process_on_validation_errors`); `xtc ci` children judge
    // them case by case instead.
    match &cli.command {
        Command::Probe(args) => probe::run(args, out),
        Command::Decode(args) => decode::run(args, out),
        Command::Calibrate(args) => calibrate::run(args, out),
        Command::Generate(args) => generate::run(args, out),
        Command::Perplexity(args) => perplexity::run(args, out),
        Command::Serve(args) => serve::run(args, out),
        Command::Tokenizer(args) => tokenizer::run(args, out),
        Command::Ci(args) => ci::run(args, out),
    }
}
