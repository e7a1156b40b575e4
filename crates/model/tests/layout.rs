//! The import rule of `xtc-model` (`src/lib.rs`): a model knows nothing of
//! batching or serving. What the crate may use at all (no batch driver, no
//! CLI) the compiler enforces through its dependencies; this test holds
//! what the dependencies cannot: the engine's layers it may not name, and
//! inside the crate the order of its folders: `format/` and `text/` at the
//! bottom, `cpu/` (the references) never importing `vulkan/`.

use std::path::Path;

use xtc_testkit::layout::{check, crate_paths, sources, super_paths};

fn src(folder: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(folder)
}

#[test]
fn the_model_imports_neither_serving_nor_batching() {
    check(
        &src(""),
        &[
            "batch", "rt", "accel", "dispatch", "kvbatch", "replay", "serve",
        ],
    );
}

/// Fails with every file of `folder` that names one of `forbidden` through
/// `crate::` or `super::`.
fn check_folder(folder: &str, forbidden: &[&str]) {
    let mut bad = Vec::new();
    for f in sources(&src(folder)) {
        let text = std::fs::read_to_string(&f).unwrap();
        for m in crate_paths(&text).into_iter().chain(super_paths(&text)) {
            if forbidden.contains(&m.as_str()) {
                bad.push(format!("{} imports {m}", f.display()));
            }
        }
    }
    assert!(bad.is_empty(), "folder rule broken:\n{}", bad.join("\n"));
}

/// The CPU references are the oracles of the Vulkan models: they never
/// reach them (the import circle through `Llama::nll` stays open).
#[test]
fn cpu_never_imports_vulkan() {
    check_folder("cpu", &["vulkan", "adapters", "stream", "open", "generate"]);
}

/// Formats and text sit at the bottom of the model: they import no model
/// code above them.
#[test]
fn format_and_text_import_no_model_above_them() {
    let above = ["cpu", "vulkan", "adapters", "stream", "open", "generate"];
    check_folder("format", &above);
    check_folder("text", &above);
}
