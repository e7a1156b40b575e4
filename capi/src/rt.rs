//! The minimal runtime calls a C program needs to run a group: loops
//! (`xtc_loop_t`), the executor (`xtc_exec_t`), scheduling classes
//! (`xtc_sched_class_t`), future/promise pairs (`xtc_future_t`,
//! `xtc_promise_t`), the blocking pool (`xtc_blocking_run`), and
//! `xtc_loop_await`, the one way C code runs as an ordinary process of a loop
//! (where group mutators are allowed once the loop runs, B-128, B-129).
//!
//! Each wraps the Rust type of `xtc::rt` named in the crate's API table
//! (`docs/man/xtc_batch.3`, section RUNTIME CALLS).

use std::cell::Cell;
use std::ffi::c_void;
use std::os::raw::c_int;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use xtc::Error;
use xtc::rt::{self, Executor, Loop, SchedClass};

use crate::boundary::{Home, call, call_void};
use crate::codes::{XTC_E_INVAL, XTC_OK, code, error_of};

/// An application pointer handed to another thread (a blocking closure's
/// `arg`, an executor setup's `arg`).
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub(crate) *mut c_void);

// SAFETY: the library never dereferences the pointer; it only hands it back
// to the application's own function on the thread the manual page names
// (a blocking-pool thread, a carrier). That the pointee may be used there is
// the application's promise when it passes the pointer.
unsafe impl Send for SendPtr {}

/// A loop (`xtc_loop_t`): a single-threaded executor of processes, used on
/// the thread that created it (a carrier's loop on its carrier).
pub struct xtc_loop_t {
    pub(crate) lp: Loop,
    pub(crate) home: Home,
    /// Made by `xtc_loop_new` (the application frees it with
    /// `xtc_loop_fini`); `false` for the borrowed loop an executor setup
    /// callback gets.
    owned: bool,
}

impl xtc_loop_t {
    /// The loop behind a non-NULL pointer, on its own thread.
    ///
    /// # Safety
    /// `p` is NULL or a live `xtc_loop_t` (from `xtc_loop_new` and not
    /// finalized, or the one a setup callback is running with).
    pub(crate) unsafe fn get<'a>(p: *const xtc_loop_t) -> Result<&'a xtc_loop_t, Error> {
        // SAFETY: caller contract.
        let w = unsafe { p.as_ref() }.ok_or(Error::Inval)?;
        w.home.owner()?;
        Ok(w)
    }
}

/// A scheduling class of one loop (`xtc_sched_class_t`, B-012, B-013).
pub struct xtc_sched_class_t {
    pub(crate) class: SchedClass,
}

/// N loops on N carrier threads (`xtc_exec_t`). Its calls are externally
/// serialized (B-016); a call made while another is in progress (e.g.
/// `xtc_exec_run` from a setup callback) is `XTC_E_DEADLK`.
pub struct xtc_exec_t {
    exec: Mutex<Option<Executor>>,
    /// Facts fixed when the carriers started (placement reads them).
    pub(crate) nodes: LoopNodesSnapshot,
    /// Set once `xtc_exec_run` joined the carriers (B-149).
    done: Arc<AtomicBool>,
}

/// The executor's loop nodes, read once at `xtc_exec_new` (they never change:
/// a carrier records its node when it starts).
#[derive(Debug, Clone)]
pub(crate) struct LoopNodesSnapshot {
    nodes: Vec<Option<u32>>,
    host_nodes: usize,
}

impl xtc::batch::LoopNodes for LoopNodesSnapshot {
    fn n_loops(&self) -> usize {
        self.nodes.len()
    }
    fn loop_node(&self, idx: usize) -> Option<u32> {
        self.nodes.get(idx).copied().flatten()
    }
    fn host_nodes(&self) -> usize {
        self.host_nodes
    }
}

/// The read half of a future/promise pair (`xtc_future_t`): handed to the
/// engine in an exec descriptor (FUTURE), to `xtc_loop_await`, or dropped.
pub struct xtc_future_t {
    pub(crate) f: rt::Future<()>,
}

/// The write half (`xtc_promise_t`): set from any thread with
/// `xtc_promise_set`, or dropped (the future then sees `XTC_E_ABORTED`).
pub struct xtc_promise_t {
    p: rt::Promise<()>,
}

/// Writes `v` through a non-NULL out pointer.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
pub(crate) unsafe fn put<T>(out: *mut T, v: T) -> Result<(), Error> {
    if out.is_null() {
        return Err(Error::Inval);
    }
    // SAFETY: non-NULL and writable (caller contract).
    unsafe { out.write(v) };
    Ok(())
}

/// Boxes `v` and writes the pointer through `out` (checked non-NULL first).
///
/// # Safety
/// As [`put`].
unsafe fn put_box<T>(out: *mut *mut T, v: T) -> Result<(), Error> {
    if out.is_null() {
        return Err(Error::Inval);
    }
    // SAFETY: checked above; caller contract.
    unsafe { put(out, Box::into_raw(Box::new(v))) }
}

/// `xtc_loop_new`: a loop on the calling thread, with an unlimited resource
/// accountant. Writes it to `*out`.
///
/// Returns `XTC_OK`; `XTC_E_INVAL` for a NULL `out`; `XTC_E_INTERNAL` when the
/// kernel refuses the loop's epoll instance or eventfd.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_loop_new(out: *mut *mut xtc_loop_t) -> c_int {
    // SAFETY: forwarded caller contract.
    unsafe { xtc_loop_new_budget(u64::MAX, out) }
}

/// `xtc_loop_new_budget`: as `xtc_loop_new`, with a resource accountant that
/// allows `bytes` (a group's storage, ring and processes are charged to it
/// at create; a create the budget refuses is `XTC_E_NOMEM`, B-185).
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_loop_new_budget(bytes: u64, out: *mut *mut xtc_loop_t) -> c_int {
    call(|| {
        if out.is_null() {
            return Err(Error::Inval);
        }
        let lp = Loop::with_budget(bytes)?;
        let w = xtc_loop_t {
            lp,
            home: Home::here(),
            owned: true,
        };
        // SAFETY: checked non-NULL; caller contract.
        unsafe { put_box(out, w) }
    })
}

/// `xtc_loop_run`: runs the loop on the calling thread until no process
/// remains (every group's driver has ended, every `xtc_loop_await` has
/// fired). A group that was never closed keeps it running (B-136).
///
/// Returns `XTC_OK`; `XTC_E_INVAL` for NULL, a loop of another thread, a
/// carrier's loop (the executor runs those), or a call from inside a running
/// loop; `XTC_E_INTERNAL` if `epoll_wait` fails or the library panicked.
///
/// # Safety
/// `loop` is NULL or a live loop.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_loop_run(r#loop: *mut xtc_loop_t) -> c_int {
    call(|| {
        // SAFETY: caller contract.
        let w = unsafe { xtc_loop_t::get(r#loop)? };
        if !w.owned {
            return Err(Error::Inval);
        }
        // A clone: a callback may finalize the wrapper while the loop runs
        // (refused, but the wrapper must not be borrowed across the run).
        let lp = w.lp.clone();
        lp.run()
    })
}

/// `xtc_loop_fini`: frees a loop made by `xtc_loop_new`. Call it after every
/// group of the loop was destroyed (B-136); finalizing with a live group
/// violates the lifetime contract and delivers nothing (B-151).
///
/// Returns `XTC_OK`; `XTC_E_INVAL` for NULL, a loop of another thread, a
/// carrier's loop, or a call from inside a running loop (nothing is freed).
///
/// # Safety
/// `loop` is NULL or a live loop; it is invalid after `XTC_OK`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_loop_fini(r#loop: *mut xtc_loop_t) -> c_int {
    call(|| {
        // SAFETY: caller contract.
        let w = unsafe { xtc_loop_t::get(r#loop)? };
        if !w.owned || Loop::current().is_some() {
            return Err(Error::Inval);
        }
        // SAFETY: made by Box::into_raw in xtc_loop_new_budget, checked live
        // and owned; no borrow of it remains.
        drop(unsafe { Box::from_raw(r#loop) });
        Ok(())
    })
}

/// `xtc_loop_await`: spawns an ordinary process on `loop` that parks until
/// `future` resolves, then calls `callback(status, arg)` on the loop with
/// `XTC_OK`, the code the promise was set with, or `XTC_E_ABORTED` when the
/// promise was dropped. The future is consumed on `XTC_OK`.
///
/// The callback runs as a process of the owner loop, not as a group
/// callback, so `xtc_batch_submit`, `_cancel`, `_resume`, `_close` and
/// `_destroy` are allowed there after the loop started (B-128, B-129): this
/// is how a thread that is not the loop's asks it to close a group (resolve
/// the promise), and how a cross-loop submitter awaits a reply future on its
/// own loop (B-126). The pending process keeps `xtc_loop_run` running.
///
/// Returns `XTC_OK`; `XTC_E_INVAL` for a NULL argument or a loop of another
/// thread; `XTC_E_AGAIN` while the loop is stopped; `XTC_E_NOMEM` when its
/// budget refuses the process. On error the future stays the caller's.
///
/// # Safety
/// `loop` is NULL or a live loop; `future` is NULL or a live future the caller
/// owns; `callback` is callable with `arg` on the loop's thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_loop_await(
    r#loop: *mut xtc_loop_t,
    future: *mut xtc_future_t,
    callback: Option<unsafe extern "C" fn(status: c_int, arg: *mut c_void)>,
    arg: *mut c_void,
) -> c_int {
    call(|| {
        // SAFETY: caller contract.
        let w = unsafe { xtc_loop_t::get(r#loop)? };
        let Some(cb) = callback else {
            return Err(Error::Inval);
        };
        if future.is_null() {
            return Err(Error::Inval);
        }
        // SAFETY: a live future from xtc_future_new_pair (Box::into_raw),
        // owned by the caller; on error it is put back at the same address.
        let boxed = unsafe { Box::from_raw(future) };
        let slot = Rc::new(Cell::new(Some(boxed)));
        let mine = slot.clone();
        let spawned = w.lp.spawn(async move {
            let Some(f) = mine.take() else { return };
            let status = match f.f.await {
                Ok(()) => XTC_OK,
                Err(e) => code(e),
            };
            // SAFETY: the application's callback, called on the loop's
            // thread with the arg it supplied (caller contract).
            unsafe { cb(status, arg) };
        });
        match spawned {
            Ok(_) => Ok(()),
            Err(e) => {
                // The process (and its clone of the slot) is gone: the box
                // goes back to the caller, at its original address.
                if let Some(b) = slot.take() {
                    let _ = Box::into_raw(b);
                }
                Err(e)
            }
        }
    })
}

/// `xtc_sched_class_new`: a scheduling class of `loop` with relative `weight`
/// (>= 1), for `sched_class` in a group's options (B-012). The class lives
/// as long as the loop; free the handle with `xtc_sched_class_free`.
///
/// Returns `XTC_OK`; `XTC_E_INVAL` for NULL, a loop of another thread or
/// weight 0; `XTC_E_NOMEM` when the loop's budget refuses it.
///
/// # Safety
/// `loop` is NULL or a live loop; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_sched_class_new(
    r#loop: *mut xtc_loop_t,
    weight: u32,
    out: *mut *mut xtc_sched_class_t,
) -> c_int {
    call(|| {
        // SAFETY: caller contract.
        let w = unsafe { xtc_loop_t::get(r#loop)? };
        if out.is_null() {
            return Err(Error::Inval);
        }
        let class = w.lp.new_class(weight)?;
        // SAFETY: checked non-NULL; caller contract.
        unsafe { put_box(out, xtc_sched_class_t { class }) }
    })
}

/// `xtc_sched_class_free`: frees a class handle (the class itself, and a
/// group registration on it, are unaffected). NULL is ignored.
///
/// # Safety
/// `sched_class` is NULL or a live handle from `xtc_sched_class_new`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_sched_class_free(sched_class: *mut xtc_sched_class_t) {
    call_void(|| {
        if !sched_class.is_null() {
            // SAFETY: from Box::into_raw in xtc_sched_class_new (caller contract).
            drop(unsafe { Box::from_raw(sched_class) });
        }
    });
}

/// `xtc_exec_new`: starts `n_loops` carrier threads, each with a loop, on the
/// host topology; each carrier records its NUMA node when it starts (used by
/// `xtc_batch_loop_for_device`).
///
/// Returns `XTC_OK`; `XTC_E_INVAL` for 0 loops, more than `INT_MAX`, or NULL
/// `out`; `XTC_E_INTERNAL` when a thread or loop cannot be created.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_exec_new(n_loops: usize, out: *mut *mut xtc_exec_t) -> c_int {
    call(|| {
        if out.is_null() || c_int::try_from(n_loops).is_err() {
            return Err(Error::Inval);
        }
        let exec = Executor::new(n_loops)?;
        let nodes = LoopNodesSnapshot {
            nodes: (0..exec.n_loops()).map(|i| exec.loop_node(i)).collect(),
            host_nodes: exec.host_nodes(),
        };
        let w = xtc_exec_t {
            exec: Mutex::new(Some(exec)),
            nodes,
            done: Arc::new(AtomicBool::new(false)),
        };
        // SAFETY: checked non-NULL; caller contract.
        unsafe { put_box(out, w) }
    })
}

/// `xtc_exec_n_loops`: the number of loops, or `XTC_E_INVAL` for NULL.
///
/// # Safety
/// `exec` is NULL or a live executor.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_exec_n_loops(exec: *const xtc_exec_t) -> c_int {
    let mut n = XTC_E_INVAL;
    let rc = call(|| {
        // SAFETY: caller contract.
        let e = unsafe { exec.as_ref() }.ok_or(Error::Inval)?;
        n = c_int::try_from(e.nodes.nodes.len()).map_err(|_| Error::Range)?;
        Ok(())
    });
    if rc == XTC_OK { n } else { rc }
}

/// `xtc_exec_setup`: runs `callback(loop, arg)` on loop `idx`'s carrier thread and
/// waits for it to return: the externally serialized setup before the first
/// run (B-015, B-016). `loop` is valid during the call only; create groups
/// on it (they belong to that carrier thread), submit to them, close them,
/// and register `xtc_loop_await` callbacks.
///
/// Returns `XTC_OK`; `XTC_E_INVAL` for NULL, `idx` out of range, or an
/// executor that has run; `XTC_E_DEADLK` when called while another call on
/// the same executor is in progress (from a setup callback);
/// `XTC_E_INTERNAL` when the carrier is lost.
///
/// # Safety
/// `exec` is NULL or a live executor; `callback` is callable with `arg` on the
/// carrier thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_exec_setup(
    exec: *mut xtc_exec_t,
    idx: c_int,
    callback: Option<unsafe extern "C" fn(r#loop: *mut xtc_loop_t, arg: *mut c_void)>,
    arg: *mut c_void,
) -> c_int {
    call(|| {
        // SAFETY: caller contract.
        let e = unsafe { exec.as_ref() }.ok_or(Error::Inval)?;
        let cb = callback.ok_or(Error::Inval)?;
        let idx = usize::try_from(idx).map_err(|_| Error::Inval)?;
        let guard = e.exec.try_lock().map_err(|_| Error::Deadlk)?;
        let ex = guard.as_ref().ok_or(Error::Inval)?;
        let flag = e.done.clone();
        let arg = SendPtr(arg);
        ex.setup(idx, move |lp: &Loop| {
            let w = xtc_loop_t {
                lp: lp.clone(),
                home: Home::with(flag),
                owned: false,
            };
            let arg = arg;
            // SAFETY: the application's callback on the carrier thread, with
            // a loop wrapper that lives for the call (caller contract).
            unsafe { cb(std::ptr::from_ref(&w).cast_mut(), arg.0) };
        })
    })
}

/// `xtc_exec_run`: runs every loop on its carrier until its processes end,
/// then joins the carriers. Afterwards destroy and statistics of the groups
/// created on them are allowed from any thread (the "externally
/// synchronized quiescent calls after executor return" of B-149). An
/// executor runs once.
///
/// Returns `XTC_OK`, or the first loop's error; `XTC_E_INVAL` for NULL or an
/// executor that already ran; `XTC_E_DEADLK` from inside a setup callback.
///
/// # Safety
/// `exec` is NULL or a live executor.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_exec_run(exec: *mut xtc_exec_t) -> c_int {
    call(|| {
        // SAFETY: caller contract.
        let e = unsafe { exec.as_ref() }.ok_or(Error::Inval)?;
        let ex = {
            let mut guard = e.exec.try_lock().map_err(|_| Error::Deadlk)?;
            guard.take().ok_or(Error::Inval)?
        };
        let res = ex.run();
        e.done.store(true, Ordering::Release);
        res
    })
}

/// `xtc_exec_fini`: frees the executor. One that never ran drops its loops
/// on their carriers (with their groups' drivers: a lifetime violation,
/// B-151).
///
/// Returns `XTC_OK`; `XTC_E_INVAL` for NULL; `XTC_E_DEADLK` from inside a
/// setup callback (nothing freed).
///
/// # Safety
/// `exec` is NULL or a live executor; it is invalid after `XTC_OK`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_exec_fini(exec: *mut xtc_exec_t) -> c_int {
    call(|| {
        // SAFETY: caller contract.
        let e = unsafe { exec.as_ref() }.ok_or(Error::Inval)?;
        drop(e.exec.try_lock().map_err(|_| Error::Deadlk)?);
        // SAFETY: from Box::into_raw in xtc_exec_new; no call is in progress.
        drop(unsafe { Box::from_raw(exec) });
        Ok(())
    })
}

/// `xtc_future_new_pair`: a one-shot future (`*out_future`, awaited once:
/// handed to a FUTURE exec or to `xtc_loop_await`, or dropped) and its
/// promise (`*out_promise`, set from any thread).
///
/// Returns `XTC_OK`, or `XTC_E_INVAL` for a NULL argument (nothing made).
///
/// # Safety
/// Both are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_future_new_pair(
    out_future: *mut *mut xtc_future_t,
    out_promise: *mut *mut xtc_promise_t,
) -> c_int {
    call(|| {
        if out_future.is_null() || out_promise.is_null() {
            return Err(Error::Inval);
        }
        let (f, p) = rt::future_pair::<()>();
        // SAFETY: both checked non-NULL; caller contract.
        unsafe {
            put_box(out_future, xtc_future_t { f })?;
            put_box(out_promise, xtc_promise_t { p })
        }
    })
}

/// `xtc_promise_set`: resolves the future with `status` (`XTC_OK`, or an
/// `XTC_E_*` code that the waiter then sees: a FUTURE exec's collect gets it
/// as a negative `exec_status`, B-074) and frees the promise. Safe after the
/// future was dropped or its group destroyed (B-075). Any thread.
///
/// Returns `XTC_OK`; `XTC_E_INVAL` for NULL, or for a `status` that is no
/// `XTC_E_*` code (the promise is then left unset and still the caller's).
///
/// # Safety
/// `promise` is NULL or a live promise; it is invalid after `XTC_OK`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_promise_set(promise: *mut xtc_promise_t, status: c_int) -> c_int {
    call(|| {
        if promise.is_null() {
            return Err(Error::Inval);
        }
        let value = match status {
            XTC_OK => Ok(()),
            s => Err(Error::from_code(s).ok_or(Error::Inval)?),
        };
        // SAFETY: from Box::into_raw in xtc_future_new_pair (caller contract).
        let p = unsafe { Box::from_raw(promise) };
        p.p.set(value);
        Ok(())
    })
}

/// `xtc_promise_drop`: frees an unset promise; its future resolves with
/// `XTC_E_ABORTED` (B-074). NULL is ignored. Any thread.
///
/// # Safety
/// `promise` is NULL or a live promise; it is invalid afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_promise_drop(promise: *mut xtc_promise_t) {
    call_void(|| {
        if !promise.is_null() {
            // SAFETY: from Box::into_raw in xtc_future_new_pair (caller contract).
            drop(unsafe { Box::from_raw(promise) });
        }
    });
}

/// `xtc_future_drop`: frees a future the application still owns (never one
/// it handed to a FUTURE exec or to `xtc_loop_await`, B-073). Setting its
/// promise later is harmless. NULL is ignored.
///
/// # Safety
/// `future` is NULL or a live future the caller owns; invalid afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_future_drop(future: *mut xtc_future_t) {
    call_void(|| {
        if !future.is_null() {
            // SAFETY: from Box::into_raw in xtc_future_new_pair (caller contract).
            drop(unsafe { Box::from_raw(future) });
        }
    });
}

/// `xtc_blocking_run`: queues `run(arg)` on the process-wide blocking pool
/// (4 threads, 1024 queued closures) and, when `out_future` is not NULL,
/// writes a future that resolves with its return value (`XTC_OK` or an
/// `XTC_E_*` code; any other value resolves `XTC_E_INTERNAL`).
///
/// Returns `XTC_OK`; `XTC_E_INVAL` for a NULL `run`; `XTC_E_AGAIN` when the
/// pool refuses the closure (queue full): it is then not run (B-079).
///
/// # Safety
/// `run` is callable with `arg` on a pool thread; `out_future` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_blocking_run(
    run: Option<unsafe extern "C" fn(arg: *mut c_void) -> c_int>,
    arg: *mut c_void,
    out_future: *mut *mut xtc_future_t,
) -> c_int {
    call(|| {
        let run = run.ok_or(Error::Inval)?;
        let (f, p) = rt::future_pair::<()>();
        let arg = SendPtr(arg);
        let job = move || {
            let arg = arg;
            // SAFETY: the application's closure on a pool thread, with its
            // own arg (caller contract).
            let rc = unsafe { run(arg.0) };
            p.set(if rc == XTC_OK {
                Ok(())
            } else {
                Err(error_of(rc))
            });
        };
        // The pool's own future is not needed: the pair above carries the
        // closure's status (a refused closure is dropped unrun, B-079).
        drop(rt::blocking_run(job)?);
        if out_future.is_null() {
            drop(f);
            Ok(())
        } else {
            // SAFETY: checked non-NULL; caller contract.
            unsafe { put_box(out_future, xtc_future_t { f }) }
        }
    })
}
