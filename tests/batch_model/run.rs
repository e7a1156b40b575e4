//! One seed of the sync or async flavour ([`run_seed`]), its coverage
//! totals ([`Cover`]) and the checks after the run ([`final_checks`]).

#[allow(unused_imports)]
use super::*;

/// Coverage totals over all seeds of one flavour (printed by the test).
#[derive(Default, Debug)]
pub(crate) struct Cover {
    pub(crate) accepted: usize,
    pub(crate) ok: u64,
    pub(crate) cancelled: u64,
    pub(crate) failed: u64,
    pub(crate) kills: usize,
    pub(crate) offloads: u64,
    pub(crate) timeouts: u64,
    pub(crate) errors: u64,
    pub(crate) hints: usize,
    pub(crate) blocking_seeds: usize,
}

pub(crate) fn run_seed(seed: u64, is_async: bool, cover: &mut Cover) {
    let mut rng = Rng::with_seed(seed);
    let sim = Sim::new(seed);
    let lp = sim.new_loop();
    let capacity = rng.usize(1..8);
    let max_active = rng.usize(1..=capacity);
    let units = rng.u64(1..10);
    let m: M = Rc::new(RefCell::new(Model {
        units,
        max_active,
        ..Model::default()
    }));
    let slot = Rc::new(RefCell::new(None));
    let timeout = is_async && rng.bool();
    let blocking = is_async && rng.u32(0..8) == 0;
    let app = App {
        m: m.clone(),
        rng: Rng::with_seed(seed ^ 1),
        group: slot.clone(),
        blocking,
        timeout,
        mt: false,
        fence: fence(),
    };
    let sink = Sink {
        m: m.clone(),
        rng: Rng::with_seed(seed ^ 2),
    };
    let g = if is_async {
        let t = timeout.then(|| Duration::from_micros(rng.u64(1..40)));
        let o = AsyncOpts {
            capacity,
            max_active,
            resource_capacity: units,
            exec_timeout: t,
            sched_class: None,
            mt_queue_cap: 0,
        };
        Group::create_async(&lp, o, app, sink).unwrap()
    } else {
        let o = SyncOpts {
            capacity,
            max_active,
            resource_capacity: units,
            sched_class: None,
        };
        Group::create(&lp, o, app, sink).unwrap()
    };
    *slot.borrow_mut() = Some(g.clone());
    lp.spawn(client(seed, lp.clone(), g.clone(), m.clone(), units, false))
        .unwrap();
    if is_async {
        lp.spawn(device(seed, lp.clone(), g.clone(), m.clone(), timeout))
            .unwrap();
    }
    loop {
        while sim.step() {
            if g.stats().reserved_units > units {
                m.borrow_mut()
                    .fail("reserved_units above resource_capacity".into());
            }
        }
        if lp.n_procs() == 0 {
            break;
        }
        assert!(
            blocking,
            "seed {seed}: sim stalled with {} processes",
            lp.n_procs()
        );
        std::thread::yield_now(); // a pool thread is running a BLOCKING closure
    }
    *slot.borrow_mut() = None;
    final_checks(&g, &m);
    g.destroy()
        .unwrap_or_else(|e| panic!("seed {seed}: destroy {e:?}"));
    let (s, a, mm) = (g.stats(), g.async_stats(), m.borrow());
    cover.accepted += mm.accepted.len();
    (cover.ok, cover.cancelled, cover.failed) = (
        cover.ok + s.completed,
        cover.cancelled + s.cancelled,
        cover.failed + s.failed,
    );
    cover.kills += usize::from(mm.killed);
    (cover.offloads, cover.timeouts, cover.errors) = (
        cover.offloads + a.offloads,
        cover.timeouts + a.offload_timeouts,
        cover.errors + a.offload_errors,
    );
    cover.hints += mm.hinted.len();
    cover.blocking_seeds += usize::from(blocking);
    drop(mm);
    let v = &m.borrow().violations;
    assert!(
        v.is_empty(),
        "seed {seed} ({}; replay with XTC_MODEL_SEED={seed}): {v:#?}",
        if is_async { "async" } else { "sync" }
    );
}

pub(crate) fn final_checks(g: &Group<Req>, m: &M) {
    let mut mm = m.borrow_mut();
    let accepted = mm.accepted.clone();
    let (mut ok, mut ab, mut failed) = (0, 0, 0);
    for (h, _) in &accepted {
        let os = mm.outcomes.get(h).cloned().unwrap_or_default();
        if os.len() != 1 {
            mm.fail(format!("{h}: {} completions", os.len()));
            continue;
        }
        match os[0] {
            Ok(()) => ok += 1,
            Err(Error::Aborted) => {
                ab += 1;
                let why = mm.cancelled.contains(h)
                    || mm.cancelled_mt.contains(h)
                    || mm.close_cancel
                    || mm.killed
                    || mm.aborted_op.contains(h);
                if !why {
                    mm.fail(format!("{h} Aborted without a cancel"));
                }
            }
            Err(e) => {
                failed += 1;
                if e == Error::Internal && !mm.unset.contains(h) && !mm.killed {
                    mm.fail(format!("{h} Internal without UNSET or kill"));
                }
            }
        }
    }
    if mm.outcomes.len() != accepted.len() {
        mm.fail("completion for a handle never accepted".into());
    }
    let s = g.stats();
    let want = (
        ok,
        ab,
        failed,
        mm.rejections,
        mm.vectors,
        mm.members,
        mm.max_vector,
    );
    let got = (
        s.completed,
        s.cancelled,
        s.failed,
        s.rejections,
        s.iterations,
        s.total_members,
        s.max_vector,
    );
    if want != got {
        mm.fail(format!("stats {got:?} != model {want:?}"));
    }
    if (s.queued, s.ready, s.blocked, s.reserved_units) != (0, 0, 0, 0) {
        mm.fail(format!("gauges not zero at the end: {s:?}"));
    }
    let a = g.async_stats();
    if (a.offloads, a.offload_timeouts, a.offload_errors) != (mm.offloads, mm.timeouts, mm.errors) {
        let msg = format!(
            "async stats {a:?} vs model {} {} {}",
            mm.offloads, mm.timeouts, mm.errors
        );
        mm.fail(msg);
    }
    if mm.inflight.is_some() {
        mm.fail("an operation was never collected".into());
    }
    let kept = std::mem::take(&mut mm.consumed_check);
    if kept.iter().any(|p| !p.is_abandoned()) {
        mm.fail("a FUTURE was not consumed (still held by the engine)".into());
    }
    // A cancel accepted while the operation was outstanding is consumed at
    // its completion boundary, whichever path carried it (B-093, B-094).
    let mut outstanding: Vec<Handle> = mm.cancel_outstanding.iter().copied().collect();
    outstanding.sort_unstable();
    for h in outstanding {
        let os = mm.outcomes.get(&h).cloned().unwrap_or_default();
        if os != [Err(Error::Aborted)] {
            mm.fail(format!("{h}: cancelled while outstanding, ended {os:?}"));
        }
        if !mm.hinted.contains(&h) {
            mm.fail(format!("{h}: cancelled while outstanding, never hinted"));
        }
    }
    let ring = mm.via_ring.len() as u64;
    if ring > 0 && (a.mt_queued, a.mt_rejections) != (ring, mm.mt_refused) {
        let msg = format!(
            "mt stats ({}, {}) vs model ({ring}, {})",
            a.mt_queued, a.mt_rejections, mm.mt_refused
        );
        mm.fail(msg);
    }
}
