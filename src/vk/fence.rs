//! [`EventFence`]: an eventfd that becomes readable (POLLIN) once signalled.
//!
//! The fallback completion fd for drivers that cannot export a `SYNC_FD`
//! sync_file (lavapipe): the device's waiter thread signals it when the
//! timeline semaphore reaches the submission's value (B-066). The accel layer
//! has its own `accel::EventFence`; the two are to be unified.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec, eventfd, poll};

/// An eventfd fence: `signal` once, then the fd stays readable. Closes its fd
/// on drop. `Send + Sync`.
#[derive(Debug)]
pub struct EventFence {
    fd: OwnedFd,
}

impl EventFence {
    /// A new unsignalled fence (`eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)`).
    ///
    /// # Errors
    /// The `eventfd` system call's error (e.g. `EMFILE`).
    pub fn new() -> std::io::Result<EventFence> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(EventFence { fd })
    }

    /// Signals the fence: the fd becomes readable. Idempotent.
    pub fn signal(&self) {
        // A full counter (EAGAIN) is still readable: nothing to do then.
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// Whether the fence is signalled (a zero-timeout poll; never blocks).
    pub fn is_signalled(&self) -> bool {
        self.wait(Some(Duration::ZERO)).unwrap_or(false)
    }

    /// Waits up to `timeout` (`None`: forever) for the fence. Returns whether
    /// it is signalled. Interrupted polls are retried.
    ///
    /// # Errors
    /// The `poll` system call's error other than `EINTR`.
    pub fn wait(&self, timeout: Option<Duration>) -> std::io::Result<bool> {
        let ts = timeout.map(|d| Timespec {
            tv_sec: d.as_secs().try_into().unwrap_or(i64::MAX),
            tv_nsec: d.subsec_nanos().into(),
        });
        loop {
            let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
            match poll(&mut fds, ts.as_ref()) {
                Ok(n) => return Ok(n > 0 && fds[0].revents().contains(PollFlags::IN)),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl AsFd for EventFence {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for EventFence {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_makes_the_fd_readable() {
        let f = EventFence::new().unwrap();
        assert!(!f.is_signalled());
        f.signal();
        f.signal();
        assert!(f.is_signalled());
        assert!(f.wait(None).unwrap());
    }
}
