//! The Khronos validation layer, when asked for, really runs and really
//! counts: a command buffer with a deliberate write-after-write hazard (two
//! copies into one range with no barrier between them) must be reported by
//! synchronization validation and counted by `xtc_vk::validation_errors()`.
//!
//! Alone in its test binary: the error it provokes is counted process-wide,
//! and every other Vulkan test asserts that count stays 0. A process that saw
//! one exits with status 1 even when every test passed (the exit check of
//! `xtc_vk::fail_process_on_validation_errors`): checked by running this test
//! binary's `exit_check_child` in a child process.
//!
//! Needs the layer (`.ci/ensure-deps.sh` installs `vulkan-validationlayers`):
//! without it `Device::open_with` fails, and so does this test.

mod vk_support;

use xtc_vk::{Buffer, CommandPool, Location, Selector, Validation};

/// Records and runs two copies into one range with no barrier between them
/// on a device under synchronization validation; returns the error count
/// before.
fn provoke_a_write_after_write() -> u64 {
    let dev = xtc_vk::Device::open_with(&Selector::Auto, Validation::Sync)
        .expect("validation requested: the layer must be installed (.ci/ensure-deps.sh)");
    assert_eq!(dev.validation_level(), Validation::Sync);
    let mut src = Buffer::new(&dev, 256, Location::Upload, "src").unwrap();
    src.write(0, &[7u32; 64]).unwrap();
    let dst = Buffer::new(&dev, 256, Location::Readback, "dst").unwrap();
    let before = xtc_vk::validation_errors();
    let mut pool = CommandPool::new(&dev).unwrap();
    let mut rec = pool.record_plain().unwrap();
    rec.copy(&src, 0, &dst, 0, 256).unwrap();
    // No barrier: the second copy's writes race the first's.
    rec.copy(&src, 0, &dst, 0, 256).unwrap();
    rec.host_barrier();
    let done = rec.finish().unwrap();
    pool.submit(vec![done]).unwrap().wait(None).unwrap();
    before
}

#[test]
fn synchronization_validation_reports_and_counts_a_write_after_write() {
    // Skips (outside CI) only on a machine with no Vulkan at all.
    if vk_support::device().is_none() {
        return;
    }
    // The error below is provoked on purpose: this process must not exit 1
    // for it (the test below checks the exit status of a process that saw one).
    xtc_vk::fail_process_on_validation_errors(false);
    let before = provoke_a_write_after_write();
    let after = xtc_vk::validation_errors();
    assert!(after > before, "the hazard went unreported");
    let last = xtc_vk::last_validation_error().unwrap();
    assert!(last.contains("SYNC-HAZARD-WRITE-AFTER-WRITE"), "{last}");
}

/// The body of the child process of the test below: provokes a hazard when
/// `XTC_TEST_EXIT_CHECK_CHILD` is set (and does nothing otherwise).
#[test]
fn exit_check_child() {
    if std::env::var_os("XTC_TEST_EXIT_CHECK_CHILD").is_some() {
        provoke_a_write_after_write();
    }
}

#[test]
fn a_process_that_saw_a_validation_error_exits_1_though_its_tests_passed() {
    if vk_support::device().is_none() {
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "exit_check_child", "--test-threads", "1"])
        .env("XTC_TEST_EXIT_CHECK_CHILD", "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(stdout.contains("1 passed"), "{stdout}");
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("error(s) in this process") && stderr.contains("SYNC-HAZARD"),
        "{stderr}"
    );
}
