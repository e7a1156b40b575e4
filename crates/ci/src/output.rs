//! What a run leaves in `--output DIR`: `results.csv` (every case:
//! `name,status,duration`), `failures.csv` (unexpected results only, the
//! same columns), `junit.xml`, `perf.json` and `golden.json` (this run's
//! records in the baseline format, ready to copy), and `logs/<group>.log`
//! (child stderr of groups with a result other than `Pass`/`Skip`).

use std::path::Path;
use std::time::Duration;

use quick_junit::{NonSuccessKind, Property, Report, TestCase, TestCaseStatus, TestSuite};

use super::baseline::DeviceTable;
use super::case::{Measure, Record};
use super::file_error::FileError;
use super::runner::{CaseRun, RunResult};
use super::status::{Counts, Status};

/// Writes every output file into `dir` (created if missing).
///
/// # Errors
/// [`FileError::Write`] naming the file or folder that cannot be written;
/// [`FileError::Serialize`] when a report cannot be serialized.
pub fn write_all(dir: &Path, run: &RunResult, seed: u64) -> Result<(), FileError> {
    let io = |p: &Path, e: std::io::Error| FileError::write(p, e);
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    write_csv(&dir.join("results.csv"), run.cases.iter())?;
    write_csv(
        &dir.join("failures.csv"),
        run.cases.iter().filter(|c| c.status.is_unexpected()),
    )?;
    let xml = junit(run, seed)?;
    let p = dir.join("junit.xml");
    std::fs::write(&p, xml).map_err(|e| io(&p, e))?;
    let (perf, golden) = records(run);
    perf.save(&dir.join("perf.json"))?;
    golden.save(&dir.join("golden.json"))?;
    let logs = dir.join("logs");
    if logs.exists() {
        std::fs::remove_dir_all(&logs).map_err(|e| io(&logs, e))?;
    }
    if !run.logs.is_empty() {
        std::fs::create_dir_all(&logs).map_err(|e| io(&logs, e))?;
        for (group, text) in &run.logs {
            let p = logs.join(format!("{group}.log"));
            std::fs::write(&p, text).map_err(|e| io(&p, e))?;
        }
    }
    Ok(())
}

/// `name,status,duration` lines (seconds, 3 decimals), no header: the
/// format `--baseline` reads.
///
/// # Errors
/// [`FileError::Write`] when the file cannot be written.
pub fn write_csv<'a>(
    path: &Path,
    cases: impl Iterator<Item = &'a CaseRun>,
) -> Result<(), FileError> {
    let err = |e: csv::Error| FileError::write(path, e);
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .from_path(path)
        .map_err(err)?;
    for c in cases {
        w.write_record([
            c.name.as_str(),
            c.status.name(),
            &format!("{:.3}", c.duration_s),
        ])
        .map_err(err)?;
    }
    w.flush().map_err(|e| FileError::write(path, e))
}

/// This run's perf figures and golden tokens, keyed by its device.
pub fn records(run: &RunResult) -> (DeviceTable<Measure>, DeviceTable<Vec<u32>>) {
    let key = run
        .device
        .as_ref()
        .map_or_else(|| super::runner::NO_DEVICE.to_owned(), |d| d.key());
    let mut perf = DeviceTable {
        note: "perf figures of one `xtc ci run` (median after warm-up)".into(),
        ..DeviceTable::default()
    };
    let mut golden = DeviceTable {
        note: "greedy tokens of one `xtc ci run`".into(),
        ..DeviceTable::default()
    };
    let ok = |c: &CaseRun| !c.status.is_failure();
    perf.merge(
        &key,
        run.cases
            .iter()
            .filter(|c| ok(c))
            .filter_map(|c| match &c.record {
                Some(Record::Perf(m)) => Some((c.name.clone(), m.clone())),
                _ => None,
            }),
    );
    golden.merge(
        &key,
        run.cases
            .iter()
            .filter(|c| ok(c))
            .filter_map(|c| match &c.record {
                Some(Record::Golden(t)) => Some((c.name.clone(), t.clone())),
                _ => None,
            }),
    );
    perf.devices.retain(|_, v| !v.is_empty());
    golden.devices.retain(|_, v| !v.is_empty());
    (perf, golden)
}

/// The JUnit XML report: one test suite per `xtc.<suite>`, a test case per
/// case (class name = its group). Regressions are failures (`Crash`,
/// `Timeout`, `Missing`: errors); skips are skipped; expected failures are
/// skipped with their reason; flakes, known flakes and improvements pass
/// with the message as system-out.
///
/// # Errors
/// [`FileError::Serialize`] when serialization failed.
pub fn junit(run: &RunResult, seed: u64) -> Result<String, FileError> {
    let mut report = Report::new("xtc ci");
    report.set_time(run.wall);
    let mut suites: Vec<(String, TestSuite)> = Vec::new();
    for c in &run.cases {
        let suite_name: String = c.name.split('.').take(2).collect::<Vec<_>>().join(".");
        let idx = match suites.iter().position(|(n, _)| *n == suite_name) {
            Some(i) => i,
            None => {
                let mut s = TestSuite::new(suite_name.clone());
                s.add_property(Property::new("seed", seed.to_string()));
                if let Some(d) = &run.device {
                    s.add_property(Property::new("device", d.key()));
                }
                suites.push((suite_name, s));
                suites.len() - 1
            }
        };
        let mut status = match c.status {
            Status::Pass | Status::Flake | Status::KnownFlake | Status::UnexpectedImprovement => {
                TestCaseStatus::success()
            }
            Status::Skip | Status::ExpectedFail => {
                let mut s = TestCaseStatus::skipped();
                s.set_message(format!("{}: {}", c.status, c.message));
                s
            }
            Status::Fail => TestCaseStatus::non_success(NonSuccessKind::Failure),
            Status::Crash | Status::Timeout | Status::Missing => {
                TestCaseStatus::non_success(NonSuccessKind::Error)
            }
        };
        if c.status.is_failure() {
            status.set_message(c.message.clone());
            status.set_type(c.status.name());
        }
        let mut tc = TestCase::new(c.name.clone(), status);
        tc.set_classname(c.name.rsplit_once('.').map_or("", |(g, _)| g));
        tc.set_time(Duration::from_secs_f64(c.duration_s.max(0.0)));
        if !c.message.is_empty() && !c.status.is_failure() {
            tc.set_system_out(format!("{}: {}", c.status, c.message));
        }
        suites[idx].1.add_test_case(tc);
    }
    report.add_test_suites(suites.into_iter().map(|(_, s)| s));
    report
        .to_string()
        .map_err(|e| FileError::Serialize(e.to_string()))
}

/// The table printed at the end of a run: one line per case whose status is
/// not `Pass` (all cases with `all`), then the counts and the closing line.
pub fn summary(run: &RunResult, all: bool) -> String {
    let mut out = String::new();
    let width = run
        .cases
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let shown: Vec<&CaseRun> = run
        .cases
        .iter()
        .filter(|c| all || c.status != Status::Pass)
        .collect();
    if !shown.is_empty() {
        out.push_str(&format!(
            "{:<width$}  {:<21}  {:>8}  note\n",
            "case", "status", "seconds"
        ));
        for c in shown {
            let note: String = c
                .message
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(160)
                .collect();
            out.push_str(&format!(
                "{:<width$}  {:<21}  {:>8.3}  {}\n",
                c.name, c.status, c.duration_s, note
            ));
        }
    }
    let counts = Counts::of(run.cases.iter().map(|c| c.status));
    out.push_str(&format!(
        "xtc ci: {} in {:.1} s\n",
        counts.detail_line(),
        run.wall.as_secs_f64()
    ));
    out.push_str(&counts.closing_line());
    out.push('\n');
    out
}
