//! The import rule of `decode` (`src/decode/mod.rs`): the model side
//! (`src/decode/model/`) never imports the serving side, the batch engine or
//! the runtime; the serving side (`src/decode/serve/`) never imports Vulkan or
//! the model side — it reaches a model only through the join
//! (`decode::Model`, `Completion`, `BatchPlan`, ...).

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

/// The paths a file names under `crate::` (and `super::` chains that leave
/// its side), outside comments: `crate::batch::Group` gives `batch`,
/// `crate::decode::model::X` gives `decode::model`, and each name of a
/// `crate::{a, b::c}` group is expanded.
fn crate_paths(src: &str) -> Vec<String> {
    let code: String = src
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| l.split(" // ").next().unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                out.push(path_of(item.trim()));
            }
        } else {
            out.push(path_of(rest));
        }
    }
    out
}

/// `decode::model::X...` → `decode::model`; `batch::Group` → `batch`.
fn path_of(s: &str) -> String {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let first = ident(s);
    if first == "decode" {
        let after = s[first.len()..].trim_start_matches("::");
        let second = ident(after);
        if !second.is_empty() {
            return format!("decode::{second}");
        }
    }
    first
}

fn check(side: &str, forbidden: &[&str]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/decode")
        .join(side);
    let files = sources(&dir);
    assert!(!files.is_empty(), "no sources under {}", dir.display());
    let mut bad = Vec::new();
    for f in files {
        let src = std::fs::read_to_string(&f).unwrap();
        for p in crate_paths(&src) {
            if forbidden.contains(&p.as_str()) {
                bad.push(format!("{} imports crate::{p}", f.display()));
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
    check(
        "model",
        &["batch", "rt", "accel", "dispatch", "cli", "decode::serve"],
    );
}

#[test]
fn the_serving_side_imports_neither_vulkan_nor_the_model_side() {
    check(
        "serve",
        &["vk", "accel", "dispatch", "cli", "decode::model"],
    );
}

#[test]
fn the_rule_checker_sees_grouped_and_nested_paths() {
    let src = "use crate::{Error, vk};\n// use crate::batch::Group;\nuse crate::decode::model::gpu::GpuModel;\nlet x = crate::rt::Loop::new(); // crate::dispatch\n";
    assert_eq!(crate_paths(src), ["Error", "vk", "decode::model", "rt"]);
}
