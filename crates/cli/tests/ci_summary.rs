//! `.ci/summary`, the closing line of `.ci/test`: counts cargo's passed,
//! failed and ignored tests from the step logs and `xtc ci`'s Pass/Skip/Fail
//! results, lists each skip with its reason, and fails on a failure or on a
//! skip that says a device or the model is missing. Runs the script on
//! made-up logs and results (bash and awk only; no device needed).

use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.ci/summary")
}

const CARGO_LOG: &str = "running 3 tests
test a ... ok
test needs_gpu ... ignored, needs a GPU
test c ... ok

test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.1s

test result: ok. 7 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.0s
";

/// An `xtc ci` output folder with the given `name,Status` rows and one
/// skipped case's reason in junit.xml.
fn ci_dir(root: &Path, rows: &str, skip_reason: &str) -> PathBuf {
    let dir = root.join("ci");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("results.csv"), rows).unwrap();
    let junit = format!(
        "<testsuites>\n<testcase name=\"x.skipped\" classname=\"x\" time=\"0.1\">\n<skipped message=\"Skip: {skip_reason}\"/>\n</testcase>\n</testsuites>\n"
    );
    std::fs::write(dir.join("junit.xml"), junit).unwrap();
    dir
}

fn run(logs: &Path, ci: &Path) -> (Option<i32>, String) {
    let out = Command::new("bash")
        .arg(script())
        .arg(logs)
        .arg(ci)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

fn logs(root: &Path, log: &str) -> PathBuf {
    let dir = root.join("logs");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("1-workspace.log"), log).unwrap();
    dir
}

#[test]
fn the_closing_line_counts_passes_failures_and_skips_with_reasons() {
    let tmp = tempfile::tempdir().unwrap();
    let ci = ci_dir(
        tmp.path(),
        "x.a,Pass,0.1\nx.b,Pass,0.2\nx.skipped,Skip,0.1\nx.known,ExpectedFail,0.3\n",
        "the driver does not export fences as SYNC_FD: not supported",
    );
    let (code, text) = run(&logs(tmp.path(), CARGO_LOG), &ci);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("xtc tests: 11 passed, 0 failed, 2 skipped (cargo: 9 passed, 0 failed, 1 ignored; xtc ci: 2 passed, 0 failed, 1 skipped, 1 expected failures or known flakes)"),
        "{text}"
    );
    assert!(text.contains("needs_gpu: needs a GPU"), "{text}");
    assert!(
        text.contains("x.skipped: Skip: the driver does not export"),
        "{text}"
    );
}

#[test]
fn a_failure_or_a_skip_for_a_missing_device_fails_it() {
    let tmp = tempfile::tempdir().unwrap();
    let ci = ci_dir(
        tmp.path(),
        "x.a,Pass,0.1\nx.skipped,Skip,0.1\n",
        "the Vulkan device did not open (no usable Vulkan device)",
    );
    let (code, text) = run(&logs(tmp.path(), CARGO_LOG), &ci);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("skipped because the setup is incomplete"),
        "{text}"
    );

    let failed = CARGO_LOG.replace("7 passed; 0 failed", "6 passed; 1 failed");
    let ci = ci_dir(tmp.path(), "x.a,Pass,0.1\n", "unused");
    let (code, text) = run(&logs(tmp.path(), &failed), &ci);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("xtc tests: 9 passed, 1 failed, 1 skipped"),
        "{text}"
    );

    let (code, text) = run(&logs(tmp.path(), CARGO_LOG), &tmp.path().join("absent"));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("results.csv is missing"), "{text}");
}

/// Runs `.ci/summary preflight` with a fake `ldconfig` first on PATH that
/// prints `lines` library lines, the Vulkan loader among them or not.
fn preflight_with_ldconfig(root: &Path, lines: usize, loader: bool) -> (Option<i32>, String) {
    use std::os::unix::fs::PermissionsExt;
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let mut listing = format!("{lines} libs found in cache `/etc/ld.so.cache'\n");
    if loader {
        listing += "\tlibvulkan.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libvulkan.so.1\n";
    }
    for i in 0..lines {
        listing += &format!(
            "\tlibfiller{i}.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libfiller{i}.so.1\n"
        );
    }
    std::fs::write(root.join("listing"), listing).unwrap();
    let fake = bin.join("ldconfig");
    std::fs::write(
        &fake,
        format!("#!/bin/sh\ncat '{}'\n", root.join("listing").display()),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .arg(script())
        .arg("preflight")
        .env("PATH", path)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

/// Regression: the preflight read `ldconfig -p | grep -q libvulkan` under
/// pipefail. Where the listing passes the 64 KiB pipe buffer after the
/// loader's line (a CI machine with many libraries), grep's early exit killed
/// ldconfig with SIGPIPE, the pipeline failed, and CI stopped after 1 s with
/// "missing: the Vulkan loader" though it was installed.
#[test]
fn the_preflight_finds_the_vulkan_loader_in_a_long_linker_cache() {
    let tmp = tempfile::tempdir().unwrap();
    // About 170 KiB of listing after the loader's line.
    let (_, text) = preflight_with_ldconfig(tmp.path(), 2000, true);
    assert!(!text.contains("the Vulkan loader"), "{text}");
    // Without it the preflight names it and fails.
    let (code, text) = preflight_with_ldconfig(tmp.path(), 2000, false);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("missing: the Vulkan loader (libvulkan1)"),
        "{text}"
    );
}
