//! The import rule inside `xtc-decode` (`src/lib.rs`): the model side
//! (`src/model/`) never imports the serving side, the batch engine or the
//! runtime; the serving side (`src/serve/`) never imports Vulkan or the model
//! side — it reaches a model only through the join (`xtc_decode::Model`,
//! `Completion`, `BatchPlan`, ...). What the crate may use at all (no CLI, no
//! CI runner) the compiler enforces through its dependencies; this test holds
//! the rule between its two halves.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(sources(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

/// The layer or module each path of a file names, outside comments: the
/// crate's own modules through `crate::` (`crate::model::X` gives `model`),
/// the engine's through `xtc::` (`xtc::batch::Group` gives `batch`), and the
/// layer crates by their layer (`xtc_vk::Device` gives `vk`); each name of a
/// `{a, b::c}` group is expanded.
fn crate_paths(src: &str) -> Vec<String> {
    let code: String = src
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| l.split(" // ").next().unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    for (prefix, layer) in [
        ("crate::", None),
        ("xtc::", None),
        ("xtc_vk", Some("vk")),
        ("xtc_dispatch", Some("dispatch")),
        ("xtc_trace", Some("trace")),
    ] {
        let mut rest = code.as_str();
        while let Some(i) = rest.find(prefix) {
            let before = rest[..i].chars().next_back();
            rest = &rest[i + prefix.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            if let Some(layer) = layer {
                out.push(layer.to_string());
            } else if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    out.push(ident(item.trim()));
                }
            } else {
                out.push(ident(rest));
            }
        }
    }
    out
}

/// The leading identifier of `s`: `model::X` gives `model`.
fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

fn check(side: &str, forbidden: &[&str]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(side);
    let files = sources(&dir);
    assert!(!files.is_empty(), "no sources under {}", dir.display());
    let mut bad = Vec::new();
    for f in files {
        let src = std::fs::read_to_string(&f).unwrap();
        for p in crate_paths(&src) {
            if forbidden.contains(&p.as_str()) {
                bad.push(format!("{} imports {p}", f.display()));
            }
        }
        for (n, line) in src.lines().enumerate() {
            let l = line.trim_start();
            if !l.starts_with("//") && l.contains("super::super::") {
                bad.push(format!(
                    "{}:{}: leaves its side through super::super",
                    f.display(),
                    n + 1
                ));
            }
        }
    }
    assert!(bad.is_empty(), "import rule broken:\n{}", bad.join("\n"));
}

#[test]
fn the_model_side_imports_neither_serving_nor_batching() {
    check("model", &["batch", "rt", "accel", "dispatch", "serve"]);
}

#[test]
fn the_serving_side_imports_neither_vulkan_nor_the_model_side() {
    check("serve", &["vk", "accel", "dispatch", "model"]);
}

#[test]
fn the_rule_checker_sees_grouped_and_nested_paths() {
    let src = "use crate::{Error, serve};\n// use xtc::batch::Group;\nuse crate::model::vulkan::f32_model::GpuModel;\nlet x = xtc::rt::Loop::new(); // xtc_dispatch\nuse xtc_vk::{Device, Kernels};\nlet y = my_xtc_vk::f();\n";
    assert_eq!(crate_paths(src), ["Error", "serve", "model", "rt", "vk"]);
}
