//! Loom facade for the batch layer's lock-free parts (the admission ring, its
//! record pools and the shared handle space).
//!
//! Every atomic, `UnsafeCell` and spin hint used by `batch::ring` comes from
//! here, so a model-checking build (`RUSTFLAGS="--cfg loom" cargo test --lib
//! batch::ring`) swaps them all for `loom`'s instrumented versions at once, as
//! tokio's `src/loom/` and crossbeam's `primitive` module do. Outside
//! `cfg(all(test, loom))` the names are the `std` types and cost nothing.
//!
//! `UnsafeCell` gives access only through [`UnsafeCell::with`] and
//! [`UnsafeCell::with_mut`] closures, the shape loom needs to track every
//! access and report a data race (a slot written twice, or read while written).

#[cfg(all(test, loom))]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
#[cfg(not(all(test, loom)))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};

#[cfg(all(test, loom))]
pub(crate) use loom::cell::UnsafeCell;

/// `std::cell::UnsafeCell` with loom's closure-based access API.
#[cfg(not(all(test, loom)))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(all(test, loom)))]
impl<T> UnsafeCell<T> {
    /// Wraps `value`.
    pub(crate) const fn new(value: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    /// Calls `f` with a shared raw pointer to the contents.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Calls `f` with an exclusive raw pointer to the contents.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Hint for a thread that waits on another thread's progress (a producer that
/// saw a stale tail, a test consumer polling): a CPU spin hint, or a loom
/// yield so the model lets the other thread run.
#[inline(always)]
pub(crate) fn spin_hint() {
    #[cfg(all(test, loom))]
    loom::thread::yield_now();
    #[cfg(not(all(test, loom)))]
    std::hint::spin_loop();
}
