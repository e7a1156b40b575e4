//! Shared helpers of the `vk_*` tests.
#![allow(dead_code)]

use xtc::vk::{Device, Selector};

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
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
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
    use rustix::event::{PollFd, PollFlags, poll};
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    loop {
        match poll(&mut fds, None) {
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => panic!("poll: {e}"),
        }
    }
    assert!(
        fds[0].revents().contains(PollFlags::IN),
        "fence fd readable"
    );
}
