//! `xtc decode`: KV-cache continuous batching of a trace-replayed workload.
//!
//! With no arguments: the GGUF model (SmolLM2-135M-Instruct, see
//! [`source`]) with real-text prompts, the embedded slice of the
//! Azure LLM inference conversation trace (arrivals sped up by
//! [`args::DEFAULT_TIME_SCALE`], lengths scaled down and fewer requests on CPU
//! devices), on the default device; prints the report and three sample
//! completions. `--synthetic` runs the seeded synthetic model
//! ([`Config::tiny`]) instead. See `xtc decode --help`.

pub mod args;
pub mod compare;
pub mod config;
pub mod memory;
pub mod outputs;
pub mod render;
pub mod run;
pub mod source;
pub mod sweep;

pub use args::{
    DecodeArgs, EXIT_ERROR, EXIT_FAILED, EXIT_LEAK, EXIT_OK, EXIT_REJECTED, EXIT_STATUS_HELP,
    EXIT_USAGE,
};
pub use run::exit_status;

use std::io::Write;

use crate::device::{self, Takes};
use args::ToyCost;
use args::{CPU_SCALING, MAX_REPLAY, MODEL_CPU_SWEEP, SYNTHETIC_SWEEP};
use compare::{CompareRun, compare};
use config::ModelFacts;
use memory::{check_kv_size, check_memory, kv_origin, unfit_rows};
use outputs::{Observe, Outputs};
use render::{banner, render_samples, with_samples};
use run::{finish_status, run_once};
use source::Source;
use xtc_model::Config;
use xtc_model::cost::IterationCost;
use xtc_replay::calibrate::CostFile;
use xtc_replay::job::{JobOpts, Mode, Workload};
use xtc_replay::report::Report;
use xtc_replay::trace::{self, Scaling};

/// Runs `xtc decode`, writing the report to `out` (progress and the banner go
/// to stderr); returns the exit status ([`EXIT_OK`], [`EXIT_ERROR`],
/// [`EXIT_REJECTED`], [`EXIT_FAILED`], [`EXIT_LEAK`]; see [`EXIT_STATUS_HELP`]).
pub fn run(args: &DecodeArgs, out: &mut dyn Write) -> i32 {
    match run_inner(args, out) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtc decode: error: {e}");
            EXIT_ERROR
        }
    }
}

fn run_inner(args: &DecodeArgs, w: &mut dyn Write) -> Result<i32, String> {
    let trace = match &args.trace {
        Some(p) => trace::load(p).map_err(|e| e.to_string())?,
        None => trace::embedded(),
    };
    let rows = trace.requests.len();
    let outs = Outputs::prepare(args)?;
    let toy_cost = match &args.toy_cost {
        Some(ToyCost::Inline(c)) => *c,
        Some(ToyCost::File(p)) => CostFile::load(p)
            .map_err(|e| format!("--toy-cost: {e}"))?
            .iteration_cost(),
        None if args.sweep.is_some() => IterationCost::LAVAPIPE_TINY,
        None => IterationCost::NONE,
    };
    let device = device::open(&args.device, "xtc decode", Takes::Toy(toy_cost))
        .map_err(|e| e.to_string())?;
    let source = Source::load(args, &device)?;
    // `--sweep`'s defaults fit the model and device (`SweepDefaults`).
    let sweep_defaults = match source {
        Source::Gguf(_) if device.on_host() => MODEL_CPU_SWEEP,
        _ => SYNTHETIC_SWEEP,
    };
    let resolved;
    let args = if args.sweep.is_some() {
        resolved = sweep_defaults.apply(args);
        &resolved
    } else {
        args
    };
    let default_requests = if args.sweep.is_some() {
        sweep_defaults.requests
    } else {
        source.default_requests(device.on_host())
    };
    let requests = args.requests.unwrap_or(default_requests).min(rows);
    let replayed = &trace.requests[..requests];
    match &args.sweep {
        Some(rates) => rates
            .0
            .iter()
            .try_for_each(|&r| check_replay_at(args, replayed, r))?,
        None => check_replay(args, replayed)?,
    }
    if let Some(n) = args.requests.filter(|&n| n > rows) {
        eprintln!(
            "xtc decode: warning: --requests {n} but the trace has only {rows} rows: replaying {rows}"
        );
    }
    let config = source.config(&device);
    let parameters = source.parameters();
    let scaling = scaling(args, &config, device.on_host());
    let wl = source.workload(
        &trace,
        requests,
        &scaling,
        &config,
        args.seed,
        args.cancel_rate,
    )?;
    let opts = JobOpts {
        stop_token: source.stop_token(),
        ..job_opts(args, &wl, &config)
    };
    let opts = source.fit_kv(
        &device,
        &config,
        opts,
        args.kv_blocks.is_some(),
        args.kernels.variant(),
    );
    check_kv_size(args, &config, &opts)?;
    check_memory(args, &config, source.weight_elems(), &opts, &device, &wl)?;
    if let Some(m) = unfit_rows(&trace, &wl, &opts, config.seq_len) {
        eprintln!("xtc decode: warning: {m}");
    }
    let model = source
        .model(&device, &opts, &config, args.kernels.variant())
        .map_err(|e| {
            format!(
                "device model: {e} (buffers for --token-budget {} token rows and a ready vector of \
             --max-active {}; {})",
                opts.token_budget,
                opts.max_active,
                kv_origin(args, &opts)
            )
        })?;
    let facts = ModelFacts {
        description: model.borrow().describe(),
        shape: model.borrow().config(),
        parameters,
        weight_bytes: source.weight_bytes(),
        path: source.path(),
    };
    let run_config = config::run_config(args, &trace, &wl, &scaling, facts, &opts, &device);
    if !args.json {
        eprintln!(
            "{}\n{}",
            banner(args, &trace, &wl, &opts, &run_config),
            source.banner_line()
        );
    }
    let mut obs = Observe::start(args, config.seq_len)?;
    if args.sweep.is_some() {
        let run = sweep::SweepRun {
            model: &model,
            trace: &trace,
            requests,
            scaling: &scaling,
            source: &source,
            model_config: &config,
            opts: &opts,
            config: &run_config,
        };
        return sweep::run(args, run, &mut obs, w);
    }
    if args.compare {
        let run = CompareRun {
            model: &model,
            wl: &wl,
            opts: &opts,
            config: &run_config,
        };
        return compare(args, run, outs, &mut obs, &source, w);
    }
    let out = run_once(&model, &wl, &opts, !args.json, obs.next_run())?;
    obs.finish();
    let report = Report::new(&out, run_config.clone());
    let samples = source.samples(&out);
    let text = if args.json {
        with_samples(&report, &samples)? + "\n"
    } else {
        report.render() + &render_samples(&samples, matches!(source, Source::Gguf(_)))
    };
    // The report first: a late output-file failure must not lose it.
    w.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    outs.write(&out, &wl, &run_config, obs.runs.first().map(|m| &**m))?;
    Ok(finish_status([&report]))
}

/// Refuses a replay the clock cannot hold, or one longer than
/// [`MAX_REPLAY`] without `--allow-long-replay`, naming `--time-scale`.
fn check_replay(args: &DecodeArgs, replayed: &[trace::TraceRequest]) -> Result<(), String> {
    check_replay_at(args, replayed, args.time_scale)
}

/// [`check_replay`] at `time_scale` (each rate of `--sweep`).
fn check_replay_at(
    args: &DecodeArgs,
    replayed: &[trace::TraceRequest],
    time_scale: f64,
) -> Result<(), String> {
    let scaling = Scaling {
        time_scale,
        ..Scaling::IDENTITY
    };
    scaling.check_arrivals(replayed)?;
    let Some(last) = replayed.iter().map(|r| r.arrival).max() else {
        return Ok(());
    };
    let span = last.as_secs_f64() / time_scale;
    if span > MAX_REPLAY.as_secs_f64() && !args.allow_long_replay {
        let least = last.as_secs_f64() / MAX_REPLAY.as_secs_f64();
        return Err(format!(
            "--time-scale {:?}: the {} replayed requests would arrive over {span:.3e} s \
             ({}; {:.1} s in the trace), longer than a day: use a larger --time-scale \
             (at least {least:.3e} for a day), fewer --requests, or --allow-long-replay \
             to run it anyway",
            time_scale,
            replayed.len(),
            long_span(span),
            last.as_secs_f64()
        ));
    }
    Ok(())
}

/// A span of more than a day in days or years.
fn long_span(secs: f64) -> String {
    let days = secs / 86400.0;
    if days < 365.0 {
        format!("about {days:.1} days")
    } else {
        format!("about {:.0} years", days / 365.25)
    }
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
        token_budget: args.token_budget.unwrap_or(args::DEFAULT_TOKEN_BUDGET),
        stop_token: None,
    }
}
