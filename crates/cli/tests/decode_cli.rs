//! `xtc decode` end to end through the command's parser (in process) and the
//! real binary: the report, `--json`, `--trace-out`, `--compare`,
//! `--cancel-rate`, `--model`, errors for bad input (exit status 1, or 2 for
//! usage: every range check is clap's), the memory check, and the exit
//! statuses of runs with rejected requests.

use xtc_model::format::checkpoint;
use xtc_model::{Config, Weights};

mod decode_cli_support;

use decode_cli_support::{BANNER, FAST, xtc, xtc_bin};

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
    // Issue 22: named up front, before the run, by trace row.
    let early = err
        .find("xtc decode: warning: 40 of 40 requests can never fit")
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        early < err.find("40 of 40 requests rejected").unwrap(),
        "{err}"
    );
    assert!(
        err.contains("trace row 1 (ContextTokens ")
            && err.contains("KV blocks of 1 position, the cache has 2")
            && err.contains("; and 35 more"),
        "{err}"
    );
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
    assert!(!err.contains("can never fit"), "{err}");
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
    // The suites of .ci/test: one command a line, comments aside, each
    // without the `2>&1 | tee LOG` that keeps its output.
    let suites: Vec<&str> = test
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split(" 2>&1 | tee ").next().unwrap_or(l).trim())
        .collect();
    for s in suites.iter().filter(|s| s.contains("cargo test")) {
        let own_dir = s.contains("CARGO_TARGET_DIR=");
        let default_build = s == &"cargo test --release --no-fail-fast";
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
