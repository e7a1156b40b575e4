//! `xtc generate "prompt"`: one chat turn with the GGUF model on the Vulkan
//! device (or the CPU reference), streamed to stdout as tokens come.
//!
//! The prompt becomes a ChatML user turn (optionally after `--system`);
//! `--raw` sends the text as is, special tokens such as `<|im_start|>`
//! parsed. Generation stops at EOS (`<|im_end|>`), `--max-tokens` or the
//! context length. Timings (prefill and decode tokens/s) go to stderr,
//! `--json` prints one JSON object instead of the stream.
//!
//! Devices (`--device`, as `xtc decode`'s): `auto` runs on the Vulkan device
//! (a GPU if there is one, else lavapipe) and falls back to the CPU
//! reference when no Vulkan device can be opened; `cpu` forces the CPU
//! reference; an index, part of a name or a render node picks a Vulkan
//! device. The model runs as a [`Stream`] either way
//! (`decode::model::stream`).
//!
//! Exit status: 0 done; 1 the model could not be found or loaded, the
//! device could not be opened, or the output could not be written; 2 a
//! usage error (bad option values, `--device toy` or an empty one, a prompt
//! that with `--max-tokens` needs more positions than the context length:
//! refused before the model runs, naming the lengths).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::device::{self, DeviceArg, DeviceFailure, Takes};
use xtc_model::cpu::llama::{ForwardError, Llama};
use xtc_model::generate::{GenerateStats, PREFILL_CHUNK, generate_on};
use xtc_model::open::{ModelSpec, StreamLimits, Target, open_stream};
use xtc_model::stream::{Stream, StreamError};
use xtc_model::text::bpe::{Bpe, TextStream};
use xtc_model::text::chat::{self, Message};
use xtc_model::text::sampling::{Sampler, SamplingParams};
use xtc_model::vulkan::ops::Variant;
use xtc_model::{MODEL_FILE, find_model};

/// Arguments of `xtc generate`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
The model is the GGUF file at $XDG_CACHE_HOME/xtc/ (default ~/.cache/xtc/) \
named SmolLM2-135M-Instruct.Q4_1.gguf, fetched by scripts/fetch-model.sh, \
unless --model is given.

Devices: auto (the default) runs on the Vulkan device if one can be opened \
(a GPU, else lavapipe), else on the CPU reference; cpu forces the CPU \
reference; an index, part of a name or a render node picks a Vulkan device \
(xtc probe lists them).

Exit status: 0 done; 1 model missing or unreadable, device not usable, or \
output not writable; 2 usage error (bad option value, --device toy or empty, \
prompt + --max-tokens longer than the context length: refused before the \
model runs).

Examples:
  xtc generate \"What is the capital of France?\"
  xtc generate --temperature 0.7 --top-p 0.9 --seed 3 \"Write a haiku about rust\"
  echo \"What is the capital of France?\" | xtc generate -
  xtc generate --raw \"<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n\"")]
pub struct GenerateArgs {
    /// The user's message (with --raw: the whole prompt text); `-` reads it
    /// from standard input (UTF-8).
    pub prompt: String,
    /// GGUF model file (default: the fetched SmolLM2-135M-Instruct in the cache directory).
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// `auto` (the default: the first Vulkan device, a GPU if present, else lavapipe; the CPU
    /// reference when no Vulkan device opens), `cpu` (the CPU reference, no Vulkan), or a Vulkan
    /// device index, part of its name or its render node (`xtc probe` lists them).
    #[arg(long, value_name = "DEV", default_value = "auto", value_parser = crate::device::parse)]
    pub device: DeviceArg,
    /// Kernel form on a Vulkan device: `auto` (by what the device supports and a
    /// measured barrier probe), `gpu` (workgroup memory and barriers; needs no subgroups)
    /// or `cpu` (barrier-free, subgroups of at least 8 lanes); forcing one tests it on any
    /// device that can run it.
    #[arg(long, value_name = "FORM", value_enum, default_value_t = KernelForm::Auto)]
    pub kernels: KernelForm,
    /// Most tokens to generate (EOS included).
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_tokens: usize,
    /// Send the prompt as is (no chat template); special tokens in it are parsed.
    #[arg(long)]
    pub raw: bool,
    /// A system message before the user's (chat template only).
    #[arg(long, value_name = "TEXT", conflicts_with = "raw")]
    pub system: Option<String>,
    /// Sampling temperature; 0 is greedy (the default).
    #[arg(
        long,
        value_name = "T",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub temperature: f32,
    /// Keep the K most probable tokens (0: all).
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P (1: all).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub top_p: f32,
    /// Drop tokens less probable than P times the most probable (0: none).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub min_p: f32,
    /// Seed of the sampler (same seed, same text).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// Threads of the CPU reference (default: one per core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Print one JSON object (text, token ids, timings) instead of streaming.
    #[arg(long)]
    pub json: bool,
}

/// A failed command: its message and exit status.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: i32,
    pub(crate) msg: String,
}

impl Failure {
    pub(crate) fn usage(msg: impl Into<String>) -> Failure {
        Failure {
            code: 2,
            msg: msg.into(),
        }
    }
    pub(crate) fn error(msg: impl ToString) -> Failure {
        Failure {
            code: 1,
            msg: msg.to_string(),
        }
    }
}

/// Usage checks shared by the GGUF commands, before anything loads:
/// `--device` is not `toy` ([`device::check`]), `--threads` is not 0.
pub(crate) fn check_options(device: &DeviceArg, threads: Option<usize>) -> Result<(), Failure> {
    device::check(device, Takes::ModelOnly).map_err(failure)?;
    if threads == Some(0) {
        return Err(Failure::usage("--threads 0: at least one thread is needed"));
    }
    Ok(())
}

/// Checks `--device` and `--threads`, finds and loads the model and its
/// tokenizer; `what` names the command in messages. Returns the model, the
/// tokenizer, the path and the thread pool to run in.
pub(crate) fn load(
    model: Option<&Path>,
    device: &DeviceArg,
    threads: Option<usize>,
) -> Result<(ModelSpec, Bpe, PathBuf, rayon::ThreadPool), Failure> {
    check_options(device, threads)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .build()
        .map_err(|e| Failure::error(format!("cannot start the thread pool: {e}")))?;
    let path = find_model(model).map_err(Failure::error)?;
    let m = Llama::load(&path).map_err(|e| Failure::error(format!("{}: {e}", path.display())))?;
    let t =
        Bpe::from_gguf(m.gguf()).map_err(|e| Failure::error(format!("{}: {e}", path.display())))?;
    if t.vocab_size() != m.config().shape.vocab_size {
        return Err(Failure::error(format!(
            "{}: the tokenizer has {} tokens, the model {}",
            path.display(),
            t.vocab_size(),
            m.config().shape.vocab_size
        )));
    }
    let name = path
        .file_name()
        .map_or_else(|| MODEL_FILE.into(), |n| n.to_string_lossy().into_owned());
    let spec = ModelSpec::Gguf {
        model: Arc::new(m),
        name,
    };
    Ok((spec, t, path, pool))
}

/// `--kernels`: which form of the kernels a Vulkan device runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelForm {
    /// By capability and the barrier probe (`GpuLlamaOptions::variant`
    /// `None`, `xtc_model::vulkan::form`).
    Auto,
    /// The GPU form ([`Variant::Gpu`]).
    Gpu,
    /// The CPU-device form ([`Variant::Cpu`]).
    Cpu,
}

impl KernelForm {
    /// The variant this forces, `None` for `auto`.
    pub fn variant(self) -> Option<Variant> {
        match self {
            KernelForm::Auto => None,
            KernelForm::Gpu => Some(Variant::Gpu),
            KernelForm::Cpu => Some(Variant::Cpu),
        }
    }
}

/// Opens `--device` for the GGUF command `what` ([`device::open`]: `auto`
/// falls back to the CPU reference, `toy` is a usage error).
pub(crate) fn open_device(arg: &DeviceArg, what: &str) -> Result<Target, Failure> {
    device::open(arg, what, Takes::ModelOnly).map_err(failure)
}

/// A `--device` failure as the command's.
fn failure(e: DeviceFailure) -> Failure {
    match e {
        DeviceFailure::Usage(m) => Failure::usage(m),
        DeviceFailure::Error(m) => Failure::error(m),
    }
}

/// A stream of `spec` on `target` through the front door
/// ([`open_stream`]) for sequences of at most `context` positions, at
/// most `max_rows` token rows and `logit_rows` logits rows per plan on a
/// Vulkan device.
pub(crate) fn stream<'m>(
    target: &Target,
    spec: &'m ModelSpec,
    context: usize,
    (max_rows, logit_rows): (usize, usize),
    form: KernelForm,
) -> Result<Box<dyn Stream + Send + 'm>, Failure> {
    let limits = StreamLimits {
        context,
        max_rows,
        logit_rows,
        kernels: form.variant(),
    };
    open_stream(spec, target, limits).map_err(Failure::error)
}

/// Runs `xtc generate`, streaming the answer to `out` (timings to stderr);
/// returns the exit status.
pub fn run(args: &GenerateArgs, out: &mut dyn Write) -> i32 {
    match run_inner(args, out) {
        Ok(()) => 0,
        Err(f) => {
            eprintln!("xtc generate: error: {}", f.msg);
            f.code
        }
    }
}

/// The prompt's text: `arg` itself, or for `-` all of `stdin` (one trailing
/// newline dropped, as a shell's `echo` adds it).
///
/// # Errors
/// An unreadable or non-UTF-8 standard input (exit 1).
fn prompt_text(arg: &str, stdin: &mut dyn std::io::Read) -> Result<String, Failure> {
    if arg != "-" {
        return Ok(arg.to_string());
    }
    let mut bytes = Vec::new();
    stdin
        .read_to_end(&mut bytes)
        .map_err(|e| Failure::error(format!("cannot read the prompt from standard input: {e}")))?;
    let mut text = String::from_utf8(bytes).map_err(|e| {
        Failure::error(format!(
            "the prompt on standard input is not UTF-8 (byte {})",
            e.utf8_error().valid_up_to()
        ))
    })?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(text)
}

fn run_inner(args: &GenerateArgs, out: &mut dyn Write) -> Result<(), Failure> {
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        seed: args.seed,
    };
    let mut sampler = Sampler::new(params)
        .map_err(|e| Failure::usage(format!("--{}", e.to_string().replace('_', "-"))))?;
    let text = prompt_text(&args.prompt, &mut std::io::stdin().lock())?;
    let t_load = Instant::now();
    let (model, tok, path, pool) = load(args.model.as_deref(), &args.device, args.threads)?;
    let target = open_device(&args.device, "xtc generate")?;
    let prompt = if args.raw {
        tok.encode_with_specials(&text)
    } else {
        let mut msgs = Vec::new();
        if let Some(s) = &args.system {
            msgs.push(Message {
                role: "system",
                content: s,
            });
        }
        msgs.push(Message {
            role: "user",
            content: &text,
        });
        chat::chatml(&tok, &msgs, true).map_err(Failure::error)?
    };
    let dropped = tok.uncovered_in(&text);
    if !dropped.is_empty() {
        eprintln!(
            "xtc generate: warning: {} byte(s) of the prompt have no token in the vocabulary and were dropped: {:02x?}",
            dropped.len(),
            dropped
        );
    }
    let name = path
        .file_name()
        .map_or_else(|| MODEL_FILE.into(), |n| n.to_string_lossy());
    // Refused before any work: prompt + --max-tokens against the positions
    // the device holds for this model.
    let capacity = target.context(model.shape().seq_len);
    check_fits(prompt.len(), args.max_tokens, capacity, &target)?;
    let context = prompt.len().saturating_add(args.max_tokens);
    let mut dev_stream = stream(&target, &model, context, (PREFILL_CHUNK, 1), args.kernels)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let device = match target {
        Target::Cpu => format!("the CPU reference ({} threads)", pool.current_num_threads()),
        _ => dev_stream.device(),
    };
    eprintln!(
        "xtc generate: {name} on {device}, loaded in {load_s:.2} s; {} prompt tokens",
        prompt.len()
    );
    let mut ids = Vec::new();
    let mut stream = TextStream::new();
    let mut text = String::new();
    let mut write_err = None;
    let eos = tok.eos();
    // The model runs on the pool (its products on all its threads); ids come
    // back over a channel and are written here as they arrive. A failed write
    // drops the receiver, which stops the generation at its next token.
    let result = std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let (dev, prompt, sampler, pool) = (&mut dev_stream, &prompt, &mut sampler, &pool);
        let worker = s.spawn(move || {
            pool.install(|| {
                generate_on(
                    dev.as_mut(),
                    prompt,
                    args.max_tokens,
                    &[eos],
                    sampler,
                    |id| tx.send(id).is_ok(),
                )
            })
        });
        for id in rx {
            ids.push(id);
            if id == eos || write_err.is_some() {
                continue;
            }
            let piece = stream.push(tok.token_bytes(id));
            text.push_str(&piece);
            if !args.json
                && let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush())
            {
                write_err = Some(e);
                break;
            }
        }
        worker.join().expect("the generation thread does not panic")
    });
    if let Some(e) = write_err {
        return Err(Failure::error(format!("cannot write the output: {e}")));
    }
    let stats = result.map_err(|e| match e {
        StreamError::Forward(ForwardError::ContextFull { .. }) => {
            Failure::usage(format!("the prompt does not fit: {e}"))
        }
        e => Failure::error(e),
    })?;
    let tail = stream.finish();
    text.push_str(&tail);
    if args.json {
        let v = serde_json::json!({
            "model": path.display().to_string(),
            "device": match target {
                Target::Cpu => "cpu".to_string(),
                _ => dev_stream.device(),
            },
            "threads": pool.current_num_threads(),
            "prompt_ids": prompt,
            "ids": ids,
            "text": text,
            "stats": stats,
            "prefill_tokens_per_s": stats.prefill_tokens_per_s(),
            "decode_tokens_per_s": stats.decode_tokens_per_s(),
        });
        writeln!(out, "{v:#}")
            .map_err(|e| Failure::error(format!("cannot write the output: {e}")))?;
    } else {
        writeln!(out, "{tail}")
            .and_then(|_| out.flush())
            .map_err(|e| Failure::error(format!("cannot write the output: {e}")))?;
    }
    eprintln!("xtc generate: {}", summary(&stats));
    Ok(())
}

/// Positions a sequence of `prompt` tokens needs to generate `max_tokens`
/// more: the prompt's, then one per generated token but the last (whose
/// position is never computed).
fn positions_needed(prompt: usize, max_tokens: usize) -> usize {
    prompt.saturating_add(max_tokens.saturating_sub(1))
}

/// Refuses (exit 2, naming the lengths) a prompt that, with `max_tokens`,
/// needs more positions than `capacity`, the context length `target` holds
/// for the model, before the stream is built or any position computed.
fn check_fits(
    prompt: usize,
    max_tokens: usize,
    capacity: usize,
    target: &Target,
) -> Result<(), Failure> {
    let need = positions_needed(prompt, max_tokens);
    if need <= capacity {
        return Ok(());
    }
    let on = match target {
        Target::Vulkan(_) if target.is_cpu_device() => {
            " on a CPU-kind Vulkan device (--device cpu holds the model's full context)"
        }
        _ => "",
    };
    let hint = if prompt < capacity {
        format!(
            "lower --max-tokens to at most {} or shorten the prompt",
            capacity - prompt + 1
        )
    } else {
        "shorten the prompt".to_string()
    };
    Err(Failure::usage(format!(
        "the prompt does not fit: {prompt} prompt tokens + --max-tokens {max_tokens} need \
         {need} positions, but the context length is {capacity}{on}; {hint}"
    )))
}

/// The stderr line of a run's timings.
fn summary(s: &GenerateStats) -> String {
    let decode = if s.decode_steps > 0 {
        format!(
            "{:.1} tokens/s decode ({} steps in {:.2} s)",
            s.decode_tokens_per_s(),
            s.decode_steps,
            s.decode.as_secs_f64()
        )
    } else {
        "no decode step".into()
    };
    format!(
        "{} tokens generated, stop: {:?}; prefill {:.1} tokens/s ({} tokens in {:.2} s); {decode}",
        s.generated_tokens,
        s.stop,
        s.prefill_tokens_per_s(),
        s.prompt_tokens,
        s.prefill.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::{Target, check_fits, positions_needed, prompt_text};

    #[test]
    fn prompt_and_max_tokens_are_checked_against_the_context() {
        assert_eq!(positions_needed(10, 1), 10);
        assert_eq!(positions_needed(10, 0), 10);
        assert_eq!(positions_needed(10, 5), 14);
        assert_eq!(positions_needed(usize::MAX, 5), usize::MAX);
        assert!(check_fits(8000, 193, 8192, &Target::Cpu).is_ok());
        let e = check_fits(8000, 194, 8192, &Target::Cpu).unwrap_err();
        assert_eq!(e.code, 2);
        assert_eq!(
            e.msg,
            "the prompt does not fit: 8000 prompt tokens + --max-tokens 194 need 8193 \
             positions, but the context length is 8192; lower --max-tokens to at most 193 \
             or shorten the prompt"
        );
        let e = check_fits(9010, 256, 8192, &Target::Cpu).unwrap_err();
        assert_eq!(e.code, 2);
        assert!(
            e.msg
                .contains("9010 prompt tokens + --max-tokens 256 need 9265 positions")
                && e.msg
                    .ends_with("context length is 8192; shorten the prompt"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn a_dash_reads_the_prompt_from_stdin_without_its_last_newline() {
        let mut none: &[u8] = b"unused";
        assert_eq!(prompt_text("Hi there", &mut none).unwrap(), "Hi there");
        let mut input: &[u8] = b"line one\nline two\r\n";
        assert_eq!(prompt_text("-", &mut input).unwrap(), "line one\nline two");
        let mut bad: &[u8] = b"ok \xff no";
        let e = prompt_text("-", &mut bad).unwrap_err();
        assert_eq!(e.code, 1);
        assert!(e.msg.contains("not UTF-8 (byte 3)"), "{}", e.msg);
    }
}
