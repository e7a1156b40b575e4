//! The cross-loop flavour ([`run_mt_seed`]): `Remote` calls from the test
//! thread between simulator steps and from a peer loop, checked against the
//! model, and the liveness check after the owner's last action.

#[allow(unused_imports)]
use super::*;

/// Which `Remote` call [`remote_op`] makes.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum RemoteOp {
    Submit,
    Cancel,
    Resume,
    /// Resolve the outstanding FUTURE operation now (a device finishing).
    Resolve,
}

impl RemoteOp {
    pub(crate) fn random(rng: &mut Rng) -> RemoteOp {
        match rng.u32(0..100) {
            0..45 => RemoteOp::Submit,
            45..75 => RemoteOp::Cancel,
            75..93 => RemoteOp::Resume,
            _ => RemoteOp::Resolve,
        }
    }
}

/// Whether the group's driver and finalizer are in the process table.
#[derive(Clone, Copy)]
pub(crate) struct Alive {
    pub(crate) driver: bool,
    pub(crate) finalizer: bool,
}

impl Alive {
    pub(crate) fn of(g: &Group<Req>) -> Alive {
        let lp = g.owner_loop();
        Alive {
            driver: lp.is_alive(g.driver_pid()),
            finalizer: lp.is_alive(g.finalizer_pid()),
        }
    }
}

/// The calls a plain thread or another loop can make, checked against the
/// model. Controls are accepted while the driver runs, and after a kill
/// until the finalizer finished; `Inval` once the driver is gone (B-143).
pub(crate) fn remote_op(
    rng: &mut Rng,
    op: RemoteOp,
    r: &Remote<Req>,
    m: &M,
    units: u64,
    alive: Alive,
) {
    m.borrow_mut().remote_calls += 1;
    match op {
        RemoteOp::Submit => {
            let charge = match rng.u32(0..20) {
                0 => 0,
                1 => units + 1,
                _ => rng.u64(1..=units),
            };
            let req = (1 << 40) + m.borrow().remote_calls;
            let res = r.submit(req, charge);
            let mut mm = m.borrow_mut();
            match res {
                Ok(h) => {
                    if mm.accepted.iter().any(|a| a.0 >= h) {
                        mm.fail(format!("hand-in {h} not above every issued handle"));
                    }
                    if charge == 0 || charge > units {
                        mm.fail(format!("hand-in with charge {charge} accepted"));
                    }
                    mm.accepted.push((h, charge));
                    mm.charge.insert(h, charge);
                    mm.req_of.insert(h, req);
                    mm.via_ring.insert(h);
                }
                Err(e) => {
                    let bad = charge == 0 || charge > units;
                    match e.error {
                        Error::Range if bad => {}
                        Error::Again if !bad => {}
                        other => mm.fail(format!("submit_mt (charge {charge}) gave {other:?}")),
                    }
                    if e.into_inner() != req {
                        mm.fail("a refused hand-in's request came back changed".into());
                    }
                    mm.mt_refused += 1;
                }
            }
        }
        RemoteOp::Cancel | RemoteOp::Resume => {
            let target = {
                let mm = m.borrow();
                let inflight = mm.inflight.clone().unwrap_or_default();
                if op == RemoteOp::Cancel && !inflight.is_empty() && rng.bool() {
                    Some(inflight[rng.usize(0..inflight.len())])
                } else if rng.u32(0..8) == 0 {
                    None // a handle never issued
                } else {
                    drop(mm);
                    pick(rng, m)
                }
            };
            let h = target.unwrap_or_else(|| Handle::new(u64::MAX - 7).expect("nonzero"));
            let res = match op {
                RemoteOp::Cancel => r.cancel(h),
                _ => r.resume(h),
            };
            let mut mm = m.borrow_mut();
            match res {
                Ok(()) if target.is_none() => mm.fail(format!("control of unknown {h} accepted")),
                Ok(()) if !alive.driver && !alive.finalizer => {
                    mm.fail(format!("control of {h} after the driver"))
                }
                Ok(()) if op == RemoteOp::Cancel => {
                    mm.cancelled_mt.insert(h);
                    let outstanding = mm.inflight.as_ref().is_some_and(|v| v.contains(&h));
                    if outstanding {
                        mm.cancel_outstanding.insert(h);
                        if rng.bool() {
                            // The operation finishes before the driver runs
                            // again (issue 12 item 1).
                            drop(mm);
                            resolve_now(m);
                        }
                    }
                }
                Ok(()) => {}
                Err(Error::Again) => mm.mt_refused += 1,
                Err(Error::Inval) if target.is_none() || !alive.driver => {}
                Err(e) => mm.fail(format!(
                    "control of {h} (driver alive {}) gave {e:?}",
                    alive.driver
                )),
            }
        }
        RemoteOp::Resolve => resolve_now(m),
    }
}

/// Resolves the outstanding FUTURE operation at once (if its timer has not).
pub(crate) fn resolve_now(m: &M) {
    let slot = m.borrow().op_promise.clone();
    let p = slot.and_then(|s| s.borrow_mut().take());
    if let Some(p) = p {
        m.borrow_mut().early += 1;
        p.set(Ok(()));
    }
}

/// A process of another loop making `Remote` calls (a cross-loop fiber).
pub(crate) async fn peer(seed: u64, r: Remote<Req>, m: M, units: u64, g: Group<Req>) {
    let mut rng = Rng::with_seed(seed ^ 0x9ee7);
    for _ in 0..rng.usize(0..40) {
        let op = RemoteOp::random(&mut rng);
        remote_op(&mut rng, op, &r, &m, units, Alive::of(&g));
        if rng.bool() {
            rt::yield_now().await;
        } else {
            rt::sleep(Duration::from_micros(rng.u64(1..20))).await;
        }
    }
}

/// Coverage totals of the cross-loop flavour.
#[derive(Default, Debug)]
pub(crate) struct MtCover {
    pub(crate) seeds: usize,
    pub(crate) hand_ins: usize,
    pub(crate) remote_calls: u64,
    pub(crate) cancel_outstanding: usize,
    pub(crate) early_resolves: u64,
    pub(crate) stale_last: usize,
    pub(crate) liveness_rounds: usize,
    pub(crate) aborted: u64,
    pub(crate) hints: usize,
    pub(crate) kills: usize,
}

/// Steps `sim` until nothing can progress, checking the resource bound.
pub(crate) fn quiesce(sim: &Sim, g: &Group<Req>, m: &M, units: u64) {
    for _ in 0..5_000_000 {
        if !sim.step() {
            return;
        }
        if g.stats().reserved_units > units {
            m.borrow_mut()
                .fail("reserved_units above resource_capacity".into());
        }
    }
    m.borrow_mut().fail("the simulation never quiesced".into());
}

pub(crate) fn run_mt_seed(seed: u64, cover: &mut MtCover) {
    let mut rng = Rng::with_seed(seed);
    let sim = Sim::new(seed);
    let lp = sim.new_loop();
    let other = sim.new_loop();
    let capacity = rng.usize(1..8);
    let max_active = rng.usize(1..=capacity);
    let units = rng.u64(1..10);
    let mt_queue_cap = rng.usize(1..6);
    let timeout = rng.u32(0..3) == 0;
    let m: M = Rc::new(RefCell::new(Model {
        units,
        max_active,
        ..Model::default()
    }));
    let slot = Rc::new(RefCell::new(None));
    let app = App {
        m: m.clone(),
        rng: Rng::with_seed(seed ^ 1),
        group: slot.clone(),
        blocking: false,
        timeout,
        mt: true,
        fence: fence(),
    };
    let sink = Sink {
        m: m.clone(),
        rng: Rng::with_seed(seed ^ 2),
    };
    let o = AsyncOpts {
        capacity,
        max_active,
        resource_capacity: units,
        exec_timeout: timeout.then(|| Duration::from_micros(rng.u64(1..40))),
        sched_class: None,
        mt_queue_cap,
    };
    let g = Group::create_async(&lp, o, app, sink).unwrap();
    *slot.borrow_mut() = Some(g.clone());
    let r = g.remote().unwrap();
    let driver = g.driver_pid();
    lp.spawn(client(seed, lp.clone(), g.clone(), m.clone(), units, true))
        .unwrap();
    let peer_r = r.clone();
    other
        .spawn(peer(seed, peer_r, m.clone(), units, g.clone()))
        .unwrap();
    // Random phase: the test thread calls the remote between steps.
    let mut trng = Rng::with_seed(seed ^ 0x7e57);
    for _ in 0..5_000_000 {
        if m.borrow().client_done {
            break;
        }
        if !sim.step() {
            m.borrow_mut().fail("the client stalled".into());
            break;
        }
        if g.stats().reserved_units > units {
            m.borrow_mut()
                .fail("reserved_units above resource_capacity".into());
        }
        if trng.u32(0..5) == 0 {
            let op = RemoteOp::random(&mut trng);
            remote_op(&mut trng, op, &r, &m, units, Alive::of(&g));
        }
    }
    // Liveness: no owner action from here on. More hand-ins, then every
    // accepted request must complete; the test thread only resumes members
    // (a blocked one needs it) through the remote.
    for _ in 0..trng.usize(0..6) {
        remote_op(&mut trng, RemoteOp::Submit, &r, &m, units, Alive::of(&g));
    }
    let mut live = Vec::new();
    let mut rounds = 0;
    for _ in 0..200 {
        quiesce(&sim, &g, &m, units);
        rounds += 1;
        live = {
            let mm = m.borrow();
            mm.accepted
                .iter()
                .map(|a| a.0)
                .filter(|h| !mm.outcomes.contains_key(h))
                .collect()
        };
        if live.is_empty() || !lp.is_alive(driver) {
            break;
        }
        for h in &live {
            // Every control record may be in use: let the driver drain them.
            for _ in 0..100 {
                if m.borrow().outcomes.contains_key(h) {
                    break; // completed meanwhile
                }
                match r.resume(*h) {
                    Ok(()) => break,
                    Err(Error::Again) => m.borrow_mut().mt_refused += 1,
                    Err(Error::Inval) if !lp.is_alive(driver) => break,
                    Err(e) => m.borrow_mut().fail(format!("resume_mt of live {h}: {e:?}")),
                }
                quiesce(&sim, &g, &m, units);
            }
        }
    }
    if !live.is_empty() {
        m.borrow_mut().fail(format!(
            "liveness: {live:?} accepted but never completed with the driver able to run"
        ));
    }
    // Close through the owner, finish, check.
    let (g2, m2) = (g.clone(), m.clone());
    let mode = if trng.bool() {
        CloseMode::Drain
    } else {
        CloseMode::Cancel
    };
    lp.spawn(async move { retry(&g2, &m2, mode).await })
        .unwrap();
    quiesce(&sim, &g, &m, units);
    if lp.n_procs() + other.n_procs() != 0 {
        m.borrow_mut().fail(format!(
            "{} processes left after close",
            lp.n_procs() + other.n_procs()
        ));
    }
    *slot.borrow_mut() = None;
    final_checks(&g, &m);
    if m.borrow().violations.is_empty() {
        g.destroy()
            .unwrap_or_else(|e| panic!("seed {seed}: destroy {e:?}"));
    }
    let mm = m.borrow();
    cover.seeds += 1;
    cover.hand_ins += mm.via_ring.len();
    cover.remote_calls += mm.remote_calls;
    cover.cancel_outstanding += mm.cancel_outstanding.len();
    cover.early_resolves += mm.early;
    cover.stale_last += usize::from(mm.stale_last);
    cover.liveness_rounds += rounds;
    cover.aborted += g.stats().cancelled;
    cover.hints += mm.hinted.len();
    cover.kills += usize::from(mm.killed);
    let v = &mm.violations;
    assert!(
        v.is_empty(),
        "seed {seed} (cross-loop; replay with XTC_MODEL_SEED={seed}): {v:#?}"
    );
}
