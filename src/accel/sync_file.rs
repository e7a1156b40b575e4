//! `SyncFile`: an owned sync_file fd (`Documentation/driver-api/sync_file.rst`).
//!
//! A sync_file becomes readable (`POLLIN`) once every fence in it has
//! signalled, so waiting is `poll(2)` and loop readiness is
//! `rt::wait_readable`. Vulkan's `vkGetFenceFdKHR(SYNC_FD)` and the DRM syncobj
//! export may hand back **-1, meaning "already signalled"**; [`SyncFile`]
//! represents that as a fence without an fd that every wait reports signalled
//! at once: never an error, never a closed or polled `-1`.
//!
//! `merge` (`SYNC_IOC_MERGE`) and `info` (`SYNC_IOC_FILE_INFO`) only work on a
//! real sync_file; on any other fd the kernel answers `ENOTTY`, reported as
//! [`FenceError::NotSyncFile`]. Waiting works on any pollable fd, which is how
//! the tests exercise it on kernels without a sync_file source.
//!
//! Taking ownership of a raw exported fd (`SyncFile::from_raw`) is `unsafe`
//! and lives in the `sys` island with the ioctls.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;

use super::sys;

/// Why a fence operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FenceError {
    /// `ENOTTY`: the fd is not a sync_file (e.g. an eventfd), so `merge`/`info`
    /// do not apply.
    #[error("fd is not a sync_file (ENOTTY): merge/info need a sync_file from a driver export")]
    NotSyncFile,
    /// The fd is not open (`EBADF`, or `POLLNVAL` from poll).
    #[error("bad or closed fence fd")]
    BadFd,
    /// A raw fd below -1 was handed over as an export.
    #[error("invalid exported fence fd {0} (only -1 or an open fd are valid)")]
    InvalidRaw(i32),
    /// The merge name is longer than 31 bytes or contains NUL.
    #[error("sync_file name must be at most 31 bytes without NUL")]
    Name,
    /// poll reported `POLLERR`/`POLLHUP` without `POLLIN`.
    #[error("fence fd reported an error condition (POLLERR/POLLHUP)")]
    PollError,
    /// Any other system error, with the operation.
    #[error("{op} failed: {errno}")]
    Os {
        /// `poll`, `SYNC_IOC_MERGE`, `SYNC_IOC_FILE_INFO`, `dup`, ...
        op: &'static str,
        /// The errno.
        errno: Errno,
    },
}

impl FenceError {
    pub(crate) fn from_errno(op: &'static str, errno: Errno) -> FenceError {
        match errno {
            Errno::NOTTY => FenceError::NotSyncFile,
            Errno::BADF => FenceError::BadFd,
            _ => FenceError::Os { op, errno },
        }
    }
}

impl From<FenceError> for crate::Error {
    fn from(e: FenceError) -> crate::Error {
        match e {
            FenceError::NotSyncFile
            | FenceError::BadFd
            | FenceError::InvalidRaw(_)
            | FenceError::Name => crate::Error::Inval,
            FenceError::Os {
                errno: Errno::NOMEM,
                ..
            } => crate::Error::Nomem,
            FenceError::PollError | FenceError::Os { .. } => crate::Error::Internal,
        }
    }
}

/// State of a fence or of a whole sync_file (`status` of the kernel structs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceStatus {
    /// 0: not yet signalled.
    Active,
    /// 1: signalled.
    Signalled,
    /// Negative: signalled with an error (the negative errno).
    Error(i32),
}

impl FenceStatus {
    fn from_raw(status: i32) -> FenceStatus {
        match status {
            0 => FenceStatus::Active,
            s if s > 0 => FenceStatus::Signalled,
            s => FenceStatus::Error(s),
        }
    }
}

/// One fence inside a sync_file (`struct sync_fence_info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceInfo {
    /// Timeline name.
    pub obj_name: String,
    /// Driver that created the fence.
    pub driver_name: String,
    /// Its state.
    pub status: FenceStatus,
    /// Signal time in ns on `CLOCK_MONOTONIC` (0 while active).
    pub timestamp_ns: u64,
}

/// What `SYNC_IOC_FILE_INFO` reports (`struct sync_file_info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncFileInfo {
    /// The sync_file's name.
    pub name: String,
    /// Combined state of all fences.
    pub status: FenceStatus,
    /// The fences it holds.
    pub fences: Vec<FenceInfo>,
}

fn c_name(bytes: &[u8; 32]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// An owned sync_file fd, or an already-signalled fence (exported fd -1).
///
/// Dropping it closes the fd exactly once; the signalled form owns nothing.
#[derive(Debug)]
pub struct SyncFile {
    pub(crate) fd: Option<OwnedFd>,
}

impl SyncFile {
    /// The already-signalled fence (a driver's fd -1 export).
    pub fn signalled() -> SyncFile {
        SyncFile { fd: None }
    }

    /// Wraps an owned fd (a sync_file, or for waiting only any pollable fd).
    pub fn from_fd(fd: OwnedFd) -> SyncFile {
        SyncFile { fd: Some(fd) }
    }

    /// Wraps an export: `None` is the already-signalled fence.
    pub fn from_export(fd: Option<OwnedFd>) -> SyncFile {
        SyncFile { fd }
    }

    /// The fd, or `None` for the already-signalled fence (never poll -1).
    pub fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// Gives up the fd (`None` for the already-signalled fence).
    pub fn into_fd(self) -> Option<OwnedFd> {
        self.fd
    }

    /// Waits until the fence signals or `timeout` passes; `None` waits
    /// forever, `Some(Duration::ZERO)` only looks. Returns `true` when
    /// signalled, `false` on timeout (a pending fence with timeout 0 reports
    /// `false`). A signal-interrupted poll is retried with the time left.
    ///
    /// # Errors
    /// [`FenceError::BadFd`] for a closed fd, [`FenceError::PollError`] for
    /// `POLLERR`/`POLLHUP` without readiness, [`FenceError::Os`] otherwise.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool, FenceError> {
        match self.as_fd() {
            None => Ok(true),
            Some(fd) => wait_fd(fd, timeout),
        }
    }

    /// `wait(Some(Duration::ZERO))`: is it signalled now?
    ///
    /// # Errors
    /// As [`wait`](Self::wait).
    pub fn is_signalled(&self) -> Result<bool, FenceError> {
        self.wait(Some(Duration::ZERO))
    }

    /// A new fence that signals when both `self` and `other` have
    /// (`SYNC_IOC_MERGE`), named `name`. With an already-signalled side the
    /// result is a duplicate of the other side; with two, it is signalled.
    ///
    /// # Errors
    /// [`FenceError::Name`] for a name over 31 bytes or with NUL;
    /// [`FenceError::NotSyncFile`] when an fd is not a sync_file.
    pub fn merge(&self, other: &SyncFile, name: &str) -> Result<SyncFile, FenceError> {
        let name = encode_name(name)?;
        match (self.as_fd(), other.as_fd()) {
            (None, None) => Ok(SyncFile::signalled()),
            (Some(fd), None) | (None, Some(fd)) => dup(fd),
            (Some(a), Some(b)) => sys::sync_merge(a, b, name)
                .map(SyncFile::from_fd)
                .map_err(|e| FenceError::from_errno("SYNC_IOC_MERGE", e)),
        }
    }

    /// The sync_file's name, status and fences (`SYNC_IOC_FILE_INFO`). The
    /// already-signalled fence reports an empty name, `Signalled`, no fences.
    ///
    /// # Errors
    /// [`FenceError::NotSyncFile`] when the fd is not a sync_file.
    pub fn info(&self) -> Result<SyncFileInfo, FenceError> {
        let Some(fd) = self.as_fd() else {
            return Ok(SyncFileInfo {
                name: String::new(),
                status: FenceStatus::Signalled,
                fences: Vec::new(),
            });
        };
        let (info, fences) =
            sys::sync_file_info(fd).map_err(|e| FenceError::from_errno("SYNC_IOC_FILE_INFO", e))?;
        Ok(SyncFileInfo {
            name: c_name(&info.name),
            status: FenceStatus::from_raw(info.status),
            fences: fences
                .iter()
                .map(|f| FenceInfo {
                    obj_name: c_name(&f.obj_name),
                    driver_name: c_name(&f.driver_name),
                    status: FenceStatus::from_raw(f.status),
                    timestamp_ns: f.timestamp_ns,
                })
                .collect(),
        })
    }

    /// Another handle on the same fence (`dup`); the signalled form clones as is.
    ///
    /// # Errors
    /// [`FenceError::Os`] when `dup` fails (e.g. `EMFILE`).
    pub fn try_clone(&self) -> Result<SyncFile, FenceError> {
        match self.as_fd() {
            None => Ok(SyncFile::signalled()),
            Some(fd) => dup(fd),
        }
    }
}

fn encode_name(name: &str) -> Result<[u8; 32], FenceError> {
    let bytes = name.as_bytes();
    if bytes.len() > 31 || bytes.contains(&0) {
        return Err(FenceError::Name);
    }
    let mut out = [0u8; 32];
    out[..bytes.len()].copy_from_slice(bytes);
    Ok(out)
}

fn dup(fd: BorrowedFd<'_>) -> Result<SyncFile, FenceError> {
    fd.try_clone_to_owned()
        .map(SyncFile::from_fd)
        .map_err(|e| FenceError::from_errno("dup", Errno::from_io_error(&e).unwrap_or(Errno::IO)))
}

/// Waits for `POLLIN` on `fd` (shared by [`SyncFile`] and `EventFence`).
pub(crate) fn wait_fd(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> Result<bool, FenceError> {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let ts = left.and_then(|d| Timespec::try_from(d).ok());
        let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
        match poll(&mut fds, ts.as_ref()) {
            // Only a finite poll returns 0, and only once its time is up.
            Ok(0) if ts.is_some() => return Ok(false),
            Ok(0) => {}
            Ok(_) => return readiness(fds[0].revents()),
            Err(Errno::INTR) => {}
            Err(e) => return Err(FenceError::from_errno("poll", e)),
        }
    }
}

fn readiness(rev: PollFlags) -> Result<bool, FenceError> {
    if rev.contains(PollFlags::IN) {
        Ok(true)
    } else if rev.contains(PollFlags::NVAL) {
        Err(FenceError::BadFd)
    } else if rev.intersects(PollFlags::ERR | PollFlags::HUP) {
        Err(FenceError::PollError)
    } else {
        Ok(false)
    }
}
