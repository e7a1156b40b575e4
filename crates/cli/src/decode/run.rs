//! One run of a workload (`run_once`, with its progress bar) and the exit
//! status its report calls for ([`exit_status`], `finish_status`).

use std::io::IsTerminal;
use std::rc::Rc;

use indicatif::{ProgressBar, ProgressStyle};
use xtc_kvbatch::metrics::DecodeMetrics;
use xtc_replay::job::{JobOpts, Mode, Progress, RunOutput, SharedModel, Workload};
use xtc_replay::report::Report;

use super::args::{EXIT_FAILED, EXIT_LEAK, EXIT_OK, EXIT_REJECTED};

/// One run of `wl` under `opts` with a progress bar (when `show` and
/// stderr is a terminal), updating `metrics` if given.
pub(crate) fn run_once(
    model: &SharedModel,
    wl: &Workload,
    opts: &JobOpts,
    show: bool,
    metrics: Option<Rc<DecodeMetrics>>,
) -> Result<RunOutput, String> {
    let bar = progress_bar(wl.requests.len() as u64, opts.mode, show);
    let b = bar.clone();
    let update = move |p: &Progress| {
        let rate = p.generated as f64 / p.elapsed.as_secs_f64().max(1e-9);
        b.set_position(p.done as u64);
        b.set_message(format!("active {:>3} | {rate:>7.1} tok/s", p.active));
    };
    let out = xtc_replay::run_with_metrics(model, wl, opts, Box::new(update), metrics)
        .map_err(|e| e.to_string());
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

/// The exit status a finished run's report calls for ([`EXIT_OK`] or one of
/// [`EXIT_REJECTED`], [`EXIT_FAILED`], [`EXIT_LEAK`]: the largest that
/// applies), with the line that explains it on stderr.
pub fn exit_status(r: &Report) -> (i32, Option<String>) {
    let n = &r.requests;
    if r.kv_cache.leaked_blocks > 0 {
        let m = format!(
            "{} KV-cache blocks still allocated after the {} run: a leak (a bug in xtc)",
            r.kv_cache.leaked_blocks, r.mode
        );
        return (EXIT_LEAK, Some(m));
    }
    if n.failed > 0 {
        let m = format!(
            "{} of {} requests failed ({} run)",
            n.failed, n.total, r.mode
        );
        return (EXIT_FAILED, Some(m));
    }
    if n.rejected > 0 {
        let m = format!(
            "{} of {} requests rejected in the {} run",
            n.rejected, n.total, r.mode
        );
        return (EXIT_REJECTED, Some(m));
    }
    (EXIT_OK, None)
}

/// The worst exit status of `reports`, printing why on stderr.
pub(crate) fn finish_status<'a>(reports: impl IntoIterator<Item = &'a Report>) -> i32 {
    let worst = reports
        .into_iter()
        .map(exit_status)
        .max_by_key(|(code, _)| *code);
    match worst {
        Some((code, Some(why))) => {
            eprintln!("xtc decode: {why} (exit status {code})");
            code
        }
        _ => EXIT_OK,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::args::{EXIT_ERROR, EXIT_STATUS_HELP, EXIT_USAGE};
    use std::time::{Duration, Instant};
    use xtc_replay::job::{Mode, RunOutput};

    fn report() -> Report {
        let out = RunOutput {
            mode: Mode::Continuous,
            device: "test".into(),
            finished: Vec::new(),
            rejected: Vec::new(),
            iterations: Vec::new(),
            started: Instant::now(),
            wall: Duration::from_secs(1),
            kv_capacity: 8,
            kv_peak: 0,
            kv_leaked: 0,
        };
        Report::from_run(&out, 10)
    }

    /// Issue 12: failed requests and leaked blocks exited 0.
    #[test]
    fn exit_status_follows_rejections_failures_and_leaks() {
        let mut r = report();
        assert_eq!(exit_status(&r), (EXIT_OK, None));
        r.requests.rejected = 2;
        assert_eq!(exit_status(&r).0, EXIT_REJECTED);
        r.requests.failed = 1;
        let (code, why) = exit_status(&r);
        assert_eq!(code, EXIT_FAILED);
        assert!(why.unwrap().contains("1 of 10 requests failed"));
        r.kv_cache.leaked_blocks = 3;
        let (code, why) = exit_status(&r);
        assert_eq!(code, EXIT_LEAK);
        assert!(why.unwrap().contains("3 KV-cache blocks still allocated"));
        // --compare: the worst of the runs.
        let ok = report();
        assert_eq!(finish_status([&ok, &r, &ok]), EXIT_LEAK);
        assert_eq!(finish_status([&ok, &ok]), EXIT_OK);
        let codes = [
            EXIT_OK,
            EXIT_ERROR,
            EXIT_USAGE,
            EXIT_REJECTED,
            EXIT_FAILED,
            EXIT_LEAK,
        ];
        for (i, c) in codes.iter().enumerate() {
            assert!(EXIT_STATUS_HELP.contains(&format!("\n  {c}  ")), "{i}");
        }
    }
}
