//! `scripts/serve-side-by-side.py` (xtc serve beside llama-server under
//! aiperf) without running a server: its table from aiperf exports
//! (`--render`, on fixtures written here) and its refusals of bad
//! arguments (exit status 2, one line).

use std::process::{Command, Output};

fn script(args: &[&str]) -> Output {
    Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/serve-side-by-side.py"
        ))
        .args(args)
        .output()
        .expect("python3 runs")
}

/// The parts of aiperf's `profile_export_aiperf.json` the table reads.
fn export(done: f64, ended: f64, goodput: Option<(f64, f64)>) -> serde_json::Value {
    let dist =
        |p50: f64, p99: f64| serde_json::json!({"unit": "ms", "avg": p50, "p50": p50, "p99": p99});
    let mut v = serde_json::json!({
        "aiperf_version": "0.13.0",
        "request_count": {"unit": "requests", "avg": done},
        "completed_request_count": {"unit": "requests", "avg": ended},
        "output_token_throughput": {"unit": "tokens/sec", "avg": 31.25},
        "time_to_first_token": dist(2946.7, 12618.3),
        "inter_token_latency": dist(606.8, 898.4),
        "benchmark_duration": {"unit": "sec", "avg": 24.5},
    });
    if ended > done {
        v["error_request_count"] = serde_json::json!({"unit": "requests", "avg": ended - done});
    }
    if let Some((g, n)) = goodput {
        v["goodput"] = serde_json::json!({"unit": "requests/sec", "avg": g});
        v["good_request_count"] = serde_json::json!({"unit": "requests", "avg": n});
    }
    v
}

#[test]
fn render_prints_a_markdown_table_with_goodput_and_the_slo() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("xtc");
    let b = dir.path().join("llama");
    for (d, v) in [
        (&a, export(32.0, 32.0, Some((0.9, 22.0)))),
        (&b, export(26.0, 32.0, Some((0.25, 6.0)))),
    ] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("profile_export_aiperf.json"), v.to_string()).unwrap();
    }
    let o = script(&[
        "--render",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--slo-ttft-ms",
        "5000",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("| server | requests done | generated tokens/s |"),
        "{out}"
    );
    assert!(lines[0].contains("goodput at the SLO"), "{out}");
    assert_eq!(lines[1], "|---|---:|---:|---:|---:|---:|");
    assert_eq!(
        lines[2],
        "| `xtc serve` | 32 | 31.2 | 2,947 / 12,618 | 607 / 898 | 0.90 (22) |"
    );
    assert_eq!(
        lines[3],
        "| llama.cpp `llama-server` | 26 of 32 (6 failed) | 31.2 | 2,947 / 12,618 | 607 / 898 | 0.25 (6) |"
    );
    assert!(
        out.contains("SLO: TTFT <= 5000 ms and mean inter-token latency <= 500 ms"),
        "{out}"
    );
    // An export without goodput (aiperf run without --goodput): a dash.
    std::fs::write(
        a.join("profile_export_aiperf.json"),
        export(32.0, 32.0, None).to_string(),
    )
    .unwrap();
    let o = script(&["--render", a.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("| 607 / 898 | - |"), "{out}");
}

#[test]
fn bad_arguments_exit_2_with_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().to_str().unwrap();
    for args in [
        &["--requests", "0"][..],
        &["--slo-ttft-ms", "-1"],
        &["--slo-itl-ms", "x"],
        &["--render", empty],
        &["--skip-llama", "--skip-xtc"],
        &["--model", "/nonexistent/model.gguf"],
    ] {
        let o = script(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("error: ") && err.lines().count() <= 20,
            "{args:?}: {err}"
        );
    }
    let o = script(&["--help"]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(
        help.contains("--goodput") && help.contains("--no-repack"),
        "{help}"
    );
}
