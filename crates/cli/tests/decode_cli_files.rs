//! `xtc decode`'s output files through the real binary: `--trace-out`
//! (Chrome trace contents, written atomically after the run, left alone or
//! absent after a failed or interrupted run, refused up front when it cannot
//! be written) and replays of short or spaced traces.

mod decode_cli_support;

use decode_cli_support::{BANNER, FAST, xtc, xtc_bin};
use xtc_model::format::checkpoint;
use xtc_model::{Config, Weights};

#[test]
fn trace_out_writes_chrome_trace_json() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("run.json");
    let (code, _) = xtc(&[
        &FAST[..],
        &["--requests", "6", "--trace-out", p.to_str().unwrap()],
    ]
    .concat());
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    let iters = ev.iter().filter(|e| e["cat"] == "iteration").count();
    let running = ev
        .iter()
        .filter(|e| e["name"] == "running" && e["ph"] == "b")
        .count();
    assert!(iters > 0);
    assert_eq!(running, 6);
    assert!(
        ev.iter()
            .all(|e| e["ph"] != "X" || e["dur"].as_f64().unwrap() >= 0.0)
    );
}

/// Issue 16: the trace names its process and threads, has counter tracks
/// (KV blocks used, ready vector, waiting requests), iteration slices of one
/// name with the index in args, each request as async slices rooted at one
/// name (one track group in Perfetto, not a track per request) with a
/// first-token instant, and an instant per rejected request.
#[test]
fn trace_out_has_metadata_counters_async_requests_and_rejections() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("run.json");
    let (code, out) = xtc(&[
        &FAST[..],
        &[
            "--requests",
            "40",
            "--kv-blocks",
            "30",
            "--block-size",
            "1",
            "--json",
            "--trace-out",
            p.to_str().unwrap(),
        ],
    ]
    .concat());
    assert_eq!(code, 3);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    let of = |ph: &str, name: &str| -> Vec<&serde_json::Value> {
        ev.iter()
            .filter(|e| e["ph"] == ph && e["name"] == name)
            .collect()
    };
    // Metadata: the process and its two threads.
    let proc_names = of("M", "process_name");
    assert_eq!(proc_names.len(), 1);
    assert_eq!(proc_names[0]["args"]["name"], "xtc decode (continuous)");
    let threads: Vec<&str> = of("M", "thread_name")
        .iter()
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(threads, ["iterations", "rejections"]);
    // Iterations: one name, their index in args, as many as the report's.
    let its = of("X", "iteration");
    assert_eq!(
        its.len() as u64,
        report["iterations"]["count"].as_u64().unwrap()
    );
    assert!(its.iter().enumerate().all(|(i, e)| e["args"]["index"] == i));
    assert!(
        ev.iter()
            .filter(|e| e["ph"] == "X")
            .all(|e| e["name"] == "iteration")
    );
    // Counters: KV blocks never above the cache or below 0, peak as reported;
    // the ready vector as the iterations; waiting requests back to 0.
    let kv: Vec<f64> = of("C", "KV blocks used")
        .iter()
        .map(|e| e["args"]["blocks"].as_f64().unwrap())
        .collect();
    assert_eq!(kv.len(), its.len());
    let peak = kv.iter().copied().fold(0.0, f64::max);
    assert!(peak <= 30.0 && peak > 0.0, "{peak}");
    let ready = of("C", "ready vector");
    assert_eq!(ready.len(), its.len());
    let waiting: Vec<f64> = of("C", "waiting requests")
        .iter()
        .map(|e| e["args"]["requests"].as_f64().unwrap())
        .collect();
    assert!(waiting.iter().all(|&n| n >= 0.0), "{waiting:?}");
    assert_eq!(waiting.last(), Some(&0.0));
    let completed = report["requests"]["completed"].as_u64().unwrap() as usize;
    assert_eq!(waiting.len(), 2 * completed);
    // Requests: async slices rooted at `request`, ids = request ids.
    let roots = of("b", "request");
    assert_eq!(roots.len(), completed);
    assert!(
        roots
            .iter()
            .all(|e| e["cat"] == "request" && e["id"].is_u64())
    );
    assert_eq!(of("e", "request").len(), completed);
    assert_eq!(of("n", "first token").len(), completed);
    for ph in ["b", "e", "n"] {
        assert!(
            ev.iter()
                .filter(|e| e["ph"] == ph)
                .all(|e| e["cat"] == "request")
        );
    }
    // No track per request: only the two named threads hold events.
    let tids: std::collections::BTreeSet<u64> = ev
        .iter()
        .filter(|e| e["ph"] == "X" || e["ph"] == "i")
        .map(|e| e["tid"].as_u64().unwrap())
        .collect();
    assert!(tids.len() <= 2, "{tids:?}");
    // Rejections: one instant each, with the reason.
    let rej = of("i", "rejected");
    assert_eq!(
        rej.len() as u64,
        report["requests"]["rejected"].as_u64().unwrap()
    );
    assert!(rej.iter().all(|e| e["args"]["reason"] == "kv-blocks"));
}

#[test]
fn bad_trace_out_path_fails_before_the_run() {
    let p = "/nonexistent/dir/t.json";
    let (code, out, err) = xtc_bin(&[&FAST[..], &["--requests", "5", "--trace-out", p]].concat());
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(p) && err.contains("--trace-out"), "{err}");
    assert!(!err.contains(BANNER), "failed only after the run:\n{err}");
    assert!(out.is_empty(), "{out}");
}

#[test]
fn a_late_trace_out_failure_keeps_the_report() {
    // /dev/full opens but every write fails (ENOSPC): the failure comes after the run.
    if !std::path::Path::new("/dev/full").exists() {
        assert!(std::env::var_os("CI").is_none(), "/dev/full missing on CI");
        return;
    }
    let (code, out, err) =
        xtc_bin(&[&FAST[..], &["--requests", "4", "--trace-out", "/dev/full"]].concat());
    assert_eq!(code, 1, "{err}");
    assert!(
        out.contains("requests        4 (4 done"),
        "report lost:\n{out}"
    );
    assert!(err.contains("--trace-out /dev/full"), "{err}");
}

/// Bad input loses nothing: before the fix `--trace-out` truncated an
/// existing file before the rest of the input was checked, so a run that
/// then failed (here: no such device) left the previous trace empty, and
/// `--trace-out` naming the `--model` file destroyed the checkpoint before
/// it was read.
#[test]
fn a_failed_run_leaves_an_existing_trace_out_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.json");
    std::fs::write(&old, "previous trace").unwrap();
    let o = old.to_str().unwrap();
    let (code, _, err) = xtc_bin(&["--device", "no-such-gpu-name", "--trace-out", o]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(std::fs::read_to_string(&old).unwrap(), "previous trace");
    let m = dir.path().join("m.bin");
    let mut b = Vec::new();
    checkpoint::write(&Weights::synthetic(Config::tiny(), 1), true, &mut b).unwrap();
    std::fs::write(&m, &b).unwrap();
    let ms = m.to_str().unwrap();
    let (code, _, err) = xtc_bin(&[&FAST[..], &["--model", ms, "--trace-out", ms]].concat());
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--trace-out") && err.contains("--model"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&m).unwrap(),
        b,
        "the checkpoint was overwritten"
    );
}

/// A trace of `rows` two-token requests, one every `gap` seconds.
fn spaced_trace(dir: &std::path::Path, rows: usize, gap: u64) -> std::path::PathBuf {
    let mut csv = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
    for i in 0..rows as u64 {
        csv += &format!("{},3,2\n", i * gap);
    }
    let p = dir.join(format!("trace-{rows}x{gap}.csv"));
    std::fs::write(&p, csv).unwrap();
    p
}

/// Files in `dir` (names), sorted.
fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Starts `xtc decode ARGS`, reads stderr until the banner (the run is about
/// to start), sends SIGTERM and returns the exit status and stderr so far.
/// SIGTERM, not SIGINT: a shell without job control starts its background
/// commands with SIGINT ignored, the child inherits that, and with SIGINT
/// this test then waited forever for a run that ignored it (found running
/// `.ci/test` in the background).
fn interrupt_after_banner(args: &[&str]) -> (std::process::ExitStatus, String) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_xtc"))
        .arg("decode")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        err += &line;
        err.push('\n');
        if line.contains(BANNER) {
            let pid = rustix::process::Pid::from_child(&child);
            rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
            break;
        }
    }
    let status = child.wait().unwrap();
    (status, err)
}

/// Issue 12: `--trace-out new.json` left a 0-byte `new.json` when the run
/// failed after the path check (here: no such device). Now the trace goes
/// to a temporary file that is renamed only after a successful run, and the
/// up-front probe leaves nothing behind.
#[test]
fn a_failed_run_leaves_no_trace_out_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("new.json");
    let (code, _, err) = xtc_bin(&[
        "--device",
        "no-such-gpu-name",
        "--trace-out",
        p.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(!p.exists(), "a failed run left {}", p.display());
    assert!(listing(dir.path()).is_empty(), "{:?}", listing(dir.path()));
}

/// Issue 12: an interrupted run (Ctrl-C during the replay) left a 0-byte
/// `--trace-out` file; now it leaves no file at all. The run is ended by a
/// signal whose default action ends it, as Ctrl-C's does (SIGTERM here, see
/// `interrupt_after_banner`).
#[test]
fn an_interrupted_run_leaves_no_trace_out_file() {
    let dir = tempfile::tempdir().unwrap();
    // The second request arrives 1000 s after the first: the run is still
    // waiting for it when interrupted.
    let t = spaced_trace(dir.path(), 2, 1000);
    let p = dir.path().join("new.json");
    let (status, err) = interrupt_after_banner(&[
        "--device",
        "toy",
        "--time-scale",
        "1",
        "--trace",
        t.to_str().unwrap(),
        "--trace-out",
        p.to_str().unwrap(),
    ]);
    assert!(!status.success(), "{err}");
    assert!(err.contains(BANNER), "{err}");
    assert!(!p.exists(), "an interrupted run left {}", p.display());
    assert_eq!(listing(dir.path()), ["trace-2x1000.csv"]);
}

/// A successful run replaces an existing `--trace-out` file in one rename:
/// its permission bits are kept, and a symlink stays a symlink (the file it
/// points to gets the trace).
#[test]
fn trace_out_replaces_the_file_after_the_run_keeping_mode_and_links() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.json");
    std::fs::write(&real, "previous trace").unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o640)).unwrap();
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let (code, _, err) = xtc_bin(
        &[
            &FAST[..],
            &["--requests", "3", "--trace-out", link.to_str().unwrap()],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&real).unwrap()).unwrap();
    assert!(v["traceEvents"].is_array());
    let mode = std::fs::metadata(&real).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    assert_eq!(listing(dir.path()), ["link.json", "real.json"]);
}

#[test]
fn a_directory_as_trace_out_is_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (code, _, err) = xtc_bin(&[&FAST[..], &["--requests", "2", "--trace-out", d]].concat());
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is a directory"), "{err}");
    assert!(!err.contains(BANNER), "{err}");
}

/// Issue 12: a 4-row `--trace` without `--requests` warned "--requests 512
/// but the trace has only 4 rows"; the default now replays every row of a
/// shorter trace silently.
#[test]
fn a_short_trace_without_requests_replays_every_row_without_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let t = spaced_trace(dir.path(), 4, 1);
    let (code, out, err) = xtc_bin(&[&FAST[..], &["--trace", t.to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
    assert!(out.contains("requests        4 (4 done"), "{out}");
}

/// Issue 12: `--time-scale 1e-9` accepted a replay of 136 years. A replay
/// longer than a day is refused (exit 1, naming the option and the way out)
/// unless `--allow-long-replay` is given.
#[test]
fn replays_longer_than_a_day_need_allow_long_replay() {
    let dir = tempfile::tempdir().unwrap();
    let t = spaced_trace(dir.path(), 2, 5);
    let t = t.to_str().unwrap();
    let base = ["--device", "toy", "--trace", t, "--time-scale", "1e-9"];
    let (code, out, err) = xtc_bin(&base);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--time-scale 1e-9") && err.contains("longer than a day"),
        "{err}"
    );
    assert!(err.contains("about 158 years"), "{err}");
    assert!(err.contains("--allow-long-replay"), "{err}");
    assert!(out.is_empty() && !err.contains(BANNER), "{err}");
    // Asked for: the run starts (and is interrupted while it waits).
    let (status, err) = interrupt_after_banner(&[&base[..], &["--allow-long-replay"]].concat());
    assert!(err.contains(BANNER), "{err}");
    assert!(!status.success());
    // One row arrives at 0 whatever the scale: runs.
    let (code, _, err) = xtc_bin(&[
        "--device",
        "toy",
        "--trace",
        t,
        "--time-scale",
        "1e-9",
        "--requests",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
}
