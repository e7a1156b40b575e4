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
}

#[test]
fn bad_arguments_exit_2_with_a_line() {
    for args in [
        &["--bogus"][..],
        &["--threads", "x"],
        &["--threads"],
        &["--pin", "latest"],
        &["--model", "/nonexistent/model.gguf"],
    ] {
        let out = script(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("peers: error: "), "{args:?}: {err}");
    }
}
