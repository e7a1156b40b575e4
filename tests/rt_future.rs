//! `rt::future_pair`: cross-thread wakes of a parked loop, dropped promises,
//! promises set after their future is gone.

use std::cell::RefCell;
use std::rc::Rc;
use xtc::Error;
use xtc::rt::{Loop, future_pair};

/// Whether thread `tid` of this process is blocked in `epoll_wait`
/// (`wchan`; kernels that hide it report "0": then "sleeping" is the signal,
/// since the loop thread blocks nowhere else).
fn blocked_in_epoll(tid: i32) -> bool {
    let wchan = std::fs::read_to_string(format!("/proc/self/task/{tid}/wchan")).unwrap_or_default();
    if wchan.contains("epoll") {
        return true;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
        return true; // no procfs: nothing to observe, set at once
    };
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|s| s.trim().chars().next());
    (wchan.is_empty() || wchan == "0") && state == Some('S')
}

#[test]
fn a_promise_set_on_another_thread_wakes_a_loop_parked_in_epoll() {
    let lp = Loop::new().unwrap();
    let (fut, promise) = future_pair::<u64>();
    let tid = rustix::thread::gettid().as_raw_nonzero().get();
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    lp.spawn(async move { *g.borrow_mut() = Some(fut.await) })
        .unwrap();
    // The loop has one process, no timer and no fd: once it blocks in
    // epoll_wait only the eventfd written by the promise can wake it.
    let setter = std::thread::spawn(move || {
        while !blocked_in_epoll(tid) {
            std::thread::yield_now();
        }
        promise.set(Ok(42));
    });
    lp.run().unwrap();
    setter.join().unwrap();
    assert_eq!(*got.borrow(), Some(Ok(42)));
}

#[test]
fn many_cross_thread_sets_each_wake_their_process() {
    let lp = Loop::new().unwrap();
    let sum = Rc::new(RefCell::new(0u64));
    let mut promises = Vec::new();
    for _ in 0..100 {
        let (fut, p) = future_pair::<u64>();
        promises.push(p);
        let sum = sum.clone();
        lp.spawn(async move { *sum.borrow_mut() += fut.await.unwrap() })
            .unwrap();
    }
    let setter = std::thread::spawn(move || {
        for (i, p) in promises.into_iter().enumerate() {
            p.set(Ok(i as u64));
        }
    });
    lp.run().unwrap();
    setter.join().unwrap();
    assert_eq!(*sum.borrow(), (0..100).sum::<u64>());
}

#[test]
fn a_dropped_promise_resolves_the_future_with_aborted() {
    let lp = Loop::new().unwrap();
    let (fut, promise) = future_pair::<u32>();
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    lp.spawn(async move { *g.borrow_mut() = Some(fut.await) })
        .unwrap();
    std::thread::spawn(move || drop(promise)).join().unwrap();
    lp.run().unwrap();
    assert_eq!(*got.borrow(), Some(Err(Error::Aborted)));
}

#[test]
fn an_error_set_on_the_promise_reaches_the_future() {
    let (fut, promise) = future_pair::<u32>();
    promise.set(Err(Error::Nosys));
    assert_eq!(futures_lite::future::block_on(fut), Err(Error::Nosys));
}

#[test]
fn setting_a_promise_whose_future_was_dropped_is_harmless() {
    let lp = Loop::new().unwrap();
    let (fut, promise) = future_pair::<Rc<()>>();
    let pid = lp
        .spawn(async move {
            let _ = fut.await;
        })
        .unwrap();
    lp.kill(pid).unwrap();
    lp.run().unwrap();
    assert!(promise.is_abandoned());
    let value = Rc::new(());
    let weak = Rc::downgrade(&value);
    promise.set(Ok(value));
    assert!(weak.upgrade().is_none(), "the value was dropped, not kept");
}

#[test]
fn a_future_polled_again_after_it_resolved_is_inval() {
    let lp = Loop::new().unwrap();
    let (fut, promise) = future_pair::<u8>();
    promise.set(Ok(1));
    let got = Rc::new(RefCell::new(Vec::new()));
    let g = got.clone();
    lp.spawn(async move {
        let mut fut = std::pin::pin!(fut);
        let first = fut.as_mut().await;
        let second = fut.as_mut().await;
        g.borrow_mut().extend([first, second]);
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(*got.borrow(), vec![Ok(1), Err(Error::Inval)]);
}

#[test]
fn promise_set_from_another_loop_on_the_same_thread() {
    let a = Loop::new().unwrap();
    let b = Loop::new().unwrap();
    let (fut, promise) = future_pair::<&'static str>();
    b.spawn(async move { promise.set(Ok("from b")) }).unwrap();
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    a.spawn(async move { *g.borrow_mut() = Some(fut.await) })
        .unwrap();
    b.run().unwrap();
    a.run().unwrap();
    assert_eq!(*got.borrow(), Some(Ok("from b")));
}
