//! FENCE operations on real loops: eventfd signalled from another thread,
//! fds the readiness path refuses (`O_PATH`, a directory, a regular file),
//! who holds the fence when (`Exec::Fence(Rc<dyn AsFd>)`: the engine keeps
//! its clone until collect returned, never dups or closes the fd), the exec
//! timeout across spurious wakes, close(CANCEL) and a driver kill while
//! parked on a fence.

mod batch_support;

use std::cell::RefCell;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::time::Duration;

use batch_support::*;
use rustix::event::{EventfdFlags, eventfd};
use xtc::Error;
use xtc::batch::{AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Item, StepResult};
use xtc::rt::{self, Instant, Loop};

/// How `submit` builds the fence.
#[derive(Clone)]
enum Fence {
    /// A fresh eventfd signalled by the signaller thread.
    Signalled,
    /// A fresh eventfd nobody signals.
    Never,
    /// A fresh eventfd signalled by the signaller thread, of which the
    /// application keeps no clone: the engine's holds it open.
    Handed,
    /// This fd (one the readiness path refuses).
    Given(Rc<dyn AsFd>),
}

struct FenceApp {
    fence: Fence,
    to_thread: crossbeam_channel::Sender<OwnedFd>,
    /// The application's clone of the fence in flight.
    current: Option<Rc<OwnedFd>>,
    /// The previous iteration's fence, kept past its collect to see the
    /// engine let go of its clone.
    previous: Option<Rc<OwnedFd>>,
    /// Fences seen released by the engine after their collect returned.
    released: Rc<std::cell::Cell<u32>>,
    seen: Rc<RefCell<Vec<(ExecStatus, Instant, Instant)>>>,
    submitted_at: Instant,
}

impl AsyncStep<Req> for FenceApp {
    async fn submit(&mut self, _: &mut [Item<'_, Req>]) -> xtc::Result<Exec> {
        self.submitted_at = rt::now();
        if let Some(prev) = self.previous.take() {
            // B-067: the engine dropped its clone once collect returned; the
            // application's is the last, so dropping it closes the fd.
            assert_eq!(Rc::strong_count(&prev), 1, "engine let go after collect");
            self.released.set(self.released.get() + 1);
        }
        let fence: Rc<dyn AsFd> = match &self.fence {
            Fence::Given(fd) => fd.clone(),
            kind => {
                let fd =
                    Rc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).unwrap());
                if matches!(kind, Fence::Signalled | Fence::Handed) {
                    // The signaller gets its own descriptor of the eventfd.
                    self.to_thread.send(fd.try_clone().unwrap()).unwrap();
                }
                if !matches!(kind, Fence::Handed) {
                    self.current = Some(fd.clone());
                }
                fd
            }
        };
        Ok(Exec::Fence(fence))
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, Req>],
        res: &mut [StepResult],
        status: ExecStatus,
    ) -> xtc::Result<()> {
        if let Some(fd) = self.current.take() {
            // The engine neither closed nor dup'ed the fd: it is still ours,
            // and the engine still holds its clone while collect runs.
            assert!(
                rustix::io::fcntl_getfd(&*fd).is_ok(),
                "fence fd still open at collect"
            );
            assert_eq!(
                Rc::strong_count(&fd),
                2,
                "engine holds its clone in collect"
            );
            self.previous = Some(fd);
        }
        self.seen
            .borrow_mut()
            .push((status, self.submitted_at, rt::now()));
        countdown(items, res);
        Ok(())
    }
}

/// A thread that signals every eventfd it is handed (another thread, as a
/// device completion would), then closes its descriptor.
fn signaller() -> crossbeam_channel::Sender<OwnedFd> {
    let (tx, rx) = crossbeam_channel::unbounded::<OwnedFd>();
    std::thread::spawn(move || {
        for fd in rx {
            rustix::io::write(&fd, &1u64.to_ne_bytes()).unwrap();
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
    fence_group_counting(lp, fence, timeout, log, Rc::default())
}

fn fence_group_counting(
    lp: &Loop,
    fence: Fence,
    timeout: Option<Duration>,
    log: &Log,
    released: Rc<std::cell::Cell<u32>>,
) -> (Group<Req>, Seen) {
    let seen = Seen::default();
    let app = FenceApp {
        fence,
        to_thread: signaller(),
        current: None,
        previous: None,
        released,
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
    let released = Rc::new(std::cell::Cell::new(0));
    let (g, seen) = fence_group_counting(&lp, Fence::Signalled, None, &log, released.clone());
    for i in 1..=6 {
        g.submit(req(i, i), 1).unwrap();
    }
    g.close(CloseMode::Drain).unwrap();
    lp.run().unwrap();
    assert!(seen.borrow().iter().all(|s| s.0 == ExecStatus::Ok));
    assert_eq!(log.len(), 6);
    assert!(log.outcomes().iter().all(|o| o.1.is_ok()));
    let ops = seen.borrow().len() as u64;
    assert_eq!(g.async_stats().offloads, ops);
    // Every fence but the last was seen released by the engine at the next
    // submit, after its collect had returned (B-067).
    assert_eq!(u64::from(released.get()), ops - 1);
    g.destroy().unwrap();
}

/// B-066 / B-067: the application may let go of its fence at once; the
/// engine's clone keeps the fd open until the wait (and collect) is over,
/// so the wait ends on that fence, never on a closed or reused fd.
#[test]
fn a_fence_the_application_let_go_of_stays_open_for_the_wait() {
    let lp = Loop::new().unwrap();
    let log = Log::default();
    let (g, seen) = fence_group(&lp, Fence::Handed, None, &log);
    for i in 1..=4 {
        g.submit(req(i, i), 1).unwrap();
    }
    g.close(CloseMode::Drain).unwrap();
    lp.run().unwrap();
    assert!(!seen.borrow().is_empty());
    assert!(seen.borrow().iter().all(|s| s.0 == ExecStatus::Ok));
    assert!(log.outcomes().iter().all(|o| o.1.is_ok()));
    assert_eq!(log.len(), 4);
    g.destroy().unwrap();
}

/// An fd of `path` opened with `flags` (read-only).
fn open(path: &std::path::Path, flags: rustix::fs::OFlags) -> Rc<dyn AsFd> {
    let fd = rustix::fs::open(
        path,
        flags | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    );
    Rc::new(fd.unwrap())
}

/// B-069 / B-085 / B-086: fds the loop's readiness registration refuses are
/// a negative status (`Inval`), never success: an `O_PATH` descriptor
/// (`EBADF`: not usable for I/O, as a closed fd is not) and a directory
/// (`EPERM`: not pollable). With the fence's ownership in the type, a
/// closed or negative fd can no longer be handed over (I/O safety).
#[test]
fn fds_the_readiness_path_refuses_are_inval_never_success() {
    let dir = tempfile::tempdir().unwrap();
    let o_path = open(dir.path(), rustix::fs::OFlags::PATH);
    let directory = open(
        dir.path(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
    );
    for (what, fd) in [("O_PATH", o_path), ("directory", directory)] {
        let lp = Loop::new().unwrap();
        let log = Log::default();
        let (g, seen) = fence_group(&lp, Fence::Given(fd.clone()), None, &log);
        g.submit(req(1, 2), 1).unwrap();
        g.close(CloseMode::Drain).unwrap();
        lp.run().unwrap();
        assert_eq!(
            seen.borrow()[0].0,
            ExecStatus::Failed(Error::Inval),
            "{what}"
        );
        assert_eq!(log.outcomes(), vec![(1, Err(Error::Inval))]);
        assert_eq!(g.async_stats().offload_errors, 1);
        g.destroy().unwrap();
        drop(g);
        assert_eq!(Rc::strong_count(&fd), 1, "{what}: the engine kept no clone");
        assert!(rustix::io::fcntl_getfd(&*fd).is_ok(), "{what}: still open");
    }
}

#[test]
fn non_pollable_fd_is_inval() {
    let file: Rc<dyn AsFd> = Rc::new(tempfile::tempfile().unwrap());
    let lp = Loop::new().unwrap();
    let log = Log::default();
    let (g, seen) = fence_group(&lp, Fence::Given(file.clone()), None, &log);
    g.submit(req(1, 2), 1).unwrap();
    g.close(CloseMode::Drain).unwrap();
    lp.run().unwrap();
    assert_eq!(seen.borrow()[0].0, ExecStatus::Failed(Error::Inval));
    assert_eq!(log.outcomes(), vec![(1, Err(Error::Inval))]);
    g.destroy().unwrap();
    drop(g);
    assert_eq!(Rc::strong_count(&file), 1, "the engine kept no clone");
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
