//! The library boundary: no Rust panic crosses it, and `!Send` state is only
//! touched on the thread it belongs to.
//!
//! - Every exported function that returns `int` runs its body through
//!   [`call`]: `Ok` is `XTC_OK`, an [`Error`] its `XTC_E_*` code, and a panic
//!   (a bug in the library) `XTC_E_INTERNAL` after the panic hook printed
//!   its message on stderr.
//! - A function that cannot return an error (`void`: the `*_drop`/`*_free`
//!   calls, `xtc_batch_router_destroy`) runs through [`call_void`], which
//!   aborts the process on a panic, as Rust does for any unwind reaching an
//!   `extern "C"` frame; `xtc_batch_route` returns NULL.
//! - Loops, groups and their callbacks' state are single-threaded (`Rc`,
//!   `RefCell`). [`Home`] records the thread that owns them; owner-only calls
//!   from another thread are refused with `XTC_E_INVAL` (foreign ownership,
//!   B-180) instead of racing. The one exception is the manual page's
//!   "externally synchronized quiescent calls after executor return"
//!   (B-149): once `xtc_exec_run` has joined the carrier threads, destroy and
//!   statistics of their groups are allowed from any thread.

use std::os::raw::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::ThreadId;

use xtc::Error;

use crate::codes::{XTC_E_INTERNAL, XTC_OK, code};

/// Runs an exported function's body: `XTC_OK`, the error's code, or
/// `XTC_E_INTERNAL` when the body panicked.
pub(crate) fn call(f: impl FnOnce() -> Result<(), Error>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => XTC_OK,
        Ok(Err(e)) => code(e),
        Err(_) => XTC_E_INTERNAL,
    }
}

/// Runs the body of a function that cannot report an error; a panic aborts
/// the process (documented in the manual page, section NOTES).
pub(crate) fn call_void(f: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        std::process::abort();
    }
}

/// The thread that owns a loop (and the groups created on it), and whether
/// its executor has returned (B-149).
#[derive(Debug, Clone)]
pub(crate) struct Home {
    thread: ThreadId,
    /// Set by `xtc_exec_run` after it joined the carriers (never for a loop of
    /// `xtc_loop_new`, which stays on its thread).
    quiescent: Arc<AtomicBool>,
}

impl Home {
    /// The calling thread, not quiescent.
    pub(crate) fn here() -> Home {
        Home::with(Arc::new(AtomicBool::new(false)))
    }

    /// The calling thread, quiescent once `flag` is set.
    pub(crate) fn with(flag: Arc<AtomicBool>) -> Home {
        Home {
            thread: std::thread::current().id(),
            quiescent: flag,
        }
    }

    /// Owner-only calls: `Inval` from any other thread.
    pub(crate) fn owner(&self) -> Result<(), Error> {
        if std::thread::current().id() == self.thread {
            Ok(())
        } else {
            Err(Error::Inval)
        }
    }

    /// Destroy and statistics: the owner thread, or any thread once the
    /// executor returned (the join orders the carriers' last writes before
    /// this Acquire load).
    pub(crate) fn owner_or_quiescent(&self) -> Result<(), Error> {
        if self.quiescent.load(Ordering::Acquire) {
            Ok(())
        } else {
            self.owner()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codes::XTC_E_RANGE;

    #[test]
    fn a_panic_becomes_internal_and_errors_their_codes() {
        assert_eq!(call(|| Ok(())), XTC_OK);
        assert_eq!(call(|| Err(Error::Range)), XTC_E_RANGE);
        assert_eq!(call(|| panic!("a bug in the library")), XTC_E_INTERNAL);
    }

    #[test]
    fn home_refuses_other_threads_until_quiescent() {
        let flag = Arc::new(AtomicBool::new(false));
        let home = Home::with(flag.clone());
        assert_eq!(home.owner(), Ok(()));
        let h = home.clone();
        let (a, b) = std::thread::spawn(move || (h.owner(), h.owner_or_quiescent()))
            .join()
            .unwrap();
        assert_eq!((a, b), (Err(Error::Inval), Err(Error::Inval)));
        flag.store(true, Ordering::Release);
        let h = home.clone();
        let (a, b) = std::thread::spawn(move || (h.owner(), h.owner_or_quiescent()))
            .join()
            .unwrap();
        assert_eq!((a, b), (Err(Error::Inval), Ok(())));
    }
}
