//! `EventFence`: a one-shot fence over an eventfd, for drivers that cannot
//! export a sync_file (lavapipe, the emulated NPU; `docs/arch/accel.md`).
//!
//! # Protocol
//! - `signalled: AtomicBool` is the truth; the eventfd is only the wake-up.
//! - [`EventFence::signal`] wins the flag with one `swap(true)`; only the
//!   winner writes `1` to the eventfd, so the counter is written exactly once
//!   however many threads signal.
//! - The flag is stored *before* the write, and nothing in this crate ever
//!   reads the eventfd, so once signalled the fd stays readable (`POLLIN`,
//!   level-triggered) for every poller, epoll loop and `rt::wait_readable`.
//! - Waiters check the flag first and poll second: a signal that lands
//!   between the two still leaves the fd readable, so the poll returns at once
//!   (no lost wake-up). Even if some outside code drains the counter with
//!   `read(2)`, [`EventFence::is_signalled`] and every later
//!   [`EventFence::wait`] still answer `true` from the flag.
//!
//! Pollers must treat the fd as read-only; reading it can only hide the
//! readiness from *other pollers* that are already blocked (the flag is
//! unaffected).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustix::event::{EventfdFlags, eventfd};

use super::sync_file::{FenceError, wait_fd};

/// A one-shot, pollable fence backed by an eventfd (`EFD_CLOEXEC |
/// EFD_NONBLOCK`). `Send + Sync`: share it with `Arc`; the fd closes when the
/// last owner drops it.
#[derive(Debug)]
pub struct EventFence {
    fd: OwnedFd,
    signalled: AtomicBool,
}

impl EventFence {
    /// A new, unsignalled fence.
    ///
    /// # Errors
    /// [`FenceError::Os`] when `eventfd(2)` fails (`EMFILE`, `ENOMEM`).
    pub fn new() -> Result<EventFence, FenceError> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| FenceError::from_errno("eventfd", e))?;
        Ok(EventFence {
            fd,
            signalled: AtomicBool::new(false),
        })
    }

    /// Signals the fence. Returns `true` for the one call that signalled it,
    /// `false` for every later (or concurrently losing) call, which changes
    /// nothing.
    ///
    /// # Errors
    /// [`FenceError::Os`] if the eventfd write fails, which needs a closed or
    /// corrupted fd; the fence then counts as signalled but pollers are not
    /// woken.
    pub fn signal(&self) -> Result<bool, FenceError> {
        if self.signalled.swap(true, Ordering::AcqRel) {
            return Ok(false);
        }
        rustix::io::write(&self.fd, &1u64.to_ne_bytes())
            .map_err(|e| FenceError::from_errno("eventfd write", e))?;
        Ok(true)
    }

    /// Whether [`signal`](Self::signal) has happened (never blocks, no syscall).
    pub fn is_signalled(&self) -> bool {
        self.signalled.load(Ordering::Acquire)
    }

    /// Waits until signalled or `timeout` passes (`None` forever,
    /// `Some(Duration::ZERO)` only looks). `true` when signalled.
    ///
    /// # Errors
    /// As [`SyncFile::wait`](super::SyncFile::wait).
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool, FenceError> {
        if self.is_signalled() {
            return Ok(true);
        }
        let ready = wait_fd(self.fd.as_fd(), timeout)?;
        Ok(ready || self.is_signalled())
    }

    /// Waits in the current loop until signalled, without blocking the
    /// thread (`rt::wait_readable` on the eventfd); ready at once when the
    /// flag is already set.
    ///
    /// # Errors
    /// As [`SyncFile::ready`](super::SyncFile::ready).
    ///
    /// # Cancel safety
    /// Dropping the future removes the registration; the fence is unaffected.
    pub async fn ready(&self) -> crate::Result<()> {
        if self.is_signalled() {
            return Ok(());
        }
        crate::rt::wait_readable(self.fd.as_fd()).await
    }

    /// A duplicate of the eventfd for a poller that needs to own one (e.g.
    /// `batch::Exec::Fence`); it turns readable with the fence.
    ///
    /// # Errors
    /// [`FenceError::Os`] when `dup` fails.
    pub fn try_clone_fd(&self) -> Result<OwnedFd, FenceError> {
        self.fd.try_clone().map_err(|e| {
            FenceError::from_errno(
                "dup",
                rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
            )
        })
    }
}

impl AsFd for EventFence {
    /// The eventfd, readable once signalled. Poll it; do not read it.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
