//! The per-loop resource accountant: a byte budget that the runtime charges
//! its own objects against (each process's task cell, scheduling classes), and
//! that layers above charge their storage against (B-185: allocation failure
//! is `Nomem`). Tests use [`Budget::fail_after`] to inject allocation failure.
//!
//! Invariant: [`Budget::used`] is the sum of the live [`Charge`]s; a charge
//! that fails changes nothing, so after every charge is dropped `used() == 0`
//! ("nothing leaks").

use crate::{Error, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// No injected failure pending.
const NO_FAIL: u64 = u64::MAX;

#[derive(Debug)]
struct Inner {
    limit: u64,
    used: AtomicU64,
    /// Successful charges left before the injected failure (`NO_FAIL`: none).
    fail_countdown: AtomicU64,
}

/// A byte budget (the loop's resource accountant). Cheap to clone: clones
/// share one account. `Send + Sync` so a [`Charge`] may travel with its object.
#[derive(Debug, Clone)]
pub struct Budget {
    inner: Arc<Inner>,
}

impl Budget {
    /// A budget of `limit` bytes (`u64::MAX`: unlimited).
    pub fn new(limit: u64) -> Budget {
        Budget {
            inner: Arc::new(Inner {
                limit,
                used: AtomicU64::new(0),
                fail_countdown: AtomicU64::new(NO_FAIL),
            }),
        }
    }

    /// Charges `bytes`; the bytes return when the [`Charge`] is dropped.
    ///
    /// # Errors
    /// `Nomem` when `used + bytes` would exceed the limit, or when an injected
    /// failure ([`fail_after`](Budget::fail_after)) is due; nothing is charged then.
    pub fn charge(&self, bytes: u64) -> Result<Charge> {
        self.take_injected_failure()?;
        let mut used = self.inner.used.load(Ordering::Relaxed);
        loop {
            let new = used
                .checked_add(bytes)
                .filter(|n| *n <= self.inner.limit)
                .ok_or(Error::Nomem)?;
            match self.inner.used.compare_exchange_weak(
                used,
                new,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => used = now,
            }
        }
        Ok(Charge {
            budget: self.clone(),
            bytes,
        })
    }

    /// `Err(Nomem)` (once) when the injected failure is due.
    fn take_injected_failure(&self) -> Result<()> {
        let left = self.inner.fail_countdown.load(Ordering::Relaxed);
        if left == NO_FAIL {
            return Ok(());
        }
        let next = if left == 0 { NO_FAIL } else { left - 1 };
        self.inner.fail_countdown.store(next, Ordering::Relaxed);
        if left == 0 { Err(Error::Nomem) } else { Ok(()) }
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.inner.used.load(Ordering::Acquire)
    }

    /// The limit in bytes (`u64::MAX`: unlimited).
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// Test hook (allocation-failure injection): the next `n` charges succeed
    /// (if they fit), the `(n+1)`-th charge from now fails with `Nomem`; later
    /// charges succeed again.
    pub fn fail_after(&self, n: u64) {
        self.inner
            .fail_countdown
            .store(n.min(NO_FAIL - 1), Ordering::Relaxed);
    }

    /// Cancels a pending [`fail_after`](Budget::fail_after).
    pub fn clear_fail(&self) {
        self.inner.fail_countdown.store(NO_FAIL, Ordering::Relaxed);
    }
}

/// Bytes held against a [`Budget`]; they are released when this is dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Budget,
    bytes: u64,
}

impl Charge {
    /// The bytes this charge holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget
            .inner
            .used
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhaustion_is_nomem_and_release_returns_bytes() {
        let b = Budget::new(100);
        let c1 = b.charge(60).unwrap();
        assert_eq!(b.charge(41).unwrap_err(), Error::Nomem);
        assert_eq!(b.used(), 60);
        let c2 = b.charge(40).unwrap();
        assert_eq!(b.used(), 100);
        drop((c1, c2));
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn fail_after_fails_exactly_the_nth_plus_one_charge() {
        let b = Budget::new(u64::MAX);
        b.fail_after(2);
        let a = b.charge(1).unwrap();
        let c = b.charge(1).unwrap();
        assert_eq!(b.charge(1).unwrap_err(), Error::Nomem);
        let d = b.charge(1).unwrap();
        assert_eq!(b.used(), 3);
        drop((a, c, d));
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn overflowing_charge_is_nomem() {
        let b = Budget::new(u64::MAX);
        let _a = b.charge(u64::MAX - 1).unwrap();
        assert_eq!(b.charge(2).unwrap_err(), Error::Nomem);
    }
}
