//! The C programs under `examples/c/` are compiled with
//! `cc -std=c11 -Wall -Wextra -Werror -pedantic` against `include/xtc_batch.h`
//! and this crate's static library, run, and their stdout compared byte for
//! byte with `examples/c/<name>.expected`.
//!
//! The library: cargo builds this crate's lib target with every crate type
//! in `[lib] crate-type` (staticlib included) before it builds the
//! integration tests, into the `deps/` directory this test executable runs
//! from, with the same profile and target. So a clean clone needs nothing
//! but `cargo test`.
//!
//! Environment knobs (off by default):
//! - `XTC_BLESS_C=1`: write each program's output to its `.expected` file
//!   (review the diff before committing it);
//! - `CC`: the C compiler (default `cc`);
//! - `XTC_C_SANITIZE=1`: build the C side with `-fsanitize=address,undefined`;
//! - `XTC_C_VALGRIND=1`: run each program under `valgrind --error-exitcode=99`
//!   (memcheck; Rust's and the runtime's one-time allocations are ignored
//!   with `--leak-check=no`). Not the executor example (`router`): the
//!   executor asks rustix's vDSO `getcpu` for each carrier's NUMA node, and
//!   rustix's vDSO lookup crashes under valgrind, which does not map the
//!   vDSO its auxv names (rustix issue 1559); run that one with
//!   `XTC_C_SANITIZE=1`.

// The programs run groups: they need the batch API (tests/capi_nosys.rs covers the
// disabled build).
#![cfg(feature = "sched-policy")]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `deps/` of the profile this test was built with (the test executable's
/// directory), where cargo put `libxtc_capi.a`.
fn staticlib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let lib = exe.parent().expect("deps dir").join("libxtc_capi.a");
    assert!(
        lib.is_file(),
        "{} missing: cargo builds the staticlib with the tests (crate-type in capi/Cargo.toml)",
        lib.display()
    );
    lib
}

fn on(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| v != "0" && !v.is_empty())
}

/// Compiles `examples/c/<name>.c` into the test's scratch directory.
fn compile(name: &str) -> PathBuf {
    compile_src(&repo().join("examples/c").join(format!("{name}.c")), name)
}

/// Compiles `src` into the scratch directory as `name`.
fn compile_src(src: &Path, name: &str) -> PathBuf {
    // One directory per profile: a debug and a release run never share it.
    let profile = staticlib()
        .parent()
        .and_then(Path::parent)
        .and_then(Path::file_name)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("c_examples")
        .join(profile);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let exe = dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-g"])
        .arg("-I")
        .arg(repo().join("include"))
        .arg(src);
    if on("XTC_C_SANITIZE") {
        cmd.arg("-fsanitize=address,undefined");
    }
    // The static library, then what Rust's std needs from the system
    // (`--print native-static-libs`).
    cmd.arg(staticlib())
        .args([
            "-ldl",
            "-lgcc_s",
            "-lutil",
            "-lrt",
            "-lpthread",
            "-lm",
            "-lc",
        ])
        .arg("-o")
        .arg(&exe);
    let out = cmd.output().unwrap_or_else(|e| panic!("{cc}: {e}"));
    assert!(
        out.status.success(),
        "compiling {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs a compiled example and returns its stdout; fails on a nonzero exit,
/// and kills it after a generous hang guard (not a timing assertion).
fn run(exe: &Path, args: &[&str]) -> String {
    let valgrind = on("XTC_C_VALGRIND") && !exe.ends_with("router");
    let mut cmd = if valgrind {
        let mut c = Command::new("valgrind");
        c.args(["-q", "--error-exitcode=99", "--leak-check=no"])
            .arg(exe);
        c
    } else {
        Command::new(exe)
    };
    let mut child = cmd
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).map(|_| s)
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).map(|_| s)
    });
    let guard = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if guard.elapsed() > Duration::from_secs(600) {
            let _ = child.kill();
            panic!("{} hung (killed after 600 s)", exe.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = out_t.join().unwrap().expect("read stdout");
    let err = err_t.join().unwrap().expect("read stderr");
    assert!(
        status.success(),
        "{} exited with {status}\nstdout:\n{out}\nstderr:\n{err}",
        exe.display()
    );
    out
}

/// Compiles, runs and compares with `examples/c/<name>.expected`.
fn check(name: &str, args: &[&str]) {
    let exe = compile(name);
    let got = run(&exe, args);
    let path = repo().join("examples/c").join(format!("{name}.expected"));
    if on("XTC_BLESS_C") {
        std::fs::write(&path, &got).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if got != want {
        panic!(
            "{name}: output differs from {}\n--- expected\n{want}--- got\n{got}---",
            path.display()
        );
    }
}

#[test]
fn sync_group_hands_one_vector_per_iteration() {
    check("sync_group", &[]);
}

#[test]
fn async_fence_group_awaits_an_eventfd() {
    check("async_fence", &[]);
}

#[test]
fn submit_mt_from_pthreads_completes_each_handle_once() {
    check("submit_mt", &[]);
}

#[test]
fn router_over_two_executor_loops() {
    let fixture = repo().join("devices/nvidia-2node");
    check("router", &[fixture.to_str().expect("UTF-8 path")]);
}

#[test]
fn errors_reach_their_codes_through_the_c_abi() {
    check("errors", &[]);
}

#[test]
fn exec_kinds_and_negative_statuses() {
    check("exec_kinds", &[]);
}

/// What C sees of every type the functions exchange: size, alignment and the
/// offset of each field, against Rust's view of the same `#[repr(C)]` types
/// (cbindgen and the two compilers agree, on this target).
#[test]
fn c_and_rust_agree_on_every_layout() {
    use std::mem::{align_of, offset_of, size_of};
    use xtc_capi::*;
    macro_rules! layout {
        ($($t:ident { $($f:ident),* })*) => {{
            let mut c = String::from("#include <stdio.h>\n#include \"xtc_batch.h\"\nint main(void) {\n");
            let mut rust = String::new();
            $(
                c.push_str(&format!(
                    "  printf(\"{0} %zu %zu\\n\", sizeof({0}), _Alignof({0}));\n",
                    stringify!($t)
                ));
                rust.push_str(&format!("{} {} {}\n", stringify!($t), size_of::<$t>(), align_of::<$t>()));
                $(
                    c.push_str(&format!(
                        "  printf(\"{0}.{1} %zu\\n\", offsetof({0}, {1}));\n",
                        stringify!($t), stringify!($f)
                    ));
                    rust.push_str(&format!("{}.{} {}\n", stringify!($t), stringify!($f), offset_of!($t, $f)));
                )*
            )*
            c.push_str("  return 0;\n}\n");
            (c, rust)
        }};
    }
    let (c, rust) = layout! {
        xtc_batch_opts_t { size, version, capacity, max_active, resource_capacity, sched_class, step, complete, user }
        xtc_batch_async_opts_t { size, version, capacity, max_active, resource_capacity, exec_timeout_ns, sched_class, submit, collect, complete, cancel_hint, user, mt_queue_cap }
        xtc_batch_stats_t { size, version, queued, ready, blocked, reserved_units, iterations, completed, cancelled, failed, rejections, max_vector, total_members }
        xtc_batch_async_stats_t { size, version, offloads, offload_timeouts, offload_errors, mt_queued, mt_rejections }
        xtc_batch_item_t { handle, request }
        xtc_batch_result_t { state, error }
        xtc_batch_exec_t { kind, fence_fd, future, run, arg }
        xtc_accel_dev_t { name, driver, kind, numa_node }
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c_layout");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    std::fs::write(&src, c).unwrap();
    let exe = compile_src(&src, "layout");
    assert_eq!(run(&exe, &[]), rust);
}
