//! `xtc decode --sweep RATES`: continuous, static and one-at-a-time batching
//! at each request rate in one process, each policy's capacity under the SLO
//! and the capacity ratios ([`xtc_replay::sweep`]), each knee
//! refined `--refine` times; a table (or JSON), `--csv-out`, `--plot-out`.

use std::io::Write;
use std::time::Instant;

use xtc_model::Config;
use xtc_replay::job::{JobOpts, Mode, SharedModel};
use xtc_replay::report::Report;
use xtc_replay::run_config::RunConfig;
use xtc_replay::sweep::{ATTAINMENT_TARGET, Sweep, SweepPoint, knee_bracket, refine_rate};
use xtc_replay::trace::{Scaling, Trace};

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
    if let (Some(c), Some(p)) = (&args.csv_out, &args.plot_out)
        && (c == p
            || std::fs::canonicalize(c)
                .ok()
                .is_some_and(|c| std::fs::canonicalize(p).ok() == Some(c)))
    {
        return Err(format!(
            "--csv-out and --plot-out name the same file ({}): the plot would overwrite the CSV",
            c.display()
        ));
    }
    let plot_out = OutFile::prepare_opt("--plot-out", args.plot_out.as_deref(), &inputs)?;
    // `SweepDefaults::apply` filled the SLO in.
    let slo = run.config.slo;
    let t0 = Instant::now();
    let mut points = Vec::new();
    let mut worst = 0;
    // One run of `modes` at `rate`; `step` names a knee refinement's step.
    let mut run_at = |rate: f64,
                      modes: &[Mode],
                      step: Option<(u32, u32)>,
                      obs: &mut Observe|
     -> Result<Vec<SweepPoint>, String> {
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
        if span <= 0.0 {
            return Err(format!(
                "--sweep: the {} replayed request(s) all arrive at the same moment (an \
                 arrival span of 0 s), so there is no request rate to sweep: replay more \
                 rows (--requests) or a trace whose arrivals are spread over time",
                wl.requests.len()
            ));
        }
        let offered = wl.requests.len() as f64 / span;
        let config = RunConfig {
            time_scale: rate,
            slo,
            ..run.config.clone()
        };
        let mut out_points = Vec::new();
        for &mode in modes {
            let o = JobOpts { mode, ..*run.opts };
            let out = run_once(run.model, &wl, &o, !args.json, obs.next_run())?;
            let report = Report::new(&out, config.clone());
            worst = worst.max(exit_status(&report).0);
            let p = SweepPoint {
                refined: step.is_some(),
                ..SweepPoint::of(&report, rate, offered)
            };
            if !args.json {
                let refining = step.map_or(String::new(), |(i, n)| {
                    format!(" (refining its knee, step {i}/{n})")
                });
                eprintln!(
                    "xtc decode: sweep {rate}x ({offered:.2} requests/s) {:<14} {:>6.1} s, \
                     {:.1}% within the SLO{refining}",
                    p.mode,
                    p.duration_s,
                    p.attainment * 100.0
                );
            }
            out_points.push(p);
        }
        Ok(out_points)
    };
    const MODES: [Mode; 3] = [Mode::Continuous, Mode::Static, Mode::OneAtATime];
    for &rate in &rates {
        points.extend(run_at(rate, &MODES, None, obs)?);
    }
    // Knee refinement: bisect each policy's bracket (last rate met, first
    // missed) on a log scale, that policy alone.
    for mode in MODES {
        for step in 1..=args.refine {
            let mine: Vec<(f64, f64)> = points
                .iter()
                .filter(|p| p.mode == mode.name())
                .map(|p| (p.time_scale, p.attainment))
                .collect();
            let Some(rate) = knee_bracket(&mine, ATTAINMENT_TARGET)
                .and_then(|(met, missed)| refine_rate(met, missed))
            else {
                break;
            };
            points.extend(run_at(rate, &[mode], Some((step, args.refine)), obs)?);
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
