//! `xtc ci`: the device-in-the-loop CI runner ([`xtc_ci`]).
//!
//! - `xtc ci run`: runs suites of cases in child processes and judges them
//!   against baselines; writes `results.csv`, `failures.csv`, `junit.xml`
//!   into `--output`; prints a table of what did not pass and the closing
//!   line `N passed, N failed, N skipped`.
//! - `xtc ci list`: the case names (stable dotted paths).
//! - `xtc ci child` (hidden): the child side of the protocol.
//!
//! Exit status of `run`: 0 every result as expected, 1 any regression
//! (`Fail`, `Crash`, `Timeout`, `Missing` not in the baseline; with `CI` set,
//! no device), 2 no regression but unexpected improvements (refresh the
//! baseline), 3 the run could not start (bad option or file).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use regex::Regex;
use serde::Serialize;

use xtc_ci::baseline::{DeviceTable, FailureBaseline};
use xtc_ci::registry::{self, Selection};
use xtc_ci::runner::{self, CaseRun, RunOptions, RunResult};
use xtc_ci::status::{Counts, EXIT_USAGE, Status};
use xtc_ci::{Measure, Suite, output, protocol};

use crate::generate::KernelForm;

/// Arguments of `xtc ci`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "Run `xtc ci run --help` for the options of a run.")]
pub struct CiArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: CiCommand,
}

/// The `xtc ci` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum CiCommand {
    /// Run suites of device-in-the-loop cases and compare with baselines.
    Run(Box<RunArgs>),
    /// List the cases (stable dotted names), one a line.
    List(ListArgs),
    /// The child side of the runner's protocol (re-executed by `run`).
    #[command(hide = true)]
    Child(ChildArgs),
}

/// A suite name of `--suite`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SuiteArg {
    /// Every kernel of kernels/ against the CPU reference (NMSE, exact ops,
    /// NaN/Inf, guard regions).
    Kernels,
    /// sync_file export, the eventfd bridge, loop wake, fd leaks.
    Fence,
    /// Sync and async batch groups driving device work.
    Batch,
    /// The batched-publish scheduler's stress on the emulated NPU.
    Dispatch,
    /// Greedy decode: golden tokens, Vulkan vs CPU reference.
    Decode,
    /// Latency and throughput figures (report-only without --perf-baseline).
    Perf,
    /// Every suite above.
    All,
    /// The runner's own test cases (deliberate crash, hang, flake).
    #[value(hide = true)]
    Selftest,
}

impl SuiteArg {
    fn suites(self) -> Vec<Suite> {
        match self {
            SuiteArg::Kernels => vec![Suite::Kernels],
            SuiteArg::Fence => vec![Suite::Fence],
            SuiteArg::Batch => vec![Suite::Batch],
            SuiteArg::Dispatch => vec![Suite::Dispatch],
            SuiteArg::Decode => vec![Suite::Decode],
            SuiteArg::Perf => vec![Suite::Perf],
            SuiteArg::All => Suite::ALL.to_vec(),
            SuiteArg::Selftest => vec![Suite::Selftest],
        }
    }
}

/// Arguments of `xtc ci run`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "\
Exit status: 0 every result as expected (flakes and expected failures included),
1 any regression (Fail, Crash, Timeout, Missing not in --baseline; with CI set,
no device is a failure), 2 only unexpected improvements (refresh the baseline),
3 the run could not start.

Refresh the baselines of this device:
  xtc ci run --suite all --baseline devices/baselines/lavapipe-failures.csv \\
      --perf-baseline devices/baselines/perf.json \\
      --golden devices/baselines/golden.json --write-baseline")]
pub struct RunArgs {
    /// Suites to run (repeat or separate with commas).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    pub suite: Vec<SuiteArg>,
    /// Vulkan device: `auto`, an index, a name or a render node path.
    #[arg(long, value_name = "D", default_value = "auto")]
    pub device: String,
    /// Kernel form: `auto` (every case; those that pin no form run the device's, chosen by
    /// capability and a barrier probe), `gpu` or `cpu` (only the cases pinned to that form,
    /// `.gpu.` / `.cpu.` in their names, and the unpinned ones, run in that form).
    #[arg(long, value_name = "FORM", value_enum, default_value_t = KernelForm::Auto)]
    pub kernels: KernelForm,
    /// Write results.csv, failures.csv, junit.xml, perf.json, golden.json and
    /// logs/ into DIR.
    #[arg(long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Only cases whose name matches REGEX (searched anywhere in the name).
    #[arg(long, value_name = "REGEX")]
    pub include: Option<String>,
    /// File of regexes (one a line, # comments): matching cases are reported
    /// Skip without running.
    #[arg(long, value_name = "F")]
    pub skips: Option<PathBuf>,
    /// File of regexes: a failure of a matching case is KnownFlake.
    #[arg(long, value_name = "F")]
    pub flakes: Option<PathBuf>,
    /// Expected failures (`name,Status` lines, e.g. a previous failures.csv):
    /// the same failure is ExpectedFail, a pass is UnexpectedImprovement.
    #[arg(long, value_name = "FAILURES.csv")]
    pub baseline: Option<PathBuf>,
    /// Perf figures keyed by device and driver: slower than the tolerance is
    /// Fail, faster is UnexpectedImprovement. Without it perf only reports.
    #[arg(long, value_name = "F")]
    pub perf_baseline: Option<PathBuf>,
    /// Relative tolerance of perf figures (0.25: up to 1.25x the baseline's time).
    #[arg(long, value_name = "T", default_value_t = 0.25)]
    pub perf_tolerance: f64,
    /// Golden greedy tokens keyed by device and driver (decode suite);
    /// without it the golden cases are skipped.
    #[arg(long, value_name = "F")]
    pub golden: Option<PathBuf>,
    /// Store this run's failures, perf figures and golden tokens into the
    /// files of --baseline, --perf-baseline and --golden (this device's
    /// entries replaced, others kept) instead of comparing with them.
    #[arg(long)]
    pub write_baseline: bool,
    /// Groups of cases run in parallel child processes (perf always runs alone).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Seconds a case may run before its child is killed (Timeout).
    #[arg(long, value_name = "S", default_value_t = 60.0)]
    pub timeout: f64,
    /// Run 1 case in N of the selection (split a run over N machines).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub fraction: usize,
    /// With --fraction: start at the K-th case (1-based).
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub fraction_start: usize,
    /// Seed of the random inputs (printed; replays a run). Default: new each run.
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// Print every case in the table, not only those that did not pass.
    #[arg(long)]
    pub verbose: bool,
    /// Print one JSON object (cases, counts, exit status) on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `xtc ci list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Suites to list.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    pub suite: Vec<SuiteArg>,
    /// Only cases whose name matches REGEX.
    #[arg(long, value_name = "REGEX")]
    pub include: Option<String>,
    /// Print a JSON array of {name, suite, group} objects.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of the hidden `xtc ci child`.
#[derive(Debug, Clone, Args)]
pub struct ChildArgs {
    /// Vulkan device selector.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Run seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Kernel form of the cases that pin none.
    #[arg(long, value_name = "FORM", value_enum, default_value_t = KernelForm::Auto)]
    pub kernels: KernelForm,
    /// The runner's --timeout per case, in milliseconds (cases whose cost
    /// depends on the device measure within it).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: Option<u64>,
}

/// Runs `xtc ci`; returns the exit status.
pub fn run(args: &CiArgs, out: &mut dyn Write) -> i32 {
    match &args.command {
        CiCommand::Run(a) => match run_cmd(a, out) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("xtc ci run: error: {e}");
                EXIT_USAGE
            }
        },
        CiCommand::List(a) => match list_cmd(a, out) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("xtc ci list: error: {e}");
                EXIT_USAGE
            }
        },
        CiCommand::Child(a) => {
            let stdin = std::io::stdin();
            protocol::child_main(
                &a.device,
                a.seed,
                a.kernels.variant(),
                a.timeout_ms.map(std::time::Duration::from_millis),
                &mut stdin.lock(),
                out,
            )
        }
    }
}

fn suites_of(args: &[SuiteArg]) -> Vec<Suite> {
    let mut v: Vec<Suite> = args.iter().flat_map(|s| s.suites()).collect();
    v.sort();
    v.dedup();
    v
}

fn include(re: &Option<String>) -> Result<Option<Regex>, String> {
    re.as_deref()
        .map(|r| Regex::new(r).map_err(|e| format!("--include {r:?}: {e}")))
        .transpose()
}

fn list_cmd(a: &ListArgs, out: &mut dyn Write) -> Result<(), String> {
    let sel = Selection {
        suites: suites_of(&a.suite),
        include: include(&a.include)?,
        ..Selection::default()
    };
    let (cases, _) = registry::select(&registry::all_cases(), &sel);
    let w = |e: std::io::Error| e.to_string();
    if a.json {
        #[derive(Serialize)]
        struct Item<'a> {
            name: &'a str,
            suite: &'a str,
            group: &'a str,
        }
        let items: Vec<Item<'_>> = cases
            .iter()
            .map(|c| Item {
                name: &c.name,
                suite: c.suite.name(),
                group: &c.group,
            })
            .collect();
        let text = serde_json::to_string_pretty(&items).map_err(|e| e.to_string())?;
        writeln!(out, "{text}").map_err(w)?;
    } else {
        for c in &cases {
            writeln!(out, "{}", c.name).map_err(w)?;
        }
    }
    Ok(())
}

/// The JSON report of `--json`.
#[derive(Debug, Serialize)]
struct JsonReport<'a> {
    seed: u64,
    device: Option<String>,
    wall_s: f64,
    counts: Counts,
    exit_code: i32,
    cases: &'a [CaseRun],
}

fn run_cmd(a: &RunArgs, out: &mut dyn Write) -> Result<i32, String> {
    if !(a.timeout.is_finite() && a.timeout > 0.0) {
        return Err(format!(
            "--timeout {}: must be a positive number of seconds",
            a.timeout
        ));
    }
    if !(a.perf_tolerance.is_finite() && a.perf_tolerance >= 0.0) {
        return Err(format!(
            "--perf-tolerance {}: must be >= 0",
            a.perf_tolerance
        ));
    }
    if a.fraction == 0 || a.fraction_start == 0 {
        return Err("--fraction and --fraction-start start at 1".into());
    }
    if a.jobs == Some(0) {
        return Err("--jobs must be at least 1".into());
    }
    if a.write_baseline && a.baseline.is_none() && a.perf_baseline.is_none() && a.golden.is_none() {
        return Err(
            "--write-baseline needs --baseline, --perf-baseline or --golden to write".into(),
        );
    }
    let sel = Selection {
        suites: suites_of(&a.suite),
        include: include(&a.include)?,
        skips: a
            .skips
            .as_deref()
            .map(registry::read_regex_list)
            .transpose()?,
        fraction: a.fraction,
        fraction_start: a.fraction_start,
        kernels: a.kernels.variant(),
    };
    let flakes = a
        .flakes
        .as_deref()
        .map(registry::read_regex_list)
        .transpose()?;
    // With --write-baseline the files are outputs: judge against nothing.
    let load = |p: &Option<PathBuf>| !a.write_baseline && p.is_some();
    let baseline = match &a.baseline {
        Some(p) if load(&a.baseline) => FailureBaseline::load(p)?,
        _ => FailureBaseline::default(),
    };
    let perf_baseline = match &a.perf_baseline {
        Some(p) if load(&a.perf_baseline) => Some(DeviceTable::<Measure>::load(p)?),
        _ => None,
    };
    let golden = match &a.golden {
        Some(p) if load(&a.golden) => Some(DeviceTable::<Vec<u32>>::load(p)?),
        _ => None,
    };
    if let Some(dir) = &a.output {
        std::fs::create_dir_all(dir).map_err(|e| format!("--output {}: {e}", dir.display()))?;
    }
    let all = registry::all_cases();
    let (cases, skipped) = registry::select(&all, &sel);
    if cases.is_empty() && skipped.is_empty() {
        return Err("no case matches the selection (see `xtc ci list`)".into());
    }
    let seed = a.seed.unwrap_or_else(fresh_seed);
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let opts = RunOptions {
        exe,
        device: a.device.clone(),
        seed,
        timeout: Duration::from_secs_f64(a.timeout),
        jobs,
        flakes,
        baseline,
        perf_baseline,
        perf_tolerance: a.perf_tolerance,
        golden,
        write_baseline: a.write_baseline,
        env: Vec::new(),
        kernels: a.kernels.variant(),
    };
    eprintln!(
        "xtc ci: {} cases ({} skipped by --skips), device {:?}, {} jobs, seed {seed} (replay with --seed {seed})",
        cases.len(),
        skipped.len(),
        a.device,
        jobs
    );
    let progress = if std::io::stderr().is_terminal() && !a.json {
        let p = ProgressBar::new(cases.len() as u64);
        p.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        p.enable_steady_tick(Duration::from_millis(200));
        p
    } else {
        ProgressBar::hidden()
    };
    let mut result = runner::run(&cases, &opts, &progress);
    progress.finish_and_clear();
    add_skips(&mut result, &all, &skipped);
    if let Some(dir) = &a.output {
        output::write_all(dir, &result, seed)?;
    }
    if a.write_baseline {
        write_baselines(a, &result, &cases)?;
    }
    let counts = Counts::of(result.cases.iter().map(|c| c.status));
    let code = counts.exit_code();
    let mut summary = output::summary(&result, a.verbose);
    if let Some(c) = result.cases.iter().find(|c| c.status.is_regression()) {
        // Before the closing line, which stays last.
        let hint = format!(
            "replay: xtc ci run --seed {seed} --include '^{}$'\n",
            regex::escape(&c.name)
        );
        let at = summary
            .trim_end_matches('\n')
            .rfind('\n')
            .map_or(0, |i| i + 1);
        summary.insert_str(at, &hint);
    }
    let w = |e: std::io::Error| e.to_string();
    if a.json {
        let report = JsonReport {
            seed,
            device: result.device.as_ref().map(|d| d.key()),
            wall_s: result.wall.as_secs_f64(),
            counts,
            exit_code: code,
            cases: &result.cases,
        };
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        writeln!(out, "{text}").map_err(w)?;
        eprint!("{summary}");
    } else {
        if let Some(d) = &result.device {
            writeln!(out, "device: {}", d.key()).map_err(w)?;
        }
        write!(out, "{summary}").map_err(w)?;
    }
    Ok(code)
}

/// Cases skipped by `--skips` join the results, in registry order.
fn add_skips(result: &mut RunResult, all: &[xtc_ci::Case], skipped: &[xtc_ci::Case]) {
    if skipped.is_empty() {
        return;
    }
    let mut runs = std::mem::take(&mut result.cases);
    runs.extend(skipped.iter().map(|c| CaseRun {
        name: c.name.clone(),
        status: Status::Skip,
        duration_s: 0.0,
        message: "listed in --skips".into(),
        record: None,
    }));
    let pos = |n: &str| all.iter().position(|c| c.name == n).unwrap_or(usize::MAX);
    runs.sort_by_key(|r| pos(&r.name));
    result.cases = runs;
}

/// `--write-baseline`: this run's failures into `--baseline` (entries of
/// cases not run now kept), its perf figures and golden tokens into
/// `--perf-baseline` and `--golden` under this device.
fn write_baselines(a: &RunArgs, result: &RunResult, ran: &[xtc_ci::Case]) -> Result<(), String> {
    if let Some(p) = &a.baseline {
        let mut keep: Vec<(String, String)> = Vec::new();
        if p.exists() {
            let old = read_pairs(p)?;
            keep.extend(
                old.into_iter()
                    .filter(|(n, _)| !ran.iter().any(|c| &c.name == n)),
            );
        }
        keep.extend(
            result
                .cases
                .iter()
                .filter(|c| c.status.is_failure())
                .map(|c| (c.name.clone(), c.status.name().to_owned())),
        );
        keep.sort();
        let mut text = String::from(
            "# Expected failures of `xtc ci run` on this device (name,Status).\n# Written by --write-baseline; read by --baseline.\n",
        );
        for (n, s) in keep {
            text.push_str(&format!("{n},{s}\n"));
        }
        std::fs::write(p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        eprintln!("xtc ci: wrote {}", p.display());
    }
    let (perf, golden) = output::records(result);
    let key = result
        .device
        .as_ref()
        .map_or_else(|| runner::NO_DEVICE.to_owned(), |d| d.key());
    if let Some(p) = &a.perf_baseline {
        let mut t = DeviceTable::<Measure>::load_or_default(p)?;
        t.note =
            "perf figures per device (`xtc ci run --perf-baseline`); refresh with --write-baseline"
                .into();
        t.merge(&key, perf.devices.get(&key).cloned().unwrap_or_default());
        t.save(p)?;
        eprintln!("xtc ci: wrote {}", p.display());
    }
    if let Some(p) = &a.golden {
        let mut t = DeviceTable::<Vec<u32>>::load_or_default(p)?;
        t.note = "golden greedy tokens per device (`xtc ci run --golden`); refresh with --write-baseline".into();
        t.merge(&key, golden.devices.get(&key).cloned().unwrap_or_default());
        t.save(p)?;
        eprintln!("xtc ci: wrote {}", p.display());
    }
    Ok(())
}

/// The `(name, status)` pairs of a baseline file, as written.
fn read_pairs(p: &Path) -> Result<Vec<(String, String)>, String> {
    let text =
        std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let mut it = l.split(',');
            Some((it.next()?.trim().to_owned(), it.next()?.trim().to_owned()))
        })
        .collect())
}

/// A seed for a run without `--seed`: the clock's nanoseconds mixed with the
/// process id (printed, so any run can be replayed).
fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    xtc_ci::case_seed(t, &std::process::id().to_string()) % 1_000_000_000
}
