//! `rt::wait_readable` on epoll: readiness, several waiters, kill while parked,
//! bad and non-pollable fds. The runtime never dups or closes the caller's fd.

use std::cell::{Cell, RefCell};
use std::os::fd::{AsFd, BorrowedFd};
use std::rc::Rc;
use xtc::Error;
use xtc::rt::{self, Loop};

#[test]
fn a_write_from_another_thread_wakes_the_waiter() {
    let lp = Loop::new().unwrap();
    let (r, w) = rustix::pipe::pipe().unwrap();
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    lp.spawn(async move {
        let res = rt::wait_readable(r.as_fd()).await;
        let mut buf = [0u8; 1];
        let n = rustix::io::read(&r, &mut buf).unwrap();
        *g.borrow_mut() = Some((res, n, buf[0]));
    })
    .unwrap();
    let writer = std::thread::spawn(move || {
        rustix::io::write(&w, b"x").unwrap();
        w // keep the write end open until joined
    });
    lp.run().unwrap();
    let _w = writer.join().unwrap();
    assert_eq!(*got.borrow(), Some((Ok(()), 1, b'x')));
    assert_eq!(lp.n_fds(), 0);
}

#[test]
fn every_waiter_on_one_fd_is_woken() {
    let lp = Loop::new().unwrap();
    let (r, w) = rustix::pipe::pipe().unwrap();
    let r = Rc::new(r);
    let woken = Rc::new(Cell::new(0));
    for _ in 0..3 {
        let (r, woken) = (r.clone(), woken.clone());
        lp.spawn(async move {
            rt::wait_readable(r.as_fd()).await.unwrap();
            woken.set(woken.get() + 1);
        })
        .unwrap();
    }
    lp.spawn(async move {
        rt::yield_now().await; // all three are registered now
        rustix::io::write(&w, b"go").unwrap();
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(woken.get(), 3);
    assert_eq!(lp.n_fds(), 0);
}

#[test]
fn a_process_killed_while_parked_on_an_fd_is_dropped_and_deregistered() {
    let lp = Loop::new().unwrap();
    let (r, w) = rustix::pipe::pipe().unwrap();
    let r = Rc::new(r);
    let hook_runs = Rc::new(Cell::new(0));
    struct Hook(Rc<Cell<u32>>);
    impl Drop for Hook {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }
    let (h, r2) = (Hook(hook_runs.clone()), r.clone());
    let victim = lp
        .spawn(async move {
            let _h = h;
            let _ = rt::wait_readable(r2.as_fd()).await;
            unreachable!("killed before the fd became readable");
        })
        .unwrap();
    let (l2, regs) = (lp.clone(), Rc::new(Cell::new(0)));
    let regs2 = regs.clone();
    lp.spawn(async move {
        rt::yield_now().await;
        regs2.set(l2.n_fds());
        l2.kill(victim).unwrap();
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(regs.get(), 1, "the victim was parked on the fd");
    assert_eq!(hook_runs.get(), 1);
    assert_eq!(lp.n_fds(), 0);
    // The fd is still the caller's and still works: not closed, not replaced.
    rustix::io::fcntl_getfd(&*r).unwrap();
    rustix::io::write(&w, b"z").unwrap();
    let r3 = r.clone();
    lp.spawn(async move { rt::wait_readable(r3.as_fd()).await.unwrap() })
        .unwrap();
    lp.run().unwrap();
}

#[test]
fn a_bad_fd_is_inval() {
    let lp = Loop::new().unwrap();
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    lp.spawn(async move {
        // SAFETY: fd 999_999 is above this process's fd limit, so it is never
        // open; the kernel answers EBADF without touching anything.
        let bad = unsafe { BorrowedFd::borrow_raw(999_999) };
        *g.borrow_mut() = Some(rt::wait_readable(bad).await);
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(*got.borrow(), Some(Err(Error::Inval)));
    assert_eq!(lp.n_fds(), 0);
}

#[test]
fn a_non_pollable_fd_is_inval() {
    let lp = Loop::new().unwrap();
    let file = tempfile::tempfile().unwrap();
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    lp.spawn(async move {
        *g.borrow_mut() = Some(rt::wait_readable(file.as_fd()).await);
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(
        *got.borrow(),
        Some(Err(Error::Inval)),
        "regular file: EPERM"
    );
}

#[test]
fn an_epollerr_event_is_inval() {
    // A pipe's write end whose read end is closed reports EPOLLERR.
    let lp = Loop::new().unwrap();
    let (r, w) = rustix::pipe::pipe().unwrap();
    drop(r);
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    lp.spawn(async move {
        *g.borrow_mut() = Some(rt::wait_readable(w.as_fd()).await);
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(*got.borrow(), Some(Err(Error::Inval)));
}

#[test]
fn wait_readable_outside_a_loop_is_inval() {
    let (r, _w) = rustix::pipe::pipe().unwrap();
    let res = futures_lite::future::block_on(rt::wait_readable(r.as_fd()));
    assert_eq!(res, Err(Error::Inval));
}
