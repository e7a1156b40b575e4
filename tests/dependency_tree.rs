//! The engine crate's dependency tree is the engine's: `cargo tree -p xtc`
//! (normal dependencies, the default features) names no Vulkan, model,
//! serving, HTTP, CI-runner or command-line crate, and its direct
//! dependencies are exactly the engine's. The workspace split exists for this:
//! a Rust user who wants the batch engine of xtc_batch(3) gets only it.

use std::collections::BTreeSet;
use std::process::Command;

/// `cargo tree -p xtc` with the given extra arguments: one package name a
/// line (versions and duplicates dropped).
fn tree(args: &[&str]) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "-p", "xtc", "--edges", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "--offline", "--locked"])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_engine_tree_has_no_vulkan_model_http_or_cli_crate() {
    let all = tree(&[]);
    assert!(all.contains("xtc") && all.contains("rustix"), "{all:?}");
    let forbidden = [
        // The layers above the engine.
        "xtc-trace",
        "xtc-dispatch",
        "xtc-vk",
        "xtc-model",
        "xtc-kvbatch",
        "xtc-replay",
        "xtc-testkit",
        "xtc-ci",
        "xtc-cli",
        // Vulkan and its kernels.
        "ash",
        "gpu-allocator",
        "naga",
        // The model, its tokenizer and reports.
        "memmap2",
        "rayon",
        "fancy-regex",
        "regex",
        "half",
        "hdrhistogram",
        "csv",
        "serde_json",
        "plotters",
        "prometheus-client",
        // HTTP, CI runner and command line.
        "tiny_http",
        "hyper",
        "axum",
        "tokio",
        "quick-junit",
        "clap",
        "indicatif",
    ];
    let found: Vec<&str> = forbidden
        .iter()
        .copied()
        .filter(|f| all.contains(*f))
        .collect();
    assert!(found.is_empty(), "the engine's tree holds {found:?}");
}

#[test]
fn the_engine_depends_directly_on_the_engine_crates_only() {
    let direct = tree(&["--depth", "1"]);
    let expected: BTreeSet<String> = [
        "xtc",
        "async-task",
        "crossbeam-channel",
        "crossbeam-utils",
        "drm",
        "fastrand",
        "futures-lite",
        "rustix",
        "serde",
        "thiserror",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(direct, expected);
}
