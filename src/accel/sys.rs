//! Raw sync_file ioctls (`include/uapi/linux/sync_file.h`): the only unsafe
//! code of `accel`.
//!
//! # Safety
//! - Each ioctl goes through `rustix::ioctl::ioctl` with an
//!   [`Updater`](rustix::ioctl::Updater) over a `#[repr(C)]` struct whose layout
//!   is the kernel's (sizes pinned by `const` asserts below: 48 bytes for
//!   `sync_merge_data`, 56 for `sync_file_info`, 80 for `sync_fence_info`); the
//!   opcodes are computed from those types with `_IOWR('>', nr, T)` and pinned
//!   to the values the kernel header gives (0xc0303e03, 0xc0383e04).
//! - `SYNC_IOC_FILE_INFO` with `num_fences > 0` makes the kernel write
//!   `num_fences` `sync_fence_info` records to the address in
//!   `sync_fence_info`: we pass a live, exclusively borrowed `Vec` of exactly
//!   that many zeroed records, which outlives the call.
//! - On success `SYNC_IOC_MERGE` installs a new fd in `fence`; nothing else
//!   owns it, so wrapping it in an `OwnedFd` is sound and closes it once.
//! - On an fd that is no sync_file the kernel answers `ENOTTY` without touching
//!   memory (checked on eventfds in `tests/accel_fence.rs`).
#![allow(unsafe_code)]

use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};

use rustix::io::Errno;
use rustix::ioctl::{Opcode, Updater, ioctl, opcode};

/// `struct sync_merge_data`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct SyncMergeData {
    pub name: [u8; 32],
    pub fd2: i32,
    pub fence: i32,
    pub flags: u32,
    pub pad: u32,
}

/// `struct sync_file_info`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct SyncFileInfoRaw {
    pub name: [u8; 32],
    pub status: i32,
    pub flags: u32,
    pub num_fences: u32,
    pub pad: u32,
    pub sync_fence_info: u64,
}

/// `struct sync_fence_info`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct SyncFenceInfoRaw {
    pub obj_name: [u8; 32],
    pub driver_name: [u8; 32],
    pub status: i32,
    pub flags: u32,
    pub timestamp_ns: u64,
}

const ZERO_FENCE: SyncFenceInfoRaw = SyncFenceInfoRaw {
    obj_name: [0; 32],
    driver_name: [0; 32],
    status: 0,
    flags: 0,
    timestamp_ns: 0,
};

const SYNC_IOC_MAGIC: u8 = b'>';
/// `SYNC_IOC_MERGE`.
pub(crate) const SYNC_IOC_MERGE: Opcode = opcode::read_write::<SyncMergeData>(SYNC_IOC_MAGIC, 3);
/// `SYNC_IOC_FILE_INFO`.
pub(crate) const SYNC_IOC_FILE_INFO: Opcode =
    opcode::read_write::<SyncFileInfoRaw>(SYNC_IOC_MAGIC, 4);

const _: () = assert!(size_of::<SyncMergeData>() == 48);
const _: () = assert!(size_of::<SyncFileInfoRaw>() == 56);
const _: () = assert!(size_of::<SyncFenceInfoRaw>() == 80);
const _: () = assert!(SYNC_IOC_MERGE as u64 == 0xc030_3e03);
const _: () = assert!(SYNC_IOC_FILE_INFO as u64 == 0xc038_3e04);

/// Most fences one sync_file may report; a larger count is refused (`E2BIG`)
/// rather than allocated.
pub(crate) const MAX_FENCES: u32 = 4096;

/// `SYNC_IOC_MERGE`: a new sync_file signalled when both `fd` and `other` are.
pub(crate) fn sync_merge(
    fd: BorrowedFd<'_>,
    other: BorrowedFd<'_>,
    name: [u8; 32],
) -> Result<OwnedFd, Errno> {
    let mut data = SyncMergeData {
        name,
        fd2: std::os::fd::AsRawFd::as_raw_fd(&other),
        fence: -1,
        flags: 0,
        pad: 0,
    };
    // SAFETY: SYNC_IOC_MERGE takes a `sync_merge_data` (layout and opcode
    // pinned above); `data` is a live exclusive borrow for the call.
    unsafe { ioctl(fd, Updater::<SYNC_IOC_MERGE, SyncMergeData>::new(&mut data))? };
    if data.fence < 0 {
        return Err(Errno::INVAL);
    }
    // SAFETY: on success the kernel installed `data.fence` as a new fd for
    // this process and nothing else refers to it; we become its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(data.fence) })
}

/// `SYNC_IOC_FILE_INFO`, twice: once for the count, once for the records.
pub(crate) fn sync_file_info(
    fd: BorrowedFd<'_>,
) -> Result<(SyncFileInfoRaw, Vec<SyncFenceInfoRaw>), Errno> {
    let mut info = SyncFileInfoRaw {
        name: [0; 32],
        status: 0,
        flags: 0,
        num_fences: 0,
        pad: 0,
        sync_fence_info: 0,
    };
    // SAFETY: SYNC_IOC_FILE_INFO takes a `sync_file_info`; with num_fences = 0
    // the kernel only writes the struct itself, which we borrow exclusively.
    unsafe {
        ioctl(
            fd,
            Updater::<SYNC_IOC_FILE_INFO, SyncFileInfoRaw>::new(&mut info),
        )?
    };
    let n = info.num_fences;
    if n == 0 {
        return Ok((info, Vec::new()));
    }
    if n > MAX_FENCES {
        return Err(Errno::TOOBIG);
    }
    let mut fences = vec![ZERO_FENCE; n as usize];
    info.sync_fence_info = fences.as_mut_ptr() as u64;
    // SAFETY: `fences` holds exactly `n` writable records, is not otherwise
    // borrowed, and lives past the call (memo point 2).
    unsafe {
        ioctl(
            fd,
            Updater::<SYNC_IOC_FILE_INFO, SyncFileInfoRaw>::new(&mut info),
        )?
    };
    info.sync_fence_info = 0;
    fences.truncate(info.num_fences.min(n) as usize);
    Ok((info, fences))
}

/// Takes ownership of a raw fd handed over by a driver export.
///
/// # Safety
/// `fd` must be an open fd that the caller owns and gives up (it is closed
/// when the returned `OwnedFd` drops).
pub(crate) unsafe fn owned_from_raw(fd: RawFd) -> OwnedFd {
    // SAFETY: the caller's contract above.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

impl super::SyncFile {
    /// Takes over a raw fd exported by a driver (`vkGetFenceFdKHR(SYNC_FD)`,
    /// a syncobj export): `-1` is the already-signalled fence (nothing is
    /// owned or closed), any other fd becomes owned and is closed on drop.
    ///
    /// # Errors
    /// [`FenceError::InvalidRaw`](super::FenceError::InvalidRaw) for a value
    /// below -1.
    ///
    /// # Safety
    /// A non-negative `fd` must be open and owned by the caller, who gives it
    /// up: nothing else may use or close it afterwards.
    pub unsafe fn from_raw(fd: RawFd) -> Result<super::SyncFile, super::FenceError> {
        match fd {
            -1 => Ok(super::SyncFile::signalled()),
            fd if fd < -1 => Err(super::FenceError::InvalidRaw(fd)),
            // SAFETY: the caller's contract (an open fd it gives up).
            fd => Ok(super::SyncFile::from_fd(unsafe { owned_from_raw(fd) })),
        }
    }
}
