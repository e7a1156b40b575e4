//! [`future_pair`]: a one-shot future/promise pair (`xtc_future_new_pair`,
//! `xtc_promise_set`; B-126 requests carry one; on the FUTURE exec path a failed or dropped promise is
//! seen as its error code, B-085).
//!
//! The two halves share a mutex-guarded slot. [`Promise::set`] stores the
//! value and wakes the waker the future left there; if the future is awaited on
//! a real loop parked in `epoll_wait`, that wake writes the loop's eventfd, so a
//! promise set on another thread wakes the loop without polling. Dropping the
//! promise unset resolves the future with `Err(Aborted)`; setting a promise
//! whose future was dropped just drops the value.

use crate::{Error, Result};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

struct Slot<T> {
    value: Option<Result<T>>,
    waker: Option<Waker>,
    future_gone: bool,
    taken: bool,
}

type SharedSlot<T> = Arc<Mutex<Slot<T>>>;

fn lock<T>(s: &SharedSlot<T>) -> MutexGuard<'_, Slot<T>> {
    // No code runs under this lock that could leave the slot half-written.
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// A new pair: the [`Future`] is awaited once on a loop, the [`Promise`] is set
/// from any thread or loop.
pub fn future_pair<T>() -> (Future<T>, Promise<T>) {
    let shared = Arc::new(Mutex::new(Slot {
        value: None,
        waker: None,
        future_gone: false,
        taken: false,
    }));
    (
        Future {
            shared: shared.clone(),
        },
        Promise {
            shared: Some(shared),
        },
    )
}

/// The consumer half: resolves to the promised `Result<T>`, or `Err(Aborted)`
/// when the promise was dropped unset. `Send` when `T: Send`.
///
/// Awaited once: polling again after it resolved gives `Err(Inval)`.
#[must_use = "a future does nothing unless awaited"]
pub struct Future<T> {
    shared: SharedSlot<T>,
}

impl<T> std::fmt::Debug for Future<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Future")
            .field("ready", &self.is_ready())
            .finish()
    }
}

impl<T> Future<T> {
    /// Whether the promise has been set (or dropped), so awaiting won't park.
    pub fn is_ready(&self) -> bool {
        lock(&self.shared).value.is_some()
    }
}

impl<T> std::future::Future for Future<T> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let mut slot = lock(&self.shared);
        if let Some(v) = slot.value.take() {
            slot.taken = true;
            return Poll::Ready(v);
        }
        if slot.taken {
            return Poll::Ready(Err(Error::Inval));
        }
        match &mut slot.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            w => *w = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl<T> Drop for Future<T> {
    fn drop(&mut self) {
        let (value, waker) = {
            let mut slot = lock(&self.shared);
            slot.future_gone = true;
            (slot.value.take(), slot.waker.take())
        };
        // The value (and a stale waker) drop outside the lock.
        drop((value, waker));
    }
}

/// The producer half. `Send` when `T: Send`; set it from any thread.
pub struct Promise<T> {
    shared: Option<SharedSlot<T>>,
}

impl<T> std::fmt::Debug for Promise<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Promise")
            .field("future_gone", &self.is_abandoned())
            .finish()
    }
}

impl<T> Promise<T> {
    /// Resolves the future with `value` and wakes the process awaiting it.
    /// Harmless when the future was already dropped (the value is dropped).
    pub fn set(mut self, value: Result<T>) {
        if let Some(shared) = self.shared.take() {
            fulfil(&shared, value);
        }
    }

    /// Whether the future half is gone (setting is then a no-op).
    pub fn is_abandoned(&self) -> bool {
        self.shared.as_ref().is_none_or(|s| lock(s).future_gone)
    }
}

fn fulfil<T>(shared: &SharedSlot<T>, value: Result<T>) {
    let waker = {
        let mut slot = lock(shared);
        if slot.future_gone {
            drop(slot);
            drop(value);
            return;
        }
        slot.value = Some(value);
        slot.waker.take()
    };
    if let Some(w) = waker {
        w.wake();
    }
}

impl<T> Drop for Promise<T> {
    /// An unset promise resolves its future with `Err(Aborted)`.
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            fulfil(&shared, Err(Error::Aborted));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>() {}

    #[test]
    fn halves_are_send_when_t_is_send() {
        assert_send::<Future<u32>>();
        assert_send::<Promise<u32>>();
    }

    #[test]
    fn set_then_await_outside_a_loop() {
        let (f, p) = future_pair::<u32>();
        p.set(Ok(7));
        assert!(f.is_ready());
        assert_eq!(futures_lite::future::block_on(f), Ok(7));
    }

    #[test]
    fn abandoned_promise_reports_it() {
        let (f, p) = future_pair::<String>();
        assert!(!p.is_abandoned());
        drop(f);
        assert!(p.is_abandoned());
        p.set(Ok("dropped".into()));
    }
}
