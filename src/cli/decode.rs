//! `xtc decode`: KV-cache continuous batching of a trace-replayed workload.
//!
//! With no arguments: the seeded synthetic model ([`Config::tiny`]), the
//! embedded slice of the Azure LLM inference conversation trace (arrivals
//! sped up by [`DEFAULT_TIME_SCALE`], lengths scaled down on CPU devices),
//! on the default device; prints the report. See `xtc decode --help`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::decode::backend::{CpuModel, ToyModel, VulkanModel};
use crate::decode::checkpoint;
use crate::decode::job::{self, JobOpts, Mode, Progress, RunOutput, SharedModel, Workload};
use crate::decode::model::{Config, KvGeometry, Weights};
use crate::decode::report::{Comparison, Report, chrome_trace};
use crate::decode::tokenizer::{self, Tokenizer};
use crate::decode::trace::{self, Scaling, Trace};
use crate::vk;

/// Default speed-up of the trace's arrival clock.
pub const DEFAULT_TIME_SCALE: f64 = 8.0;

/// Largest `--max-active`: a ready vector of more members than this is refused
/// up front (the group's and the device's per-member storage would not fit).
pub const MAX_ACTIVE_LIMIT: usize = 1 << 20;

/// Default number of requests replayed.
pub const DEFAULT_REQUESTS: usize = 512;

/// Length scaling on CPU devices: prompt / 32 (the trace's median prompt of
/// ~1,000 tokens becomes ~32), output / 4 (median ~240 becomes ~60), each
/// capped at 128 tokens (half the default model's 256 positions).
pub const CPU_SCALING: Scaling = Scaling {
    time_scale: DEFAULT_TIME_SCALE,
    prompt_div: 32,
    output_div: 4,
    max_prompt: 128,
    max_output: 128,
};

/// Arguments of `xtc decode`.
#[derive(Debug, Clone, clap::Args)]
pub struct DecodeArgs {
    /// llama2.c checkpoint to run instead of the synthetic model.
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// llama2.c tokenizer.bin: print sample outputs as text.
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<PathBuf>,
    /// Trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens) instead of the embedded Azure slice.
    /// TIMESTAMP is `YYYY-MM-DD HH:MM:SS[.f]` (optionally with a `+00:00`/`Z`
    /// suffix) or plain seconds; rows must be in time order (an earlier row is
    /// an error naming its line).
    #[arg(long, value_name = "PATH")]
    pub trace: Option<PathBuf>,
    /// Requests to replay (the trace's first rows; a warning if the trace has fewer).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_REQUESTS)]
    pub requests: usize,
    /// Speed-up of the arrival clock (2 replays twice as fast).
    #[arg(long, value_name = "X", default_value_t = DEFAULT_TIME_SCALE, allow_negative_numbers = true)]
    pub time_scale: f64,
    /// Members in the ready vector at most (1 to 1048576).
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub max_active: usize,
    /// Blocks in the KV cache, at most 4294967295 (default: enough for max-active requests of the longest scaled length).
    #[arg(long, value_name = "N")]
    pub kv_blocks: Option<usize>,
    /// Positions per KV block.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub block_size: usize,
    /// Token rows per iteration (prefill chunks + one per decoding member).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub token_budget: usize,
    /// Device: `auto` (a GPU if present, else lavapipe), a Vulkan device index, name or render node, `cpu` (the CPU reference, no Vulkan) or `toy` (no model: measures the batching alone).
    #[arg(long, value_name = "DEV", default_value = "auto")]
    pub device: String,
    /// Seed of the synthetic weights, prompts and cancellations.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Write a Chrome trace / Perfetto JSON of iterations and requests (with
    /// `--compare`: of the continuous run only). The file is created before the
    /// run (an existing one is kept as is until the run succeeds).
    #[arg(long, value_name = "FILE")]
    pub trace_out: Option<PathBuf>,
    /// Fraction of requests whose client cancels after a random number of tokens.
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub cancel_rate: f64,
    /// Run continuous, static and one-at-a-time batching on the same workload and print ratios
    /// (`--trace-out` then traces the continuous run only).
    #[arg(long)]
    pub compare: bool,
    /// Divide prompt lengths by this (default: 32 on CPU devices, 1 on GPUs).
    #[arg(long, value_name = "N")]
    pub prompt_div: Option<usize>,
    /// Divide output lengths by this (default: 4 on CPU devices, 1 on GPUs).
    #[arg(long, value_name = "N")]
    pub output_div: Option<usize>,
}

/// Runs `xtc decode`, writing the report to `out` (progress and the banner go
/// to stderr); returns the exit status (0 ok, 1 error).
pub fn run(args: &DecodeArgs, out: &mut dyn Write) -> i32 {
    match run_inner(args, out) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("xtc decode: error: {e}");
            1
        }
    }
}

fn run_inner(args: &DecodeArgs, w: &mut dyn Write) -> Result<(), String> {
    check_args(args)?;
    let trace = match &args.trace {
        Some(p) => trace::load(p).map_err(|e| e.to_string())?,
        None => trace::embedded(),
    };
    let replayed = &trace.requests[..args.requests.min(trace.requests.len())];
    Scaling {
        time_scale: args.time_scale,
        ..Scaling::IDENTITY
    }
    .check_arrivals(replayed)?;
    if args.requests > trace.requests.len() {
        eprintln!(
            "xtc decode: warning: --requests {} but the trace has only {} rows: replaying {}",
            args.requests,
            trace.requests.len(),
            trace.requests.len()
        );
    }
    open_trace_out(args)?;
    let weights = load_weights(args)?;
    let config = weights.config;
    let device = DeviceChoice::open(&args.device)?;
    let scaling = scaling(args, &config, device.is_cpu());
    let wl = job::workload(
        &trace,
        args.requests,
        &scaling,
        config.vocab_size,
        args.seed,
        args.cancel_rate,
    );
    let opts = job_opts(args, &wl, &config);
    let tokenizer = load_tokenizer(args, &config)?;
    check_kv_size(args, &config, &opts, &device)?;
    let model = device.model(weights, &opts).map_err(|e| {
        format!(
            "{e} (buffers for --token-budget {} token rows and a ready vector of \
             --max-active {}; {})",
            opts.token_budget,
            opts.max_active,
            kv_origin(args, &opts)
        )
    })?;
    if !args.json {
        eprintln!(
            "{}",
            banner(args, &trace, &wl, &opts, &model.borrow().describe())
        );
    }
    if args.compare {
        return compare(args, &model, &wl, &opts, w);
    }
    let out = run_once(&model, &wl, &opts, !args.json)?;
    let report = Report::from_run(&out, wl.requests.len());
    let text = if args.json {
        serde_json::to_string_pretty(&report).map_err(|e| e.to_string())? + "\n"
    } else {
        report.render() + &tokenizer.map_or(String::new(), |t| samples(&t, &out))
    };
    // The report first: a late trace-file failure must not lose it.
    w.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    write_trace(args, &out)
}

/// Where the model runs (`--device`).
#[derive(Debug)]
pub enum DeviceChoice {
    /// A Vulkan device (`auto`: a GPU if present, else lavapipe).
    Vulkan(vk::Device),
    /// The CPU reference forward pass (no Vulkan).
    Cpu,
    /// The device-free toy model (measures the batching alone; tokens are hashes).
    Toy,
}

impl DeviceChoice {
    /// Opens `--device`: `cpu`, `toy`, or a Vulkan selector (`auto`, an
    /// index, a render node path, or part of the device name).
    ///
    /// # Errors
    /// The Vulkan backend's message (no loader, no device, no match).
    pub fn open(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(DeviceChoice::Cpu),
            "toy" => Ok(DeviceChoice::Toy),
            sel => {
                let sel: vk::Selector = sel.parse().map_err(|e| format!("--device {s}: {e}"))?;
                let dev = vk::Device::open(&sel).map_err(|e| device_error(s, &e))?;
                Ok(DeviceChoice::Vulkan(dev))
            }
        }
    }

    /// Whether lengths are scaled down by default (everything but a GPU).
    pub fn is_cpu(&self) -> bool {
        match self {
            DeviceChoice::Vulkan(d) => d.info().kind == vk::DeviceKind::Cpu,
            _ => true,
        }
    }

    /// Loads the model on this device with a KV cache of `opts`' shape.
    ///
    /// # Errors
    /// The backend's message.
    pub fn model(&self, weights: Weights, opts: &JobOpts) -> Result<SharedModel, String> {
        let kv = KvGeometry {
            block_size: opts.block_size,
            n_blocks: opts.kv_blocks,
        };
        Ok(match self {
            DeviceChoice::Toy => job::shared(ToyModel::new(
                weights.config.vocab_size,
                kv.n_blocks,
                kv.block_size,
            )),
            DeviceChoice::Cpu => job::shared(CpuModel::new(weights, kv)),
            DeviceChoice::Vulkan(dev) => job::shared(
                VulkanModel::new(dev, &weights, kv, opts.token_budget, opts.max_active.max(1))
                    .map_err(|e| e.to_string())?,
            ),
        })
    }
}

fn load_weights(args: &DecodeArgs) -> Result<Weights, String> {
    match &args.model {
        Some(p) => checkpoint::load(p).map_err(|e| e.to_string()),
        None => Ok(Weights::synthetic(Config::tiny(), args.seed)),
    }
}

fn check_args(args: &DecodeArgs) -> Result<(), String> {
    if args.requests == 0 {
        return Err("--requests must be at least 1".into());
    }
    if !(args.time_scale > 0.0 && args.time_scale.is_finite()) {
        return Err(format!(
            "--time-scale must be a positive number, not {}",
            args.time_scale
        ));
    }
    if !(0.0..=1.0).contains(&args.cancel_rate) {
        return Err(format!(
            "--cancel-rate must be in 0..=1, not {}",
            args.cancel_rate
        ));
    }
    for (name, v) in [
        ("--max-active", args.max_active),
        ("--block-size", args.block_size),
        ("--token-budget", args.token_budget),
        ("--kv-blocks", args.kv_blocks.unwrap_or(1)),
        ("--prompt-div", args.prompt_div.unwrap_or(1)),
        ("--output-div", args.output_div.unwrap_or(1)),
    ] {
        if v == 0 {
            return Err(format!("{name} must be at least 1, not 0"));
        }
    }
    if args.max_active > MAX_ACTIVE_LIMIT {
        return Err(format!(
            "--max-active {} is more than the {MAX_ACTIVE_LIMIT} members a ready vector may hold",
            args.max_active
        ));
    }
    if args.tokenizer.is_some() && args.model.is_none() {
        return Err("--tokenizer needs --model (the synthetic model has no vocabulary)".into());
    }
    Ok(())
}

/// The length scaling for the device: CPU devices get [`CPU_SCALING`]'s
/// divisors unless overridden; lengths are capped so `prompt + output` fits
/// the model's `seq_len`.
pub fn scaling(args: &DecodeArgs, config: &Config, is_cpu: bool) -> Scaling {
    let (pd, od) = if is_cpu {
        (CPU_SCALING.prompt_div, CPU_SCALING.output_div)
    } else {
        (1, 1)
    };
    let max_prompt = if is_cpu {
        CPU_SCALING.max_prompt
    } else {
        usize::MAX
    };
    let max_output = if is_cpu {
        CPU_SCALING.max_output
    } else {
        usize::MAX
    };
    let half = (config.seq_len / 2).max(1);
    Scaling {
        time_scale: args.time_scale,
        prompt_div: args.prompt_div.unwrap_or(pd).max(1),
        output_div: args.output_div.unwrap_or(od).max(1),
        max_prompt: max_prompt.min(config.seq_len.saturating_sub(half).max(1)),
        max_output: max_output.min(half),
    }
}

/// Job options from the arguments; the default KV cache holds `max_active`
/// requests of the workload's longest length.
pub fn job_opts(args: &DecodeArgs, wl: &Workload, config: &Config) -> JobOpts {
    let longest = wl
        .requests
        .iter()
        .map(|r| r.prompt.len() + r.output_tokens)
        .max()
        .unwrap_or(1)
        .min(config.seq_len);
    let per_req = longest.div_ceil(args.block_size.max(1));
    JobOpts {
        mode: Mode::Continuous,
        max_active: args.max_active,
        kv_blocks: args
            .kv_blocks
            .unwrap_or(per_req.saturating_mul(args.max_active.max(1))),
        block_size: args.block_size,
        token_budget: args.token_budget,
        stop_token: args.model.as_ref().map(|_| tokenizer::EOS),
    }
}

fn load_tokenizer(args: &DecodeArgs, config: &Config) -> Result<Option<Tokenizer>, String> {
    args.tokenizer
        .as_ref()
        .map(|p| Tokenizer::load(p, config.vocab_size).map_err(|e| e.to_string()))
        .transpose()
}

fn banner(args: &DecodeArgs, trace: &Trace, wl: &Workload, o: &JobOpts, device: &str) -> String {
    let name = args
        .trace
        .as_ref()
        .map_or(trace::EMBEDDED_NAME.to_string(), |p| {
            p.display().to_string()
        });
    let span = wl.requests.last().map_or(Duration::ZERO, |r| r.arrival);
    format!(
        "xtc decode: {} of {} requests from {name} (arrivals over {:.2} s at {}x), {device}\n\
         max-active {}, KV cache {} blocks x {} positions, token budget {}",
        wl.requests.len(),
        trace.requests.len(),
        span.as_secs_f64(),
        args.time_scale,
        o.max_active,
        o.kv_blocks,
        o.block_size,
        o.token_budget
    )
}

fn run_once(
    model: &SharedModel,
    wl: &Workload,
    opts: &JobOpts,
    show: bool,
) -> Result<RunOutput, String> {
    let bar = progress_bar(wl.requests.len() as u64, opts.mode, show);
    let b = bar.clone();
    let update = move |p: &Progress| {
        let rate = p.generated as f64 / p.elapsed.as_secs_f64().max(1e-9);
        b.set_position(p.done as u64);
        b.set_message(format!("active {:>3} | {rate:>7.1} tok/s", p.active));
    };
    let out = job::run(model, wl, opts, Box::new(update)).map_err(|e| e.to_string());
    bar.finish_and_clear();
    out
}

fn progress_bar(total: u64, mode: Mode, show: bool) -> ProgressBar {
    if !show || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style =
        ProgressStyle::with_template("{prefix:>14} [{bar:30}] {pos}/{len} requests | {msg}")
            .expect("valid template")
            .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(mode.name());
    bar
}

fn compare(
    args: &DecodeArgs,
    model: &SharedModel,
    wl: &Workload,
    opts: &JobOpts,
    w: &mut dyn Write,
) -> Result<(), String> {
    let t0 = Instant::now();
    let mut reports = Vec::new();
    let mut traced = None;
    for mode in [Mode::Continuous, Mode::Static, Mode::OneAtATime] {
        let o = JobOpts { mode, ..*opts };
        let out = run_once(model, wl, &o, !args.json)?;
        reports.push(Report::from_run(&out, wl.requests.len()));
        if mode == Mode::Continuous {
            traced = Some(out);
        }
    }
    let one = reports.pop().expect("three runs");
    let stat = reports.pop().expect("three runs");
    let cont = reports.pop().expect("three runs");
    let cmp = Comparison::new(cont, stat, one);
    let text = if args.json {
        serde_json::to_string_pretty(&cmp).map_err(|e| e.to_string())? + "\n"
    } else {
        format!(
            "{}{}(three runs in {:.1} s)\n",
            cmp.continuous.render(),
            cmp.render(),
            t0.elapsed().as_secs_f64()
        )
    };
    w.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    traced.map_or(Ok(()), |out| write_trace(args, &out))
}

/// Opens (creating it if missing, never truncating) the `--trace-out` file
/// before the run, so a bad path is reported before minutes of work rather
/// than after; an existing file keeps its content until the trace is written
/// after a successful run. A `--trace-out` that is one of the input files is
/// refused.
fn open_trace_out(args: &DecodeArgs) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let Some(path) = &args.trace_out else {
        return Ok(());
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| {
            format!(
                "--trace-out {}: cannot create the file: {e}",
                path.display()
            )
        })?;
    let Ok(out) = file.metadata() else {
        return Ok(());
    };
    let inputs = [
        ("--model", &args.model),
        ("--trace", &args.trace),
        ("--tokenizer", &args.tokenizer),
    ];
    for (opt, input) in inputs {
        let Some(input) = input else { continue };
        let same = std::fs::metadata(input)
            .is_ok_and(|m| m.is_file() && (m.dev(), m.ino()) == (out.dev(), out.ino()));
        if same {
            return Err(format!(
                "--trace-out {} is the {opt} file: it would be overwritten; write the trace elsewhere",
                path.display()
            ));
        }
    }
    Ok(())
}

fn write_trace(args: &DecodeArgs, out: &RunOutput) -> Result<(), String> {
    let Some(path) = &args.trace_out else {
        return Ok(());
    };
    let text = serde_json::to_string(&chrome_trace(out)).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| {
        format!(
            "--trace-out {}: cannot write the trace (the report above is complete): {e}",
            path.display()
        )
    })
}

/// The `--device` error as the user wrote the selector, with the Vulkan
/// devices that exist and a pointer to `xtc probe`.
fn device_error(sel: &str, e: &vk::VkError) -> String {
    let reason = match e {
        vk::VkError::NoMatch(_) => format!("no usable Vulkan device matches `{sel}`"),
        other => other.to_string(),
    };
    let list = match vk::enumerate() {
        Ok(devs) if devs.is_empty() => "no Vulkan devices found".to_string(),
        Ok(devs) => {
            let rows: Vec<String> = devs
                .iter()
                .map(|d| {
                    let node = d
                        .render_node
                        .as_ref()
                        .map_or(String::new(), |r| format!(", {}", r.path.display()));
                    format!("  {}: {} ({:?}{node})", d.index, d.name, d.kind)
                })
                .collect();
            format!("Vulkan devices here:\n{}", rows.join("\n"))
        }
        Err(e) => format!("cannot list Vulkan devices: {e}"),
    };
    format!(
        "--device {sel}: {reason}\n{list}\n\
         (use an index, part of a name, a render node, or `auto`, `cpu`, `toy`; \
         `xtc probe` shows the details)"
    )
}

/// Where the KV-cache size came from, for error messages.
fn kv_origin(args: &DecodeArgs, o: &JobOpts) -> String {
    let size = format!(
        "KV cache of {} blocks x {} positions",
        o.kv_blocks, o.block_size
    );
    match args.kv_blocks {
        Some(_) => format!("{size}, from --kv-blocks: lower it"),
        None => format!(
            "{size}, derived from --max-active {} x {} blocks per request: \
             lower --max-active or set --kv-blocks",
            o.max_active,
            o.kv_blocks / o.max_active.max(1)
        ),
    }
}

/// Bytes of the KV cache (keys and values, f32) of `opts` for `config`, or
/// `None` on overflow; the toy model keeps one u32 slot per position.
fn kv_bytes(config: &Config, o: &JobOpts, toy: bool) -> Option<u128> {
    let positions = (o.kv_blocks as u128).checked_mul(o.block_size as u128)?;
    if toy {
        return positions.checked_mul(4);
    }
    let per_pos = 2 * 4 * config.n_layers as u128 * config.kv_dim() as u128;
    positions.checked_mul(per_pos)
}

/// Rejects a KV cache that cannot fit: larger than the host's memory on CPU
/// devices (`cpu`, `toy`, lavapipe), or more blocks than 32-bit block ids
/// name, naming the option the size came from.
fn check_kv_size(
    args: &DecodeArgs,
    config: &Config,
    o: &JobOpts,
    dev: &DeviceChoice,
) -> Result<(), String> {
    let toy = matches!(dev, DeviceChoice::Toy);
    let limit = if dev.is_cpu() { host_memory() } else { None };
    match (kv_bytes(config, o, toy), limit) {
        (None, _) => Err(format!(
            "the KV cache is too large ({})",
            kv_origin(args, o)
        )),
        (Some(b), Some(max)) if b > max => Err(format!(
            "the KV cache needs {} MiB, more than this machine's {} MiB ({})",
            b >> 20,
            max >> 20,
            kv_origin(args, o)
        )),
        // Checked before the model allocates anything for the cache.
        _ if u32::try_from(o.kv_blocks).is_err() => Err(format!(
            "the KV cache has more than the {} blocks block ids can name ({})",
            u32::MAX,
            kv_origin(args, o)
        )),
        _ => Ok(()),
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn host_memory() -> Option<u128> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u128 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn samples(t: &Tokenizer, out: &RunOutput) -> String {
    let mut s = String::new();
    for f in out.finished.iter().take(3) {
        let prev = f.seq.prompt.last().copied().unwrap_or(tokenizer::BOS);
        let text = t.decode(prev, &f.seq.generated);
        s += &format!("  request {}: {text:?}\n", f.seq.id);
    }
    s
}
