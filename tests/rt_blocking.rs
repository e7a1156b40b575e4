//! The blocking pool and mailboxes.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Barrier};
use xtc::Error;
use xtc::rt::{self, BlockingPool, Loop, mailbox};

#[test]
fn a_closure_runs_on_a_pool_thread_and_resolves_the_future() {
    let lp = Loop::new().unwrap();
    let caller = std::thread::current().id();
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    lp.spawn(async move {
        let fut = rt::blocking_run(move || std::thread::current().id() != caller).unwrap();
        *g.borrow_mut() = Some(fut.await);
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(*got.borrow(), Some(Ok(true)));
}

#[test]
fn a_full_queue_refuses_with_again_without_running_the_closure() {
    let pool = BlockingPool::new(1, 1).unwrap();
    let gate = Arc::new(Barrier::new(2));
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let g = gate.clone();
    let busy = pool
        .run(move || {
            started_tx.send(()).unwrap();
            g.wait();
        })
        .unwrap();
    started_rx.recv().unwrap(); // the only thread is now held by `busy`
    let queued = pool.run(|| 1).unwrap(); // fills the queue (capacity 1)
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = ran.clone();
    let refused = pool
        .run(move || r.store(true, std::sync::atomic::Ordering::SeqCst))
        .unwrap_err();
    assert_eq!(refused, Error::Again);
    gate.wait();
    let lp = Loop::new().unwrap();
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    lp.spawn(async move { *g.borrow_mut() = Some((busy.await.is_ok(), queued.await)) })
        .unwrap();
    lp.run().unwrap();
    assert_eq!(*got.borrow(), Some((true, Ok(1))));
    pool.shutdown();
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "refused closure never ran"
    );
}

#[test]
fn a_shut_down_pool_refuses_with_again() {
    let pool = BlockingPool::new(2, 8).unwrap();
    pool.shutdown();
    assert!(pool.is_shut_down());
    assert_eq!(pool.run(|| ()).unwrap_err(), Error::Again);
    assert_eq!(BlockingPool::new(0, 8).unwrap_err(), Error::Inval);
}

#[test]
fn a_panicking_closure_resolves_its_future_with_aborted() {
    let pool = BlockingPool::new(1, 4).unwrap();
    let fut = pool
        .run(|| -> u32 { panic!("closure failure (expected by the test)") })
        .unwrap();
    let after = pool.run(|| 5u32).unwrap();
    let lp = Loop::new().unwrap();
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    lp.spawn(async move { *g.borrow_mut() = Some((fut.await, after.await)) })
        .unwrap();
    lp.run().unwrap();
    assert_eq!(*got.borrow(), Some((Err(Error::Aborted), Ok(5))));
}

#[test]
fn a_send_from_another_thread_wakes_the_receiving_loop() {
    let lp = Loop::new().unwrap();
    let (tx, rx) = mailbox::<u32>();
    let got = Rc::new(RefCell::new(Vec::new()));
    let g = got.clone();
    lp.spawn(async move {
        loop {
            match rx.recv().await {
                Ok(v) => g.borrow_mut().push(Ok(v)),
                Err(e) => {
                    g.borrow_mut().push(Err(e));
                    break;
                }
            }
        }
    })
    .unwrap();
    let sender = std::thread::spawn(move || {
        let tx2 = tx.clone();
        for i in 0..50 {
            tx.send(i).unwrap();
        }
        tx2.send(50).unwrap();
    });
    lp.run().unwrap();
    sender.join().unwrap();
    let got = got.borrow();
    assert_eq!(got.len(), 52);
    assert!(
        got[..51]
            .iter()
            .enumerate()
            .all(|(i, v)| *v == Ok(i as u32))
    );
    assert_eq!(got[51], Err(Error::Aborted), "all senders gone");
}

#[test]
fn a_send_to_a_dropped_receiver_hands_the_message_back() {
    let (tx, rx) = mailbox::<String>();
    drop(rx);
    assert_eq!(tx.send("m".to_string()), Err("m".to_string()));
}

#[test]
fn try_recv_reports_empty_and_closed() {
    let (tx, rx) = mailbox::<u8>();
    assert_eq!(rx.try_recv(), Err(Error::Again));
    tx.send(1).unwrap();
    drop(tx);
    assert_eq!(rx.try_recv(), Ok(1));
    assert_eq!(rx.try_recv(), Err(Error::Aborted));
}

#[test]
fn a_pool_shut_down_from_its_own_closure_does_not_wait_on_itself() {
    let pool = Arc::new(BlockingPool::new(2, 4).unwrap());
    let p = pool.clone();
    let fut = pool.run(move || p.shutdown()).unwrap();
    let lp = Loop::new().unwrap();
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    lp.spawn(async move { *g.borrow_mut() = Some(fut.await) })
        .unwrap();
    lp.run().unwrap();
    assert_eq!(*got.borrow(), Some(Ok(())));
    assert!(pool.is_shut_down());
    assert_eq!(pool.run(|| ()).unwrap_err(), Error::Again);
}
