//! `SyncFile` and `EventFence` with real fds.
//!
//! This kernel has no sync_file source (no CONFIG_SW_SYNC, no DRM, no
//! /dev/dri), so the sync_file *ioctl* success paths (merge, info) are covered
//! only on a device machine (`tests/accel_device.rs` runs them when a render
//! node opens); here they are checked on their error path
//! (`ENOTTY` on an eventfd) and the poll-based wait on eventfds.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use rustix::event::{EventfdFlags, eventfd};
use xtc::accel::{EventFence, FenceError, FenceStatus, SyncFile};

fn efd(initial: u32) -> OwnedFd {
    eventfd(initial, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).unwrap()
}

fn counter(fd: impl AsFd) -> u64 {
    let mut buf = [0u8; 8];
    rustix::io::read(fd, &mut buf).unwrap();
    u64::from_ne_bytes(buf)
}

#[test]
fn pending_fence_with_timeout_zero_is_not_signalled() {
    let f = SyncFile::from_fd(efd(0));
    assert_eq!(f.wait(Some(Duration::ZERO)), Ok(false));
    assert_eq!(f.is_signalled(), Ok(false));
    assert_eq!(
        f.wait(Some(Duration::from_millis(1))),
        Ok(false),
        "short timeout expires"
    );
    let ready = SyncFile::from_fd(efd(1));
    assert_eq!(ready.wait(Some(Duration::ZERO)), Ok(true));
    assert_eq!(ready.wait(None), Ok(true));
}

#[test]
fn wait_wakes_when_signalled_from_another_thread() {
    let fd = efd(0);
    let writer = fd.try_clone().unwrap();
    let f = SyncFile::from_fd(fd);
    let t = thread::spawn(move || rustix::io::write(&writer, &1u64.to_ne_bytes()).unwrap());
    assert_eq!(f.wait(None), Ok(true));
    t.join().unwrap();
}

#[test]
fn minus_one_export_is_already_signalled() {
    // SAFETY: -1 owns nothing.
    let f = unsafe { SyncFile::from_raw(-1) }.unwrap();
    assert!(f.as_fd().is_none(), "-1 must never be kept as an fd");
    assert_eq!(f.wait(Some(Duration::ZERO)), Ok(true));
    assert_eq!(f.wait(None), Ok(true));
    let info = f.info().unwrap();
    assert_eq!(
        (info.status, info.fences.len()),
        (FenceStatus::Signalled, 0)
    );
    let m = f.merge(&SyncFile::signalled(), "both").unwrap();
    assert!(m.as_fd().is_none());
    // SAFETY: -5 is rejected before any ownership is taken.
    let bad = unsafe { SyncFile::from_raw(-5) };
    assert_eq!(bad.unwrap_err(), FenceError::InvalidRaw(-5));
    assert_eq!(
        xtc::Error::from(FenceError::InvalidRaw(-5)),
        xtc::Error::Inval
    );
}

#[test]
fn from_raw_takes_ownership() {
    let fd = efd(1);
    let raw = fd.as_raw_fd();
    std::mem::forget(fd);
    // SAFETY: `raw` is an open eventfd whose OwnedFd was forgotten: we hand it over.
    let f = unsafe { SyncFile::from_raw(raw) }.unwrap();
    assert_eq!(f.as_fd().map(|b| b.as_raw_fd()), Some(raw));
    assert_eq!(f.wait(Some(Duration::ZERO)), Ok(true));
}

#[test]
fn merge_and_info_on_a_non_sync_file_are_clear_errors() {
    println!(
        "note: no sync_file source on this kernel (no sw_sync, no DRM); the SYNC_IOC_MERGE / \
         SYNC_IOC_FILE_INFO success paths are covered only on a device machine"
    );
    let a = SyncFile::from_fd(efd(0));
    let b = SyncFile::from_fd(efd(0));
    assert_eq!(a.info().unwrap_err(), FenceError::NotSyncFile);
    assert_eq!(a.merge(&b, "ab").unwrap_err(), FenceError::NotSyncFile);
    assert_eq!(xtc::Error::from(FenceError::NotSyncFile), xtc::Error::Inval);
    assert!(FenceError::NotSyncFile.to_string().contains("ENOTTY"));
    assert_eq!(a.merge(&b, &"x".repeat(32)).unwrap_err(), FenceError::Name);
    assert_eq!(a.merge(&b, "a\0b").unwrap_err(), FenceError::Name);
    // Merging with an already-signalled fence is a duplicate of the other side.
    let d = a.merge(&SyncFile::signalled(), "dup").unwrap();
    assert_ne!(
        d.as_fd().unwrap().as_raw_fd(),
        a.as_fd().unwrap().as_raw_fd()
    );
    assert_eq!(d.wait(Some(Duration::ZERO)), Ok(false));
}

#[test]
fn poll_error_conditions_are_reported() {
    let (r, w) = rustix::pipe::pipe().unwrap();
    drop(w);
    // A pipe whose writer is gone polls POLLHUP without POLLIN.
    let f = SyncFile::from_fd(r);
    assert_eq!(f.wait(Some(Duration::ZERO)), Err(FenceError::PollError));
}

#[test]
fn event_fence_signals_exactly_once_across_threads() {
    let fence = Arc::new(EventFence::new().unwrap());
    let n = 8;
    let start = Arc::new(Barrier::new(n));
    let wins: usize = (0..n)
        .map(|_| {
            let (f, b) = (fence.clone(), start.clone());
            thread::spawn(move || {
                b.wait();
                f.signal().unwrap() as usize
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .sum();
    assert_eq!(wins, 1, "exactly one signal() call wins");
    assert!(fence.is_signalled());
    assert_eq!(
        counter(fence.as_fd()),
        1,
        "the eventfd was written exactly once"
    );
}

#[test]
fn event_fence_wait_never_misses_a_racing_signal() {
    for _ in 0..200 {
        let fence = Arc::new(EventFence::new().unwrap());
        let go = Arc::new(Barrier::new(2));
        let (f, g) = (fence.clone(), go.clone());
        let signaller = thread::spawn(move || {
            g.wait();
            f.signal().unwrap()
        });
        go.wait();
        // Races the signal: flag check, then poll. Must return, and true.
        assert_eq!(fence.wait(None), Ok(true));
        assert!(signaller.join().unwrap());
    }
}

#[test]
fn event_fence_survives_a_read_of_its_counter() {
    let fence = EventFence::new().unwrap();
    assert!(!fence.is_signalled());
    assert_eq!(fence.wait(Some(Duration::ZERO)), Ok(false));
    assert!(fence.signal().unwrap());
    assert!(!fence.signal().unwrap(), "second signal changes nothing");
    // Someone drains the eventfd (a read racing the fence's waiters)...
    assert_eq!(counter(fence.as_fd()), 1);
    // ...the signal is not lost.
    assert!(fence.is_signalled());
    assert_eq!(fence.wait(Some(Duration::ZERO)), Ok(true));
    assert_eq!(fence.wait(None), Ok(true));
}

#[test]
fn event_fence_fd_is_pollable_and_cloneable() {
    let fence = EventFence::new().unwrap();
    let dup = SyncFile::from_fd(fence.try_clone_fd().unwrap());
    assert_eq!(dup.wait(Some(Duration::ZERO)), Ok(false));
    fence.signal().unwrap();
    assert_eq!(
        dup.wait(Some(Duration::ZERO)),
        Ok(true),
        "a dup'd fd turns readable with the fence"
    );
    fn send_sync<T: Send + Sync>() {}
    send_sync::<EventFence>();
    fn send<T: Send>() {}
    send::<SyncFile>();
}

#[test]
fn fences_are_ready_in_a_loop_when_signalled_from_a_thread() {
    use std::cell::Cell;
    use std::rc::Rc;
    let lp = xtc::rt::Loop::new().unwrap();
    let fence = Arc::new(EventFence::new().unwrap());
    let sync = SyncFile::from_fd(fence.try_clone_fd().unwrap());
    let done = Rc::new(Cell::new(0));
    let (f, d) = (fence.clone(), done.clone());
    lp.spawn(async move {
        let signaller = thread::spawn(move || f.signal().unwrap());
        assert_eq!(sync.ready().await, Ok(()));
        assert!(signaller.join().unwrap());
        d.set(d.get() + 1);
    })
    .unwrap();
    let (f, d) = (fence.clone(), done.clone());
    lp.spawn(async move {
        assert_eq!(f.ready().await, Ok(()));
        assert_eq!(SyncFile::signalled().ready().await, Ok(()));
        d.set(d.get() + 1);
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(done.get(), 2, "both waiters woke");
}

#[test]
fn fence_readiness_is_nosys_under_sim() {
    use std::cell::Cell;
    use std::rc::Rc;
    let sim = xtc::rt::Sim::from_env(7);
    let lp = sim.new_loop();
    let fence = EventFence::new().unwrap();
    let got = Rc::new(Cell::new(None));
    let g = got.clone();
    lp.spawn(async move { g.set(Some(fence.ready().await)) })
        .unwrap();
    sim.run_until_idle().unwrap();
    assert_eq!(got.get(), Some(Err(xtc::Error::Nosys)));
}
