//! Cross-loop results, the reply-future pattern (xtc_batch(3) B-124..B-127).
//!
//! Loop 0 owns a batch group; loop 1 submits to it through a
//! [`Remote`](xtc::batch::Remote) and awaits each result on its OWN loop: the
//! request carries the promise half of an `rt::future_pair`, the group's
//! `complete` callback (which runs on loop 0, the driver's loop) sets it, and
//! the submitter awaits the future. The engine adds no result channel of its
//! own.
//!
//! `cargo run --example cross_loop`

use std::time::Duration;

use xtc::batch::{
    AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Handle, Item, StepResult,
};
use xtc::rt::{self, Executor, Promise};

/// A request: the consumer's per-sequence state plus where the answer goes.
struct Ask {
    x: u64,
    /// Iterations still to run (a stand-in for decode steps).
    left: u32,
    /// Resolved by `complete` on the driver loop; awaited on the submitter's.
    reply: Promise<u64>,
}

/// One INLINE operation per iteration; each member counts down to DONE.
struct Square;

impl AsyncStep<Ask> for Square {
    async fn submit(&mut self, _items: &mut [Item<'_, Ask>]) -> xtc::Result<Exec> {
        Ok(Exec::Inline)
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, Ask>],
        results: &mut [StepResult],
        _status: ExecStatus,
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

/// The driver loop's completion: resolve the request's promise.
fn complete(_h: Handle, ask: Ask, outcome: xtc::Result<()>) {
    ask.reply.set(outcome.map(|()| ask.x * ask.x));
}

/// Submits with the back-off the rustdoc recommends: sleep from 20 µs,
/// doubling up to 1 ms, while the ring is full.
async fn submit(remote: &xtc::batch::Remote<Ask>, mut ask: Ask) -> xtc::Result<Handle> {
    let mut pause = Duration::from_micros(20);
    loop {
        match remote.submit(ask, 1) {
            Ok(h) => return Ok(h),
            Err(e) if e.error == xtc::Error::Again => {
                ask = e.into_inner();
                rt::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(1));
            }
            Err(e) => return Err(e.error),
        }
    }
}

pub fn main() -> xtc::Result<()> {
    let exec = Executor::new(2)?;
    let (to_submitter, from_owner) = crossbeam_channel::bounded(1);
    exec.setup(0, move |lp| {
        let opts = AsyncOpts {
            capacity: 8,
            max_active: 8,
            resource_capacity: 8,
            mt_queue_cap: 16,
            ..AsyncOpts::default()
        };
        let group = Group::create_async(lp, opts, Square, complete).expect("create");
        let (done_tx, done_rx) = rt::mailbox::<()>();
        to_submitter
            .send((group.remote().expect("mt enabled"), done_tx))
            .unwrap();
        // The owner process closes the group once the submitter is done.
        lp.spawn(async move {
            let _ = done_rx.recv().await;
            group.close(CloseMode::Drain).expect("close");
        })
        .expect("spawn");
    })?;
    exec.setup(1, move |lp| {
        let (remote, done_tx) = from_owner.recv().unwrap();
        lp.spawn(async move {
            let mut answers = Vec::new();
            for x in 1..=20u64 {
                let (answer, reply) = rt::future_pair();
                let ask = Ask {
                    x,
                    left: 1 + (x % 4) as u32,
                    reply,
                };
                let h = submit(&remote, ask).await.expect("submit_mt");
                let value = answer.await.expect("completed");
                println!("handle {h}: {x}^2 = {value} (awaited on loop 1)");
                answers.push(value);
            }
            assert_eq!(answers, (1..=20u64).map(|x| x * x).collect::<Vec<_>>());
            let _ = done_tx.send(());
        })
        .expect("spawn");
    })?;
    exec.run()
}
