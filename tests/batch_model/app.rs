//! The group under test: the scripted step (sync [`Step`] and async
//! [`AsyncStep`] of [`App`]) that picks random results, yields and probes
//! mutators, and the completion sink that checks every delivery against the
//! model.

#[allow(unused_imports)]
use super::*;

pub(crate) struct App {
    pub(crate) m: M,
    pub(crate) rng: Rng,
    pub(crate) group: Rc<RefCell<Option<Group<Req>>>>,
    pub(crate) blocking: bool,
    pub(crate) timeout: bool,
    /// Cross-loop flavour: FUTURE operations resolved by timer processes.
    pub(crate) mt: bool,
    /// A real eventfd handed as the FENCE (the simulator cannot wait on it).
    pub(crate) fence: Rc<dyn AsFd>,
}

impl App {
    /// A FUTURE operation resolved at a random virtual time by a timer
    /// process (cross-loop flavour): Ok, failed, dropped, or (with an exec
    /// timeout) never.
    pub(crate) fn timed_future(&mut self) -> Exec {
        let (f, p) = rt::future_pair();
        let slot = Rc::new(RefCell::new(Some(p)));
        self.m.borrow_mut().op_promise = Some(slot.clone());
        let delay = Duration::from_micros(self.rng.u64(0..30));
        let fate = self.rng.u32(0..100);
        let (m, timeout) = (self.m.clone(), self.timeout);
        let lp = Loop::current().expect("submit runs on the owner loop");
        lp.spawn(async move {
            rt::sleep(delay).await;
            let Some(p) = slot.borrow_mut().take() else {
                return; // the test thread resolved it early
            };
            match fate {
                0..80 => p.set(Ok(())),
                80..88 => p.set(Err(Error::Nomem)),
                88..94 => drop(p),
                _ if timeout => m.borrow_mut().consumed_check.push(p), // never
                _ => p.set(Ok(())),
            }
        })
        .expect("timer process");
        Exec::Future(f)
    }

    /// Yields 0..=2 times and probes a mutator, which must be `Deadlk`.
    pub(crate) async fn dawdle(&mut self) {
        if let Some(g) = self.group.borrow().clone()
            && self.rng.u32(0..4) == 0
        {
            let e = g.close(CloseMode::Drain);
            if e != Err(Error::Deadlk) {
                self.m
                    .borrow_mut()
                    .fail(format!("mutator in a callback gave {e:?}"));
            }
        }
        for _ in 0..self.rng.u32(0..3) {
            rt::yield_now().await;
        }
    }
}

/// An eventfd for FENCE operations (B-070: `Nosys` under Sim).
pub(crate) fn fence() -> Rc<dyn AsFd> {
    let flags = rustix::event::EventfdFlags::CLOEXEC;
    Rc::new(rustix::event::eventfd(0, flags).expect("eventfd"))
}

pub(crate) fn handles(items: &[Item<'_, Req>]) -> Vec<Handle> {
    items.iter().map(|i| i.handle).collect()
}

impl Step<Req> for App {
    async fn step(
        &mut self,
        items: &mut [Item<'_, Req>],
        results: &mut [StepResult],
    ) -> xtc::Result<()> {
        let _cb = InCb::enter(&self.m);
        let hs = handles(items);
        self.m.borrow_mut().on_vector(&hs);
        self.dawdle().await;
        if self.rng.u32(0..30) == 0 {
            return Err(Error::Nomem);
        }
        self.m.borrow_mut().choose(&mut self.rng, &hs, results);
        Ok(())
    }
}

impl AsyncStep<Req> for App {
    async fn submit(&mut self, items: &mut [Item<'_, Req>]) -> xtc::Result<Exec> {
        let _cb = InCb::enter(&self.m);
        let hs = handles(items);
        {
            let mut m = self.m.borrow_mut();
            m.on_vector(&hs);
            if m.inflight.is_some() {
                m.fail("submit while an operation is outstanding".into());
            }
        }
        self.dawdle().await;
        let pick = self.rng.u32(0..100);
        if pick < 4 {
            return Err(Error::Nomem);
        }
        self.m.borrow_mut().offloads += 1;
        self.m.borrow_mut().inflight = Some(hs);
        Ok(match pick {
            4..30 => Exec::Inline,
            30..34 => Exec::Fence(self.fence.clone()), // Nosys under Sim (B-070)
            34..45 if self.blocking => {
                let fail = self.rng.u32(0..5) == 0;
                Exec::Blocking(Box::new(
                    move || if fail { Err(Error::Range) } else { Ok(()) },
                ))
            }
            _ if self.mt => self.timed_future(),
            _ => {
                let (f, p) = rt::future_pair();
                self.m.borrow_mut().promises.push(p);
                Exec::Future(f)
            }
        })
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, Req>],
        results: &mut [StepResult],
        status: ExecStatus,
    ) -> xtc::Result<()> {
        let _cb = InCb::enter(&self.m);
        let hs = handles(items);
        {
            let mut m = self.m.borrow_mut();
            match m.inflight.take() {
                Some(v) if v == hs => {}
                other => m.fail(format!("collect of {hs:?} but outstanding {other:?}")),
            }
            m.op_promise = None;
            match status {
                ExecStatus::Timeout => m.timeouts += 1,
                ExecStatus::Failed(_) => m.errors += 1,
                _ => {}
            }
            if matches!(
                status,
                ExecStatus::Aborted | ExecStatus::Failed(Error::Aborted)
            ) {
                m.aborted_op.extend(hs.iter().copied());
            }
            if status == ExecStatus::Timeout && !self.timeout {
                m.fail("timeout without exec_timeout".into());
            }
        }
        self.dawdle().await;
        if self.rng.u32(0..40) == 0 {
            return Err(Error::Range);
        }
        self.m.borrow_mut().choose(&mut self.rng, &hs, results);
        Ok(())
    }

    async fn cancel_hint(&mut self, h: Handle) {
        let _cb = InCb::enter(&self.m);
        {
            let mut m = self.m.borrow_mut();
            let inflight = m.inflight.as_ref().is_some_and(|v| v.contains(&h));
            if !inflight || !m.hinted.insert(h) {
                m.fail(format!("hint for {h}: in flight {inflight}, or twice"));
            }
        }
        self.dawdle().await;
    }
}

pub(crate) struct Sink {
    pub(crate) m: M,
    pub(crate) rng: Rng,
}

impl Complete<Req> for Sink {
    async fn complete(&mut self, h: Handle, r: Req, o: xtc::Result<()>) {
        let _cb = InCb::enter(&self.m);
        {
            let mut m = self.m.borrow_mut();
            if m.req_of.get(&h) != Some(&r) {
                m.fail(format!("{h} came back with request {r}"));
            }
            m.outcomes.entry(h).or_default().push(o);
        }
        for _ in 0..self.rng.u32(0..2) {
            rt::yield_now().await;
        }
    }
}
