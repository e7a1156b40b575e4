//! `xtc probe`: table and JSON over fixture trees, the clear "no node"
//! answer, and usage errors.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .join("devices")
        .join(name)
}

fn run(args: &[&str]) -> (i32, String) {
    let mut out = Vec::new();
    let mut argv = vec!["xtc"];
    argv.extend_from_slice(args);
    let code = xtc_cli::run(argv, &mut out);
    (code, String::from_utf8(out).unwrap())
}

#[test]
fn json_report_places_the_gpu_on_its_node_loop() {
    let root = fixture("nvidia-2node");
    let (code, out) = run(&[
        "probe",
        "--json",
        "--loops",
        "4",
        "--sysfs-root",
        root.to_str().unwrap(),
    ]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["host_nodes"], 2);
    assert_eq!(v["loop_nodes"], serde_json::json!([0, 1, 0, 1]));
    let d = &v["devices"][0];
    assert_eq!(
        (
            d["name"].as_str(),
            d["numa_node"].as_u64(),
            d["loop_idx"].as_u64()
        ),
        (Some("renderD128"), Some(1), Some(1))
    );
    assert_eq!(d["driver"], "nvidia");
    assert_eq!(d["pci"]["address"], "0000:41:00.0");
}

#[test]
fn table_lists_every_node_with_notes() {
    let root = fixture("amd-two-render");
    let (code, out) = run(&[
        "probe",
        "--loops",
        "4",
        "--sysfs-root",
        root.to_str().unwrap(),
    ]);
    assert_eq!(code, 0);
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("renderD")).collect();
    assert_eq!(rows.len(), 2, "{out}");
    for row in rows {
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!((cols[2], cols[5], cols[7]), ("amdgpu", "3", "3"), "{row}");
    }
    let bad = fixture("bad-sysfs");
    let (_, out) = run(&["probe", "--sysfs-root", bad.to_str().unwrap()]);
    assert!(
        out.contains("note: numa_node: unparsable \"banana\""),
        "{out}"
    );
}

#[test]
fn empty_root_says_no_node_exists() {
    let t = tempfile::tempdir().unwrap();
    let (code, out) = run(&["probe", "--sysfs-root", t.path().to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out.contains("no render or accel node exists"), "{out}");
    let (code, out) = run(&[
        "probe",
        "--json",
        "--sysfs-root",
        t.path().to_str().unwrap(),
    ]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["devices"], serde_json::json!([]));
}

#[test]
fn bad_arguments_fail_clearly() {
    assert_eq!(
        run(&["probe", "--loops", "0"]).0,
        2,
        "--loops 0 is a usage error"
    );
    assert_eq!(run(&["probe", "--bogus"]).0, 2);
    assert_eq!(run(&[]).0, 2, "a subcommand is required");
    let (code, out) = run(&["probe", "--sysfs-root", "/nonexistent/xtc-root"]);
    assert_eq!(
        (code, out.as_str()),
        (1, ""),
        "a bad root is an error, not an empty answer"
    );
}

#[test]
fn binary_on_this_machine() {
    let out = Command::new(env!("CARGO_BIN_EXE_xtc"))
        .arg("probe")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let none = xtc::accel::probe().unwrap().is_empty();
    assert_eq!(
        text.contains("no render or accel node exists"),
        none,
        "{text}"
    );
    print!("{text}");
}

#[test]
fn live_json_lists_vulkan_devices() {
    let (code, out) = run(&["probe", "--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["loop_nodes_source"], "executor");
    match v["vulkan"].as_array() {
        Some(list) => {
            assert!(v["vulkan_note"].is_null());
            for d in list {
                assert!(d["name"].is_string() && d["index"].is_u64(), "{d}");
            }
            println!("Vulkan devices listed: {}", list.len());
        }
        None => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must have Vulkan (lavapipe): {}",
                v["vulkan_note"]
            );
            assert!(
                v["vulkan_note"]
                    .as_str()
                    .unwrap()
                    .starts_with("unavailable: "),
                "{v}"
            );
        }
    }
    let (_, out) = run(&["probe", "--json", "--no-vulkan"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["vulkan"].is_null(), v["vulkan_note"].as_str()),
        (true, Some("skipped (--no-vulkan)"))
    );
    let root = fixture("npu-accel");
    let (_, out) = run(&["probe", "--json", "--sysfs-root", root.to_str().unwrap()]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["vulkan_note"], "not listed with --sysfs-root");
    assert_eq!(v["loop_nodes_source"], "round_robin_model");
}

/// `--json` output is always one whole JSON document: before the fix a
/// `--sysfs-root` that is not UTF-8 printed `{ "root": ` and then failed
/// ("path contains invalid UTF-8 characters"), leaving broken JSON on stdout.
/// The root is now reported lossily (U+FFFD for the bad bytes).
#[test]
fn json_stays_valid_for_a_non_utf8_root() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join(OsStr::from_bytes(b"root\xff"));
    std::fs::create_dir(&root).unwrap();
    let mut out = Vec::new();
    let argv = [
        OsStr::new("xtc"),
        OsStr::new("probe"),
        OsStr::new("--json"),
        OsStr::new("--sysfs-root"),
        root.as_os_str(),
    ];
    let code = xtc_cli::run(argv, &mut out);
    let text = String::from_utf8(out).unwrap();
    assert_eq!(code, 0, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(v["root"].as_str().unwrap().ends_with("root\u{fffd}"), "{v}");
    assert_eq!(v["devices"], serde_json::json!([]));
}
