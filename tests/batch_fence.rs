//! FENCE operations on real loops: eventfd signalled from another thread,
//! bad / closed (not open) / non-pollable fds, the exec timeout across spurious wakes,
//! close(CANCEL) and a driver kill while parked on a fence.

mod batch_support;

use std::cell::RefCell;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use batch_support::*;
use rustix::event::{EventfdFlags, eventfd};
use xtc::Error;
use xtc::batch::{AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Item, StepResult};
use xtc::rt::{self, Instant, Loop};

/// How `submit` builds the fence.
#[derive(Clone, Copy, PartialEq)]
enum Fence {
    /// A fresh eventfd signalled by the signaller thread.
    Signalled,
    /// A fresh eventfd nobody signals.
    Never,
    /// This raw fd (bad, closed or non-pollable).
    Raw(RawFd),
}

struct FenceApp {
    fence: Fence,
    to_thread: crossbeam_channel::Sender<Arc<OwnedFd>>,
    current: Option<Arc<OwnedFd>>,
    seen: Rc<RefCell<Vec<(ExecStatus, Instant, Instant)>>>,
    submitted_at: Instant,
}

impl AsyncStep<Req> for FenceApp {
    async fn submit(&mut self, _: &mut [Item<'_, Req>]) -> xtc::Result<Exec> {
        self.submitted_at = rt::now();
        let raw = match self.fence {
            Fence::Raw(fd) => fd,
            kind => {
                let fd =
                    Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).unwrap());
                if kind == Fence::Signalled {
                    self.to_thread.send(fd.clone()).unwrap();
                }
                let raw = fd.as_raw_fd();
                self.current = Some(fd);
                raw
            }
        };
        Ok(Exec::Fence(raw))
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, Req>],
        res: &mut [StepResult],
        status: ExecStatus,
    ) -> xtc::Result<()> {
        if let Some(fd) = self.current.take() {
            // The engine neither closed nor dup'ed the fd: it is still ours.
            assert!(
                rustix::io::fcntl_getfd(&*fd).is_ok(),
                "fence fd still open at collect"
            );
            drop(fd); // the application closes its fence
        }
        self.seen
            .borrow_mut()
            .push((status, self.submitted_at, rt::now()));
        countdown(items, res);
        Ok(())
    }
}

/// A thread that signals every eventfd it is handed (another thread, as a
/// device completion would).
fn signaller() -> crossbeam_channel::Sender<Arc<OwnedFd>> {
    let (tx, rx) = crossbeam_channel::unbounded::<Arc<OwnedFd>>();
    std::thread::spawn(move || {
        for fd in rx {
            rustix::io::write(&*fd, &1u64.to_ne_bytes()).unwrap();
        }
    });
    tx
}

type Seen = Rc<RefCell<Vec<(ExecStatus, Instant, Instant)>>>;

fn fence_group(
    lp: &Loop,
    fence: Fence,
    timeout: Option<Duration>,
    log: &Log,
) -> (Group<Req>, Seen) {
    let seen = Seen::default();
    let app = FenceApp {
        fence,
        to_thread: signaller(),
        current: None,
        seen: seen.clone(),
        submitted_at: Instant(0),
    };
    let o = AsyncOpts {
        capacity: 8,
        max_active: 4,
        resource_capacity: 8,
        exec_timeout: timeout,
        sched_class: None,
        mt_queue_cap: 0,
    };
    (
        Group::create_async(lp, o, app, log.complete()).unwrap(),
        seen,
    )
}

#[test]
fn eventfd_signalled_from_another_thread_wakes_the_driver() {
    let lp = Loop::new().unwrap();
    let log = Log::default();
    let (g, seen) = fence_group(&lp, Fence::Signalled, None, &log);
    for i in 1..=6 {
        g.submit(req(i, i), 1).unwrap();
    }
    g.close(CloseMode::Drain).unwrap();
    lp.run().unwrap();
    assert!(seen.borrow().iter().all(|s| s.0 == ExecStatus::Ok));
    assert_eq!(log.len(), 6);
    assert!(log.outcomes().iter().all(|o| o.1.is_ok()));
    assert_eq!(g.async_stats().offloads, seen.borrow().len() as u64);
    g.destroy().unwrap();
}

#[test]
fn bad_closed_and_negative_fds_are_inval_never_success() {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let beyond = limit
        .current
        .map_or(1 << 20, |c| c.min(i32::MAX as u64 - 1)) as RawFd;
    for fd in [-1, beyond] {
        let lp = Loop::new().unwrap();
        let log = Log::default();
        let (g, seen) = fence_group(&lp, Fence::Raw(fd), None, &log);
        g.submit(req(1, 2), 1).unwrap();
        g.close(CloseMode::Drain).unwrap();
        lp.run().unwrap();
        assert_eq!(
            seen.borrow()[0].0,
            ExecStatus::Failed(Error::Inval),
            "fd {fd}"
        );
        assert_eq!(log.outcomes(), vec![(1, Err(Error::Inval))]);
        assert_eq!(g.async_stats().offload_errors, 1);
    }
}

#[test]
fn non_pollable_fd_is_inval() {
    let file = tempfile::tempfile().unwrap();
    let lp = Loop::new().unwrap();
    let log = Log::default();
    let (g, seen) = fence_group(&lp, Fence::Raw(file.as_raw_fd()), None, &log);
    g.submit(req(1, 2), 1).unwrap();
    g.close(CloseMode::Drain).unwrap();
    lp.run().unwrap();
    assert_eq!(seen.borrow()[0].0, ExecStatus::Failed(Error::Inval));
    assert_eq!(log.outcomes(), vec![(1, Err(Error::Inval))]);
    drop(file);
}

#[test]
fn timeout_ends_the_wait_at_the_deadline_across_spurious_wakes() {
    let lp = Loop::new().unwrap();
    let log = Log::default();
    let timeout = Duration::from_millis(30);
    let (g, seen) = fence_group(&lp, Fence::Never, Some(timeout), &log);
    let h = g.submit(req(1, 3), 1).unwrap();
    // A peer wakes the driver again and again during the wait (submits and
    // resumes signal it); none of that ends the wait.
    let (peer, s2) = (g.clone(), seen.clone());
    lp.spawn(async move {
        let mut wakes = 0;
        while s2.borrow().is_empty() {
            rt::sleep(Duration::from_millis(2)).await;
            if s2.borrow().is_empty() {
                let _ = peer.resume(h);
                wakes += 1;
            }
        }
        assert!(wakes >= 2, "the driver was woken during the wait ({wakes})");
        peer.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    lp.run().unwrap();
    let (status, start, end) = seen.borrow()[0];
    assert_eq!(status, ExecStatus::Timeout);
    assert!(
        end >= start + timeout,
        "the wait ended at the deadline, not before"
    );
    assert_eq!(log.outcomes(), vec![(1, Err(Error::Again))]);
    assert_eq!(g.async_stats().offload_timeouts, 1);
}

#[test]
fn close_cancel_ends_a_fence_wait_with_aborted() {
    let lp = Loop::new().unwrap();
    let log = Log::default();
    let (g, seen) = fence_group(&lp, Fence::Never, None, &log);
    g.submit(req(1, 3), 1).unwrap();
    g.submit(req(2, 3), 1).unwrap();
    let closer = g.clone();
    lp.spawn(async move {
        while closer.async_stats().offloads == 0 {
            rt::yield_now().await;
        }
        rt::sleep(Duration::from_millis(1)).await;
        closer.close(CloseMode::Cancel).unwrap();
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(seen.borrow().len(), 1);
    assert_eq!(seen.borrow()[0].0, ExecStatus::Aborted);
    assert_eq!(
        log.outcomes(),
        vec![(1, Err(Error::Aborted)), (2, Err(Error::Aborted))]
    );
}

#[test]
fn a_kill_ends_a_fence_wait_and_collect_runs_once_with_aborted() {
    let lp = Loop::new().unwrap();
    let log = Log::default();
    let (g, seen) = fence_group(&lp, Fence::Never, None, &log);
    g.submit(req(1, 3), 1).unwrap();
    let killer = g.clone();
    lp.spawn(async move {
        while killer.async_stats().offloads == 0 {
            rt::yield_now().await;
        }
        killer.owner_loop().kill(killer.driver_pid()).unwrap();
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(seen.borrow().len(), 1, "collect exactly once");
    assert_eq!(seen.borrow()[0].0, ExecStatus::Aborted);
    assert_eq!(log.outcomes(), vec![(1, Err(Error::Aborted))]);
    g.destroy().unwrap();
}
