//! `xtc ci run` itself (issue 15), through the binary and the hidden
//! `selftest` suite: a crashing case, a hanging case, a flaky case, a
//! failure, a baseline that matches or does not, known flakes, skips, a
//! child that stops early, perf and golden records against their
//! baselines; the output files and the exit statuses (0 as expected, 1
//! regression, 2 only improvements, 3 could not start).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};

const XTC: &str = env!("CARGO_BIN_EXE_xtc");

/// Runs `xtc ci run --suite selftest --include RE --output DIR ARGS...`.
fn run(dir: &Path, include: &str, args: &[&str]) -> (i32, HashMap<String, String>, Output) {
    run_env(dir, include, args, &[])
}

/// Seconds each selftest case may take: generous, since a loaded machine
/// may take seconds to start the child (the hanging case has its own).
const TIMEOUT: &str = "60";

fn run_env(
    dir: &Path,
    include: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (i32, HashMap<String, String>, Output) {
    run_timeout(dir, include, TIMEOUT, args, env)
}

fn run_timeout(
    dir: &Path,
    include: &str,
    timeout: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (i32, HashMap<String, String>, Output) {
    let out_dir = dir.join("out");
    let mut cmd = Command::new(XTC);
    cmd.args([
        "ci",
        "run",
        "--suite",
        "selftest",
        "--include",
        include,
        "--timeout",
        timeout,
    ])
    .arg("--output")
    .arg(&out_dir)
    .args(args)
    .env("XTC_CI_SELFTEST_DIR", dir)
    .env_remove("CI");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("xtc runs");
    let csv = std::fs::read_to_string(out_dir.join("results.csv")).unwrap_or_default();
    let statuses = csv
        .lines()
        .map(|l| {
            let mut f = l.split(',');
            (f.next().unwrap().to_owned(), f.next().unwrap().to_owned())
        })
        .collect();
    (out.status.code().unwrap_or(-1), statuses, out)
}

fn status<'a>(s: &'a HashMap<String, String>, case: &str) -> &'a str {
    s.get(&format!("xtc.selftest.{case}"))
        .unwrap_or_else(|| panic!("no result for {case} in {s:?}"))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_crashing_case_is_crash_and_the_rest_of_its_group_runs_in_a_fresh_child() {
    let dir = tempfile::tempdir().unwrap();
    let (code, s, out) = run(dir.path(), r"\.crash\.", &[]);
    assert_eq!(status(&s, "crash.abort"), "Crash");
    assert_eq!(status(&s, "crash.after"), "Pass");
    assert_eq!(code, 1, "{}", stdout(&out));
    let text = stdout(&out);
    assert!(text.contains("SIGABRT"), "{text}");
    assert!(text.ends_with("1 passed, 1 failed, 0 skipped\n"), "{text}");
    // The crashing group's child log is kept.
    let logs = dir.path().join("out/logs/xtc.selftest.crash.log");
    assert!(logs.exists());
}

#[test]
fn a_hanging_case_is_killed_as_timeout_and_the_group_continues() {
    let dir = tempfile::tempdir().unwrap();
    let (code, s, _) = run_timeout(dir.path(), r"\.hang\.", "10", &[], &[]);
    assert_eq!(status(&s, "hang.sleep"), "Timeout");
    assert_eq!(status(&s, "hang.after"), "Pass");
    assert_eq!(code, 1);
}

#[test]
fn a_case_that_fails_then_passes_on_the_rerun_is_a_flake_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let (code, s, out) = run(dir.path(), r"\.flaky\.", &[]);
    assert_eq!(status(&s, "flaky.first_run"), "Flake");
    assert_eq!(code, 0, "{}", stdout(&out));
    assert!(stdout(&out).contains("1 flaky, 0 expected failures"));
}

#[test]
fn failures_panics_and_early_stops_are_regressions() {
    let dir = tempfile::tempdir().unwrap();
    let (code, s, out) = run(dir.path(), r"\.(fail|panic|stop)\.", &["--json"]);
    assert_eq!(status(&s, "fail.always"), "Fail");
    assert_eq!(status(&s, "panic.assert"), "Fail");
    assert_eq!(status(&s, "stop.early"), "Pass");
    assert_eq!(status(&s, "stop.missing"), "Missing");
    assert_eq!(code, 1);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["exit_code"], 1);
    assert_eq!(report["counts"]["failed"], 3);
    let panic = report["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "xtc.selftest.panic.assert")
        .unwrap();
    let msg = panic["message"].as_str().unwrap();
    assert!(
        msg.contains("the answer") && msg.contains("selftest.rs"),
        "{msg}"
    );
}

#[test]
fn failures_csv_is_the_next_baseline_expected_failures_and_improvements() {
    let dir = tempfile::tempdir().unwrap();
    let (code, s, _) = run(dir.path(), r"\.(fail|pass)\.always", &[]);
    assert_eq!((code, status(&s, "fail.always")), (1, "Fail"));
    let failures = std::fs::read_to_string(dir.path().join("out/failures.csv")).unwrap();
    assert!(
        failures.starts_with("xtc.selftest.fail.always,Fail,"),
        "{failures}"
    );
    assert_eq!(failures.lines().count(), 1);
    let junit = std::fs::read_to_string(dir.path().join("out/junit.xml")).unwrap();
    assert!(junit.contains("xtc.selftest.fail.always") && junit.contains("<failure"));

    // That file as the baseline: the failure is expected, the run is green.
    let base = dir.path().join("base.csv");
    std::fs::copy(dir.path().join("out/failures.csv"), &base).unwrap();
    let b = base.to_str().unwrap();
    let (code, s, _) = run(dir.path(), r"\.(fail|pass)\.always", &["--baseline", b]);
    assert_eq!((code, status(&s, "fail.always")), (0, "ExpectedFail"));

    // A pass the baseline lists as failing: an improvement, exit 2.
    std::fs::write(&base, "xtc.selftest.pass.always,Fail\n").unwrap();
    let (code, s, _) = run(dir.path(), r"\.pass\.always", &["--baseline", b]);
    assert_eq!(
        (code, status(&s, "pass.always")),
        (2, "UnexpectedImprovement")
    );

    // A baseline that no longer matches (listed Crash, now Fail): a regression.
    std::fs::write(&base, "xtc.selftest.fail.always,Crash\n").unwrap();
    let (code, s, _) = run(dir.path(), r"\.fail\.always", &["--baseline", b]);
    assert_eq!((code, status(&s, "fail.always")), (1, "Fail"));
}

#[test]
fn known_flakes_and_skips_come_from_regex_lists() {
    let dir = tempfile::tempdir().unwrap();
    let flakes = dir.path().join("flakes.txt");
    std::fs::write(&flakes, "# known\nfail\\.always$\n").unwrap();
    let skips = dir.path().join("skips.txt");
    std::fs::write(&skips, "crash\n").unwrap();
    let args = [
        "--flakes",
        flakes.to_str().unwrap(),
        "--skips",
        skips.to_str().unwrap(),
    ];
    let (code, s, _) = run(dir.path(), r"\.(fail\.always|crash\.abort)", &args);
    assert_eq!(status(&s, "fail.always"), "KnownFlake");
    assert_eq!(status(&s, "crash.abort"), "Skip");
    assert_eq!(code, 0);
}

#[test]
fn perf_and_golden_records_are_judged_against_their_baselines() {
    let dir = tempfile::tempdir().unwrap();
    let perf = dir.path().join("perf.json");
    let golden = dir.path().join("golden.json");
    let (p, g) = (perf.to_str().unwrap(), golden.to_str().unwrap());
    // Record both baselines from this run.
    let (code, _, out) = run(
        dir.path(),
        r"\.record\.",
        &["--perf-baseline", p, "--golden", g, "--write-baseline"],
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let table: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&perf).unwrap()).unwrap();
    assert_eq!(
        table["devices"]["no device"]["xtc.selftest.record.perf"]["value"],
        100.0
    );
    let args = ["--perf-baseline", p, "--golden", g];
    let (code, s, _) = run(dir.path(), r"\.record\.", &args);
    assert_eq!(
        (code, status(&s, "record.perf"), status(&s, "record.golden")),
        (0, "Pass", "Pass")
    );

    let set = |value: f64, tokens: &str| {
        let t = format!(
            r#"{{"devices": {{"no device": {{"xtc.selftest.record.perf": {{"value": {value}, "unit": "us", "higher_is_better": false}}}}}}}}"#
        );
        std::fs::write(&perf, t).unwrap();
        let t = format!(
            r#"{{"devices": {{"no device": {{"xtc.selftest.record.golden": {tokens}}}}}}}"#
        );
        std::fs::write(&golden, t).unwrap();
    };
    // 100 us against a 50 us baseline (tolerance 25 %): slower, Fail.
    set(50.0, "[1, 2, 3]");
    let (code, s, _) = run(dir.path(), r"\.record\.", &args);
    assert_eq!((code, status(&s, "record.perf")), (1, "Fail"));
    // Against 200 us: faster beyond the tolerance, an improvement.
    set(200.0, "[1, 2, 3]");
    let (code, s, _) = run(dir.path(), r"\.record\.", &args);
    assert_eq!(
        (code, status(&s, "record.perf")),
        (2, "UnexpectedImprovement")
    );
    // A wider tolerance takes it; other golden tokens fail.
    let wide = ["--perf-baseline", p, "--golden", g, "--perf-tolerance", "3"];
    set(200.0, "[1, 2, 4]");
    let (code, s, out) = run(dir.path(), r"\.record\.", &wide);
    assert_eq!(status(&s, "record.perf"), "Pass");
    assert_eq!((code, status(&s, "record.golden")), (1, "Fail"));
    assert!(stdout(&out).contains("index 2"), "{}", stdout(&out));
    // Without a perf baseline the figure is only reported.
    let (code, s, _) = run(dir.path(), r"\.record\.perf", &[]);
    assert_eq!((code, status(&s, "record.perf")), (0, "Pass"));
}

/// A machine with no Vulkan driver (the loader finds none: the driver list
/// points at a file that does not exist) skips device cases without `CI` and
/// fails them with it; a `--device` that matches nothing on a machine that
/// has Vulkan fails either way (no silent skips).
#[test]
fn without_a_device_cases_skip_but_with_ci_set_they_fail() {
    let dir = tempfile::tempdir().unwrap();
    let args = |device: &'static str| {
        [
            "ci",
            "run",
            "--suite",
            "fence",
            "--include",
            "loop_wake",
            "--device",
            device,
        ]
    };
    let no_driver = |ci: Option<&str>| {
        let mut cmd = Command::new(XTC);
        cmd.args(args("auto"))
            .env("VK_DRIVER_FILES", "/nonexistent/icd.json")
            .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
            .env_remove("CI")
            .current_dir(dir.path());
        if let Some(ci) = ci {
            cmd.env("CI", ci);
        }
        cmd.output().unwrap()
    };
    let out = no_driver(None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("0 passed, 0 failed, 1 skipped"), "{text}");
    let out = no_driver(Some("true"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("CI is set"), "{text}");
    let out = Command::new(XTC)
        .args(args("no-such-device-anywhere"))
        .env_remove("CI")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("0 passed, 1 failed, 0 skipped") && text.contains("no-such-device-anywhere"),
        "{text}"
    );
}

#[test]
fn bad_options_exit_3_with_a_message() {
    let cases: &[&[&str]] = &[
        &["ci", "run", "--include", "("],
        &["ci", "run", "--baseline", "/no/such/baseline.csv"],
        &["ci", "run", "--suite", "bogus"],
        &["ci", "run", "--include", "no-case-has-this-name"],
        &["ci", "run", "--timeout", "0"],
        &["ci", "run", "--write-baseline"],
    ];
    for args in cases {
        let out = Command::new(XTC).args(*args).output().unwrap();
        assert_eq!(out.status.code(), Some(3), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}: no message");
    }
}

#[test]
fn list_names_every_suite_and_hides_the_selftests() {
    let out = Command::new(XTC).args(["ci", "list"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    for name in [
        "xtc.kernels.matmul.f32_win.m32_n576_k576",
        "xtc.fence.sync_file_export",
        "xtc.fence.pending_until_host_signal",
        "xtc.batch.async.cancel_in_flight",
        "xtc.dispatch.reclaim.handshake",
        "xtc.decode.synthetic.cpu.golden.p0",
        "xtc.decode.synthetic.gpu.golden.p0",
        "xtc.decode.smollm2_135m_q4_1.gpu.reference.p0",
        "xtc.decode.smollm2_135m_q4_1.cpu.batched",
        "xtc.perf.decode_iter.b32",
    ] {
        assert!(text.lines().any(|l| l == name), "{name} not listed");
    }
    assert!(!text.contains("selftest"));
    let out = Command::new(XTC)
        .args(["ci", "list", "--suite", "selftest", "--json"])
        .output()
        .unwrap();
    let items: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        items
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["suite"] == "selftest")
    );
}
