//! The shared library exports every function the header declares, and the
//! header declares every function of the manual page's SYNOPSIS with its
//! exact signature.
//!
//! `libxtc_capi.so` is opened with `libloading` (dlopen, as a C program's
//! plugin loader would) from the `deps/` directory cargo built it into with
//! this test (see tests/c_examples.rs), and each function name parsed from
//! `include/xtc_batch.h` is resolved with dlsym.

use std::path::{Path, PathBuf};

fn header() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../include/xtc_batch.h");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Declarations of the header with whitespace collapsed (one per `;`).
fn declarations(h: &str) -> Vec<String> {
    let no_comments = strip_comments(h);
    no_comments
        .split(';')
        .map(|d| d.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|d| !d.is_empty())
        .collect()
}

fn strip_comments(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find("*/").expect("closed comment");
        rest = &rest[i + end + 2..];
    }
    out.push_str(rest);
    out.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Names of the functions the header declares (a declaration whose name is
/// followed by `(` and which is no typedef or macro).
fn functions(h: &str) -> Vec<String> {
    let mut names = Vec::new();
    for d in declarations(h) {
        let d = d.rsplit('}').next().unwrap_or(&d).trim().to_string();
        let d = d.rsplit("#endif").next().unwrap_or(&d).trim().to_string();
        if d.starts_with("typedef") || d.starts_with('#') || d.contains("#define") {
            continue;
        }
        let Some(open) = d.find('(') else { continue };
        let head = &d[..open];
        let name = head.rsplit([' ', '*']).next().unwrap_or("");
        if name.starts_with("xtc_") {
            names.push(name.to_string());
        }
    }
    names.sort();
    names.dedup();
    names
}

fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent().expect("deps dir").join("libxtc_capi.so")
}

/// The SYNOPSIS of xtc_batch(3), declaration by declaration.
const SYNOPSIS: &[&str] = &[
    "int xtc_batch_create(xtc_loop_t *loop, const xtc_batch_opts_t *opts, xtc_batch_t **out)",
    "int xtc_batch_create_async(xtc_loop_t *loop, const xtc_batch_async_opts_t *opts, xtc_batch_t **out)",
    "int xtc_batch_submit(xtc_batch_t *group, void *request, uint64_t charge, uint64_t *out_handle)",
    "int xtc_batch_submit_mt(xtc_batch_t *group, void *request, uint64_t charge, uint64_t *out_handle)",
    "int xtc_batch_cancel(xtc_batch_t *group, uint64_t handle)",
    "int xtc_batch_cancel_mt(xtc_batch_t *group, uint64_t handle)",
    "int xtc_batch_resume(xtc_batch_t *group, uint64_t handle)",
    "int xtc_batch_resume_mt(xtc_batch_t *group, uint64_t handle)",
    "int xtc_batch_close(xtc_batch_t *group, enum xtc_batch_close_mode mode)",
    "int xtc_batch_destroy(xtc_batch_t *group)",
    "int xtc_batch_get_stats(xtc_batch_t *group, xtc_batch_stats_t *out)",
    "int xtc_batch_get_async_stats(xtc_batch_t *group, xtc_batch_async_stats_t *out)",
    "int xtc_batch_loop_for_device(xtc_exec_t *exec, const xtc_accel_dev_t *dev, int *out_loop_idx)",
    "int xtc_batch_router_create(xtc_batch_t **groups, int n, xtc_batch_router_t **out)",
    "void xtc_batch_router_destroy(xtc_batch_router_t *router)",
    "xtc_batch_t *xtc_batch_route(xtc_batch_router_t *router, uint64_t key)",
];

/// The callbacks of the manual page, as the header's typedefs spell them.
const CALLBACKS: &[&str] = &[
    "typedef int (*xtc_batch_step_fn)(const xtc_batch_item_t *items, xtc_batch_result_t *results, size_t count, void *user)",
    "typedef void (*xtc_batch_complete_fn)(uint64_t handle, void *request, int outcome, void *user)",
    "typedef int (*xtc_batch_submit_fn)(const xtc_batch_item_t *items, size_t count, void *user, xtc_batch_exec_t *out_exec)",
    "typedef int (*xtc_batch_collect_fn)(const xtc_batch_item_t *items, xtc_batch_result_t *results, size_t count, int exec_status, void *user)",
];

#[test]
fn the_header_declares_the_synopsis_with_its_signatures() {
    let decls = declarations(&header());
    for want in SYNOPSIS.iter().chain(CALLBACKS) {
        assert!(
            decls.iter().any(|d| d.ends_with(want)),
            "include/xtc_batch.h lacks `{want};`"
        );
    }
}

#[test]
fn every_header_function_resolves_in_the_shared_library() {
    let names = functions(&header());
    let synopsis: Vec<&str> = SYNOPSIS
        .iter()
        .map(|s| {
            let head = &s[..s.find('(').unwrap()];
            head.rsplit([' ', '*']).next().unwrap()
        })
        .collect();
    for s in &synopsis {
        assert!(names.iter().any(|n| n == s), "parser missed {s}");
    }
    // Every exported function of the source is in the header (cbindgen
    // emits each `#[unsafe(no_mangle)]` function; the header test keeps the
    // committed file in step).
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let exported: usize = std::fs::read_dir(&src)
        .expect("capi/src")
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .map(|t| t.matches("#[unsafe(no_mangle)]").count())
        .sum();
    assert_eq!(names.len(), exported, "header functions {names:?}");
    let path = cdylib();
    // SAFETY: loading our own library runs no initialisers beyond Rust's std
    // ones (the crate has no constructors).
    let lib = unsafe { libloading::Library::new(&path) }
        .unwrap_or_else(|e| panic!("dlopen {}: {e}", path.display()));
    let mut missing = Vec::new();
    for n in &names {
        // SAFETY: the symbol is only resolved, never called.
        let sym = unsafe { lib.get::<*const ()>(n.as_bytes()) };
        if sym.is_err() {
            missing.push(n.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "not exported by {}: {missing:?}",
        path.display()
    );
}

/// docs/man/xtc_batch.3 documents every function the library exports (a
/// `.Fn name` line in its SYNOPSIS) and names each in NAME.
#[test]
fn the_man_page_documents_every_header_function() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/man/xtc_batch.3");
    let man = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    for n in functions(&header()) {
        assert!(
            man.lines().any(|l| l.starts_with(&format!(".Fn {n} "))),
            "docs/man/xtc_batch.3 has no `.Fn {n}` synopsis line"
        );
        assert!(
            man.lines().any(|l| l.starts_with(&format!(".Nm {n}"))),
            "docs/man/xtc_batch.3 does not name {n} in NAME"
        );
    }
}
