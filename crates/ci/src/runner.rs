//! The parent side of a run: groups of cases run in child processes
//! ([`super::protocol`]), `--jobs` at a time (exclusive groups alone, after
//! the rest), each case bounded by `--timeout`; records resolved against the
//! perf and golden baselines; a group with an unexpected result rerun once
//! (a changed status is `Flake`); `--flakes` and `--baseline` applied.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use regex::RegexSet;
use serde::Serialize;

use super::baseline::{DeviceTable, FailureBaseline};
use super::case::{Case, DeviceId, Measure, Record};
use super::protocol::{EXIT_RESPAWN, Event};
use super::status::Status;
use xtc_model::vulkan::ops::Variant;

/// The baseline key of records from a run whose cases opened no device.
pub const NO_DEVICE: &str = "no device";

/// How a run executes and judges its cases.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The binary to re-execute as `xtc ci child` (normally the running one).
    pub exe: PathBuf,
    /// `--device` (a `vk::Selector` string).
    pub device: String,
    /// Run seed.
    pub seed: u64,
    /// Longest a case may run before its child is killed (`Timeout`).
    pub timeout: Duration,
    /// Groups run at once (exclusive groups always run alone).
    pub jobs: usize,
    /// `--flakes`: failures of matching cases are `KnownFlake`.
    pub flakes: Option<RegexSet>,
    /// `--baseline`: the expected failures.
    pub baseline: FailureBaseline,
    /// `--perf-baseline`: figures per device; `None`: perf is report-only.
    pub perf_baseline: Option<DeviceTable<Measure>>,
    /// Relative tolerance of perf figures (0.25: up to 25 % slower passes).
    pub perf_tolerance: f64,
    /// `--golden`: greedy tokens per device.
    pub golden: Option<DeviceTable<Vec<u32>>>,
    /// `--write-baseline`: records are stored, not compared.
    pub write_baseline: bool,
    /// Extra environment of the children (the runner's own tests).
    pub env: Vec<(String, String)>,
    /// `--kernels`: the kernel form of the cases that pin none (`None`:
    /// `auto`), passed to every child.
    pub kernels: Option<Variant>,
}

/// The final result of one case.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaseRun {
    /// Case name.
    pub name: String,
    /// Reported status.
    pub status: Status,
    /// Wall time of the (first) run of its body.
    pub duration_s: f64,
    /// Why; figures; the child's exit for crashes.
    pub message: String,
    /// Figure or tokens the case recorded.
    pub record: Option<Record>,
}

/// The whole run.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Every case, in registry order.
    pub cases: Vec<CaseRun>,
    /// The device the children opened (none if no case opened one).
    pub device: Option<DeviceId>,
    /// Each group's child logs (stderr), for groups with a result other than
    /// `Pass`/`Skip`.
    pub logs: BTreeMap<String, String>,
    /// Wall time of the run.
    pub wall: Duration,
}

/// A judged group: its name, results and log (when kept).
type Judged = (String, Vec<CaseRun>, Option<String>);

/// One group's cases, in order.
#[derive(Debug, Clone)]
struct Group {
    name: String,
    cases: Vec<String>,
}

/// Groups `cases` (registry order kept); exclusive groups apart.
fn groups(cases: &[Case]) -> (Vec<Group>, Vec<Group>) {
    let mut order: Vec<(String, bool)> = Vec::new();
    let mut members: HashMap<String, Vec<String>> = HashMap::new();
    for c in cases {
        let m = members.entry(c.group.clone()).or_default();
        if m.is_empty() {
            order.push((c.group.clone(), c.exclusive));
        }
        m.push(c.name.clone());
    }
    let mut shared = Vec::new();
    let mut exclusive = Vec::new();
    for (name, excl) in order {
        let g = Group {
            cases: members.remove(&name).unwrap_or_default(),
            name,
        };
        if excl {
            exclusive.push(g)
        } else {
            shared.push(g)
        }
    }
    (shared, exclusive)
}

/// Runs `cases` and judges them (see the module docs). `progress` counts
/// finished cases.
pub fn run(cases: &[Case], opts: &RunOptions, progress: &ProgressBar) -> RunResult {
    let t0 = Instant::now();
    let (shared, exclusive) = groups(cases);
    let done: Mutex<Vec<Judged>> = Mutex::new(Vec::new());
    let device: Mutex<Option<DeviceId>> = Mutex::new(None);
    for (list, jobs) in [(shared, opts.jobs.max(1)), (exclusive, 1)] {
        let queue = Mutex::new(VecDeque::from(list));
        std::thread::scope(|s| {
            for _ in 0..jobs {
                s.spawn(|| {
                    loop {
                        let next = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
                        let Some(g) = next else { break };
                        let (runs, dev, log) = judge_group(&g, opts, progress);
                        if let Some(d) = dev {
                            device
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert(d);
                        }
                        done.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((g.name, runs, log));
                    }
                });
            }
        });
    }
    let mut by_name: HashMap<String, CaseRun> = HashMap::new();
    let mut logs = BTreeMap::new();
    for (group, runs, log) in done.into_inner().unwrap_or_else(|p| p.into_inner()) {
        if let Some(l) = log {
            logs.insert(group, l);
        }
        for r in runs {
            by_name.insert(r.name.clone(), r);
        }
    }
    let cases = cases
        .iter()
        .filter_map(|c| by_name.remove(&c.name))
        .collect();
    RunResult {
        cases,
        device: device.into_inner().unwrap_or_else(|p| p.into_inner()),
        logs,
        wall: t0.elapsed(),
    }
}

/// Runs one group, reruns it once if a result is unexpected, and applies
/// flakes and the baseline. Returns the results, the device, and the log
/// (only when something did not pass).
fn judge_group(
    g: &Group,
    opts: &RunOptions,
    progress: &ProgressBar,
) -> (Vec<CaseRun>, Option<DeviceId>, Option<String>) {
    progress.set_message(g.name.clone());
    let first = run_group(g, opts, Some(progress));
    let device = first.device.clone();
    let mut runs = resolve_all(first.runs, device.as_ref(), opts);
    let mut log = first.log;
    let judged = |r: &CaseRun| judge(r.status, &r.name, opts);
    if runs.iter().any(|r| judged(r).is_unexpected()) {
        let second = run_group(g, opts, None);
        log.push_str("\n--- rerun ---\n");
        log.push_str(&second.log);
        let again = resolve_all(second.runs, device.as_ref(), opts);
        for r in &mut runs {
            if let Some(b) = again.iter().find(|b| b.name == r.name)
                && b.status != r.status
            {
                r.message = format!(
                    "{} on the first run, {} on the rerun: {}{}",
                    r.status,
                    b.status,
                    r.message,
                    if b.message.is_empty() {
                        String::new()
                    } else {
                        format!(" / rerun: {}", b.message)
                    }
                );
                r.status = Status::Flake;
            }
        }
    }
    for r in &mut runs {
        r.status = judge(r.status, &r.name, opts);
    }
    let quiet = runs
        .iter()
        .all(|r| matches!(r.status, Status::Pass | Status::Skip));
    (runs, device, (!quiet).then_some(log))
}

/// The reported status of a case whose (rerun-resolved) status is `s`.
fn judge(s: Status, name: &str, opts: &RunOptions) -> Status {
    if s.is_failure() && opts.flakes.as_ref().is_some_and(|f| f.is_match(name)) {
        return Status::KnownFlake;
    }
    s.with_baseline(opts.baseline.get(name))
}

/// Compares each record with the baselines (perf figures, golden tokens).
fn resolve_all(runs: Vec<CaseRun>, dev: Option<&DeviceId>, opts: &RunOptions) -> Vec<CaseRun> {
    runs.into_iter().map(|r| resolve(r, dev, opts)).collect()
}

fn resolve(mut r: CaseRun, dev: Option<&DeviceId>, opts: &RunOptions) -> CaseRun {
    if r.status != Status::Pass {
        return r;
    }
    let key = dev.map_or_else(|| NO_DEVICE.to_owned(), DeviceId::key);
    match &r.record {
        Some(Record::Perf(m)) if !opts.write_baseline => {
            let base = opts
                .perf_baseline
                .as_ref()
                .and_then(|t| t.get(&key, &r.name));
            match base {
                None if opts.perf_baseline.is_some() => {
                    r.message = format!("{} (no baseline for this device: report only)", r.message)
                }
                None => {}
                Some(b) => {
                    let (status, note) = compare_perf(m, b, opts.perf_tolerance);
                    r.status = status;
                    r.message = format!("{}; {note}", r.message);
                }
            }
        }
        Some(Record::Golden(tokens)) if !opts.write_baseline => match &opts.golden {
            None => {
                r.status = Status::Skip;
                r.message = "no --golden file given".into();
            }
            Some(t) => match t.get(&key, &r.name) {
                None => {
                    r.status = Status::Fail;
                    r.message = format!(
                        "no golden tokens for device {key:?}: record them with --write-baseline"
                    );
                }
                Some(want) if want == tokens => {}
                Some(want) => {
                    let at = want.iter().zip(tokens).take_while(|(a, b)| a == b).count();
                    r.status = Status::Fail;
                    r.message = format!(
                        "greedy tokens differ from the golden ones at index {at}: got {:?}, golden {:?}",
                        tokens, want
                    );
                }
            },
        },
        _ => {}
    }
    r
}

/// A perf figure against its baseline: `Fail` beyond `tolerance` on the
/// slow side, `UnexpectedImprovement` beyond it on the fast side (relative:
/// slower means `value > base * (1 + tolerance)` for a latency).
pub fn compare_perf(m: &Measure, base: &Measure, tolerance: f64) -> (Status, String) {
    // Express both as "time-like" (lower is better) so one rule serves.
    let (now, then) = if m.higher_is_better {
        (
            1.0 / m.value.max(f64::MIN_POSITIVE),
            1.0 / base.value.max(f64::MIN_POSITIVE),
        )
    } else {
        (m.value, base.value)
    };
    let ratio = now / then;
    let note = format!(
        "baseline {:.3} {} ({:.2}x the baseline's time, tolerance {:.0} %)",
        base.value,
        base.unit,
        ratio,
        tolerance * 100.0
    );
    if ratio > 1.0 + tolerance {
        (Status::Fail, note)
    } else if ratio < 1.0 / (1.0 + tolerance) {
        (Status::UnexpectedImprovement, note)
    } else {
        (Status::Pass, note)
    }
}

/// What one execution of a group (possibly over several children) gave.
struct GroupRun {
    runs: Vec<CaseRun>,
    device: Option<DeviceId>,
    log: String,
}

enum Msg {
    Line(String),
    Eof,
}

/// Runs the group's cases in children until each has a result (see the
/// protocol module for how crashes, timeouts and missing cases are told).
fn run_group(g: &Group, opts: &RunOptions, progress: Option<&ProgressBar>) -> GroupRun {
    let mut pending: VecDeque<String> = g.cases.iter().cloned().collect();
    let mut results: HashMap<String, CaseRun> = HashMap::new();
    let mut device = None;
    let mut log = String::new();
    let tick = |n: u64| {
        if let Some(p) = progress {
            p.inc(n);
        }
    };
    let put = |results: &mut HashMap<String, CaseRun>, r: CaseRun| {
        tick(1);
        results.insert(r.name.clone(), r);
    };
    while !pending.is_empty() {
        let mut child = match spawn(opts, &pending) {
            Ok(c) => c,
            Err(e) => {
                for name in pending.drain(..) {
                    put(
                        &mut results,
                        missing(name, &format!("cannot start a child: {e}")),
                    );
                }
                break;
            }
        };
        let (tx, rx) = crossbeam_channel::unbounded();
        let stdout = child.stdout.take().expect("piped stdout");
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(Msg::Line(line)).is_err() {
                    return;
                }
            }
            let _ = tx.send(Msg::Eof);
        });
        let mut stderr = child.stderr.take().expect("piped stderr");
        let err_reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stderr.read_to_end(&mut buf);
            buf
        });
        let mut current: Option<(String, Instant)> = None;
        let mut started_any = false;
        let mut deadline = Instant::now() + opts.timeout;
        let mut killed = false;
        loop {
            let wait = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(Msg::Line(line)) => match Event::from_line(&line) {
                    Some(Event::Start { case }) => {
                        pending.retain(|p| p != &case);
                        current = Some((case, Instant::now()));
                        started_any = true;
                        deadline = Instant::now() + opts.timeout;
                    }
                    Some(Event::End {
                        case,
                        status,
                        message,
                        duration_s,
                        record,
                    }) => {
                        current = None;
                        deadline = Instant::now() + opts.timeout;
                        put(
                            &mut results,
                            CaseRun {
                                name: case,
                                status,
                                duration_s,
                                message,
                                record,
                            },
                        );
                    }
                    Some(Event::Device(id)) => device = Some(id),
                    None => {
                        log.push_str("[stdout] ");
                        log.push_str(&line);
                        log.push('\n');
                    }
                },
                Ok(Msg::Eof) | Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    killed = true;
                    let (name, since) = match current.take() {
                        Some(c) => c,
                        None => {
                            // Stuck before its next case: charge that case.
                            let Some(n) = pending.pop_front() else { break };
                            (n, deadline - opts.timeout)
                        }
                    };
                    started_any = true;
                    put(
                        &mut results,
                        CaseRun {
                            name,
                            status: Status::Timeout,
                            duration_s: since.elapsed().as_secs_f64(),
                            message: format!(
                                "killed after {:.1} s (--timeout {} s)",
                                since.elapsed().as_secs_f64(),
                                opts.timeout.as_secs_f64()
                            ),
                            record: None,
                        },
                    );
                    break;
                }
            }
        }
        let status = child.wait();
        let _ = reader.join();
        let err = err_reader.join().unwrap_or_default();
        let err = String::from_utf8_lossy(&err).into_owned();
        log.push_str(&err);
        if killed {
            continue;
        }
        let code = status.as_ref().ok().and_then(|s| s.code());
        let exit = status
            .map(describe_exit)
            .unwrap_or_else(|e| format!("wait failed: {e}"));
        if let Some((name, since)) = current.take() {
            put(
                &mut results,
                CaseRun {
                    name,
                    status: Status::Crash,
                    duration_s: since.elapsed().as_secs_f64(),
                    message: format!("the child {exit} during the case{}", tail(&err)),
                    record: None,
                },
            );
        } else if code == Some(0) || !started_any {
            let why = if code == Some(0) {
                "the child finished without starting it".to_owned()
            } else {
                format!("the child {exit} before starting any case{}", tail(&err))
            };
            for name in pending.drain(..) {
                put(&mut results, missing(name, &why));
            }
        } else if code != Some(EXIT_RESPAWN) {
            log.push_str(&format!(
                "[runner] child {exit} between cases; continuing in a fresh child\n"
            ));
        }
    }
    let runs = g
        .cases
        .iter()
        .map(|n| {
            results
                .remove(n)
                .unwrap_or_else(|| missing(n.clone(), "no result"))
        })
        .collect();
    GroupRun { runs, device, log }
}

fn missing(name: String, why: &str) -> CaseRun {
    CaseRun {
        name,
        status: Status::Missing,
        duration_s: 0.0,
        message: why.to_owned(),
        record: None,
    }
}

fn spawn(opts: &RunOptions, names: &VecDeque<String>) -> std::io::Result<Child> {
    let mut cmd = Command::new(&opts.exe);
    cmd.args(["ci", "child", "--device", &opts.device, "--seed"])
        .arg(opts.seed.to_string())
        .args(opts.kernels.iter().flat_map(|k| ["--kernels", k.name()]))
        .arg("--timeout-ms")
        .arg(opts.timeout.as_millis().max(1).to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in &opts.env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn()?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let list: String = names.iter().map(|n| format!("{n}\n")).collect();
    // The child reads its whole list before running anything; a child that
    // died at once makes this fail, which the reader then sees as EOF.
    let _ = stdin.write_all(list.as_bytes());
    drop(stdin);
    Ok(child)
}

/// `exited with status N` / `was killed by signal N (SIGxxx)`.
fn describe_exit(s: ExitStatus) -> String {
    if let Some(c) = s.code() {
        return format!("exited with status {c}");
    }
    let sig = s.signal().unwrap_or(0);
    let name = match sig {
        4 => " (SIGILL)",
        6 => " (SIGABRT)",
        7 => " (SIGBUS)",
        8 => " (SIGFPE)",
        9 => " (SIGKILL)",
        11 => " (SIGSEGV)",
        15 => " (SIGTERM)",
        _ => "",
    };
    format!("was killed by signal {sig}{name}")
}

/// The last lines of a child's stderr, for a crash message.
fn tail(err: &str) -> String {
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let from = lines.len().saturating_sub(3);
    format!("; stderr: {}", lines[from..].join(" | "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(value: f64, higher_is_better: bool) -> Measure {
        Measure {
            value,
            unit: "us".into(),
            higher_is_better,
        }
    }

    #[test]
    fn perf_is_judged_relative_to_the_baseline_both_ways() {
        let t = 0.25;
        assert_eq!(
            compare_perf(&m(110.0, false), &m(100.0, false), t).0,
            Status::Pass
        );
        assert_eq!(
            compare_perf(&m(130.0, false), &m(100.0, false), t).0,
            Status::Fail
        );
        assert_eq!(
            compare_perf(&m(70.0, false), &m(100.0, false), t).0,
            Status::UnexpectedImprovement
        );
        // Throughputs: lower is slower.
        assert_eq!(
            compare_perf(&m(70.0, true), &m(100.0, true), t).0,
            Status::Fail
        );
        assert_eq!(
            compare_perf(&m(130.0, true), &m(100.0, true), t).0,
            Status::UnexpectedImprovement
        );
        assert_eq!(
            compare_perf(&m(90.0, true), &m(100.0, true), t).0,
            Status::Pass
        );
    }
}
