//! No fd leak: 100,000 FENCE iterations, each on a fresh eventfd that the
//! application signals in submit and lets go of in collect (the engine's
//! `Rc` clone, dropped after collect returns, is the last), leave the
//! process's open-fd count where it was (the engine keeps no fd). Alone in
//! its binary so no other test opens fds meanwhile.

use std::os::fd::OwnedFd;
use std::rc::Rc;

use rustix::event::{EventfdFlags, eventfd};
use xtc::batch::{
    AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Handle, Item, StepResult,
};
use xtc::rt::Loop;

const ITERATIONS: u32 = 100_000;

struct Eventfds {
    current: Option<Rc<OwnedFd>>,
    ok: u32,
    /// Open fds seen in collect halfway through (the current fence included).
    midway: std::rc::Rc<std::cell::Cell<usize>>,
}

impl AsyncStep<u32> for Eventfds {
    async fn submit(&mut self, _: &mut [Item<'_, u32>]) -> xtc::Result<Exec> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).unwrap();
        rustix::io::write(&fd, &1u64.to_ne_bytes()).unwrap(); // already signalled
        let fd = Rc::new(fd);
        self.current = Some(fd.clone());
        Ok(Exec::Fence(fd))
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, u32>],
        res: &mut [StepResult],
        status: ExecStatus,
    ) -> xtc::Result<()> {
        assert_eq!(status, ExecStatus::Ok);
        self.ok += 1;
        if self.ok == ITERATIONS / 2 {
            self.midway.set(open_fds());
        }
        // The application drops its clone; the engine drops its own once
        // this collect returned, which closes the fd.
        self.current = None;
        for (it, r) in items.iter_mut().zip(res.iter_mut()) {
            *it.request -= 1;
            *r = if *it.request == 0 {
                StepResult::Done
            } else {
                StepResult::Continue
            };
        }
        Ok(())
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn hundred_thousand_fence_iterations_keep_the_fd_count_flat() {
    let lp = Loop::new().unwrap();
    let done = std::rc::Rc::new(std::cell::Cell::new(0));
    let d2 = done.clone();
    let complete = move |_: Handle, left: u32, o: xtc::Result<()>| {
        assert_eq!((left, o), (0, Ok(())));
        d2.set(d2.get() + 1);
    };
    let o = AsyncOpts {
        capacity: 1,
        max_active: 1,
        resource_capacity: 1,
        exec_timeout: None,
        sched_class: None,
        mt_queue_cap: 0,
    };
    let before = open_fds();
    let midway = std::rc::Rc::new(std::cell::Cell::new(0));
    let app = Eventfds {
        current: None,
        ok: 0,
        midway: midway.clone(),
    };
    let g = Group::create_async(&lp, o, app, complete).unwrap();
    g.submit(10, 1).unwrap();
    let g2 = g.clone();
    lp.spawn(async move {
        while g2.stats().completed < 1 {
            xtc::rt::yield_now().await;
        }
        g2.submit(ITERATIONS, 1).unwrap();
        g2.close(CloseMode::Drain).unwrap();
    })
    .unwrap();
    lp.run().unwrap();
    assert_eq!(
        midway.get(),
        before + 1,
        "only the current fence is open midway"
    );
    assert_eq!(done.get(), 2);
    assert_eq!(g.stats().iterations, u64::from(ITERATIONS) + 10);
    g.destroy().unwrap();
    drop(g);
    let after = open_fds();
    assert_eq!(after, before, "open fds before {before}, after {after}");
}
