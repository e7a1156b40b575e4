//! `xtc decode` end to end through the command's parser (in process) and the
//! real binary: the report, `--json`, `--trace-out`, `--compare`,
//! `--cancel-rate`, `--model`, errors for bad input (exit status 1, or 2 for
//! usage: every range check is clap's), the memory check, and the exit
//! statuses of runs with rejected requests.

use xtc_decode::model::format::checkpoint;
use xtc_decode::model::{Config, Weights};

fn xtc(args: &[&str]) -> (i32, String) {
    let mut out = Vec::new();
    let argv = ["xtc", "decode"].iter().chain(args).copied();
    let code = xtc_cli::run(argv, &mut out);
    (code, String::from_utf8(out).unwrap())
}

/// Fast flags: the toy model, a burst of arrivals.
const FAST: [&str; 4] = ["--device", "toy", "--time-scale", "10000"];

#[test]
fn prints_the_report() {
    let (code, out) = xtc(&[&FAST[..], &["--requests", "20"]].concat());
    assert_eq!(code, 0);
    for field in [
        "requests        20 (20 done",
        "throughput",
        "iterations",
        "queue",
        "TPOT",
        "end-to-end",
        "TTFT",
        "inter-token",
        "KV cache peak",
    ] {
        assert!(out.contains(field), "missing {field:?} in\n{out}");
    }
}

#[test]
fn json_report_has_the_figures() {
    let (code, out) = xtc(&[&FAST[..], &["--requests", "12", "--json"]].concat());
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["requests"]["total"], 12);
    assert_eq!(v["requests"]["completed"], 12);
    assert!(v["tokens"]["generated"].as_u64().unwrap() > 0);
    let lat = &v["latency"];
    assert!(lat["ttft"]["p99_ms"].is_number() && lat["itl"]["p50_ms"].is_number());
    let kv = &v["kv_cache"];
    assert!(kv["peak_blocks"].as_u64().unwrap() <= kv["blocks"].as_u64().unwrap());
    assert_eq!(kv["leaked_blocks"], 0);
}

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
fn compare_runs_three_policies_and_prints_ratios() {
    let (code, out) = xtc(&[&FAST[..], &["--requests", "10", "--compare", "--json"]].concat());
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for k in ["continuous", "static", "one_at_a_time"] {
        assert_eq!(v[k]["requests"]["completed"], 10, "{k}");
    }
    assert_eq!(v["one_at_a_time"]["iterations"]["mean_ready_members"], 1.0);
    assert!(v["speedup_vs_one"].as_f64().unwrap() > 0.0);
    let (code, out) = xtc(&[&FAST[..], &["--requests", "4", "--compare"]].concat());
    assert_eq!(code, 0);
    assert!(out.contains("continuous vs one-at-a-time"), "{out}");
}

#[test]
fn cancel_rate_cancels_and_leaks_no_blocks() {
    let (code, out) = xtc(&[
        "--device",
        "toy",
        "--time-scale",
        "100",
        "--requests",
        "30",
        "--cancel-rate",
        "1",
        "--json",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let cancelled = v["requests"]["cancelled"].as_u64().unwrap();
    assert!(cancelled > 0);
    assert_eq!(v["requests"]["completed"].as_u64().unwrap() + cancelled, 30);
    assert_eq!(v["kv_cache"]["leaked_blocks"], 0);
}

#[test]
fn runs_a_checkpoint_on_the_cpu_reference() {
    let c = Config {
        dim: 16,
        hidden_dim: 32,
        n_layers: 1,
        n_heads: 2,
        n_kv_heads: 1,
        vocab_size: 40,
        seq_len: 64,
    };
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.bin");
    let mut b = Vec::new();
    checkpoint::write(&Weights::synthetic(c, 1), true, &mut b).unwrap();
    std::fs::write(&p, b).unwrap();
    let m = p.to_str().unwrap();
    let (code, out) = xtc(&[
        "--model",
        m,
        "--device",
        "cpu",
        "--requests",
        "3",
        "--time-scale",
        "1000",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["requests"]["completed"].as_u64().unwrap() + v["requests"]["rejected"].as_u64().unwrap(),
        3
    );
    assert!(v["device"].as_str().unwrap().contains("CPU"));
}

#[test]
fn bad_input_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(
        &bad,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,x,1\n",
    )
    .unwrap();
    assert_eq!(
        xtc(&["--device", "toy", "--trace", bad.to_str().unwrap()]).0,
        1
    );
    let empty = dir.path().join("empty.csv");
    std::fs::write(&empty, "").unwrap();
    assert_eq!(
        xtc(&["--device", "toy", "--trace", empty.to_str().unwrap()]).0,
        1
    );
    let junk = dir.path().join("junk.bin");
    std::fs::write(&junk, [1u8, 2, 3]).unwrap();
    assert_eq!(
        xtc(&["--device", "toy", "--model", junk.to_str().unwrap()]).0,
        1
    );
    // Values out of range are usage errors (clap's value parsers).
    assert_eq!(xtc(&["--device", "toy", "--requests", "0"]).0, 2);
    assert_eq!(xtc(&["--device", "toy", "--time-scale", "0"]).0, 2);
    assert_eq!(xtc(&["--device", "toy", "--cancel-rate", "2"]).0, 2);
    assert_eq!(xtc(&["--device", "toy", "--token-budget", "0"]).0, 2);
    assert_eq!(xtc(&["--device", "toy", "--tokenizer", "/x"]).0, 2);
    assert_eq!(xtc(&["--device", "no-such-gpu-name"]).0, 1);
    assert_eq!(xtc(&["--requests", "many"]).0, 2);
}

/// Runs the `xtc` binary (stderr is part of what the user sees).
fn xtc_bin(args: &[&str]) -> (i32, String, String) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_xtc"))
        .arg("decode")
        .args(args)
        .output()
        .unwrap();
    let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (o.status.code().unwrap_or(-1), s(o.stdout), s(o.stderr))
}

/// The banner's first words: printed once the run is about to start.
const BANNER: &str = "requests from";

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
fn zero_sizes_are_refused_up_front_naming_the_option() {
    for opt in [
        "--kv-blocks",
        "--token-budget",
        "--block-size",
        "--max-active",
    ] {
        let (code, _, err) = xtc_bin(&["--device", "toy", opt, "0"]);
        assert_eq!(code, 2, "{opt}: {err}");
        assert!(
            err.contains(&format!("invalid value '0' for '{opt} <N>': must be")),
            "{err}"
        );
        assert!(
            !err.contains(BANNER),
            "{opt}: banner before the error:\n{err}"
        );
    }
}

#[test]
fn absurd_kv_cache_names_the_option_it_came_from() {
    let (code, _, err) = xtc_bin(&["--device", "toy", "--kv-blocks", "100000000000000000"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("'--kv-blocks <N>': must be from 1 to 4294967295"),
        "{err}"
    );
    // 1000 requests' worth of blocks of 10^15 positions: no machine holds it.
    let (code, _, err) = xtc_bin(&[
        "--device",
        "toy",
        "--max-active",
        "1000",
        "--block-size",
        "1000000000000000",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("derived from --max-active 1000"), "{err}");
    let (code, _, err) = xtc_bin(&["--device", "toy", "--max-active", "100000000000000000"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("'--max-active <N>': must be from 1 to 1048576"),
        "{err}"
    );
    assert!(!err.contains(BANNER), "{err}");
}

#[test]
fn negative_numbers_reach_the_range_checks() {
    let (code, _, err) = xtc_bin(&["--device", "toy", "--time-scale", "-1"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "invalid value '-1' for '--time-scale <X>': must be a finite number greater than 0"
        ),
        "{err}"
    );
    let (code, _, err) = xtc_bin(&["--device", "toy", "--cancel-rate", "-0.1"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("invalid value '-0.1' for '--cancel-rate <P>': must be a number from 0 to 1"),
        "{err}"
    );
}

#[test]
fn device_errors_echo_the_selector_and_point_to_probe() {
    let (code, _, err) = xtc_bin(&["--device", "99"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--device 99:") && !err.contains("Index("),
        "{err}"
    );
    assert!(err.contains("xtc probe"), "{err}");
    if std::env::var_os("CI").is_some() {
        // lavapipe is installed on CI: it is listed as a device that exists.
        assert!(
            err.contains("Vulkan devices here") && err.contains("llvmpipe"),
            "{err}"
        );
    }
}

#[test]
fn more_requests_than_rows_warns() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.csv");
    std::fs::write(
        &t,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00,3,2\n2024-05-10 00:00:01,4,2\n",
    )
    .unwrap();
    let t = t.to_str().unwrap();
    let (code, _, err) = xtc_bin(&[&FAST[..], &["--trace", t, "--requests", "5"]].concat());
    assert_eq!(code, 0, "{err}");
    let warn: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warn.len(), 1, "{err}");
    assert!(warn[0].contains("only 2 rows"), "{err}");
    let (_, _, err) = xtc_bin(&[&FAST[..], &["--trace", t, "--requests", "2"]].concat());
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn help_says_compare_traces_the_continuous_run() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_xtc"))
        .args(["decode", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(o.stdout).unwrap();
    assert!(help.contains("continuous run only"), "{help}");
    assert!(help.contains("plain seconds"), "{help}");
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

/// A tiny but positive `--time-scale` stretches the arrivals past what a
/// clock holds: before the fix `Duration::div_f64` panicked ("cannot convert
/// float seconds to Duration"); now it is an error naming the option, before
/// the run.
#[test]
fn time_scale_too_small_for_the_clock_is_an_error() {
    for scale in ["1e-300", "1e-12", "5e-324"] {
        let (code, out, err) =
            xtc_bin(&["--device", "toy", "--requests", "3", "--time-scale", scale]);
        assert_eq!(code, 1, "{scale}: {err}");
        assert!(err.contains(&format!("--time-scale {scale}")), "{err}");
        assert!(err.contains("larger --time-scale"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(!err.contains(BANNER), "{err}");
        assert!(out.is_empty(), "{out}");
    }
    // Small but representable: runs (the first row arrives at 0 whatever the scale).
    let (code, _, err) = xtc_bin(&[
        "--device",
        "toy",
        "--requests",
        "1",
        "--time-scale",
        "1e-300",
    ]);
    assert_eq!(code, 0, "{err}");
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

/// `xtc decode ARGS` under a 4 GiB address-space limit, so a run that
/// allocates more fails (allocation abort) instead of exhausting this machine.
fn xtc_bin_4gib(args: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_xtc"));
    cmd.arg("decode").args(args);
    // SAFETY: the closure runs in the forked child before exec and only
    // calls setrlimit(2), which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let lim = rustix::process::Rlimit {
                current: Some(4 << 30),
                maximum: Some(4 << 30),
            };
            rustix::process::setrlimit(rustix::process::Resource::As, lim)?;
            Ok(())
        });
    }
    cmd.output().unwrap()
}

/// `--kv-blocks` beyond the 32-bit block ids is refused up front naming the
/// option: before the fix the toy model first allocated one slot per
/// position (16 GiB for 2^32 blocks of 1 position, which passed the host
/// memory check) and only then failed with "invalid KV cache shape". Now
/// clap's range refuses it (usage, exit 2) before anything is allocated.
#[test]
fn kv_blocks_beyond_block_ids_are_refused_up_front() {
    let o = xtc_bin_4gib(&[
        "--device",
        "toy",
        "--requests",
        "2",
        "--kv-blocks",
        "4294967296",
        "--block-size",
        "1",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("'--kv-blocks <N>': must be from 1 to 4294967295"),
        "{err}"
    );
    assert!(!err.contains(BANNER), "{err}");
}

/// Issue 12: `--kv-blocks 4294967295 --block-size 1` on the toy model passed
/// the memory check (it counted only the toy's 16 GiB of slots, against
/// `MemTotal`) and the kernel then killed the run (exit 137, no message):
/// the block allocator's free list and flags are 20 GiB more. The check now
/// counts every part that scales with the options against what the process
/// can get (here the 4 GiB address-space limit, so the test holds on any
/// machine; the old binary aborts on the first allocation instead).
#[test]
fn memory_check_counts_the_block_allocator_and_the_toy_slots() {
    let o = xtc_bin_4gib(&[
        "--device",
        "toy",
        "--requests",
        "3",
        "--kv-blocks",
        "4294967295",
        "--block-size",
        "1",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the run needs about 36.0 GiB of host memory"),
        "{err}"
    );
    assert!(
        err.contains("block allocator 20.0 GiB") && err.contains("KV cache 16.0 GiB"),
        "{err}"
    );
    assert!(err.contains("address-space limit"), "{err}");
    assert!(err.contains("from --kv-blocks"), "{err}");
    assert!(!err.contains(BANNER), "{err}");
    assert!(o.stdout.is_empty());
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
/// to start), sends SIGINT and returns the exit status and stderr so far.
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
            rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
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
/// `--trace-out` file; now it leaves no file at all.
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

/// Issue 12: `--device ''` silently selected device 0 (the Vulkan layer reads
/// an empty selector as `auto`); it is now a usage error.
#[test]
fn an_empty_device_is_a_usage_error() {
    for dev in ["", "  "] {
        let (code, out, err) = xtc_bin(&["--device", dev, "--requests", "1"]);
        assert_eq!(code, 2, "{dev:?}: {err}");
        assert!(
            err.contains("'--device <DEV>': must name a device"),
            "{err}"
        );
        assert!(out.is_empty() && !err.contains(BANNER), "{err}");
    }
}

/// Issue 12: a run with rejected requests exited 0 and printed one line per
/// rejected request (1,383 in one run). Now one line per reason, and exit
/// status 3 with a line on stderr saying why.
#[test]
fn rejections_are_counted_per_reason_and_exit_3() {
    let args = [
        &FAST[..],
        &["--requests", "40", "--kv-blocks", "2", "--block-size", "1"],
    ]
    .concat();
    let (code, out, err) = xtc_bin(&args);
    assert_eq!(code, 3, "{err}");
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("rejected")).collect();
    assert_eq!(lines.len(), 2, "{out}"); // the request counts, one summary
    assert!(lines[0].contains("40 rejected"), "{out}");
    assert!(
        lines[1].contains("40 requests rejected: need up to")
            && lines[1].contains("but the cache has 2")
            && lines[1].contains("and 35 more"),
        "{out}"
    );
    assert!(err.contains("40 of 40 requests rejected"), "{err}");
    assert!(err.contains("exit status 3"), "{err}");
    let (code, out, _) = xtc_bin(&[&args[..], &["--json"]].concat());
    assert_eq!(code, 3);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let r = v["rejections"].as_array().unwrap();
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["reason"], "kv-blocks");
    assert_eq!(r[0]["count"], 40);
    assert_eq!(r[0]["limit"], 2);
    assert_eq!(r[0]["ids"].as_array().unwrap().len(), 40);
    let by = &v["requests"]["rejected_by_reason"];
    assert_eq!(
        (&by["kv-blocks"], &by["seq-len"], &by["submit"]),
        (&40.into(), &0.into(), &0.into())
    );
    // --compare: the worst of the three runs.
    let (code, _, _) = xtc_bin(&[&args[..], &["--compare"]].concat());
    assert_eq!(code, 3);
    // Every request fits: 0.
    let (code, _, err) = xtc_bin(&[&FAST[..], &["--requests", "5"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("exit status"), "{err}");
}

/// Issue 12: range checks were split between clap (exit 2) and the command
/// (exit 1, another style); now every single-option range is a clap value
/// parser: exit 2, "invalid value 'V' for '--OPT <N>': must be ...".
/// `--time-scale inf` said "must be positive"; it now says finite.
#[test]
fn range_errors_are_usage_errors_in_one_style() {
    for (opt, v) in [
        ("--requests", "0"),
        ("--requests", "x"),
        ("--time-scale", "0"),
        ("--time-scale", "inf"),
        ("--time-scale", "NaN"),
        ("--cancel-rate", "1.5"),
        ("--max-active", "1048577"),
        ("--kv-blocks", "0"),
        ("--block-size", "-3"),
        ("--token-budget", "0"),
        ("--prompt-div", "0"),
        ("--output-div", "0"),
    ] {
        let (code, out, err) = xtc_bin(&["--device", "toy", opt, v]);
        assert_eq!(code, 2, "{opt} {v}: {err}");
        assert!(
            err.starts_with(&format!("error: invalid value '{v}' for '{opt} <")),
            "{opt} {v}: {err}"
        );
        assert!(err.contains("': must be"), "{err}");
        assert!(out.is_empty() && !err.contains(BANNER), "{err}");
    }
    let (_, _, err) = xtc_bin(&["--device", "toy", "--time-scale", "inf"]);
    assert!(
        err.contains("must be a finite number greater than 0") && !err.contains("positive"),
        "{err}"
    );
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

#[test]
fn help_lists_the_exit_statuses() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_xtc"))
        .args(["decode", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(o.stdout).unwrap();
    assert!(help.contains("Exit status:"), "{help}");
    for line in [
        "  0  every request",
        "  1  error",
        "  2  usage error",
        "  3  the run finished but some requests were rejected",
        "  4  the run finished but some requests failed",
        "  5  KV-cache blocks were still allocated",
    ] {
        assert!(help.contains(line), "missing {line:?} in\n{help}");
    }
    assert!(help.contains("--allow-long-replay"), "{help}");
}

/// Issue 12: after the README's test command, `target/release/xtc` was the
/// build without `sched-policy` (the no-default-features suite overwrote
/// it). That suite now builds in `target/nosys`, and the README and
/// `.ci/run` run the same command.
#[test]
fn the_nosys_suite_builds_apart_and_readme_matches_ci() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let ci = std::fs::read_to_string(format!("{root}/.ci/run")).unwrap();
    let test = std::fs::read_to_string(format!("{root}/.ci/test")).unwrap();
    // .ci/run carries the README's test command line as the README writes it.
    let readme_line = readme
        .lines()
        .find(|l| l.ends_with("# the tests"))
        .expect("the README's test command");
    let ci_line = ci
        .lines()
        .find(|l| l.starts_with(".ci/ensure-deps.sh"))
        .expect("the command of .ci/run");
    assert_eq!(readme_line, ci_line);
    let ci_cmd = ci_line
        .strip_suffix("# the tests")
        .unwrap_or(ci_line)
        .trim();
    assert_eq!(ci_cmd, ".ci/ensure-deps.sh && .ci/test");
    // The suites of .ci/test: one command a line, comments aside.
    let suites: Vec<&str> = test
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for s in suites.iter().filter(|s| s.contains("cargo test")) {
        let own_dir = s.contains("CARGO_TARGET_DIR=");
        let default_build = s == &"cargo test --release";
        assert!(
            own_dir || default_build,
            "{s:?} would overwrite target/release"
        );
    }
    let nosys = suites
        .iter()
        .find(|s| s.contains("--no-default-features"))
        .unwrap();
    assert!(
        nosys.starts_with("CARGO_TARGET_DIR=target/nosys "),
        "{nosys}"
    );
    assert!(nosys.contains("--test decode_nosys"), "{nosys}");
}

/// A `--model` file that is neither GGUF nor a llama2.c checkpoint (a text
/// file here) is an error naming the file and both formats tried.
#[test]
fn a_model_file_in_neither_format_names_both() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("notes.txt");
    std::fs::write(
        &p,
        "these are not weights, just some words of text\n".repeat(4),
    )
    .unwrap();
    let p = p.to_str().unwrap();
    let (code, out, err) = xtc_bin(&["--model", p, "--device", "cpu", "--requests", "1"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(p) && err.contains("not a GGUF file") && err.contains("llama2.c checkpoint"),
        "{err}"
    );
    assert!(out.is_empty(), "{out}");
}
