//! `scripts/peers/llama-cpp.sh` (the peer harness of issue 23) answers
//! `--help` and refuses bad arguments with exit status 2, without building or
//! downloading anything (the harness itself is never run here: it builds
//! llama.cpp for minutes and measures speed).

use std::process::Command;

fn script(args: &[&str]) -> std::process::Output {
    Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/peers/llama-cpp.sh"
        ))
        .args(args)
        .output()
        .expect("bash runs")
}

#[test]
fn help_describes_the_harness() {
    let out = script(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("llama-cpp-python"), "{text}");
    assert!(text.contains("--repack 0"), "{text}");
    assert!(text.contains("--build-only"), "{text}");
    assert!(text.contains("--halt-poll-ns"), "{text}");
}

#[test]
fn bad_arguments_exit_2_with_a_line() {
    for args in [
        &["--bogus"][..],
        &["--threads", "x"],
        &["--threads"],
        &["--pin", "latest"],
        &["--model", "/nonexistent/model.gguf"],
        &["--halt-poll-ns", "x"],
        &["--halt-poll-ns", "-5"],
        &["--halt-poll-ns"],
    ] {
        let out = script(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("peers: error: "), "{args:?}: {err}");
    }
}

/// The measuring half records how idle CPUs wait (it matters to lavapipe's
/// sleeping workers, not to llama.cpp's spinning threads), restores a
/// `--halt-poll-ns` it set even when the run fails, and refuses a value out
/// of range, all before llama.cpp would run.
#[test]
fn run_py_checks_halt_poll_and_records_the_idle_state() {
    let run = |args: &[&str]| {
        Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../scripts/peers/run.py"
            ))
            .args(["--bin", "/nonexistent", "--model", "/nonexistent"])
            .args(args)
            .output()
            .expect("python3 runs")
    };
    let out = run(&["--halt-poll-ns", "20000000"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--halt-poll-ns wants 0 to 10000000"), "{err}");
    // Without the option nothing is touched; the missing tools are named.
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("llama-bench is missing"), "{err}");
    assert!(!err.contains("guest_halt_poll_ns"), "{err}");
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/peers/run.py"
    ))
    .unwrap();
    assert!(
        src.contains("\"idle\": idle_state()"),
        "the JSON records the idle state"
    );
}

/// The harness's one-stream ceiling from dispatch groups alone: from the
/// one-member profile of `--bench llama`'s JSON, groups x fastest group
/// bounds a token's device time from below (154 x 82.6 us = 12.72 ms, at most
/// 78.6 tokens/s, 0.654x of a 120.2 tokens/s tg128); no ceiling without a
/// one-member profile (the CPU reference's side, `--skip-xtc`); a profile
/// with persistent chains marks it `chained` (a loose bound).
#[test]
fn run_py_one_stream_ceiling_from_the_profile() {
    let code = r#"
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("run", sys.argv[1])
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)
x = {"sides": [{"side": "cpu-reference", "rows": []},
               {"side": "vulkan", "profiles": [
                   {"members": 32, "groups_per_iteration": 154, "fastest_group_us": 146.4},
                   {"members": 1, "groups_per_iteration": 154, "fastest_group_us": 82.6}]}]}
chained = {"sides": [{"side": "vulkan", "profiles": [
    {"members": 1, "groups_per_iteration": 7, "fastest_group_us": 66.5, "chained": True}]}]}
print(json.dumps([run.handoff_ceiling(x, 120.2), run.handoff_ceiling(None, 120.2),
                  run.handoff_ceiling({"sides": [x["sides"][0]]}, 120.2),
                  run.handoff_ceiling(chained, 140.4)]))
"#;
    let out = Command::new("python3")
        .args(["-c", code])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/peers/run.py"
        ))
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v[0];
    assert_eq!(c["groups"], 154);
    assert!(
        (c["floor_ms"].as_f64().unwrap() - 12.7204).abs() < 1e-6,
        "{c}"
    );
    assert!(
        (c["tokens_per_s"].as_f64().unwrap() - 78.614).abs() < 1e-2,
        "{c}"
    );
    assert!((c["ratio"].as_f64().unwrap() - 0.654).abs() < 1e-3, "{c}");
    assert_eq!(c["chained"], false, "{c}");
    assert!(v[1].is_null() && v[2].is_null(), "{v}");
    // A profile with persistent chains: the bound is marked loose.
    assert_eq!(v[3]["groups"], 7);
    assert_eq!(v[3]["chained"], true, "{v}");
}
