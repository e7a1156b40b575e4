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
