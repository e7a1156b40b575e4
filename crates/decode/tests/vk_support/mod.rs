//! Shared helpers of the tests that need a Vulkan device: thin panicking
//! wrappers over `xtc_vk::support`, which `xtc ci` uses too.
#![allow(dead_code)]

use xtc_vk::{Device, Selector};

/// The default Vulkan device (lavapipe in CI), or `None` (test skipped) when
/// there is none and `CI` is unset. With `CI` set a missing device fails.
pub fn device() -> Option<Device> {
    match Device::open(&Selector::Auto) {
        Ok(d) => Some(d),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping: no Vulkan device ({e}); set CI=1 to make this a failure");
            None
        }
        Err(e) => panic!("CI is set but no Vulkan device opened: {e}"),
    }
}

/// Open fds of this process (entries of /proc/self/fd).
pub fn fd_count() -> usize {
    xtc_vk::support::open_fds().unwrap()
}

/// Largest absolute difference between two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Blocks in poll(2) until `fd` is readable; asserts POLLIN.
pub fn wait_readable(fd: std::os::fd::BorrowedFd<'_>) {
    assert!(
        xtc_vk::support::poll_readable(fd, None).unwrap(),
        "fence fd readable"
    );
}
