//! Adapters from the application's C callbacks to the engine's [`Step`],
//! [`AsyncStep`] and [`Complete`], and the C views of a ready vector
//! (`xtc_batch_item_t`, `xtc_batch_result_t`) and of an operation
//! (`xtc_batch_exec_t`).
//!
//! The item and result arrays handed to C are buffers owned by the adapter
//! and reused across iterations, allocated at create for the largest vector
//! (`max_active` members): iterations never allocate them (B-017).

use std::ffi::c_void;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::os::raw::c_int;
use std::rc::Rc;

use xtc::batch::{AsyncStep, Complete, Exec, ExecStatus, Handle, Item, Step, StepResult};
use xtc::{Error, Result, rt};

use crate::codes::{
    XTC_OK, code, error_of, exec_status, ret_of, step_result, xtc_batch_exec_kind, xtc_batch_state,
};
use crate::rt::{SendPtr, xtc_future_t};

/// A submitted request: the application's pointer, borrowed (B-007, B-026).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CRequest(pub(crate) *mut c_void);

// SAFETY: the engine never dereferences the pointer; it stores it and hands it
// back to the group's callbacks on the driver loop. `xtc_batch_submit_mt`
// moves it from the producer's thread to the driver's: that its pointee may
// be used there is the application's side of the cross-loop contract (the
// request carries whatever outbound state it needs, B-127).
unsafe impl Send for CRequest {}

/// One member of a ready vector: its handle and the request pointer the
/// application submitted (B-032).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xtc_batch_item_t {
    /// The member's handle, as `xtc_batch_submit` returned it.
    pub handle: u64,
    /// The request pointer the application submitted (may be NULL, B-026).
    pub request: *mut c_void,
}

/// The result word of one member (B-033..B-036): `state` is one of
/// `XTC_BATCH_UNSET` (as the engine writes it before each step or collect),
/// `XTC_BATCH_CONTINUE`, `XTC_BATCH_DONE`, `XTC_BATCH_BLOCKED` or
/// `XTC_BATCH_ERROR`; `error` is read only for `XTC_BATCH_ERROR` and must
/// then be an existing nonzero `XTC_E_*` code.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xtc_batch_result_t {
    /// `enum xtc_batch_state` value.
    pub state: c_int,
    /// `XTC_E_*` code for `XTC_BATCH_ERROR`; ignored otherwise.
    pub error: c_int,
}

const UNSET: xtc_batch_result_t = xtc_batch_result_t {
    state: xtc_batch_state::XTC_BATCH_UNSET as c_int,
    error: XTC_OK,
};

/// How the operation `submit` launched is awaited (B-065..B-079). The
/// engine zeroes it (`fence_fd` -1) before each `submit`; `submit` sets
/// `kind` and the field that kind reads.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xtc_batch_exec_t {
    /// `enum xtc_batch_exec_kind` value; anything else is an unknown kind
    /// (`collect` gets `exec_status == XTC_E_INVAL`).
    pub kind: c_int,
    /// FENCE: a pollable fd the application owns and keeps open until
    /// `collect` returns; the engine never dups or closes it. A negative fd
    /// is `XTC_E_INVAL` as `exec_status`.
    pub fence_fd: c_int,
    /// FUTURE: the read half of `xtc_future_new_pair`; the engine consumes it
    /// (NULL is `XTC_E_INVAL` as `exec_status`).
    pub future: *mut xtc_future_t,
    /// BLOCKING: run as `run(arg)` on the blocking pool; its return value
    /// (`XTC_OK` or an `XTC_E_*` code) is the operation's status.
    pub run: Option<unsafe extern "C" fn(arg: *mut c_void) -> c_int>,
    /// BLOCKING: the argument of `run`.
    pub arg: *mut c_void,
}

/// The `step` callback (B-030, B-031): called once per iteration with the
/// whole ready vector; returns `XTC_OK` or an `XTC_E_*` code that fails the
/// vector (B-037). Mandatory in `xtc_batch_opts_t` (NULL is `XTC_E_INVAL`).
pub type xtc_batch_step_fn = Option<
    unsafe extern "C" fn(
        items: *const xtc_batch_item_t,
        results: *mut xtc_batch_result_t,
        count: usize,
        user: *mut c_void,
    ) -> c_int,
>;

/// The terminal callback (B-039): exactly once per accepted submit, with
/// `XTC_OK`, `XTC_E_ABORTED` or the recorded failure. Mandatory.
pub type xtc_batch_complete_fn = Option<
    unsafe extern "C" fn(handle: u64, request: *mut c_void, outcome: c_int, user: *mut c_void),
>;

/// The asynchronous `submit` callback (B-063..B-065, B-080): launches one
/// operation for the vector and describes it in `*out_exec`. Mandatory.
pub type xtc_batch_submit_fn = Option<
    unsafe extern "C" fn(
        items: *const xtc_batch_item_t,
        count: usize,
        user: *mut c_void,
        out_exec: *mut xtc_batch_exec_t,
    ) -> c_int,
>;

/// The asynchronous `collect` callback (B-081..B-090): the same frozen
/// vector, fresh result words and the raw `exec_status`. Mandatory.
pub type xtc_batch_collect_fn = Option<
    unsafe extern "C" fn(
        items: *const xtc_batch_item_t,
        results: *mut xtc_batch_result_t,
        count: usize,
        exec_status: c_int,
        user: *mut c_void,
    ) -> c_int,
>;

/// The optional `cancel_hint` callback (B-094): fires on the driver once
/// per in-flight member whose cancel it observes.
pub type xtc_batch_cancel_hint_fn = Option<unsafe extern "C" fn(handle: u64, user: *mut c_void)>;

/// The non-NULL function of a callback type.
pub(crate) type Fn<T> = <T as Unwrap>::F;

/// `Option<fn>` -> `fn`, for the callback types.
pub(crate) trait Unwrap {
    type F;
}

impl<F> Unwrap for Option<F> {
    type F = F;
}

/// The C view of a vector, rebuilt in place each iteration.
struct Views {
    items: Vec<xtc_batch_item_t>,
    results: Vec<xtc_batch_result_t>,
}

/// An empty vector with room for `n` elements, allocated now.
///
/// # Errors
/// `Range` when `n` elements cannot be addressed (B-018); `Nomem` when the
/// allocation fails.
fn reserved<T>(n: usize) -> Result<Vec<T>> {
    let bytes = n.checked_mul(size_of::<T>()).ok_or(Error::Range)?;
    if bytes > isize::MAX as usize {
        return Err(Error::Range);
    }
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::Nomem)?;
    Ok(v)
}

impl Views {
    /// Views with room for the largest vector, `max_active` members,
    /// allocated at create like the rest of the group's storage: an
    /// iteration never allocates them (B-017).
    fn with_capacity(max_active: usize) -> Result<Views> {
        Ok(Views {
            items: reserved(max_active)?,
            results: reserved(max_active)?,
        })
    }

    fn load(&mut self, items: &[Item<'_, CRequest>]) {
        self.items.clear();
        self.items.extend(items.iter().map(|it| xtc_batch_item_t {
            handle: it.handle.get(),
            request: it.request.0,
        }));
        self.results.clear();
        self.results.resize(items.len(), UNSET);
    }

    fn store(&self, out: &mut [StepResult]) {
        for (o, r) in out.iter_mut().zip(&self.results) {
            *o = step_result(r.state, r.error);
        }
    }
}

/// A synchronous group's step: one C call per ready vector (B-002).
pub(crate) struct CStep {
    step: Fn<xtc_batch_step_fn>,
    user: *mut c_void,
    views: Views,
}

impl CStep {
    /// The adapter of a group whose vectors hold at most `max_active` members.
    ///
    /// # Errors
    /// As [`Views::with_capacity`].
    pub(crate) fn new(
        step: Fn<xtc_batch_step_fn>,
        user: *mut c_void,
        max_active: usize,
    ) -> Result<CStep> {
        Ok(CStep {
            step,
            user,
            views: Views::with_capacity(max_active)?,
        })
    }
}

impl Step<CRequest> for CStep {
    async fn step(
        &mut self,
        items: &mut [Item<'_, CRequest>],
        results: &mut [StepResult],
    ) -> Result<()> {
        self.views.load(items);
        let v = &mut self.views;
        // SAFETY: the application's step (non-NULL, checked at create) with
        // arrays of `count` elements that live for the call (B-030).
        let rc = unsafe {
            (self.step)(
                v.items.as_ptr(),
                v.results.as_mut_ptr(),
                v.items.len(),
                self.user,
            )
        };
        v.store(results);
        ret_of(rc)
    }
}

/// The terminal callback (B-039): handle, request, `XTC_OK` or the code.
pub(crate) struct CComplete {
    complete: Fn<xtc_batch_complete_fn>,
    user: *mut c_void,
}

impl CComplete {
    pub(crate) fn new(complete: Fn<xtc_batch_complete_fn>, user: *mut c_void) -> CComplete {
        CComplete { complete, user }
    }
}

impl Complete<CRequest> for CComplete {
    async fn complete(&mut self, handle: Handle, request: CRequest, outcome: Result<()>) {
        let outcome = match outcome {
            Ok(()) => XTC_OK,
            Err(e) => code(e),
        };
        // SAFETY: the application's complete callback (non-NULL, checked at
        // create) with the request pointer it submitted (B-039).
        unsafe { (self.complete)(handle.get(), request.0, outcome, self.user) };
    }
}

/// The application's fence fd, borrowed for a FENCE wait (B-066, B-067).
struct AppFd(RawFd);

impl AsFd for AppFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd is not negative (checked in `exec_of`) and, by the
        // manual page's FENCE contract, the application owns it and keeps it
        // open until `collect` returns; the engine holds this value only
        // until then and never closes it.
        unsafe { BorrowedFd::borrow_raw(self.0) }
    }
}

/// The shim between the C fence fd and the engine's `Exec::Fence`: the
/// engine holds this `Rc` for the wait and drops it after `collect` returns.
fn fence(fd: Rc<dyn AsFd>) -> Exec {
    Exec::Fence(fd)
}

/// An operation the engine cannot await: a wait that fails at once with `e`,
/// reported to collect as that negative status and counted in
/// `offload_errors` (B-085, B-086).
fn failed(e: Error) -> Exec {
    let (f, p) = rt::future_pair::<()>();
    p.set(Err(e));
    Exec::Future(f)
}

/// The engine's operation for a descriptor `submit` filled (B-065..B-079).
///
/// # Safety
/// A FUTURE descriptor's non-NULL `future` is a live `xtc_future_t` the
/// application hands over (it is consumed here).
unsafe fn exec_of(x: &xtc_batch_exec_t) -> Exec {
    use xtc_batch_exec_kind::*;
    match x.kind {
        k if k == XTC_BATCH_EXEC_INLINE as c_int => Exec::Inline,
        k if k == XTC_BATCH_EXEC_FENCE as c_int => {
            if x.fence_fd < 0 {
                failed(Error::Inval)
            } else {
                fence(Rc::new(AppFd(x.fence_fd)))
            }
        }
        k if k == XTC_BATCH_EXEC_FUTURE as c_int => {
            if x.future.is_null() {
                failed(Error::Inval)
            } else {
                // SAFETY: a live future from xtc_future_new_pair, handed over
                // (B-072: the engine consumes it exactly once).
                let b = unsafe { Box::from_raw(x.future) };
                Exec::Future(b.f)
            }
        }
        k if k == XTC_BATCH_EXEC_BLOCKING as c_int => match x.run {
            None => failed(Error::Inval),
            Some(run) => {
                let arg = SendPtr(x.arg);
                Exec::Blocking(Box::new(move || {
                    let arg = arg;
                    // SAFETY: the application's closure on a pool thread with
                    // its own arg (B-078).
                    let rc = unsafe { run(arg.0) };
                    if rc == XTC_OK {
                        Ok(())
                    } else {
                        Err(error_of(rc))
                    }
                }))
            }
        },
        _ => failed(Error::Inval), // unknown exec kind (B-085)
    }
}

/// An asynchronous group's submit / collect / cancel_hint (B-058..B-098).
pub(crate) struct CAsync {
    submit: Fn<xtc_batch_submit_fn>,
    collect: Fn<xtc_batch_collect_fn>,
    cancel_hint: xtc_batch_cancel_hint_fn,
    user: *mut c_void,
    views: Views,
}

impl CAsync {
    /// The adapter of a group whose vectors hold at most `max_active` members.
    ///
    /// # Errors
    /// As [`Views::with_capacity`].
    pub(crate) fn new(
        submit: Fn<xtc_batch_submit_fn>,
        collect: Fn<xtc_batch_collect_fn>,
        cancel_hint: xtc_batch_cancel_hint_fn,
        user: *mut c_void,
        max_active: usize,
    ) -> Result<CAsync> {
        Ok(CAsync {
            submit,
            collect,
            cancel_hint,
            user,
            views: Views::with_capacity(max_active)?,
        })
    }
}

impl AsyncStep<CRequest> for CAsync {
    async fn submit(&mut self, items: &mut [Item<'_, CRequest>]) -> Result<Exec> {
        self.views.load(items);
        let mut x = xtc_batch_exec_t {
            kind: 0,
            fence_fd: -1,
            future: std::ptr::null_mut(),
            run: None,
            arg: std::ptr::null_mut(),
        };
        let v = &self.views;
        // SAFETY: the application's submit (non-NULL, checked at create) with
        // `count` items and a descriptor that live for the call (B-063).
        let rc = unsafe { (self.submit)(v.items.as_ptr(), v.items.len(), self.user, &mut x) };
        if rc != XTC_OK {
            // No operation is outstanding (B-080). A future it may have put
            // in the descriptor is not consumed: the application keeps it.
            return Err(error_of(rc));
        }
        // SAFETY: on success the descriptor hands over what its kind names.
        Ok(unsafe { exec_of(&x) })
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, CRequest>],
        results: &mut [StepResult],
        status: ExecStatus,
    ) -> Result<()> {
        self.views.load(items);
        let v = &mut self.views;
        // SAFETY: the application's collect (non-NULL, checked at create)
        // with the same frozen vector and fresh result words (B-082).
        let rc = unsafe {
            (self.collect)(
                v.items.as_ptr(),
                v.results.as_mut_ptr(),
                v.items.len(),
                exec_status(status),
                self.user,
            )
        };
        v.store(results);
        ret_of(rc)
    }

    async fn cancel_hint(&mut self, handle: Handle) {
        if let Some(hint) = self.cancel_hint {
            // SAFETY: the application's optional hint (B-094).
            unsafe { hint(handle.get(), self.user) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn step(
        _: *const xtc_batch_item_t,
        _: *mut xtc_batch_result_t,
        _: usize,
        _: *mut c_void,
    ) -> c_int {
        XTC_OK
    }

    /// B-017: the C views of the largest vector are allocated when the
    /// adapter is made (at create, before the driver is published); loading
    /// a vector of `max_active` members moves nothing. They used to start
    /// empty and grow on the driver during the first iterations.
    #[test]
    fn views_are_allocated_at_create_for_the_largest_vector() {
        let s = CStep::new(step, std::ptr::null_mut(), 64).unwrap();
        let mut v = s.views;
        assert!(v.items.capacity() >= 64 && v.results.capacity() >= 64);
        let (pi, pr) = (v.items.as_ptr(), v.results.as_ptr());
        let mut reqs: Vec<CRequest> = (0..64).map(|_| CRequest(std::ptr::null_mut())).collect();
        let items: Vec<Item<'_, CRequest>> = reqs
            .iter_mut()
            .enumerate()
            .map(|(i, r)| Item {
                handle: Handle::new(i as u64 + 1).unwrap(),
                request: r,
            })
            .collect();
        v.load(&items);
        assert_eq!((v.items.as_ptr(), v.results.as_ptr()), (pi, pr));
        assert_eq!(v.items.len(), 64);
    }

    /// B-018: a `max_active` whose views cannot be addressed is `Range`,
    /// before anything is allocated.
    #[test]
    fn views_too_large_to_address_are_range() {
        let r = CStep::new(step, std::ptr::null_mut(), usize::MAX / 4);
        assert!(matches!(r, Err(Error::Range)));
        assert_eq!(
            reserved::<xtc_batch_item_t>(usize::MAX / 8).err(),
            Some(Error::Range)
        );
    }
}
