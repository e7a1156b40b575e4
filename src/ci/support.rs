//! Small device helpers shared by the `vk_*` tests and the `xtc ci` suites
//! (one implementation of each check, used by both).

use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::vk::{CommandPool, VkResult};

/// Open fds of this process (entries of `/proc/self/fd`).
///
/// # Errors
/// `/proc/self/fd` cannot be read.
pub fn open_fds() -> std::io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/fd")?.count())
}

/// Blocks in poll(2) until `fd` is readable or `timeout` passes (`None`:
/// forever; interrupted polls are retried). Returns whether it became
/// readable.
///
/// # Errors
/// poll(2) failed.
pub fn poll_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> std::io::Result<bool> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let ts = timeout.map(|d| Timespec {
        tv_sec: d.as_secs() as i64,
        tv_nsec: i64::from(d.subsec_nanos()),
    });
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    loop {
        match poll(&mut fds, ts.as_ref()) {
            Ok(_) => return Ok(fds[0].revents().contains(PollFlags::IN)),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// One empty fence round trip on `pool`: reset, record an empty command
/// buffer, submit it, and wait in poll(2) for its completion fd. Returns the
/// submission's timeline value (B-066: every iteration is one submission).
///
/// # Errors
/// As [`CommandPool::submit`]; `Inval` when the fd never became readable.
pub fn empty_round_trip(pool: &mut CommandPool) -> VkResult<u64> {
    pool.reset()?;
    let cmd = pool.record_plain()?.finish()?;
    let sub = pool.submit(vec![cmd])?;
    if !poll_readable(sub.fence_fd(), None)? {
        return Err(crate::vk::VkError::Inval(
            "completion fd not readable".into(),
        ));
    }
    Ok(sub.value())
}
