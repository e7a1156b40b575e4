//! `xtc.fence.*`: the completion fds of device submissions (B-066).
//!
//! - `sync_file_export`: where the driver exports fences as `SYNC_FD`
//!   (`VK_KHR_external_fence_fd`), a submission's fd is a real sync_file:
//!   `SYNC_IOC_FILE_INFO` answers on every fd that comes back (active with a
//!   fence while the work is held back by a host gate, signalled after).
//!   `Skip` with the reason, never `Pass`, where the driver cannot export
//!   or exports -1 ("already signalled": no fd to check) for work that is
//!   still pending.
//! - `pending_until_host_signal`: a submission held back by a
//!   [`HostGate`] (a `VkEvent` the host sets later, waited on by the
//!   command buffer) has a
//!   completion fd that is NOT readable (`poll`) while the gate is closed,
//!   and readable once it opens: deterministic, whatever the fd is (a
//!   sync_file, or lavapipe's eventfd signalled by the waiter thread).
//! - `eventfd_bridge`: where it does not, each submission's eventfd is
//!   signalled by the device's waiter thread, in submission order, and only
//!   once its timeline value is reached; `Skip` on sync_file devices.
//! - `loop_wake`: an `rt::Loop` process parked on a submission's fd
//!   (`rt::wait_readable`) is woken by the device and sees the work done.
//! - `no_fd_leak_10k`: 10,000 record + submit + wake round trips leave the
//!   process's open-fd count where it was.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use crate::case::{Case, CaseError, Ctx, Outcome, Suite, ensure};
use crate::support::{empty_round_trip, open_fds, poll_readable};
use xtc::accel::{FenceStatus, SyncFile};
use xtc_vk::{CommandPool, FenceKind, HostGate};

/// Registers the suite's cases.
pub fn cases(v: &mut Vec<Case>) {
    let s = Suite::Fence;
    v.push(Case::new(s, "xtc.fence.sync_file_export", sync_file_export));
    v.push(Case::new(
        s,
        "xtc.fence.pending_until_host_signal",
        pending_until_host_signal,
    ));
    v.push(Case::new(s, "xtc.fence.eventfd_bridge", eventfd_bridge));
    v.push(Case::new(s, "xtc.fence.loop_wake", loop_wake));
    v.push(Case::new(s, "xtc.fence.no_fd_leak_10k", no_fd_leak));
}

const WAIT: Option<Duration> = Some(Duration::from_secs(20));

fn sync_file_export(ctx: &mut Ctx) -> Result<Outcome, CaseError> {
    let dev = ctx.device()?;
    if dev.fence_kind() != FenceKind::SyncFile {
        return Ok(Outcome::skip(format!(
            "{} does not export fences as SYNC_FD (VK_KHR_external_fence_fd): not supported",
            dev.info().name
        )));
    }
    let mut pool = CommandPool::new(&dev)?;
    for i in 0..8 {
        pool.reset()?;
        let gate = HostGate::new(&dev)?;
        let mut rec = pool.record_plain()?;
        rec.wait_gate(&gate)?;
        let cmd = rec.finish()?;
        let sub = pool.submit(vec![cmd])?;
        if sub.kind() != FenceKind::SyncFile {
            // The export gave -1, "already signalled", for work that cannot
            // have run (its gate is closed): nothing to check.
            gate.open()?;
            return Ok(Outcome::skip(format!(
                "{}: vkGetFenceFdKHR exported -1 (already signalled) for pending work at submission {i}: no sync_file to check",
                dev.info().name
            )));
        }
        let sf = SyncFile::from_fd(sub.fence_fd().try_clone_to_owned()?);
        let info = sf.info().map_err(|e| {
            CaseError::Fail(format!(
                "submission {i}: SYNC_IOC_FILE_INFO on the export: {e}"
            ))
        })?;
        ensure(
            info.status == FenceStatus::Active && !info.fences.is_empty(),
            || format!("submission {i}: pending, yet SYNC_IOC_FILE_INFO says {info:?}"),
        )?;
        gate.open()?;
        ensure(poll_readable(sub.fence_fd(), WAIT)?, || {
            format!("submission {i}: sync_file not signalled within {WAIT:?}")
        })?;
        let info = sf.info().map_err(|e| CaseError::Fail(e.to_string()))?;
        ensure(info.status == FenceStatus::Signalled, || {
            format!("submission {i}: readable, yet SYNC_IOC_FILE_INFO says {info:?}")
        })?;
        ensure(sub.is_complete()?, || {
            format!("submission {i}: fd readable before the timeline value")
        })?;
    }
    Ok(Outcome::pass_with(
        "8 exported sync_files: active while gated, signalled after (SYNC_IOC_FILE_INFO)",
    ))
}

fn pending_until_host_signal(ctx: &mut Ctx) -> Result<Outcome, CaseError> {
    const LOOKS: u32 = 5;
    const LOOK: Option<Duration> = Some(Duration::from_millis(20));
    let dev = ctx.device()?;
    let mut pool = CommandPool::new(&dev)?;
    let gate = HostGate::new(&dev)?;
    let mut rec = pool.record_plain()?;
    rec.wait_gate(&gate)?;
    let cmd = rec.finish()?;
    let sub = pool.submit(vec![cmd])?;
    for look in 0..LOOKS {
        ensure(!poll_readable(sub.fence_fd(), LOOK)?, || {
            format!(
                "{:?} fd readable at look {look} while its gate is closed",
                sub.kind()
            )
        })?;
        ensure(!sub.is_complete()?, || {
            format!("timeline value reached at look {look} while the gate is closed")
        })?;
    }
    gate.open()?;
    ensure(poll_readable(sub.fence_fd(), WAIT)?, || {
        format!(
            "{:?} fd not readable within {WAIT:?} after the gate opened",
            sub.kind()
        )
    })?;
    ensure(sub.is_complete()?, || {
        "fd readable before the timeline value".to_owned()
    })?;
    Ok(Outcome::pass_with(format!(
        "{:?} fd not readable over {LOOKS} polls while gated, readable after the host signal",
        sub.kind()
    )))
}

fn eventfd_bridge(ctx: &mut Ctx) -> Result<Outcome, CaseError> {
    let dev = ctx.device()?;
    if dev.fence_kind() != FenceKind::EventFd {
        return Ok(Outcome::skip(
            "the device exports sync_files: the eventfd bridge is not used",
        ));
    }
    let mut pools: Vec<CommandPool> = (0..16)
        .map(|_| CommandPool::new(&dev))
        .collect::<Result<_, _>>()?;
    // 16 submissions in flight at once, then their fds in submission order.
    let mut subs = Vec::new();
    for p in &mut pools {
        let cmd = p.record_plain()?.finish()?;
        subs.push(p.submit(vec![cmd])?);
    }
    let mut last = 0;
    for (i, s) in subs.iter().enumerate() {
        ensure(s.kind() == FenceKind::EventFd, || {
            format!("submission {i}: fence kind {:?}", s.kind())
        })?;
        ensure(s.value() > last, || {
            format!("submission {i}: timeline value {} after {last}", s.value())
        })?;
        last = s.value();
        ensure(poll_readable(s.fence_fd(), WAIT)?, || {
            format!("submission {i}: eventfd not signalled within {WAIT:?}")
        })?;
        ensure(dev.completed_value()? >= s.value(), || {
            format!("submission {i}: eventfd signalled before its timeline value")
        })?;
    }
    Ok(Outcome::pass_with(
        "16 in-flight eventfds signalled in order",
    ))
}

fn loop_wake(ctx: &mut Ctx) -> Result<Outcome, CaseError> {
    let dev = ctx.device()?;
    let lp = xtc::rt::Loop::new()?;
    let woke = Rc::new(Cell::new(0u32));
    let failure: Rc<Cell<Option<String>>> = Rc::default();
    let (w, f) = (woke.clone(), failure.clone());
    let mut pool = CommandPool::new(&dev)?;
    lp.spawn(async move {
        for i in 0..100 {
            let step = async {
                pool.reset()?;
                let cmd = pool.record_plain()?.finish()?;
                let sub = pool.submit(vec![cmd])?;
                xtc::rt::wait_readable(sub.fence_fd()).await?;
                ensure(sub.is_complete()?, || {
                    format!("iteration {i}: the loop woke before the work completed")
                })
            };
            match step.await {
                Ok(()) => w.set(w.get() + 1),
                Err(CaseError::Fail(m) | CaseError::Skip(m) | CaseError::DeviceLost(m)) => {
                    f.set(Some(m));
                    return;
                }
            }
        }
    })?;
    lp.run()?;
    if let Some(m) = failure.take() {
        return Err(CaseError::Fail(m));
    }
    ensure(woke.get() == 100, || {
        format!("woke {} times of 100", woke.get())
    })?;
    Ok(Outcome::pass_with("100 fd wakes of an rt::Loop process"))
}

fn no_fd_leak(ctx: &mut Ctx) -> Result<Outcome, CaseError> {
    const N: u64 = 10_000;
    let dev = ctx.device()?;
    let mut pool = CommandPool::new(&dev)?;
    for _ in 0..100 {
        empty_round_trip(&mut pool)?;
    }
    dev.sync_waiter();
    let before = open_fds()?;
    let first = empty_round_trip(&mut pool)?;
    let mut last = first;
    for _ in 1..N {
        last = empty_round_trip(&mut pool)?;
    }
    dev.sync_waiter();
    let after = open_fds()?;
    ensure(last - first == N - 1, || {
        format!("{} submissions for {N} round trips", last - first + 1)
    })?;
    ensure(after == before, || {
        format!("open fds {before} before {N} submissions, {after} after")
    })?;
    Ok(Outcome::pass_with(format!(
        "{before} open fds before and after {N} submissions"
    )))
}
