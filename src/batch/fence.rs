//! Borrowing the application's fence fd for one readiness wait (FENCE).
//!
//! # Safety
//! `Exec::Fence` carries a raw fd that the application owns and keeps open
//! until `collect` returns (B-066, B-067: the engine never dups or closes it).
//! The borrow made here lives only inside the driver's wait on that
//! operation, which ends before `collect` runs, so it never outlives the
//! application's ownership. A fd the application closed early is detected by
//! the readiness registration (`EBADF` → `Inval`, B-069); a negative fd is
//! refused here without borrowing.
#![allow(unsafe_code)]

use std::os::fd::{BorrowedFd, RawFd};

/// The fence fd as a borrowed fd for the wait, or `None` for a negative fd.
pub(crate) fn borrow_fence<'a>(fd: RawFd) -> Option<BorrowedFd<'a>> {
    if fd < 0 {
        return None;
    }
    // SAFETY: fd is not -1 (checked above) and, by the FENCE contract, stays
    // open and owned by the application until collect returns; the borrow is
    // dropped when the wait ends, before collect (see the module's Safety).
    Some(unsafe { BorrowedFd::borrow_raw(fd) })
}
