//! The crate's error type: the manual page's `XTC_E_*` codes.
//!
//! `xtc_batch(3)` (B-180..B-185) gives each code its meaning; [`Error::code`]
//! returns the negative C value so logs and the C ABI agree (`xtc_error` in
//! `include/xtc_batch.h`, `docs/man/xtc_batch.3`). Backend errors
//! (`vk`, `accel`, `decode`) have their own types that convert into this one.

/// `XTC_E_*` error codes of `xtc_batch(3)`.
///
/// Meanings (B-180..B-185): `Inval` malformed arguments, foreign ownership,
/// foreign class, invalid close mode or an unavailable handle; `Version` an
/// unsupported descriptor version; `Range` charge, allocation arithmetic or
/// handle exhaustion; `Again` full/closed admission, creation after first
/// execution, destruction before shutdown completed; `Deadlk` mutation during a
/// callback; `Nomem` allocation failure; `Nosys` not built / not reachable;
/// `Aborted` cancellation; `Internal` omitted/invalid results, unexpected driver
/// exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Error {
    /// `XTC_E_INVAL` (-22): malformed argument, foreign object, unavailable handle.
    #[error("invalid argument (XTC_E_INVAL)")]
    Inval,
    /// `XTC_E_VERSION` (-1001): unsupported descriptor version.
    #[error("unsupported version (XTC_E_VERSION)")]
    Version,
    /// `XTC_E_RANGE` (-34): charge, allocation arithmetic or handle exhaustion.
    #[error("out of range (XTC_E_RANGE)")]
    Range,
    /// `XTC_E_AGAIN` (-11): full/closed admission, create after first run, destroy too early.
    #[error("try again (XTC_E_AGAIN)")]
    Again,
    /// `XTC_E_DEADLK` (-35): mutation while a callback of the group is in flight.
    #[error("mutation during a callback (XTC_E_DEADLK)")]
    Deadlk,
    /// `XTC_E_NOMEM` (-12): allocation failure (resource accountant exhausted).
    #[error("out of memory (XTC_E_NOMEM)")]
    Nomem,
    /// `XTC_E_NOSYS` (-38): feature not built, or path not reachable (FENCE under `Sim`).
    #[error("not supported (XTC_E_NOSYS)")]
    Nosys,
    /// `XTC_E_ABORTED` (-125): the request or operation was cancelled.
    #[error("aborted (XTC_E_ABORTED)")]
    Aborted,
    /// `XTC_E_INTERNAL` (-1002): omitted/invalid result, unexpected driver exit.
    #[error("internal error (XTC_E_INTERNAL)")]
    Internal,
}

impl Error {
    /// The negative `XTC_E_*` value of this error (errno-style where one exists).
    pub fn code(self) -> i32 {
        match self {
            Error::Inval => -22,
            Error::Version => -1001,
            Error::Range => -34,
            Error::Again => -11,
            Error::Deadlk => -35,
            Error::Nomem => -12,
            Error::Nosys => -38,
            Error::Aborted => -125,
            Error::Internal => -1002,
        }
    }

    /// The error whose [`code`](Error::code) is `code`, or `None` for a value
    /// that is no `XTC_E_*` code (0 and positive values included).
    pub fn from_code(code: i32) -> Option<Error> {
        Error::ALL.into_iter().find(|e| e.code() == code)
    }

    /// Every error code, in the manual page's order.
    pub const ALL: [Error; 9] = [
        Error::Inval,
        Error::Version,
        Error::Range,
        Error::Again,
        Error::Deadlk,
        Error::Nomem,
        Error::Nosys,
        Error::Aborted,
        Error::Internal,
    ];
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_negative() {
        for e in Error::ALL {
            assert!(e.code() < 0);
            assert_eq!(Error::from_code(e.code()), Some(e));
        }
        assert_eq!(Error::from_code(0), None);
        assert_eq!(Error::from_code(7), None);
    }
}
