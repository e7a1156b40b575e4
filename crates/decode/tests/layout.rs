//! The import rule inside `xtc-decode` (`src/lib.rs`): the model side
//! (`src/model/`) never imports the serving side, the batch engine or the
//! runtime; the serving side (`src/serve/`) never imports Vulkan or the model
//! side — it reaches a model only through the join (`xtc_decode::Model`,
//! `Completion`, `BatchPlan`, ...). What the crate may use at all (no CLI, no
//! CI runner) the compiler enforces through its dependencies; this test holds
//! the rule between its two halves, and inside the model side the order of
//! its folders: `format/` and `text/` at the bottom, `cpu/` (the references)
//! never importing `vulkan/`.

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

/// The `crate::model::` modules the code (outside comments) of each file
/// under `src/model/<folder>` names, with the file.
fn model_paths(folder: &str) -> Vec<(PathBuf, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/model")
        .join(folder);
    let files = sources(&dir);
    assert!(!files.is_empty(), "no sources under {}", dir.display());
    let mut out = Vec::new();
    for f in files {
        let src = std::fs::read_to_string(&f).unwrap();
        for line in src.lines().filter(|l| !l.trim_start().starts_with("//")) {
            let code = line.split(" // ").next().unwrap_or(line);
            let mut rest = code;
            while let Some(i) = rest.find("model::") {
                rest = &rest[i + "model::".len()..];
                out.push((f.clone(), ident(rest)));
            }
            // `super::vulkan` from a folder's mod.rs.
            if code.contains("super::vulkan") {
                out.push((f.clone(), "vulkan".into()));
            }
        }
    }
    out
}

fn check_model(folder: &str, forbidden: &[&str]) {
    let bad: Vec<String> = model_paths(folder)
        .into_iter()
        .filter(|(_, m)| forbidden.contains(&m.as_str()))
        .map(|(f, m)| format!("{} imports model::{m}", f.display()))
        .collect();
    assert!(
        bad.is_empty(),
        "model folder rule broken:\n{}",
        bad.join("\n")
    );
}

/// The CPU references are the oracles of the Vulkan models: they never
/// reach them (the import circle through `Llama::nll` stays open).
#[test]
fn cpu_never_imports_vulkan() {
    check_model("cpu", &["vulkan", "adapters", "stream", "open", "generate"]);
}

/// Formats and text sit at the bottom of the model: they import no model
/// code above them.
#[test]
fn format_and_text_import_no_model_above_them() {
    let above = ["cpu", "vulkan", "adapters", "stream", "open", "generate"];
    check_model("format", &above);
    check_model("text", &above);
}

#[test]
fn the_rule_checker_sees_grouped_and_nested_paths() {
    let src = "use crate::{Error, serve};\n// use xtc::batch::Group;\nuse crate::model::vulkan::f32_model::GpuModel;\nlet x = xtc::rt::Loop::new(); // xtc_dispatch\nuse xtc_vk::{Device, Kernels};\nlet y = my_xtc_vk::f();\n";
    assert_eq!(crate_paths(src), ["Error", "serve", "model", "rt", "vk"]);
}
