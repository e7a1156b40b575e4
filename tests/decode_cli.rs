//! `xtc decode` end to end through the command's parser (in process): the
//! report, `--json`, `--trace-out`, `--compare`, `--cancel-rate`, `--model`,
//! and errors for bad input (exit status 1, or 2 for usage).

use xtc::decode::checkpoint;
use xtc::decode::model::{Config, Weights};

fn xtc(args: &[&str]) -> (i32, String) {
    let mut out = Vec::new();
    let argv = ["xtc", "decode"].iter().chain(args).copied();
    let code = xtc::cli::run(argv, &mut out);
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
        "queue time",
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
    assert_eq!(v["requests"], 12);
    assert_eq!(v["completed"], 12);
    assert!(v["generated_tokens"].as_u64().unwrap() > 0);
    assert!(v["ttft"]["p99_ms"].is_number() && v["itl"]["p50_ms"].is_number());
    assert!(v["kv_peak_blocks"].as_u64().unwrap() <= v["kv_blocks"].as_u64().unwrap());
    assert_eq!(v["kv_leaked_blocks"], 0);
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
    let running = ev.iter().filter(|e| e["name"] == "running").count();
    assert!(iters > 0);
    assert_eq!(running, 6);
    assert!(
        ev.iter()
            .all(|e| e["ph"] == "M" || e["dur"].as_f64().unwrap() >= 0.0)
    );
}

#[test]
fn compare_runs_three_policies_and_prints_ratios() {
    let (code, out) = xtc(&[&FAST[..], &["--requests", "10", "--compare", "--json"]].concat());
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for k in ["continuous", "static", "one_at_a_time"] {
        assert_eq!(v[k]["completed"], 10, "{k}");
    }
    assert_eq!(v["one_at_a_time"]["mean_ready"], 1.0);
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
    let cancelled = v["cancelled"].as_u64().unwrap();
    assert!(cancelled > 0);
    assert_eq!(v["completed"].as_u64().unwrap() + cancelled, 30);
    assert_eq!(v["kv_leaked_blocks"], 0);
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
        v["completed"].as_u64().unwrap() + v["rejected"].as_u64().unwrap(),
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
    assert_eq!(xtc(&["--device", "toy", "--requests", "0"]).0, 1);
    assert_eq!(xtc(&["--device", "toy", "--time-scale", "0"]).0, 1);
    assert_eq!(xtc(&["--device", "toy", "--cancel-rate", "2"]).0, 1);
    assert_eq!(xtc(&["--device", "toy", "--token-budget", "0"]).0, 1);
    assert_eq!(xtc(&["--device", "toy", "--tokenizer", "/x"]).0, 1);
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
        assert_eq!(code, 1, "{opt}: {err}");
        assert!(err.contains(&format!("{opt} must be at least 1")), "{err}");
        assert!(
            !err.contains(BANNER),
            "{opt}: banner before the error:\n{err}"
        );
    }
}

#[test]
fn absurd_kv_cache_names_the_option_it_came_from() {
    let (code, _, err) = xtc_bin(&["--device", "toy", "--kv-blocks", "100000000000000000"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("from --kv-blocks"), "{err}");
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
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--max-active 100000000000000000 is more than"),
        "{err}"
    );
    assert!(!err.contains(BANNER), "{err}");
}

#[test]
fn negative_numbers_reach_the_range_checks() {
    let (code, _, err) = xtc_bin(&["--device", "toy", "--time-scale", "-1"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--time-scale must be a positive number, not -1"),
        "{err}"
    );
    let (code, _, err) = xtc_bin(&["--device", "toy", "--cancel-rate", "-0.1"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--cancel-rate must be in 0..=1, not -0.1"),
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

/// `--kv-blocks` beyond the 32-bit block ids is refused up front naming the
/// option: before the fix the toy model first allocated one slot per
/// position (16 GiB for 2^32 blocks of 1 position, which passed the host
/// memory check) and only then failed with "invalid KV cache shape". The
/// child runs under a 4 GiB address-space limit so the old behaviour fails
/// (allocation abort) instead of exhausting this machine.
#[test]
fn kv_blocks_beyond_block_ids_are_refused_up_front() {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_xtc"));
    cmd.args(["decode", "--device", "toy", "--requests", "2"])
        .args(["--kv-blocks", "4294967296", "--block-size", "1"]);
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
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("4294967295 blocks") && err.contains("from --kv-blocks"),
        "{err}"
    );
    assert!(!err.contains(BANNER), "{err}");
}
