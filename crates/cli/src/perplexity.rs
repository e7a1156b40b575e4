//! `xtc perplexity FILE`: the GGUF model's mean negative log-likelihood
//! (nats per token) and perplexity over a text file, on the Vulkan device
//! or the CPU reference (`--device`, as `xtc generate`'s: `auto` is the
//! Vulkan device if one opens, else the CPU reference).
//!
//! The file (UTF-8) is encoded as plain text (no chat template, no BOS:
//! SmolLM2 adds none) and scored in windows of `--ctx` tokens, each from a
//! fresh sequence: every token but a window's first is predicted from the
//! window before it. A uniform guess over the vocabulary would score
//! `ln(vocab)` (10.80 nats for 49152 tokens); the report prints both.
//!
//! Exit status: 0 done; 1 the model or the file could not be read, or the
//! text has fewer than 2 tokens; 2 a usage error.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use super::generate::{Failure, KernelForm, check_options, load, open_device, stream};
use xtc_model::open::{CPU_DEVICE_CONTEXT, Target};
use xtc_model::stream::{SCORE_STEP, nll};

/// Default window length in tokens.
pub const DEFAULT_CTX: usize = 512;

/// Arguments of `xtc perplexity`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
Exit status: 0 done; 1 model or file unreadable, or fewer than 2 tokens; 2 usage error.

Example (the public-domain paragraph shipped for this check):
  xtc perplexity data/pride_and_prejudice_ch1.txt")]
pub struct PerplexityArgs {
    /// UTF-8 text file to score.
    pub file: PathBuf,
    /// GGUF model file (default: the fetched SmolLM2-135M-Instruct in the cache directory).
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// `auto` (the default: the first Vulkan device, a GPU if present, else lavapipe; the CPU
    /// reference when no Vulkan device opens), `cpu` (the CPU reference, no Vulkan), or a Vulkan
    /// device index, part of its name or its render node (`xtc probe` lists them).
    #[arg(long, value_name = "DEV", default_value = "auto", value_parser = crate::device::parse)]
    pub device: crate::device::DeviceArg,
    /// Kernel form on a Vulkan device: `auto` (by what the device supports and a
    /// measured barrier probe), `gpu` or `cpu` (as `xtc generate --kernels`).
    #[arg(long, value_name = "FORM", value_enum, default_value_t = KernelForm::Auto)]
    pub kernels: KernelForm,
    /// Tokens per window (at least 2, at most the model's context length).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CTX)]
    pub ctx: usize,
    /// Threads of the CPU reference (default: one per core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `xtc perplexity`, writing the result to `out` (progress to stderr);
/// returns the exit status.
pub fn run(args: &PerplexityArgs, out: &mut dyn Write) -> i32 {
    match run_inner(args, out) {
        Ok(()) => 0,
        Err(f) => {
            eprintln!("xtc perplexity: error: {}", f.msg);
            f.code
        }
    }
}

fn run_inner(args: &PerplexityArgs, out: &mut dyn Write) -> Result<(), Failure> {
    check_options(&args.device, args.threads)?;
    if args.ctx < 2 {
        return Err(Failure::usage(format!(
            "--ctx {}: a window needs at least 2 tokens",
            args.ctx
        )));
    }
    let bytes = std::fs::read(&args.file)
        .map_err(|e| Failure::error(format!("cannot read {}: {e}", args.file.display())))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        Failure::error(format!(
            "{}: not UTF-8 (first bad byte at offset {})",
            args.file.display(),
            e.utf8_error().valid_up_to()
        ))
    })?;
    let (model, tok, path, pool) = load(args.model.as_deref(), &args.device, args.threads)?;
    let max = model.shape().seq_len;
    if args.ctx > max {
        return Err(Failure::usage(format!(
            "--ctx {}: above the model's context length {max}",
            args.ctx
        )));
    }
    let target = open_device(&args.device, "xtc perplexity")?;
    if let Target::Vulkan(d) = &target
        && target.is_cpu_device()
        && args.ctx > CPU_DEVICE_CONTEXT
    {
        return Err(Failure::usage(format!(
            "--ctx {}: above the {} positions a sequence may hold on the CPU device {} \
             (use --device cpu, or a smaller --ctx)",
            args.ctx,
            CPU_DEVICE_CONTEXT,
            d.info().name
        )));
    }
    let mut dev_stream = stream(
        &target,
        &model,
        args.ctx,
        (SCORE_STEP, SCORE_STEP),
        args.kernels,
    )?;
    let ids = tok.encode(&text);
    let dropped = tok.uncovered_in(&text).len();
    if dropped > 0 {
        eprintln!(
            "xtc perplexity: warning: {dropped} byte(s) have no token in the vocabulary and were dropped"
        );
    }
    if ids.len() < 2 {
        return Err(Failure::error(format!(
            "{}: {} token(s); at least 2 are needed",
            args.file.display(),
            ids.len()
        )));
    }
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::new(0)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} tokens scored, {per_sec}, eta {eta}")
            .expect("valid template"),
    );
    let t0 = Instant::now();
    let nll = pool
        .install(|| {
            nll(dev_stream.as_mut(), &ids, args.ctx, |done, total| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            })
        })
        .map_err(Failure::error)?;
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let vocab = model.shape().vocab_size;
    let uniform = (vocab as f64).ln();
    let windows = ids.len().div_ceil(args.ctx);
    let w = |r: std::io::Result<()>| {
        r.map_err(|e| Failure::error(format!("cannot write the output: {e}")))
    };
    if args.json {
        let v = serde_json::json!({
            "file": args.file.display().to_string(),
            "model": path.display().to_string(),
            "device": dev_stream.device(),
            "tokens": ids.len(),
            "scored": nll.tokens,
            "windows": windows,
            "ctx": args.ctx,
            "mean_nll": nll.mean(),
            "perplexity": nll.perplexity(),
            "uniform_nll": uniform,
            "seconds": secs,
        });
        w(writeln!(out, "{v:#}"))?;
    } else {
        w(writeln!(
            out,
            "{}: {} tokens, {} scored in {windows} window(s) of at most {}\n\
             mean NLL {:.4} nats/token, perplexity {:.2} (a uniform guess over {vocab} tokens: {:.4} nats)\n\
             {:.1} s ({:.1} tokens/s)",
            args.file.display(),
            ids.len(),
            nll.tokens,
            args.ctx,
            nll.mean(),
            nll.perplexity(),
            uniform,
            secs,
            ids.len() as f64 / secs
        ))?;
    }
    Ok(())
}
