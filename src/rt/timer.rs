//! Timers, `yield_now` and the loop clock.
//!
//! Each loop keeps its armed timers ordered by `(deadline, arm order)`, so
//! timers fire in deadline order and ties fire in the order they were armed.
//! A real loop hands the nearest deadline to `epoll_wait` as its timeout (no
//! periodic wake); a [`Sim`](super::Sim) jumps its virtual clock to it when no
//! process is runnable. A [`Sleep`] that is dropped (its process finished or was
//! killed) disarms its timer.

use super::Instant;
use super::event_loop::{Loop, LoopInner};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Weak;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Key of an armed timer: deadline, then arm order.
pub(crate) type TimerKey = (Instant, u64);

/// The armed timers of one loop.
#[derive(Default)]
pub(crate) struct Timers {
    armed: BTreeMap<TimerKey, Waker>,
    next: u64,
}

impl Timers {
    pub(crate) fn arm(&mut self, deadline: Instant, waker: Waker) -> TimerKey {
        self.next += 1;
        let key = (deadline, self.next);
        self.armed.insert(key, waker);
        key
    }

    /// Replaces the waker of a still-armed timer; false if it already fired.
    pub(crate) fn rearm(&mut self, key: TimerKey, waker: &Waker) -> bool {
        match self.armed.get_mut(&key) {
            Some(w) => {
                if !w.will_wake(waker) {
                    *w = waker.clone();
                }
                true
            }
            None => false,
        }
    }

    pub(crate) fn disarm(&mut self, key: TimerKey) {
        self.armed.remove(&key);
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.armed.keys().next().map(|k| k.0)
    }

    /// Removes every timer due at `now`, in deadline order, returning their wakers.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<Waker> {
        let mut due = Vec::new();
        while let Some(entry) = self.armed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            due.push(entry.remove());
        }
        due
    }

    /// Removes every timer (loop teardown).
    pub(crate) fn clear(&mut self) -> Vec<Waker> {
        std::mem::take(&mut self.armed).into_values().collect()
    }
}

/// The current loop's clock (real or virtual, see [`Instant`]).
///
/// # Panics
/// Outside a running loop or [`Sim`](super::Sim) step (there is no clock to read).
pub fn now() -> Instant {
    Loop::current()
        .expect("xtc::rt::now() called outside a running loop")
        .now()
}

/// The pid of the process being polled on the current loop (`None` outside
/// a process, e.g. in a loop's teardown).
pub fn current_pid() -> Option<super::Pid> {
    Loop::current().and_then(|l| l.polling())
}

/// Suspends the calling process for `d` on its loop's clock (`xtc_proc_sleep`).
///
/// The deadline is taken when the future is first polled. Under
/// [`Sim`](super::Sim) the wait costs no real time: the virtual clock jumps.
///
/// # Panics
/// When polled outside a loop.
pub fn sleep(d: Duration) -> Sleep {
    Sleep {
        when: When::After(d),
        armed: None,
    }
}

/// Suspends the calling process until its loop's clock reaches `deadline`.
///
/// # Panics
/// When polled outside a loop.
pub fn sleep_until(deadline: Instant) -> Sleep {
    Sleep {
        when: When::At(deadline),
        armed: None,
    }
}

enum When {
    After(Duration),
    At(Instant),
}

/// Future of [`sleep`] / [`sleep_until`]; disarms its timer when dropped.
#[must_use = "a sleep does nothing unless awaited"]
pub struct Sleep {
    when: When,
    armed: Option<(Weak<LoopInner>, TimerKey)>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let lp = Loop::current().expect("xtc::rt::sleep polled outside a running loop");
        let now = lp.now();
        let deadline = match self.when {
            When::After(d) => {
                let at = now + d;
                self.when = When::At(at);
                at
            }
            When::At(at) => at,
        };
        if now >= deadline {
            self.disarm();
            return Poll::Ready(());
        }
        if let Some((_, key)) = &self.armed
            && lp.inner().timers.borrow_mut().rearm(*key, cx.waker())
        {
            return Poll::Pending;
        }
        let key = lp
            .inner()
            .timers
            .borrow_mut()
            .arm(deadline, cx.waker().clone());
        self.armed = Some((lp.weak(), key));
        Poll::Pending
    }
}

impl Sleep {
    fn disarm(&mut self) {
        if let Some((lp, key)) = self.armed.take()
            && let Some(lp) = lp.upgrade()
            && let Ok(mut timers) = lp.timers.try_borrow_mut()
        {
            timers.disarm(key);
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.disarm();
    }
}

/// Gives the other runnable processes of the loop a turn (`xtc_yield`): the
/// first poll wakes itself and returns `Pending`, the second completes.
pub fn yield_now() -> YieldNow {
    YieldNow { yielded: false }
}

/// Future of [`yield_now`].
#[must_use = "a yield does nothing unless awaited"]
pub struct YieldNow {
    yielded: bool,
}

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
