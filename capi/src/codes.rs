//! Status codes, descriptor version, enumerations and the conversions between
//! them and the crate's [`Error`] (xtc_batch(3), B-180..B-185).
//!
//! cbindgen turns each `pub const` into a `#define` and each `#[repr(C)]`
//! enum into a C enum (the status codes are an enum, so a negative code is
//! one C operand). Integer values written by the application (result
//! states, exec kinds, close modes, error codes) are read as plain `int`s and
//! validated here, never transmuted into a Rust enum: an out-of-range value
//! is a typed error, not undefined behaviour.

use std::os::raw::c_int;

use xtc::Error;
use xtc::batch::{CloseMode, ExecStatus, StepResult};

/// Status codes (B-180..B-185): `XTC_OK` and the negative `XTC_E_*` values
/// every `int` function returns (the same numbers as `xtc::Error::code`).
/// An enum rather than macros, so a negative value is one C operand.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum xtc_error {
    /// Success.
    XTC_OK = 0,
    /// Malformed argument, descriptor size, foreign ownership or class, invalid
    /// close mode, unavailable handle (B-180).
    XTC_E_INVAL = -22,
    /// Unsupported descriptor version (B-181).
    XTC_E_VERSION = -1001,
    /// Charge, allocation arithmetic or handle exhaustion (B-182).
    XTC_E_RANGE = -34,
    /// Full or closed admission, creation after first execution, destruction
    /// before shutdown has completed (B-183).
    XTC_E_AGAIN = -11,
    /// Mutation during a callback (B-184).
    XTC_E_DEADLK = -35,
    /// Allocation failure during create (B-185).
    XTC_E_NOMEM = -12,
    /// Not built (`--enable-sched-policy` off) or not reachable (B-005).
    XTC_E_NOSYS = -38,
    /// The request or operation was cancelled.
    XTC_E_ABORTED = -125,
    /// Omitted or invalid result, invalid error value, unexpected driver exit, or
    /// a Rust panic caught at the library boundary.
    XTC_E_INTERNAL = -1002,
}

/// The [`xtc_error`] codes as `int`s (what the functions return), for Rust
/// callers and the library itself. Not in the header (the enum is).
///
/// cbindgen:ignore
pub mod status {
    use std::os::raw::c_int;

    /// `XTC_OK` as an `int`.
    pub const XTC_OK: c_int = super::xtc_error::XTC_OK as c_int;
    /// `XTC_E_INVAL` as an `int`.
    pub const XTC_E_INVAL: c_int = super::xtc_error::XTC_E_INVAL as c_int;
    /// `XTC_E_VERSION` as an `int`.
    pub const XTC_E_VERSION: c_int = super::xtc_error::XTC_E_VERSION as c_int;
    /// `XTC_E_RANGE` as an `int`.
    pub const XTC_E_RANGE: c_int = super::xtc_error::XTC_E_RANGE as c_int;
    /// `XTC_E_AGAIN` as an `int`.
    pub const XTC_E_AGAIN: c_int = super::xtc_error::XTC_E_AGAIN as c_int;
    /// `XTC_E_DEADLK` as an `int`.
    pub const XTC_E_DEADLK: c_int = super::xtc_error::XTC_E_DEADLK as c_int;
    /// `XTC_E_NOMEM` as an `int`.
    pub const XTC_E_NOMEM: c_int = super::xtc_error::XTC_E_NOMEM as c_int;
    /// `XTC_E_NOSYS` as an `int`.
    pub const XTC_E_NOSYS: c_int = super::xtc_error::XTC_E_NOSYS as c_int;
    /// `XTC_E_ABORTED` as an `int`.
    pub const XTC_E_ABORTED: c_int = super::xtc_error::XTC_E_ABORTED as c_int;
    /// `XTC_E_INTERNAL` as an `int`.
    pub const XTC_E_INTERNAL: c_int = super::xtc_error::XTC_E_INTERNAL as c_int;
}

pub(crate) use status::*;

/// The descriptor version this library implements: set the `version` field
/// of every options and statistics descriptor to it (B-006, B-061). Any
/// other value is `XTC_E_VERSION`. Layout growth is carried by `size`, not by
/// the version (see the `*_SIZE_VER0` macros in the header).
pub const XTC_BATCH_VERSION: u32 = 1;

/// Largest descriptor `size` accepted (a page, as Linux's
/// `copy_struct_from_user` callers cap it): a bigger value is `XTC_E_INVAL`
/// without reading past the library's own layout.
pub const XTC_DESC_SIZE_MAX: u32 = 4096;

/// The non-negative `exec_status` sentinels handed to `collect` (B-085); a
/// negative `exec_status` is an `XTC_E_*` code (the wait failed).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum xtc_batch_exec_status {
    /// The token fired: the operation finished; collect decides (B-088).
    XTC_BATCH_EXEC_OK = 0,
    /// `exec_timeout_ns` elapsed first (B-089).
    XTC_BATCH_EXEC_TIMEOUT = 1,
    /// Cancel-close, driver kill or teardown while the operation was
    /// outstanding (B-090).
    XTC_BATCH_EXEC_ABORTED = 2,
}

/// `xtc_batch_close` modes (B-131..B-135). Passed as an `int`-sized value; any
/// other value is `XTC_E_INVAL`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum xtc_batch_close_mode {
    /// Stop admission; accepted requests finish.
    XTC_BATCH_DRAIN = 0,
    /// Stop admission and cancel every nonterminal request.
    XTC_BATCH_CANCEL = 1,
}

/// Values of `xtc_batch_result_t.state` (B-033, B-034).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum xtc_batch_state {
    /// Written by the engine before each step or collect; left so, the
    /// member fails with `XTC_E_INTERNAL` (B-036).
    XTC_BATCH_UNSET = 0,
    /// The member stays READY for the next iteration.
    XTC_BATCH_CONTINUE = 1,
    /// The member finished: `complete` gets `XTC_OK`.
    XTC_BATCH_DONE = 2,
    /// The member keeps its slot and charge until `xtc_batch_resume`.
    XTC_BATCH_BLOCKED = 3,
    /// The member failed with the `XTC_E_*` code in `error`.
    XTC_BATCH_ERROR = 4,
}

/// Values of `xtc_batch_exec_t.kind` (B-065..B-079). The engine sets `kind`
/// to 0 before calling `submit`: a descriptor left unfilled, or any value not
/// listed here, is an unknown exec kind, reported to `collect` as
/// `exec_status == XTC_E_INVAL` (B-085).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum xtc_batch_exec_kind {
    /// The work was done inside `submit`; `collect` runs at once.
    XTC_BATCH_EXEC_INLINE = 1,
    /// `fence_fd` is a pollable fence (sync_file, dma-fence, eventfd) the
    /// application owns and keeps open until `collect` returns.
    XTC_BATCH_EXEC_FENCE = 2,
    /// `future` is the read half of `xtc_future_new_pair`; the engine consumes it.
    XTC_BATCH_EXEC_FUTURE = 3,
    /// `run(arg)` runs on the blocking pool; the driver parks until it returns.
    XTC_BATCH_EXEC_BLOCKING = 4,
}

/// Kinds of `xtc_accel_dev_t.kind`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum xtc_accel_kind {
    /// A DRM render node, `/dev/dri/renderD*`.
    XTC_ACCEL_RENDER = 1,
    /// A compute-accelerator node, `/dev/accel/accel*`.
    XTC_ACCEL_ACCEL = 2,
}

/// The `XTC_E_*` value of `e` (the same numbers as [`Error::code`]).
pub(crate) fn code(e: Error) -> c_int {
    e.code()
}

/// The error an application-supplied code names; `XTC_E_INTERNAL` for a value
/// that is no `XTC_E_*` code (0, positive, or unknown negative): B-037's
/// "invalid error value".
pub(crate) fn error_of(rc: c_int) -> Error {
    Error::from_code(rc).unwrap_or(Error::Internal)
}

/// A callback's `int` return: 0 is success, anything else fails with
/// [`error_of`] (B-037, B-080).
pub(crate) fn ret_of(rc: c_int) -> Result<(), Error> {
    if rc == XTC_OK {
        Ok(())
    } else {
        Err(error_of(rc))
    }
}

/// A close mode from its `int` value; `Inval` for any other (B-180).
pub(crate) fn close_mode(v: u32) -> Result<CloseMode, Error> {
    match v {
        v if v == xtc_batch_close_mode::XTC_BATCH_DRAIN as u32 => Ok(CloseMode::Drain),
        v if v == xtc_batch_close_mode::XTC_BATCH_CANCEL as u32 => Ok(CloseMode::Cancel),
        _ => Err(Error::Inval),
    }
}

/// A result word as the application wrote it (B-034..B-036): `UNSET` stays
/// unset (the engine fails it `Internal`, or `Again` after a timeout); an
/// unknown state, or `ERROR` whose `error` is not an existing nonzero
/// `XTC_E_*` code, is an invalid result and fails the member `Internal`.
pub(crate) fn step_result(state: c_int, error: c_int) -> StepResult {
    use xtc_batch_state::*;
    match state {
        s if s == XTC_BATCH_UNSET as c_int => StepResult::Unset,
        s if s == XTC_BATCH_CONTINUE as c_int => StepResult::Continue,
        s if s == XTC_BATCH_DONE as c_int => StepResult::Done,
        s if s == XTC_BATCH_BLOCKED as c_int => StepResult::Blocked,
        s if s == XTC_BATCH_ERROR as c_int => {
            StepResult::Error(Error::from_code(error).unwrap_or(Error::Internal))
        }
        _ => StepResult::Error(Error::Internal),
    }
}

/// The `exec_status` handed to `collect` (B-085): the non-negative sentinels,
/// or the negative `XTC_E_*` code of a failed wait.
pub(crate) fn exec_status(s: ExecStatus) -> c_int {
    match s {
        ExecStatus::Ok => xtc_batch_exec_status::XTC_BATCH_EXEC_OK as c_int,
        ExecStatus::Timeout => xtc_batch_exec_status::XTC_BATCH_EXEC_TIMEOUT as c_int,
        ExecStatus::Aborted => xtc_batch_exec_status::XTC_BATCH_EXEC_ABORTED as c_int,
        ExecStatus::Failed(e) => code(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_the_crate_errors() {
        let ours = [
            (Error::Inval, XTC_E_INVAL),
            (Error::Version, XTC_E_VERSION),
            (Error::Range, XTC_E_RANGE),
            (Error::Again, XTC_E_AGAIN),
            (Error::Deadlk, XTC_E_DEADLK),
            (Error::Nomem, XTC_E_NOMEM),
            (Error::Nosys, XTC_E_NOSYS),
            (Error::Aborted, XTC_E_ABORTED),
            (Error::Internal, XTC_E_INTERNAL),
        ];
        assert_eq!(ours.len(), Error::ALL.len());
        for (e, c) in ours {
            assert_eq!(e.code(), c, "{e:?}");
        }
    }

    #[test]
    fn invalid_values_are_internal_or_inval() {
        assert_eq!(error_of(0), Error::Internal);
        assert_eq!(error_of(5), Error::Internal);
        assert_eq!(error_of(-7), Error::Internal);
        assert_eq!(error_of(XTC_E_AGAIN), Error::Again);
        assert_eq!(ret_of(12345), Err(Error::Internal));
        assert_eq!(ret_of(0), Ok(()));
        assert_eq!(close_mode(0), Ok(CloseMode::Drain));
        assert_eq!(close_mode(1), Ok(CloseMode::Cancel));
        assert_eq!(close_mode(2), Err(Error::Inval));
        assert_eq!(close_mode(u32::MAX), Err(Error::Inval));
        assert_eq!(step_result(4, 0), StepResult::Error(Error::Internal));
        assert_eq!(step_result(4, 3), StepResult::Error(Error::Internal));
        assert_eq!(step_result(4, XTC_E_RANGE), StepResult::Error(Error::Range));
        assert_eq!(step_result(9, 0), StepResult::Error(Error::Internal));
        assert_eq!(step_result(-1, 0), StepResult::Error(Error::Internal));
        assert_eq!(step_result(0, XTC_E_RANGE), StepResult::Unset);
        assert_eq!(step_result(2, 99), StepResult::Done, "error ignored");
        assert_eq!(exec_status(ExecStatus::Failed(Error::Nosys)), XTC_E_NOSYS);
    }
}
