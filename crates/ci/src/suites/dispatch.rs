//! `xtc.dispatch.*`: the batched-publish scheduler (design note
//! `docs/arch/dispatch.md`) on the emulated NPU, fixed seeds.
//!
//! - `sync_start.stepped`: the sync_start stress scene (D-15), 20 seeds
//!   under the deterministic stepper: no fault, exact outputs, the store
//!   fences of every pop ([`RunReport::check_fence_counts`]: one per
//!   non-sync pop), MIX drains in every round and drain retries overall.
//! - `sync_start.threads`: the same scene on real threads (emulated cores
//!   polling the mapped register region).
//! - `sync_start.a2a3`: the scene on the 24-cluster profile.
//! - `drain.escapes`: the retry-ABA scene (a sync_start cohort whose drain
//!   must retry), 10 seeds: every drain ends, outputs exact.
//! - `reclaim.handshake`: a task window held by an open scope: the pressure
//!   handshake ends the orchestrator's stall with an acknowledged
//!   publication, never the backstop; publications are batched.

use crate::case::{Case, CaseError, Ctx, Outcome, Suite, ensure};
use xtc_dispatch::scenarios::{open_scope, retry_aba, sync_start_stress};
use xtc_dispatch::{DeviceProfile, RunOpts, RunReport, Scheduler, StallEnd, StepOpts};

/// Registers the suite's cases.
pub fn cases(v: &mut Vec<Case>) {
    let s = Suite::Dispatch;
    v.push(Case::new(s, "xtc.dispatch.sync_start.stepped", stepped));
    v.push(Case::new(s, "xtc.dispatch.sync_start.threads", threads));
    v.push(Case::new(s, "xtc.dispatch.sync_start.a2a3", a2a3));
    v.push(Case::new(s, "xtc.dispatch.drain.escapes", escapes));
    v.push(Case::new(s, "xtc.dispatch.reclaim.handshake", reclaim));
}

/// No fault, exact outputs, the fence rule.
fn sound(r: &RunReport, what: &str) -> Result<(), CaseError> {
    ensure(r.fault.is_none(), || format!("{what}: fault {:?}", r.fault))?;
    ensure(r.outputs_exact(), || {
        format!("{what}: an output slot is wrong")
    })?;
    r.check_fence_counts()
        .map_err(|e| CaseError::Fail(format!("{what}: {e}")))
}

fn stepped(_: &mut Ctx) -> Result<Outcome, CaseError> {
    let s = Scheduler::new(DeviceProfile::small())?;
    let (mut drains, mut retries, mut sync_pops) = (0, 0, 0);
    for round in 0..20u64 {
        let g = sync_start_stress(s.profile().clusters, round);
        let r = s
            .run_stepped(&g, RunOpts::default(), StepOpts::seeded(round))
            .map_err(|e| CaseError::Fail(format!("round {round}: {e:?}")))?;
        sound(&r, &format!("round {round}"))?;
        ensure(r.summary.drains >= 12, || {
            format!(
                "round {round}: {} drains, the scene makes 12",
                r.summary.drains
            )
        })?;
        drains += r.summary.drains;
        retries += r.summary.drain_retries;
        sync_pops += r.pops.iter().filter(|p| p.sync).count();
    }
    ensure(retries > 0 && sync_pops > 0, || {
        format!("the scene no longer exercises retries ({retries}) or sync pops ({sync_pops})")
    })?;
    Ok(Outcome::pass_with(format!(
        "20 seeds: {drains} drains, {retries} retries, {sync_pops} sync pops"
    )))
}

fn threads(_: &mut Ctx) -> Result<Outcome, CaseError> {
    let s = Scheduler::new(DeviceProfile::small())?;
    for round in 0..3u64 {
        let g = sync_start_stress(s.profile().clusters, round);
        // Real threads on a shared CI machine: a watchdog that a thread
        // descheduled for seconds does not trip (its own cases test it).
        let opts = RunOpts {
            watchdog_ns: 60_000_000_000,
            ..RunOpts::default()
        };
        let r = s.run_threads(&g, opts)?;
        sound(&r, &format!("round {round}"))?;
    }
    Ok(Outcome::pass_with("3 rounds on real threads"))
}

fn a2a3(_: &mut Ctx) -> Result<Outcome, CaseError> {
    let s = Scheduler::new(DeviceProfile::a2a3())?;
    for round in 0..3u64 {
        let g = sync_start_stress(s.profile().clusters, round);
        let r = s
            .run_stepped(&g, RunOpts::default(), StepOpts::seeded(round))
            .map_err(|e| CaseError::Fail(format!("round {round}: {e:?}")))?;
        sound(&r, &format!("round {round}"))?;
    }
    Ok(Outcome::pass_with("3 seeds on the a2a3 profile"))
}

fn escapes(_: &mut Ctx) -> Result<Outcome, CaseError> {
    let s = Scheduler::new(DeviceProfile::small())?;
    let g = retry_aba(s.profile().clusters);
    let mut retries = 0;
    for seed in 0..10u64 {
        let r = s
            .run_stepped(&g, RunOpts::default(), StepOpts::seeded(seed))
            .map_err(|e| CaseError::Fail(format!("seed {seed}: {e:?}")))?;
        sound(&r, &format!("seed {seed}"))?;
        retries += r.summary.drain_retries;
    }
    Ok(Outcome::pass_with(format!(
        "10 seeds, {retries} drain retries"
    )))
}

fn reclaim(_: &mut Ctx) -> Result<Outcome, CaseError> {
    const WINDOW: usize = 8;
    let s = Scheduler::new(DeviceProfile::small())?;
    let opts = RunOpts {
        window: Some(WINDOW),
        handshake: true,
        ..RunOpts::default()
    };
    for seed in 0..3u64 {
        let so = StepOpts {
            tick_ns: 1_000,
            max_steps: 2_000_000,
            ..StepOpts::seeded(seed)
        };
        let r = s
            .run_stepped(&open_scope(), opts.clone(), so)
            .map_err(|e| CaseError::Fail(format!("seed {seed}: {e:?}")))?;
        sound(&r, &format!("seed {seed}"))?;
        let stall = r
            .stalls
            .iter()
            .find(|st| st.task == WINDOW)
            .ok_or_else(|| CaseError::Fail(format!("seed {seed}: task {WINDOW} never stalled")))?;
        ensure(stall.how == StallEnd::Acked, || {
            format!(
                "seed {seed}: the stall ended {:?}, not by an acked publication",
                stall.how
            )
        })?;
        ensure(
            r.stalls.iter().all(|st| st.how != StallEnd::Backstop),
            || format!("seed {seed}: a stall reached the backstop"),
        )?;
        let (publications, advances) = r.watermark;
        ensure(publications < advances / 2, || {
            format!(
                "seed {seed}: {publications} publications for {advances} advances (not batched)"
            )
        })?;
    }
    Ok(Outcome::pass_with(
        "3 seeds: acked publication, no backstop",
    ))
}
