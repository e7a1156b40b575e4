//! `xtc decode --compare`: the same model, workload and options under
//! continuous, static and one-at-a-time batching, and their ratios.

use std::io::Write;
use std::time::Instant;

use xtc_replay::job::{JobOpts, Mode, SharedModel, Workload};
use xtc_replay::report::{Comparison, Report};
use xtc_replay::run_config::RunConfig;

use super::args::DecodeArgs;
use super::outputs::{Observe, Outputs};
use super::render::{render_samples, with_samples};
use super::run::{finish_status, run_once};
use super::source::Source;

/// What `--compare` runs: the same model, workload, options and
/// configuration under each policy.
pub(crate) struct CompareRun<'a> {
    pub(crate) model: &'a SharedModel,
    pub(crate) wl: &'a Workload,
    pub(crate) opts: &'a JobOpts,
    pub(crate) config: &'a RunConfig,
}

/// Runs the three policies, prints the comparison (with the continuous
/// run's samples) and writes the continuous run's outputs; returns the worst
/// exit status.
pub(crate) fn compare(
    args: &DecodeArgs,
    run: CompareRun<'_>,
    outs: Outputs,
    obs: &mut Observe,
    source: &Source,
    w: &mut dyn Write,
) -> Result<i32, String> {
    let CompareRun {
        model,
        wl,
        opts,
        config,
    } = run;
    let t0 = Instant::now();
    let mut reports = Vec::new();
    let mut traced = None;
    for mode in [Mode::Continuous, Mode::Static, Mode::OneAtATime] {
        let o = JobOpts { mode, ..*opts };
        let out = run_once(model, wl, &o, !args.json, obs.next_run())?;
        reports.push(Report::new(&out, config.clone()));
        if mode == Mode::Continuous {
            traced = Some(out);
        }
    }
    let one = reports.pop().expect("three runs");
    let stat = reports.pop().expect("three runs");
    let cont = reports.pop().expect("three runs");
    let cmp = Comparison::new(cont, stat, one);
    let samples = traced.as_ref().map_or(Vec::new(), |o| source.samples(o));
    let text = if args.json {
        with_samples(&cmp, &samples)? + "\n"
    } else {
        format!(
            "{}{}(three runs in {:.1} s)\n{}",
            cmp.continuous.render(),
            cmp.render(),
            t0.elapsed().as_secs_f64(),
            render_samples(&samples, matches!(source, Source::Gguf(_)))
        )
    };
    obs.finish();
    w.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    if let Some(out) = traced {
        outs.write(&out, wl, config, obs.runs.first().map(|m| &**m))?;
    }
    Ok(finish_status([
        &cmp.continuous,
        &cmp.static_,
        &cmp.one_at_a_time,
    ]))
}
