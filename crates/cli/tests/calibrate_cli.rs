//! `xtc calibrate` through the binary: on the Vulkan device (lavapipe) with
//! the real model at a tiny design it writes a valid cost file whose points
//! and fit agree with each other, and `xtc decode --device toy --toy-cost
//! FILE` replays it; bad designs are usage errors and bad cost files clear
//! errors naming the file, before anything runs. Needs the model file and
//! Vulkan for the device test; with `CI` set a missing one fails.

#[path = "../../model/tests/model_support/mod.rs"]
mod model_support;
#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn xtc(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_xtc"))
        .args(args)
        .output()
        .expect("run xtc");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The toy replaying `cost` on two requests of the embedded trace.
fn toy_with(cost: &str) -> (i32, String, String) {
    xtc(&[
        "decode",
        "--device",
        "toy",
        "--requests",
        "2",
        "--time-scale",
        "1000",
        "--toy-cost",
        cost,
    ])
}

#[test]
fn calibrates_the_real_model_on_the_vulkan_device_and_the_toy_replays_it() {
    let Some(model) = model_support::model_path() else {
        return;
    };
    if vk_support::device().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cost.json");
    let (code, out, err) = xtc(&[
        "calibrate",
        "--device",
        "auto",
        "--model",
        model.to_str().unwrap(),
        "--rows",
        "1,3",
        "--cached",
        "0,40",
        "--prefill-rows",
        "4",
        "--repeats",
        "1",
        "--output",
        file.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let printed: Value = serde_json::from_str(&out).unwrap();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(printed, v, "--json prints what --output writes");
    assert_eq!(v["format"], "xtc-iteration-cost");
    assert_eq!(v["version"], 1);
    assert_eq!(v["repeats"], 1);
    assert_eq!(v["block_size"], 16);
    assert!(v["device"].as_str().unwrap().contains("Vulkan"), "{v}");
    assert!(v["model"].as_str().unwrap().ends_with(".gguf"), "{v}");
    // 2 x 2 decode points, then a 4-row prefill after 0 and after 40 (the
    // smallest and the median cached count).
    let pts = v["points"].as_array().unwrap();
    let shape: Vec<(&str, u64, u64, u64)> = pts
        .iter()
        .map(|p| {
            (
                p["kind"].as_str().unwrap(),
                p["rows"].as_u64().unwrap(),
                p["cached"].as_u64().unwrap(),
                p["positions_read"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("decode", 1, 0, 1),
            ("decode", 3, 0, 3),
            ("decode", 1, 40, 41),
            ("decode", 3, 40, 123),
            ("prefill", 4, 0, 10),
            ("prefill", 4, 40, 170),
        ]
    );
    let c = &v["cost"];
    let coef = ["fixed_us", "per_row_us", "per_position_us"].map(|k| c[k].as_f64().unwrap());
    for p in pts {
        let f = |k: &str| p[k].as_f64().unwrap();
        assert!(f("measured_us") > 0.0, "{p}");
        assert_eq!(p["samples_us"].as_array().unwrap().len(), 1);
        assert!(
            (f("measured_us") - f("fitted_us") - f("residual_us")).abs() < 1e-3,
            "{p}"
        );
        let rows = p["rows"].as_f64().unwrap();
        let fitted = coef[0] + coef[1] * rows + coef[2] * f("positions_read");
        assert!(
            (fitted - f("fitted_us")).abs() < 1e-3 * fitted.abs().max(1.0),
            "{p}"
        );
    }
    // The toy replays the fit (its report names the modeled cost).
    let (code, out, err) = toy_with(file.to_str().unwrap());
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("modeled iteration"), "{err}");
    assert!(out.contains("requests        2 (2 done"), "{out}");
}

#[test]
fn bad_designs_are_usage_errors() {
    for (args, says) in [
        (&["--cached", "100"][..], "--cached needs at least two"),
        (&["--rows", "8"][..], "--rows needs at least two"),
        (&["--repeats", "0"][..], "--repeats"),
        (&["--rows", "1,x"][..], "\"x\" must be a whole number"),
        (&["--prefill-rows", "0"][..], "\"0\" must be from 1"),
    ] {
        let (code, _, err) = xtc(&[&["calibrate"][..], args].concat());
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn bad_cost_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.json");
    let good = r#"{"format":"xtc-iteration-cost","version":1,"model":"m","device":"d",
        "cpu":null,"load_average_1m":null,"measured_at_unix_s":0,"block_size":16,"repeats":1,
        "cost":{"fixed_us":FIXED,"per_row_us":20.0,"per_position_us":0.5},
        "r_squared":0.99,"rms_residual_us":1.0,"points":[]}"#;
    let cases = [
        (
            missing.to_str().unwrap().to_string(),
            "cannot read the cost file",
        ),
        (
            write(dir.path(), "text.json", "fixed 3 ms\n"),
            "not an iteration-cost file (write one with `xtc calibrate --output FILE`)",
        ),
        (
            write(
                dir.path(),
                "short.json",
                r#"{"format":"xtc-iteration-cost"}"#,
            ),
            "missing field",
        ),
        (
            write(
                dir.path(),
                "other.json",
                &good
                    .replace("xtc-iteration-cost", "something-else")
                    .replace("FIXED", "1"),
            ),
            "format \"something-else\" version 1, expected \"xtc-iteration-cost\" version 1",
        ),
        (
            write(dir.path(), "huge.json", &good.replace("FIXED", "1e300")),
            "cost.fixed_us = 1e300 is not a finite number",
        ),
    ];
    for (path, says) in &cases {
        let (code, _, err) = toy_with(path);
        assert_eq!(code, 1, "{path}: {err}");
        assert!(
            err.contains("--toy-cost") && err.contains(says),
            "{path}: {err}"
        );
        assert!(err.contains(path.as_str()), "names the file: {err}");
    }
    // The same file with a sane coefficient runs; a negative one (a term
    // below the noise) replays as 0 rather than failing.
    for fixed in ["1000", "-5"] {
        let ok = write(dir.path(), "ok.json", &good.replace("FIXED", fixed));
        let (code, _, err) = toy_with(&ok);
        assert_eq!(code, 0, "{err}");
        assert!(err.contains("modeled iteration"), "{err}");
    }
    // Inline coefficients: two or three numbers, else a usage error.
    let (code, _, err) = toy_with("1,2,3,4");
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("FIXED_US,PER_ROW_US[,PER_POSITION_US]"),
        "{err}"
    );
    let (code, _, err) = toy_with("100,10,0.25");
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("100 us + 10 us per token row + 0.250 us"),
        "{err}"
    );
}
