//! fd readiness on epoll, and the real loop's eventfd waker.
//!
//! Each real loop owns one epoll instance. Its eventfd is registered with the
//! data word [`WAKE_TOKEN`]; every other registration carries its fd number.
//! An fd is registered once (`EPOLLIN | EPOLLONESHOT`) however many processes
//! wait on it; an event marks all its waiters ready and wakes them, and a
//! waiter that polls again while the registration is disarmed re-arms it.
//! The last waiter to leave deletes the registration. The runtime never dups
//! or closes a caller's fd: it holds only the caller's `BorrowedFd`.
//!
//! Errors: `epoll_ctl` refusing the fd (`EBADF`: closed/bad fd, `EPERM`: not
//! pollable, e.g. a regular file) and an `EPOLLERR` event are `Inval`; under
//! [`Sim`](super::Sim) readiness is not reachable and `wait_readable` is `Nosys`.

use super::event_loop::{Loop, LoopInner};
use crate::{Error, Result};
use rustix::event::epoll;
use rustix::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use rustix::io::Errno;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// epoll data word of the loop's eventfd.
const WAKE_TOKEN: u64 = u64::MAX;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Readiness {
    Waiting,
    Ready,
    Failed,
}

/// One waiting process's slot.
struct Waiter {
    state: Cell<Readiness>,
    waker: RefCell<Option<Waker>>,
}

struct FdEntry {
    armed: bool,
    waiters: Vec<Rc<Waiter>>,
}

/// epoll instance + eventfd of a real loop.
pub(crate) struct Poller {
    epfd: OwnedFd,
    fds: RefCell<HashMap<RawFd, FdEntry>>,
    events: RefCell<Vec<epoll::Event>>,
}

impl Poller {
    /// Creates the epoll instance and the eventfd (returned for the inbox).
    pub(crate) fn new() -> Result<(Poller, OwnedFd)> {
        let epfd = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(map_sys)?;
        let wake = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(map_sys)?;
        epoll::add(
            &epfd,
            &wake,
            epoll::EventData::new_u64(WAKE_TOKEN),
            epoll::EventFlags::IN,
        )
        .map_err(map_sys)?;
        let poller = Poller {
            epfd,
            fds: RefCell::new(HashMap::new()),
            events: RefCell::new(Vec::with_capacity(64)),
        };
        Ok((poller, wake))
    }

    pub(crate) fn n_fds(&self) -> usize {
        self.fds.borrow().len()
    }

    /// Whether any fd is registered (the run loop then also polls epoll between turns).
    pub(crate) fn has_fds(&self) -> bool {
        !self.fds.borrow().is_empty()
    }

    /// Waits for events (`None`: forever), wakes the waiters of ready fds and
    /// drains the eventfd. Returns without error on `EINTR`.
    pub(crate) fn wait(&self, timeout: Option<Duration>, wake_fd: Option<&OwnedFd>) -> Result<()> {
        let ts = timeout.map(|d| rustix::event::Timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(d.subsec_nanos()),
        });
        let mut events = self.events.borrow_mut();
        events.clear();
        match epoll::wait(
            &self.epfd,
            rustix::buffer::spare_capacity(&mut events),
            ts.as_ref(),
        ) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(_) => return Err(Error::Internal),
        }
        let mut wakers = Vec::new();
        for ev in events.iter() {
            let (flags, data) = (ev.flags, ev.data.u64());
            if data == WAKE_TOKEN {
                if let Some(fd) = wake_fd {
                    let mut buf = [0u8; 8];
                    let _ = rustix::io::read(fd, &mut buf);
                }
                continue;
            }
            self.mark_ready(data as RawFd, flags, &mut wakers);
        }
        drop(events);
        wakers.into_iter().for_each(Waker::wake);
        Ok(())
    }

    fn mark_ready(&self, fd: RawFd, flags: epoll::EventFlags, wakers: &mut Vec<Waker>) {
        let mut fds = self.fds.borrow_mut();
        let Some(entry) = fds.get_mut(&fd) else {
            return;
        };
        entry.armed = false;
        let state = if flags.contains(epoll::EventFlags::ERR) {
            Readiness::Failed
        } else {
            Readiness::Ready
        };
        for w in &entry.waiters {
            w.state.set(state);
            wakers.extend(w.waker.borrow_mut().take());
        }
    }

    fn interest() -> epoll::EventFlags {
        epoll::EventFlags::IN | epoll::EventFlags::ONESHOT
    }

    /// Adds a waiter for `fd`, registering or re-arming the fd.
    fn register(&self, fd: BorrowedFd<'_>, waiter: Rc<Waiter>) -> Result<()> {
        let raw = fd.as_raw_fd();
        let mut fds = self.fds.borrow_mut();
        let data = epoll::EventData::new_u64(raw as u64);
        match fds.get_mut(&raw) {
            Some(entry) => {
                if !entry.armed {
                    epoll::modify(&self.epfd, fd, data, Self::interest()).map_err(map_fd_err)?;
                    entry.armed = true;
                }
                entry.waiters.push(waiter);
            }
            None => {
                epoll::add(&self.epfd, fd, data, Self::interest()).map_err(map_fd_err)?;
                fds.insert(
                    raw,
                    FdEntry {
                        armed: true,
                        waiters: vec![waiter],
                    },
                );
            }
        }
        Ok(())
    }

    /// Re-arms `fd` for a still-waiting waiter after a spurious wake.
    fn rearm(&self, fd: BorrowedFd<'_>) -> Result<()> {
        let raw = fd.as_raw_fd();
        let mut fds = self.fds.borrow_mut();
        if let Some(entry) = fds.get_mut(&raw)
            && !entry.armed
        {
            let data = epoll::EventData::new_u64(raw as u64);
            epoll::modify(&self.epfd, fd, data, Self::interest()).map_err(map_fd_err)?;
            entry.armed = true;
        }
        Ok(())
    }

    /// Removes a waiter; the last one deletes the registration.
    fn deregister(&self, fd: BorrowedFd<'_>, waiter: &Rc<Waiter>) {
        let raw = fd.as_raw_fd();
        let Ok(mut fds) = self.fds.try_borrow_mut() else {
            return;
        };
        let Some(entry) = fds.get_mut(&raw) else {
            return;
        };
        entry.waiters.retain(|w| !Rc::ptr_eq(w, waiter));
        if entry.waiters.is_empty() {
            fds.remove(&raw);
            // EBADF here means the caller closed the fd already; epoll then
            // dropped the registration by itself.
            let _ = epoll::delete(&self.epfd, fd);
        }
    }
}

fn map_sys(_: Errno) -> Error {
    Error::Internal
}

/// `epoll_ctl` on a caller's fd: a bad, closed or non-pollable fd is `Inval`.
fn map_fd_err(e: Errno) -> Error {
    match e {
        Errno::BADF | Errno::PERM | Errno::INVAL | Errno::LOOP => Error::Inval,
        Errno::NOMEM | Errno::NOSPC => Error::Nomem,
        _ => Error::Internal,
    }
}

/// Waits until `fd` is readable on the current loop (`xtc_accel_wait_fence`,
/// the FENCE path of B-066..B-070: sync_file, dma-fence, eventfd, pipe...).
///
/// The fd stays the caller's: it is neither dup'ed nor closed. Dropping the
/// future (or killing the process) removes the registration.
///
/// # Errors
/// - `Inval`: a bad or closed fd (`EBADF`), a non-pollable fd (`EPERM`,
///   e.g. a regular file), an `EPOLLERR` event, or no current loop.
/// - `Nosys`: under [`Sim`](super::Sim) (fd readiness is not sim-reachable).
pub fn wait_readable(fd: BorrowedFd<'_>) -> WaitReadable<'_> {
    WaitReadable {
        fd,
        reg: None,
        done: false,
    }
}

/// Future of [`wait_readable`].
#[must_use = "a readiness wait does nothing unless awaited"]
pub struct WaitReadable<'fd> {
    fd: BorrowedFd<'fd>,
    reg: Option<(Weak<LoopInner>, Rc<Waiter>)>,
    done: bool,
}

impl Future for WaitReadable<'_> {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if self.done {
            return Poll::Ready(Err(Error::Inval));
        }
        let res = self.poll_inner(cx);
        if res.is_ready() {
            self.done = true;
            self.leave();
        }
        res
    }
}

impl WaitReadable<'_> {
    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let Some(lp) = Loop::current() else {
            return Poll::Ready(Err(Error::Inval));
        };
        let Some(poller) = lp.inner().poller() else {
            return Poll::Ready(Err(Error::Nosys));
        };
        let fd = self.fd;
        if let Some((_, waiter)) = &self.reg {
            return match waiter.state.get() {
                Readiness::Ready => Poll::Ready(Ok(())),
                Readiness::Failed => Poll::Ready(Err(Error::Inval)),
                Readiness::Waiting => {
                    *waiter.waker.borrow_mut() = Some(cx.waker().clone());
                    match poller.rearm(fd) {
                        Ok(()) => Poll::Pending,
                        Err(e) => Poll::Ready(Err(e)),
                    }
                }
            };
        }
        let waiter = Rc::new(Waiter {
            state: Cell::new(Readiness::Waiting),
            waker: RefCell::new(Some(cx.waker().clone())),
        });
        if let Err(e) = poller.register(fd, waiter.clone()) {
            return Poll::Ready(Err(e));
        }
        self.reg = Some((lp.weak(), waiter));
        Poll::Pending
    }

    fn leave(&mut self) {
        if let Some((lp, waiter)) = self.reg.take()
            && let Some(lp) = lp.upgrade()
            && let Some(poller) = lp.poller()
        {
            poller.deregister(self.fd, &waiter);
        }
    }
}

impl Drop for WaitReadable<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}
