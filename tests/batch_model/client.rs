//! The processes that drive a seed: the client (random submits, cancels,
//! resumes, closes, maybe a kill), its operations, and the device process
//! that resolves FUTURE operations late, early, failed, dropped or never.

#[allow(unused_imports)]
use super::*;

/// The client: random mutator calls, then drain or cancel. In the
/// cross-loop flavour it stops after the random calls (the test thread then
/// checks liveness and closes), often with a stale or unknown-handle cancel
/// as the owner's last action (issue 12: that must not wedge admission).
pub(crate) async fn client(seed: u64, lp: Loop, g: Group<Req>, m: M, units: u64, mt: bool) {
    let mut rng = Rng::with_seed(seed ^ 0x5eed);
    let mut last: Option<Handle> = None;
    let mut next_req = 0u64;
    for _ in 0..rng.usize(10..120) {
        op(&mut rng, &lp, &g, &m, units, &mut last, &mut next_req).await;
        if rng.u32(0..10) < 7 {
            rt::yield_now().await;
        }
    }
    if mt {
        if rng.bool() {
            while m.borrow().in_cb > 0 {
                rt::yield_now().await; // a callback is suspended: Deadlk
            }
            stale_cancel(&mut rng, &g, &m).await;
            m.borrow_mut().stale_last = true;
        }
        m.borrow_mut().client_done = true;
        return;
    }
    // Drain (resuming every live member) or cancel; escalate in the end.
    if rng.bool() {
        retry(&g, &m, CloseMode::Drain).await;
        for _ in 0..30 {
            if !lp.is_alive(g.driver_pid()) {
                return;
            }
            let live: Vec<Handle> = m.borrow().accepted.iter().map(|a| a.0).collect();
            for h in live {
                let _ = g.resume(h);
            }
            rt::sleep(Duration::from_micros(rng.u64(1..20))).await;
        }
    }
    retry(&g, &m, CloseMode::Cancel).await;
}

pub(crate) async fn retry(g: &Group<Req>, m: &M, mode: CloseMode) {
    loop {
        let in_cb = m.borrow().in_cb > 0;
        let r = g.close(mode);
        check_deadlk(m, in_cb, r);
        if r.is_ok() {
            if mode == CloseMode::Cancel {
                m.borrow_mut().close_cancel = true;
            }
            return;
        }
        rt::yield_now().await;
    }
}

pub(crate) fn check_deadlk(m: &M, in_cb: bool, r: xtc::Result<()>) {
    if in_cb != (r == Err(Error::Deadlk)) {
        m.borrow_mut()
            .fail(format!("callback in flight {in_cb} but mutator gave {r:?}"));
    }
}

pub(crate) async fn op(
    rng: &mut Rng,
    lp: &Loop,
    g: &Group<Req>,
    m: &M,
    units: u64,
    last: &mut Option<Handle>,
    next_req: &mut u64,
) {
    let in_cb = m.borrow().in_cb > 0;
    match rng.u32(0..100) {
        0..50 => {
            let charge = match rng.u32(0..20) {
                0 => 0,
                1 => units + 1,
                _ => rng.u64(1..=units),
            };
            // Consecutive unless cross-loop hand-ins took numbers between.
            let guess = match m.borrow().via_ring.is_empty() {
                true => last.map_or(0, |h| h.get() + 1),
                false => 0,
            };
            *next_req += 1;
            let r = g.submit(*next_req, charge);
            let mut mm = m.borrow_mut();
            match r {
                Ok(h) => {
                    if last.is_some_and(|l| h <= l) {
                        mm.fail(format!("handle {h} not above {last:?}"));
                    }
                    if guess != 0 && h.get() != guess {
                        mm.fail(format!("handle {h} skipped from {guess}"));
                    }
                    *last = Some(h);
                    mm.accepted.push((h, charge));
                    mm.charge.insert(h, charge);
                    mm.req_of.insert(h, *next_req);
                    if in_cb {
                        mm.fail("submit accepted during a callback".into());
                    }
                }
                Err(e) => {
                    if in_cb != (e.error == Error::Deadlk) {
                        mm.fail(format!(
                            "callback in flight {in_cb}, submit gave {:?}",
                            e.error
                        ));
                    }
                    if e.error != Error::Deadlk {
                        mm.rejections += 1;
                    }
                }
            }
        }
        50..60 => {
            let Some(h) = pick(rng, m) else { return };
            let r = g.cancel(h);
            check_deadlk(m, in_cb, r.and(Ok(())));
            let mut mm = m.borrow_mut();
            let delivered = mm.outcomes.contains_key(&h);
            match r {
                Ok(()) if delivered => mm.fail(format!("cancel of notified {h} accepted")),
                Ok(()) => {
                    mm.cancelled.insert(h);
                    if mm.inflight.as_ref().is_some_and(|v| v.contains(&h)) {
                        mm.cancel_outstanding.insert(h);
                    }
                }
                Err(Error::Inval) if !delivered => mm.fail(format!("cancel of live {h} refused")),
                _ => {}
            }
        }
        60..63 if !m.borrow().via_ring.is_empty() || rng.bool() => {
            stale_cancel(rng, g, m).await;
        }
        60..80 => {
            let Some(h) = pick(rng, m) else { return };
            let r = g.resume(h);
            check_deadlk(m, in_cb, r);
            if r.is_ok() && m.borrow().outcomes.contains_key(&h) {
                m.borrow_mut()
                    .fail(format!("resume of notified {h} accepted"));
            }
        }
        80..82 => {
            let mode = if rng.bool() {
                CloseMode::Drain
            } else {
                CloseMode::Cancel
            };
            let r = g.close(mode);
            check_deadlk(m, in_cb, r);
            if r.is_ok() && mode == CloseMode::Cancel {
                let mut mm = m.borrow_mut();
                mm.close_cancel = true;
                let outstanding = mm.inflight.clone().unwrap_or_default();
                mm.cancel_outstanding.extend(outstanding);
            }
        }
        82..83 if rng.bool() => {
            if lp.kill(g.driver_pid()).is_ok() {
                m.borrow_mut().killed = true;
            }
        }
        86..93 => rt::sleep(Duration::from_micros(rng.u64(1..30))).await,
        _ => rt::yield_now().await,
    }
}

/// An owner cancel of a handle with no live request: one already notified
/// (stale) or one never issued (unknown); both are `Inval` (B-050).
pub(crate) async fn stale_cancel(rng: &mut Rng, g: &Group<Req>, m: &M) {
    let notified: Vec<Handle> = m.borrow().outcomes.keys().copied().collect();
    let h = match (notified.is_empty(), rng.bool()) {
        (false, true) => notified[rng.usize(0..notified.len())],
        _ => {
            let top = m.borrow().accepted.iter().map(|a| a.0.get()).max();
            Handle::new(top.unwrap_or(1) + 1_000_000).expect("nonzero")
        }
    };
    let in_cb = m.borrow().in_cb > 0;
    let r = g.cancel(h);
    check_deadlk(m, in_cb, r);
    if !in_cb && r != Err(Error::Inval) {
        m.borrow_mut()
            .fail(format!("cancel of stale or unknown {h} gave {r:?}"));
    }
}

pub(crate) fn pick(rng: &mut Rng, m: &M) -> Option<Handle> {
    let mm = m.borrow();
    if mm.accepted.is_empty() {
        return None;
    }
    Some(mm.accepted[rng.usize(0..mm.accepted.len())].0)
}

/// A device resolving promises late, early, failed, dropped or never.
pub(crate) async fn device(seed: u64, lp: Loop, g: Group<Req>, m: M, timeout: bool) {
    let mut rng = Rng::with_seed(seed ^ 0xde71ce);
    while lp.is_alive(g.driver_pid()) || lp.is_alive(g.finalizer_pid()) {
        rt::sleep(Duration::from_micros(rng.u64(0..15))).await;
        let p = m.borrow_mut().promises.pop();
        let Some(p) = p else { continue };
        match rng.u32(0..100) {
            0..75 => p.set(Ok(())),
            75..82 => p.set(Err(Error::Nomem)),
            82..90 => drop(p),
            _ if timeout => m.borrow_mut().consumed_check.push(p), // never
            _ => p.set(Ok(())),
        }
    }
}
