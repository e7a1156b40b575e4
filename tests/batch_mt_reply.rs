//! Cross-loop results, the reply-future pattern (B-124..B-127): submitters on
//! two other loops pass a promise in the request; `complete` runs on the
//! DRIVER loop and sets it; each submitter awaits its future on its own loop.

use std::sync::{Arc, Mutex};

use xtc::batch::{
    AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Handle, Item, Remote, StepResult,
};
use xtc::rt::{self, Executor, Loop, LoopId, Promise};

struct Ask {
    x: u64,
    left: u32,
    reply: Promise<(u64, LoopId)>,
}

struct Countdown;

impl AsyncStep<Ask> for Countdown {
    async fn submit(&mut self, _: &mut [Item<'_, Ask>]) -> xtc::Result<Exec> {
        Ok(Exec::Inline)
    }
    async fn collect(
        &mut self,
        items: &mut [Item<'_, Ask>],
        results: &mut [StepResult],
        _: ExecStatus,
    ) -> xtc::Result<()> {
        for (it, r) in items.iter_mut().zip(results.iter_mut()) {
            it.request.left -= 1;
            *r = if it.request.left == 0 {
                StepResult::Done
            } else {
                StepResult::Continue
            };
        }
        Ok(())
    }
}

/// What each submitter saw: (x, answer, loop that completed, loop that awaited).
type Seen = Arc<Mutex<Vec<(u64, u64, LoopId, LoopId)>>>;

async fn ask(remote: &Remote<Ask>, x: u64, seen: &Seen) {
    let (answer, reply) = rt::future_pair();
    let mut req = Ask {
        x,
        left: 1 + (x % 3) as u32,
        reply,
    };
    loop {
        match remote.submit(req, 1) {
            Ok(_) => break,
            Err(e) => {
                assert_eq!(e.error, xtc::Error::Again);
                req = e.into_inner();
                rt::yield_now().await;
            }
        }
    }
    let (value, completed_on) = answer.await.expect("complete sets the promise");
    let awaited_on = Loop::current().expect("a process").id();
    seen.lock()
        .unwrap()
        .push((x, value, completed_on, awaited_on));
}

#[test]
fn reply_futures_resolve_on_the_submitters_loops() {
    let exec = Executor::new(3).unwrap();
    let seen: Seen = Arc::default();
    let (tx, rx) = crossbeam_channel::unbounded();
    let owner_id = Arc::new(Mutex::new(None));
    let oid = owner_id.clone();
    exec.setup(0, move |lp| {
        *oid.lock().unwrap() = Some(lp.id());
        let opts = AsyncOpts {
            capacity: 4,
            max_active: 4,
            resource_capacity: 4,
            mt_queue_cap: 4,
            ..AsyncOpts::default()
        };
        let complete = |_h: Handle, a: Ask, out: xtc::Result<()>| {
            let here = Loop::current().expect("driver").id();
            a.reply.set(out.map(|()| (a.x * a.x, here)));
        };
        let g = Group::create_async(lp, opts, Countdown, complete).unwrap();
        let (done_tx, done_rx) = rt::mailbox::<()>();
        for _ in 0..2 {
            tx.send((g.remote().unwrap(), done_tx.clone())).unwrap();
        }
        drop(done_tx);
        lp.spawn(async move {
            for _ in 0..2 {
                done_rx.recv().await.unwrap();
            }
            g.close(CloseMode::Drain).unwrap();
        })
        .unwrap();
    })
    .unwrap();
    for idx in 1..3u64 {
        let (rx, seen) = (rx.clone(), seen.clone());
        exec.setup(idx as usize, move |lp| {
            let (remote, done) = rx.recv().unwrap();
            let remote: Remote<Ask> = remote;
            let left = Arc::new(Mutex::new(10));
            for k in 0..10 {
                let (r, s, d, l) = (remote.clone(), seen.clone(), done.clone(), left.clone());
                lp.spawn(async move {
                    ask(&r, idx * 100 + k, &s).await;
                    let mut l = l.lock().unwrap();
                    *l -= 1;
                    if *l == 0 {
                        d.send(()).unwrap();
                    }
                })
                .unwrap();
            }
        })
        .unwrap();
    }
    exec.run().unwrap();
    let owner = owner_id.lock().unwrap().unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 20);
    for &(x, value, completed_on, awaited_on) in seen.iter() {
        assert_eq!(value, x * x);
        assert_eq!(
            completed_on, owner,
            "complete runs on the driver loop (B-125)"
        );
        assert_ne!(
            awaited_on, owner,
            "the submitter awaits on its own loop (B-126)"
        );
    }
}
