//! Host-side helpers for checks on a device, shared by the tests of every
//! crate above this one and the `xtc ci` suites (one implementation each):
//! the process's open fd count (leak checks) and a poll(2) wait for a
//! completion fd.

use std::os::fd::BorrowedFd;
use std::time::Duration;

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
