//! The import-rule checker behind each crate's `tests/layout.rs`: the layer
//! or module every path of a source file names, outside comments.
//!
//! A path `crate::X::..` names `X` (the crate's own module), `xtc::X::..`
//! names the engine's layer `X` (`xtc::batch::Group` gives `batch`), and a
//! layer crate names its layer (`xtc_vk::Device` gives `vk`, `xtc_model`
//! gives `model`); each name of a `{a, b::c}` group is expanded.

use std::path::{Path, PathBuf};

/// The layer crates and the layer each names.
const LAYER_CRATES: [(&str, &str); 7] = [
    ("xtc_vk", "vk"),
    ("xtc_dispatch", "dispatch"),
    ("xtc_trace", "trace"),
    ("xtc_model", "model"),
    ("xtc_kvbatch", "kvbatch"),
    ("xtc_replay", "replay"),
    ("xtc_serve", "serve"),
];

/// Every `.rs` file under `dir`, recursively, sorted.
///
/// # Panics
/// If `dir` cannot be read (a layout test must fail, not pass, on a moved
/// folder).
pub fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for e in entries {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            out.extend(sources(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// `src` without its comment lines and trailing ` // ` comments.
pub fn code(src: &str) -> String {
    src.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| l.split(" // ").next().unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The layer or module each path of `src` names (see the module doc).
pub fn crate_paths(src: &str) -> Vec<String> {
    let code = code(src);
    let mut out = Vec::new();
    let prefixes = [("crate::", None), ("xtc::", None)]
        .into_iter()
        .chain(LAYER_CRATES.iter().map(|&(c, l)| (c, Some(l))));
    for (prefix, layer) in prefixes {
        let mut rest = code.as_str();
        while let Some(i) = rest.find(prefix) {
            let before = rest[..i].chars().next_back();
            rest = &rest[i + prefix.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            if let Some(layer) = layer {
                // `xtc_vk` but not `xtc_vkfoo`.
                if rest.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
                    continue;
                }
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

/// The modules `super::X` names in `src`, outside comments (a folder's
/// `mod.rs` reaching a sibling folder).
pub fn super_paths(src: &str) -> Vec<String> {
    let code = code(src);
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("super::") {
        rest = &rest[i + "super::".len()..];
        if !rest.starts_with("super::") {
            out.push(ident(rest));
        }
    }
    out
}

/// The leading identifier of `s`: `model::X` gives `model`.
pub fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// Checks that no file under `dir` names a path in `forbidden` (as
/// [`crate_paths`] reads them) or leaves its folder through
/// `super::super::`.
///
/// # Panics
/// With every offending file and path, when the rule is broken.
pub fn check(dir: &Path, forbidden: &[&str]) {
    let files = sources(dir);
    assert!(!files.is_empty(), "no sources under {}", dir.display());
    let mut bad = Vec::new();
    for f in files {
        let src = std::fs::read_to_string(&f).expect("a source file");
        for p in crate_paths(&src) {
            if forbidden.contains(&p.as_str()) {
                bad.push(format!("{} imports {p}", f.display()));
            }
        }
        for (n, line) in src.lines().enumerate() {
            let l = line.trim_start();
            if !l.starts_with("//") && l.contains("super::super::") {
                bad.push(format!(
                    "{}:{}: leaves its folder through super::super",
                    f.display(),
                    n + 1
                ));
            }
        }
    }
    assert!(bad.is_empty(), "import rule broken:\n{}", bad.join("\n"));
}

/// The items of crate `krate` (`xtc_model`, say) each file under `dir`
/// names outside comments, as `(file, item)` (`krate::{A, B}` expanded).
pub fn items_of(dir: &Path, krate: &str) -> Vec<(String, String)> {
    let prefix = format!("{krate}::");
    let mut out = Vec::new();
    for f in sources(dir) {
        let text = code(&std::fs::read_to_string(&f).expect("a source file"));
        let mut rest = text.as_str();
        while let Some(i) = rest.find(&prefix) {
            rest = &rest[i + prefix.len()..];
            let names: Vec<String> = match rest.strip_prefix('{') {
                Some(g) => g[..g.find('}').unwrap_or(g.len())]
                    .split(',')
                    .map(|s| ident(s.trim()))
                    .collect(),
                None => vec![ident(rest)],
            };
            out.extend(names.into_iter().map(|n| (f.display().to_string(), n)));
        }
    }
    out
}

/// Checks that every item of `krate` the files under `dir` name is one of
/// `allowed` (a crate that may reach another only through its join).
///
/// # Panics
/// With every file and item past `allowed`, or when no item is named at
/// all (the check would then prove nothing).
pub fn check_items(dir: &Path, krate: &str, allowed: &[&str]) {
    let items = items_of(dir, krate);
    assert!(
        !items.is_empty(),
        "{} names nothing of {krate}",
        dir.display()
    );
    let bad: Vec<String> = items
        .iter()
        .filter(|(_, n)| !allowed.contains(&n.as_str()))
        .map(|(f, n)| format!("{f} names {krate}::{n}"))
        .collect();
    assert!(bad.is_empty(), "past the join:\n{}", bad.join("\n"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_checker_sees_grouped_and_nested_paths() {
        let src = "use crate::{Error, serve};\n// use xtc::batch::Group;\nuse crate::model::vulkan::f32_model::GpuModel;\nlet x = xtc::rt::Loop::new(); // xtc_dispatch\nuse xtc_vk::{Device, Kernels};\nlet y = my_xtc_vk::f();\nuse xtc_model::Model;\nuse xtc_vkx::A;\n";
        assert_eq!(
            crate_paths(src),
            ["Error", "serve", "model", "rt", "vk", "model"]
        );
    }

    #[test]
    fn super_paths_skip_comments_and_climbs() {
        let src = "use super::vulkan::X;\n// super::open\nuse super::super::adapters;\n";
        assert_eq!(super_paths(src), ["vulkan", "adapters"]);
    }
}
