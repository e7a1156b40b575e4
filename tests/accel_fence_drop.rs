//! Fences close their fd exactly once on drop. One test in its own binary, so
//! no other test thread can reuse the fd number between the drop and the check.

use std::os::fd::AsRawFd;
use std::path::PathBuf;

use xtc::accel::{EventFence, SyncFile};

fn fd_link(raw: i32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{raw}")).ok()
}

#[test]
fn dropping_a_fence_closes_its_fd() {
    let fence = EventFence::new().unwrap();
    let raw = rustix::fd::AsFd::as_fd(&fence).as_raw_fd();
    assert_eq!(
        fd_link(raw).unwrap().to_string_lossy(),
        "anon_inode:[eventfd]"
    );
    drop(fence);
    assert_eq!(fd_link(raw), None, "EventFence left fd {raw} open");

    let sync = SyncFile::from_fd(EventFence::new().unwrap().try_clone_fd().unwrap());
    let raw = sync.as_fd().unwrap().as_raw_fd();
    assert!(fd_link(raw).is_some());
    drop(sync);
    assert_eq!(fd_link(raw), None, "SyncFile left fd {raw} open");

    // The already-signalled fence owns nothing: dropping it closes nothing.
    let keep = EventFence::new().unwrap();
    let keep_raw = rustix::fd::AsFd::as_fd(&keep).as_raw_fd();
    drop(SyncFile::signalled());
    assert!(fd_link(keep_raw).is_some());
}
