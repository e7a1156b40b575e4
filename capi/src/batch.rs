//! The functions of xtc_batch(3)'s SYNOPSIS, with its names and signatures,
//! over [`xtc::batch`].
//!
//! Every call returns `XTC_OK` or a negative `XTC_E_*` code (B-180..B-185);
//! without the `sched-policy` feature every call returns `XTC_E_NOSYS`
//! first (B-005, B-159). Out parameters are written only on success (B-025).

use std::ffi::c_void;
use std::mem::offset_of;
use std::os::raw::c_int;
use std::time::Duration;

use xtc::Error;
use xtc::accel::{Device, NodeKind};
use xtc::batch::{self, AsyncOpts, AsyncStats, Group, Handle, Remote, Router, Stats, SyncOpts};

use crate::accel::xtc_accel_dev_t;
use crate::boundary::{Home, call};
use crate::codes::close_mode;
use crate::desc::{Descriptor, read_in, write_out};
use crate::rt::{put, xtc_exec_t, xtc_loop_t, xtc_sched_class_t};
use crate::step::{
    CAsync, CComplete, CRequest, CStep, xtc_batch_cancel_hint_fn, xtc_batch_collect_fn,
    xtc_batch_complete_fn, xtc_batch_step_fn, xtc_batch_submit_fn,
};

/// A batch group (`xtc_batch_t`, B-001). Owner-loop calls are made on the
/// thread of the loop it was created on; the `_mt` calls from any thread.
pub struct xtc_batch_t {
    group: Group<CRequest>,
    /// `Some` for an asynchronous group created with `mt_queue_cap > 0`.
    remote: Option<Remote<CRequest>>,
    home: Home,
}

/// The `enum xtc_batch_close_mode` argument as the caller passed it: read as
/// an integer and validated, so an invalid mode is `XTC_E_INVAL`, never
/// undefined behaviour (the header names it `enum xtc_batch_close_mode`).
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct CloseModeArg(pub u32);

/// A keyed-shard router (`xtc_batch_router_t`, B-168..B-171): a copy of the
/// group pointer array and a modulo.
pub struct xtc_batch_router_t {
    router: Router<*mut xtc_batch_t>,
}

/// Options of `xtc_batch_create` (B-006..B-014). Set `size` to
/// `sizeof(xtc_batch_opts_t)` and `version` to `XTC_BATCH_VERSION`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xtc_batch_opts_t {
    /// `sizeof(xtc_batch_opts_t)` as the application's header declares it.
    pub size: u32,
    /// `XTC_BATCH_VERSION`.
    pub version: u32,
    /// Slots: waiting plus active requests; at least `max_active` (B-010, B-020).
    pub capacity: usize,
    /// Active members at most; positive (B-010).
    pub max_active: usize,
    /// Units active members may reserve together; positive (B-011).
    pub resource_capacity: u64,
    /// NULL: default scheduling; else a class of this loop registered to no
    /// other group (B-012).
    pub sched_class: *mut xtc_sched_class_t,
    /// Mandatory (B-009).
    pub step: xtc_batch_step_fn,
    /// Mandatory (B-009).
    pub complete: xtc_batch_complete_fn,
    /// Passed to every callback; borrowed (B-007).
    pub user: *mut c_void,
}

/// Options of `xtc_batch_create_async` (B-058..B-061, B-107). Set `size` to
/// `sizeof(xtc_batch_async_opts_t)` and `version` to `XTC_BATCH_VERSION`.
/// A descriptor of `XTC_BATCH_ASYNC_OPTS_SIZE_VER0` bytes (the layout before
/// cross-loop admission, without `mt_queue_cap`) is accepted and reads
/// `mt_queue_cap` as 0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xtc_batch_async_opts_t {
    /// `sizeof(xtc_batch_async_opts_t)` as the application's header declares it.
    pub size: u32,
    /// `XTC_BATCH_VERSION`.
    pub version: u32,
    /// Slots: waiting plus active requests; at least `max_active`.
    pub capacity: usize,
    /// Active members at most; positive.
    pub max_active: usize,
    /// Units active members may reserve together; positive.
    pub resource_capacity: u64,
    /// Engine timeout of a FENCE or FUTURE wait in nanoseconds; 0: none;
    /// negative: `XTC_E_INVAL` (B-060).
    pub exec_timeout_ns: i64,
    /// As in `xtc_batch_opts_t`.
    pub sched_class: *mut xtc_sched_class_t,
    /// Mandatory.
    pub submit: xtc_batch_submit_fn,
    /// Mandatory.
    pub collect: xtc_batch_collect_fn,
    /// Mandatory.
    pub complete: xtc_batch_complete_fn,
    /// Optional (NULL: no hint).
    pub cancel_hint: xtc_batch_cancel_hint_fn,
    /// Passed to every callback; borrowed.
    pub user: *mut c_void,
    /// Cross-loop admission ring size; 0 disables the `_mt` calls (B-107, B-109).
    pub mt_queue_cap: usize,
}

/// `xtc_batch_get_stats` snapshot (B-172..B-178). Set `size` and `version`
/// before the call; the library fills the rest.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct xtc_batch_stats_t {
    /// `sizeof(xtc_batch_stats_t)` as the application's header declares it.
    pub size: u32,
    /// `XTC_BATCH_VERSION`.
    pub version: u32,
    /// Requests waiting for admission, held cross-loop hand-ins included.
    pub queued: u64,
    /// Active members that are READY (in flight included).
    pub ready: u64,
    /// Active members that are BLOCKED.
    pub blocked: u64,
    /// Resource units reserved by active members.
    pub reserved_units: u64,
    /// Vector calls: steps, or submits of an asynchronous group.
    pub iterations: u64,
    /// Completions delivered with `XTC_OK`.
    pub completed: u64,
    /// Completions delivered with `XTC_E_ABORTED`.
    pub cancelled: u64,
    /// Completions delivered with any other error.
    pub failed: u64,
    /// Owner-loop submits that failed after owner/callback validation.
    pub rejections: u64,
    /// Largest ready vector so far.
    pub max_vector: u64,
    /// Sum of ready-vector lengths.
    pub total_members: u64,
}

/// `xtc_batch_get_async_stats` counters (B-104, B-105): zero on a synchronous
/// group. A descriptor of `XTC_BATCH_ASYNC_STATS_SIZE_VER0` bytes (without
/// the cross-loop counters) gets the first three.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct xtc_batch_async_stats_t {
    /// `sizeof(xtc_batch_async_stats_t)` as the application's header declares it.
    pub size: u32,
    /// `XTC_BATCH_VERSION`.
    pub version: u32,
    /// Operations launched (submit returned `XTC_OK`).
    pub offloads: u64,
    /// Operations whose wait ended at `exec_timeout_ns`.
    pub offload_timeouts: u64,
    /// Operations that could not be awaited (negative `exec_status`).
    pub offload_errors: u64,
    /// Cross-loop submit hand-ins the driver has drained from the ring so far
    /// (cumulative, saturating): accepted by `xtc_batch_submit_mt` and taken
    /// into the group, whether they got a slot at once or were held. A
    /// hand-in still on the ring is not counted.
    pub mt_queued: u64,
    /// Refused cross-loop calls: every `xtc_batch_submit_mt` answered
    /// `XTC_E_AGAIN` or `XTC_E_RANGE`, and every `_cancel_mt`/`_resume_mt`
    /// answered `XTC_E_AGAIN` (B-177).
    pub mt_rejections: u64,
}

// SAFETY: repr(C); size and version first; every field is an integer, a raw
// pointer or an Option of a function pointer (all-zero valid); the first
// layout is the whole struct.
unsafe impl Descriptor for xtc_batch_opts_t {
    const SIZE_VER0: usize = size_of::<xtc_batch_opts_t>();
}

// SAFETY: as above; the first layout ends where `mt_queue_cap` (an integer,
// the only field past it) begins.
unsafe impl Descriptor for xtc_batch_async_opts_t {
    const SIZE_VER0: usize = offset_of!(xtc_batch_async_opts_t, mt_queue_cap);
}

// SAFETY: repr(C); size and version first; integer fields only.
unsafe impl Descriptor for xtc_batch_stats_t {
    const SIZE_VER0: usize = size_of::<xtc_batch_stats_t>();
}

// SAFETY: repr(C); size and version first; integer fields only; the first
// layout ends where `mt_queued` begins.
unsafe impl Descriptor for xtc_batch_async_stats_t {
    const SIZE_VER0: usize = offset_of!(xtc_batch_async_stats_t, mt_queued);
}

/// `Nosys` without the `sched-policy` feature (B-005).
fn gate() -> Result<(), Error> {
    if cfg!(feature = "sched-policy") {
        Ok(())
    } else {
        Err(Error::Nosys)
    }
}

/// The group behind a non-NULL pointer.
///
/// # Safety
/// `g` is NULL or a live group.
unsafe fn group<'a>(g: *const xtc_batch_t) -> Result<&'a xtc_batch_t, Error> {
    // SAFETY: caller contract.
    unsafe { g.as_ref() }.ok_or(Error::Inval)
}

/// The class an options descriptor names (a clone: the handle may be freed).
///
/// # Safety
/// `c` is NULL or a live class handle.
unsafe fn class_of(c: *const xtc_sched_class_t) -> Option<xtc::rt::SchedClass> {
    // SAFETY: caller contract.
    unsafe { c.as_ref() }.map(|c| c.class.clone())
}

/// Members of the largest vector, for the C views allocated with the group
/// (B-017); 0 for limits that create refuses anyway, so its `Inval` comes
/// first (B-010, B-011).
fn view_len(capacity: usize, max_active: usize, resource_capacity: u64) -> usize {
    if max_active <= capacity && resource_capacity > 0 {
        max_active
    } else {
        0
    }
}

/// Boxes a created group and writes it to `out` (checked non-NULL earlier).
///
/// # Safety
/// `out` is writable.
unsafe fn publish(
    out: *mut *mut xtc_batch_t,
    group: Group<CRequest>,
    remote: Option<Remote<CRequest>>,
    home: Home,
) -> Result<(), Error> {
    let b = Box::new(xtc_batch_t {
        group,
        remote,
        home,
    });
    // SAFETY: caller contract.
    unsafe { put(out, Box::into_raw(b)) }
}

/// `xtc_batch_create`: a synchronous group on `loop` (B-001..B-018).
///
/// Returns `XTC_OK` and writes `*out`; `XTC_E_NOSYS` in a disabled build;
/// `XTC_E_INVAL` for a NULL argument, a bad descriptor size (see
/// `docs/man/xtc_batch.3`, DESCRIPTORS), a NULL callback, `capacity <
/// max_active`, a zero limit, a foreign or taken class, or a loop of another
/// thread; `XTC_E_VERSION` for another descriptor version; `XTC_E_AGAIN`
/// once the loop has run (B-015); `XTC_E_RANGE` for storage arithmetic
/// overflow (B-018); `XTC_E_NOMEM` when the loop's budget refuses the
/// storage (nothing is published, B-017).
///
/// # Safety
/// `loop` is NULL or a live loop; `opts` is NULL or a descriptor of at
/// least its `size` bytes; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_create(
    r#loop: *mut xtc_loop_t,
    opts: *const xtc_batch_opts_t,
    out: *mut *mut xtc_batch_t,
) -> c_int {
    call(|| {
        gate()?;
        // SAFETY: caller contract.
        let lp = unsafe { xtc_loop_t::get(r#loop)? };
        // SAFETY: caller contract.
        let o = unsafe { read_in(opts)? };
        if out.is_null() {
            return Err(Error::Inval);
        }
        let (Some(step), Some(complete)) = (o.step, o.complete) else {
            return Err(Error::Inval); // B-009
        };
        let sync = SyncOpts {
            capacity: o.capacity,
            max_active: o.max_active,
            resource_capacity: o.resource_capacity,
            // SAFETY: caller contract (a live class handle or NULL).
            sched_class: unsafe { class_of(o.sched_class) },
        };
        let views = view_len(o.capacity, o.max_active, o.resource_capacity);
        let g = Group::create(
            &lp.lp,
            sync,
            CStep::new(step, o.user, views)?,
            CComplete::new(complete, o.user),
        )?;
        // SAFETY: out checked non-NULL above.
        unsafe { publish(out, g, None, lp.home.clone()) }
    })
}

/// `xtc_batch_create_async`: an asynchronous group whose iterations launch
/// one operation each through `submit` and end in `collect` (B-058..B-105);
/// `mt_queue_cap > 0` enables the `_mt` calls (B-107).
///
/// Returns as `xtc_batch_create`, plus `XTC_E_INVAL` for a negative
/// `exec_timeout_ns`.
///
/// # Safety
/// As `xtc_batch_create`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_create_async(
    r#loop: *mut xtc_loop_t,
    opts: *const xtc_batch_async_opts_t,
    out: *mut *mut xtc_batch_t,
) -> c_int {
    call(|| {
        gate()?;
        // SAFETY: caller contract.
        let lp = unsafe { xtc_loop_t::get(r#loop)? };
        // SAFETY: caller contract.
        let o = unsafe { read_in(opts)? };
        if out.is_null() {
            return Err(Error::Inval);
        }
        let (Some(submit), Some(collect), Some(complete)) = (o.submit, o.collect, o.complete)
        else {
            return Err(Error::Inval); // B-060
        };
        let ns = u64::try_from(o.exec_timeout_ns).map_err(|_| Error::Inval)?;
        let opts = AsyncOpts {
            capacity: o.capacity,
            max_active: o.max_active,
            resource_capacity: o.resource_capacity,
            exec_timeout: (ns > 0).then(|| Duration::from_nanos(ns)),
            // SAFETY: caller contract (a live class handle or NULL).
            sched_class: unsafe { class_of(o.sched_class) },
            mt_queue_cap: o.mt_queue_cap,
        };
        let views = view_len(o.capacity, o.max_active, o.resource_capacity);
        let g = Group::create_async(
            &lp.lp,
            opts,
            CAsync::new(submit, collect, o.cancel_hint, o.user, views)?,
            CComplete::new(complete, o.user),
        )?;
        let remote = if o.mt_queue_cap > 0 {
            Some(g.remote()?)
        } else {
            None
        };
        // SAFETY: out checked non-NULL above.
        unsafe { publish(out, g, remote, lp.home.clone()) }
    })
}

/// `xtc_batch_submit`: queues `request` with a fixed `charge` and writes its
/// handle (B-019..B-029). Owner loop only.
///
/// Returns `XTC_OK`; `XTC_E_INVAL` for a NULL group or `out_handle`, or a
/// call from another loop or thread; `XTC_E_DEADLK` during a callback of the
/// group; `XTC_E_RANGE` for a charge outside `1..resource_capacity` or
/// exhausted handles; `XTC_E_AGAIN` when full, closed, or while a cross-loop
/// hand-in is held. A failed submit calls no callback and leaves
/// `*out_handle` unchanged (B-025).
///
/// # Safety
/// `group` is NULL or a live group; `out_handle` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_submit(
    group: *mut xtc_batch_t,
    request: *mut c_void,
    charge: u64,
    out_handle: *mut u64,
) -> c_int {
    call(|| {
        gate()?;
        // SAFETY: caller contract.
        let g = unsafe { self::group(group)? };
        if out_handle.is_null() {
            return Err(Error::Inval);
        }
        g.home.owner()?;
        let h = g
            .group
            .submit(CRequest(request), charge)
            .map_err(|e| e.error)?;
        // SAFETY: checked non-NULL; caller contract.
        unsafe { put(out_handle, h.get()) }
    })
}

/// `xtc_batch_submit_mt`: hands `request` to the group from any loop or
/// thread and writes its handle at once, before admission (B-106..B-121).
///
/// Returns `XTC_OK`; `XTC_E_NOSYS` for a synchronous group or one created
/// with `mt_queue_cap == 0` (B-107); `XTC_E_INVAL` for a NULL group or
/// `out_handle`; `XTC_E_RANGE` for the charge or handle exhaustion;
/// `XTC_E_AGAIN` when the ring or record pool is full or the group was
/// closed (retry with a growing back-off, B-113, B-114).
///
/// # Safety
/// `group` is NULL or a live group that no thread destroys during the call
/// (B-146); `out_handle` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_submit_mt(
    group: *mut xtc_batch_t,
    request: *mut c_void,
    charge: u64,
    out_handle: *mut u64,
) -> c_int {
    call(|| {
        gate()?;
        // SAFETY: caller contract.
        let g = unsafe { self::group(group)? };
        if out_handle.is_null() {
            return Err(Error::Inval);
        }
        let r = g.remote.as_ref().ok_or(Error::Nosys)?;
        let h = r.submit(CRequest(request), charge).map_err(|e| e.error)?;
        // SAFETY: checked non-NULL; caller contract.
        unsafe { put(out_handle, h.get()) }
    })
}

/// A handle from its value; `Inval` for 0.
fn handle(h: u64) -> Result<Handle, Error> {
    Handle::new(h).ok_or(Error::Inval)
}

/// A control of one handle on the owner loop (`xtc_batch_cancel`,
/// `xtc_batch_resume`): the NOSYS gate, NULL, another loop or a callback
/// (`owner`), handle 0, then `op`.
///
/// # Safety
/// `group` is NULL or a live group.
unsafe fn owner_control(
    group: *mut xtc_batch_t,
    handle: u64,
    op: impl FnOnce(&Group<CRequest>, Handle) -> Result<(), Error>,
) -> c_int {
    call(|| {
        gate()?;
        // SAFETY: caller contract.
        let g = unsafe { self::group(group)? };
        g.home.owner()?;
        op(&g.group, self::handle(handle)?)
    })
}

/// A cross-loop control of one handle (`xtc_batch_cancel_mt`,
/// `xtc_batch_resume_mt`): the NOSYS gate, NULL, a group without
/// `mt_queue_cap` (`Nosys`), handle 0, then `op`.
///
/// # Safety
/// As `xtc_batch_submit_mt`.
unsafe fn mt_control(
    group: *mut xtc_batch_t,
    handle: u64,
    op: impl FnOnce(&Remote<CRequest>, Handle) -> Result<(), Error>,
) -> c_int {
    call(|| {
        gate()?;
        // SAFETY: caller contract.
        let g = unsafe { self::group(group)? };
        let r = g.remote.as_ref().ok_or(Error::Nosys)?;
        op(r, self::handle(handle)?)
    })
}

/// `xtc_batch_cancel`: records a cancel consumed at the next boundary
/// (B-047..B-053). Owner loop only.
///
/// Returns `XTC_OK` (also for a duplicate cancel, or after DONE was
/// recorded); `XTC_E_INVAL` for NULL, handle 0, a stale or foreign handle, or
/// another loop; `XTC_E_DEADLK` during a callback; `XTC_E_AGAIN` when the
/// handle is a cross-loop hand-in behind one still being written (retry).
///
/// # Safety
/// `group` is NULL or a live group.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_cancel(group: *mut xtc_batch_t, handle: u64) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe { owner_control(group, handle, |g, h| g.cancel(h)) }
}

/// `xtc_batch_cancel_mt`: a cancel from any loop or thread, drained at the
/// driver's next boundary, always after the handle's own submit (B-121,
/// B-122). A cancel for a completed handle is discarded (B-123).
///
/// Returns `XTC_OK`; `XTC_E_NOSYS` without `mt_queue_cap`; `XTC_E_INVAL`
/// for NULL, handle 0, a handle never issued by the group, or once the driver
/// has finished (B-143); `XTC_E_AGAIN` when the control pool is full.
///
/// # Safety
/// As `xtc_batch_submit_mt`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_cancel_mt(group: *mut xtc_batch_t, handle: u64) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe { mt_control(group, handle, |r, h| r.cancel(h)) }
}

/// `xtc_batch_resume`: BLOCKED to READY, keeping the charge (B-054..B-057).
/// Owner loop only.
///
/// Returns `XTC_OK` (also on READY); `XTC_E_INVAL` for NULL, handle 0, a
/// WAITING, terminal, stale or foreign handle, or another loop;
/// `XTC_E_DEADLK` during a callback.
///
/// # Safety
/// `group` is NULL or a live group.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_resume(group: *mut xtc_batch_t, handle: u64) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe { owner_control(group, handle, |g, h| g.resume(h)) }
}

/// `xtc_batch_resume_mt`: a resume from any loop or thread (B-122).
///
/// Returns as `xtc_batch_cancel_mt`.
///
/// # Safety
/// As `xtc_batch_submit_mt`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_resume_mt(group: *mut xtc_batch_t, handle: u64) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe { mt_control(group, handle, |r, h| r.resume(h)) }
}

/// `xtc_batch_close`: stops admission; `XTC_BATCH_CANCEL` also cancels every
/// nonterminal request. Idempotent; escalates DRAIN to CANCEL, never back;
/// always signals boundary work (B-131..B-135). From here on
/// `xtc_batch_submit_mt` returns `XTC_E_AGAIN` (B-141). Owner loop only.
///
/// Returns `XTC_OK`; `XTC_E_INVAL` for NULL, a mode other than
/// `XTC_BATCH_DRAIN`/`XTC_BATCH_CANCEL`, or another loop; `XTC_E_DEADLK`
/// during a callback.
///
/// # Safety
/// `group` is NULL or a live group.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_close(group: *mut xtc_batch_t, mode: CloseModeArg) -> c_int {
    call(|| {
        gate()?;
        // SAFETY: caller contract.
        let g = unsafe { self::group(group)? };
        let mode = close_mode(mode.0)?;
        g.home.owner()?;
        g.group.close(mode)
    })
}

/// `xtc_batch_destroy`: frees a closed group whose driver has ended
/// (B-147..B-150). Allowed on the owner loop's thread, or from any thread
/// after `xtc_exec_run` returned for a group of an executor loop (B-149).
///
/// Returns `XTC_OK` (the group is freed; the pointer is invalid from here);
/// `XTC_E_INVAL` for NULL or another thread; `XTC_E_DEADLK` during a
/// callback (B-042); `XTC_E_AGAIN` when the group is not closed or its
/// driver is still in the process table (B-138, B-183): nothing is freed.
///
/// # Safety
/// `group` is NULL or a live group; no other thread uses it during or after
/// the call (B-146).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_destroy(group: *mut xtc_batch_t) -> c_int {
    call(|| {
        gate()?;
        {
            // SAFETY: caller contract.
            let g = unsafe { self::group(group)? };
            g.home.owner_or_quiescent()?;
            g.group.destroy()?;
        }
        // SAFETY: made by Box::into_raw in `publish`; destroyed, and the
        // borrow above has ended.
        drop(unsafe { Box::from_raw(group) });
        Ok(())
    })
}

fn stats_of(s: Stats) -> xtc_batch_stats_t {
    xtc_batch_stats_t {
        size: 0,
        version: 0,
        queued: s.queued,
        ready: s.ready,
        blocked: s.blocked,
        reserved_units: s.reserved_units,
        iterations: s.iterations,
        completed: s.completed,
        cancelled: s.cancelled,
        failed: s.failed,
        rejections: s.rejections,
        max_vector: s.max_vector,
        total_members: s.total_members,
    }
}

fn async_stats_of(s: AsyncStats) -> xtc_batch_async_stats_t {
    xtc_batch_async_stats_t {
        size: 0,
        version: 0,
        offloads: s.offloads,
        offload_timeouts: s.offload_timeouts,
        offload_errors: s.offload_errors,
        mt_queued: s.mt_queued,
        mt_rejections: s.mt_rejections,
    }
}

/// `xtc_batch_get_stats`: a snapshot of committed state, allowed at any time
/// on the owner loop's thread, also inside callbacks (B-043, B-172..B-178),
/// and from any thread after `xtc_exec_run` returned (B-149).
///
/// Returns `XTC_OK`; `XTC_E_INVAL` for NULL, a bad `out->size`, or another
/// thread; `XTC_E_VERSION` for another `out->version`.
///
/// # Safety
/// `group` is NULL or a live group; `out` is NULL or a writable descriptor
/// of at least its `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_get_stats(
    group: *mut xtc_batch_t,
    out: *mut xtc_batch_stats_t,
) -> c_int {
    call(|| {
        gate()?;
        // SAFETY: caller contract.
        let g = unsafe { self::group(group)? };
        g.home.owner_or_quiescent()?;
        let s = stats_of(g.group.stats());
        // SAFETY: caller contract.
        unsafe { write_out(out, &s) }
    })
}

/// `xtc_batch_get_async_stats`: the asynchronous and cross-loop counters
/// (B-104, B-105), checked like `xtc_batch_get_stats`; zero on a synchronous
/// group.
///
/// # Safety
/// As `xtc_batch_get_stats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_get_async_stats(
    group: *mut xtc_batch_t,
    out: *mut xtc_batch_async_stats_t,
) -> c_int {
    call(|| {
        gate()?;
        // SAFETY: caller contract.
        let g = unsafe { self::group(group)? };
        g.home.owner_or_quiescent()?;
        let s = async_stats_of(g.group.async_stats());
        // SAFETY: caller contract.
        unsafe { write_out(out, &s) }
    })
}

/// The Rust device a C descriptor names; `Inval` for a name without a NUL in
/// its 32 bytes, that is not UTF-8, or an unknown kind.
fn device_of(d: &xtc_accel_dev_t) -> Result<Device, Error> {
    let name = crate::accel::c_str(&d.name).ok_or(Error::Inval)?;
    let kind = crate::accel::kind_of(d.kind).ok_or(Error::Inval)?;
    Ok(Device {
        name: name.to_owned(),
        kind,
        dev_path: match kind {
            NodeKind::Render => format!("/dev/dri/{name}").into(),
            NodeKind::Accel => format!("/dev/accel/{name}").into(),
        },
        driver: None,
        pci: None,
        numa_node: u32::try_from(d.numa_node).ok(),
        local_cpus: None,
        open_error: None,
        driver_source: None,
        notes: Vec::new(),
    })
}

/// `xtc_batch_loop_for_device`: the executor loop whose carrier runs on the
/// NUMA node of `dev` (as `xtc_accel_probe` read it from sysfs), or loop 0
/// when that cannot be decided (B-156..B-167). Writes an index in
/// `[0, xtc_exec_n_loops(exec))`.
///
/// Returns `XTC_OK`; `XTC_E_INVAL` for a NULL argument, or a device whose
/// name is no render/accel node label of its kind (B-166); `XTC_E_NOSYS` in
/// a disabled build, which still writes 0 (B-159).
///
/// # Safety
/// `exec` is NULL or a live executor; `dev` is NULL or readable;
/// `out_loop_idx` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_loop_for_device(
    exec: *mut xtc_exec_t,
    dev: *const xtc_accel_dev_t,
    out_loop_idx: *mut c_int,
) -> c_int {
    call(|| {
        if gate().is_err() {
            if !out_loop_idx.is_null() {
                // SAFETY: non-NULL; caller contract (B-159: still writes 0).
                unsafe { out_loop_idx.write(0) };
            }
            return Err(Error::Nosys);
        }
        // SAFETY: caller contract.
        let (e, d) = unsafe { (exec.as_ref(), dev.as_ref()) };
        let (Some(e), Some(d)) = (e, d) else {
            return Err(Error::Inval);
        };
        if out_loop_idx.is_null() {
            return Err(Error::Inval);
        }
        let idx = batch::loop_for(&e.nodes, &device_of(d)?)?;
        let idx = c_int::try_from(idx).map_err(|_| Error::Range)?;
        // SAFETY: checked non-NULL; caller contract.
        unsafe { put(out_loop_idx, idx) }
    })
}

/// `xtc_batch_router_create`: a router over `groups[0..n)` (B-168..B-171).
/// Copies the pointer array: it borrows the groups and never owns them.
///
/// Returns `XTC_OK` and writes `*out`; `XTC_E_INVAL` for a NULL array or
/// `out`, `n <= 0`, or a NULL group in the array; `XTC_E_NOMEM` when the
/// copy cannot be allocated; `XTC_E_NOSYS` in a disabled build.
///
/// # Safety
/// `groups` is NULL or points to `n` readable pointers; `out` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_router_create(
    groups: *mut *mut xtc_batch_t,
    n: c_int,
    out: *mut *mut xtc_batch_router_t,
) -> c_int {
    call(|| {
        gate()?;
        let n = usize::try_from(n).map_err(|_| Error::Inval)?;
        if groups.is_null() || out.is_null() || n == 0 {
            return Err(Error::Inval);
        }
        // SAFETY: n readable pointers at `groups` (caller contract).
        let src = unsafe { std::slice::from_raw_parts(groups, n) };
        if src.iter().any(|g| g.is_null()) {
            return Err(Error::Inval);
        }
        let mut copy = Vec::new();
        copy.try_reserve_exact(n).map_err(|_| Error::Nomem)?;
        copy.extend_from_slice(src);
        let router = Router::new(copy)?;
        let b = Box::new(xtc_batch_router_t { router });
        // SAFETY: checked non-NULL; caller contract.
        unsafe { put(out, Box::into_raw(b)) }
    })
}

/// `xtc_batch_router_destroy`: frees the router only, never a group
/// (B-171). NULL is ignored.
///
/// # Safety
/// `router` is NULL or a live router; invalid afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_router_destroy(router: *mut xtc_batch_router_t) {
    crate::boundary::call_void(|| {
        if !router.is_null() {
            // SAFETY: from Box::into_raw in xtc_batch_router_create.
            drop(unsafe { Box::from_raw(router) });
        }
    });
}

/// `xtc_batch_route`: `groups[key % n]`, the same group for the same key
/// (B-169); NULL for a NULL router. Read-only: any thread.
///
/// # Safety
/// `router` is NULL or a live router.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_batch_route(
    router: *mut xtc_batch_router_t,
    key: u64,
) -> *mut xtc_batch_t {
    // SAFETY: caller contract.
    match unsafe { router.as_ref() } {
        Some(r) => *r.router.route(key),
        None => std::ptr::null_mut(),
    }
}
