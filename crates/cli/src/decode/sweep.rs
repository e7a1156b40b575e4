//! `xtc decode --sweep RATES`: continuous, static and one-at-a-time batching
//! at each request rate in one process, each policy's capacity under the SLO
//! and the capacity ratios ([`xtc_decode::serve::sweep`]); a table (or
//! JSON), `--csv-out`, `--plot-out`.

use std::io::Write;
use std::time::Instant;

use xtc_decode::model::Config;
use xtc_decode::serve::job::{JobOpts, Mode, SharedModel};
use xtc_decode::serve::report::Report;
use xtc_decode::serve::run_config::RunConfig;
use xtc_decode::serve::sweep::{Sweep, SweepPoint};
use xtc_decode::serve::trace::{Scaling, Trace};

use super::args::DecodeArgs;
use super::outputs::Observe;
use super::run::{exit_status, run_once};
use super::source::Source;
use crate::out_file::OutFile;

/// What a sweep runs: one model, the trace's first `requests` rows with the
/// length scaling of `scaling` (its time scale is replaced by each rate),
/// the job options and the configuration of the run.
pub struct SweepRun<'a> {
    /// The model, shared by every run.
    pub model: &'a SharedModel,
    /// The trace.
    pub trace: &'a Trace,
    /// Rows replayed.
    pub requests: usize,
    /// Length scaling (the time scale is each rate's).
    pub scaling: &'a Scaling,
    /// The model's prompts (text windows of a GGUF model, random ids
    /// otherwise: [`Source::workload`]).
    pub source: &'a Source,
    /// The model's shape as the run sees it.
    pub model_config: &'a Config,
    /// Job options (the mode is each policy's).
    pub opts: &'a JobOpts,
    /// The configuration (time scale and SLO are each run's).
    pub config: &'a RunConfig,
}

/// Runs the sweep and writes its table (or JSON) to `w`, then `--csv-out`
/// and `--plot-out`; returns the exit status (the worst of the runs').
///
/// # Errors
/// An output file that cannot be used (checked before the first run), a run
/// that fails.
pub fn run(
    args: &DecodeArgs,
    run: SweepRun<'_>,
    obs: &mut Observe,
    w: &mut dyn Write,
) -> Result<i32, String> {
    let rates = args.sweep.clone().map(|r| r.0).unwrap_or_default();
    let inputs = [
        ("--model", args.model.as_deref()),
        ("--trace", args.trace.as_deref()),
        ("--tokenizer", args.tokenizer.as_deref()),
    ];
    let csv_out = OutFile::prepare_opt("--csv-out", args.csv_out.as_deref(), &inputs)?;
    let plot_out = OutFile::prepare_opt("--plot-out", args.plot_out.as_deref(), &inputs)?;
    // `SweepDefaults::apply` filled the SLO in.
    let slo = run.config.slo;
    let t0 = Instant::now();
    let mut points = Vec::new();
    let mut worst = 0;
    for &rate in &rates {
        let scaling = Scaling {
            time_scale: rate,
            ..*run.scaling
        };
        let wl = run.source.workload(
            run.trace,
            run.requests,
            &scaling,
            run.model_config,
            args.seed,
            args.cancel_rate,
        )?;
        let span = wl
            .requests
            .iter()
            .map(|r| r.arrival)
            .max()
            .unwrap_or_default()
            .as_secs_f64();
        let offered = wl.requests.len() as f64 / span.max(1e-9);
        let config = RunConfig {
            time_scale: rate,
            slo,
            ..run.config.clone()
        };
        for mode in [Mode::Continuous, Mode::Static, Mode::OneAtATime] {
            let o = JobOpts { mode, ..*run.opts };
            let out = run_once(run.model, &wl, &o, !args.json, obs.next_run())?;
            let report = Report::new(&out, config.clone());
            worst = worst.max(exit_status(&report).0);
            let p = SweepPoint::of(&report, rate, offered);
            if !args.json {
                eprintln!(
                    "xtc decode: sweep {rate}x ({offered:.2} requests/s) {:<14} {:>6.1} s, \
                     {:.1}% within the SLO",
                    p.mode,
                    p.duration_s,
                    p.attainment * 100.0
                );
            }
            points.push(p);
        }
    }
    obs.finish();
    let config = RunConfig {
        time_scale: rates.first().copied().unwrap_or(1.0),
        slo,
        ..run.config.clone()
    };
    let sweep = Sweep::new(config, points, t0.elapsed().as_secs_f64());
    let text = if args.json {
        serde_json::to_string_pretty(&sweep).map_err(|e| e.to_string())? + "\n"
    } else {
        format!(
            "{}\nmarkdown (ready to paste):\n\n{}",
            sweep.render(),
            sweep.markdown()
        )
    };
    w.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    if let Some(f) = csv_out {
        f.write(sweep.csv()?.as_bytes())?;
    }
    if let Some(f) = plot_out {
        f.write(sweep.plot_svg()?.as_bytes())?;
    }
    Ok(worst)
}
