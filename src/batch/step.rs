//! The application's side of a group: the step (synchronous), the split
//! submit / collect pair (asynchronous), the terminal callback, and the values
//! they exchange with the driver (items, results, exec descriptors, statuses).
//!
//! Every callback is an `async fn` (B-040: callbacks may yield). While one is
//! in flight every mutator of its group returns [`Error::Deadlk`] (B-041). The
//! driver is generic over these traits, so no `dyn` dispatch sits on the hot
//! path; the traits are not object-safe and need not be.
#![allow(async_fn_in_trait)] // groups live on one loop: no `Send` bound is wanted

use std::os::fd::{AsFd, AsRawFd};
use std::rc::Rc;

use crate::batch::Handle;
use crate::error::{Error, Result};
use crate::rt;

/// One member of a ready vector (`xtc_batch_item_t`, B-032): its handle and
/// its request.
///
/// The request is lent mutably for the length of the callback, so a step or
/// collect may update per-sequence state (the manual page's request pointer is
/// the application's per-sequence handle, B-091). The vector itself is frozen:
/// a callback cannot add, remove or reorder members.
pub struct Item<'a, R> {
    /// The member's handle, as returned by `submit`.
    pub handle: Handle,
    /// The member's request, owned by the group until `complete`.
    pub request: &'a mut R,
}

/// Result word of one member (`xtc_batch_result_t`, B-033..B-036).
///
/// Every word starts as [`StepResult::Unset`] before each step or collect
/// (B-033). A word left `Unset` fails its member with [`Error::Internal`]
/// (B-036). `Error(e)` carries an existing error by construction, so the C
/// page's "invalid error value" cannot be written in Rust (B-035).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StepResult {
    /// Not written by the callback: the member fails with `Internal`.
    #[default]
    Unset,
    /// The member stays READY for the next iteration.
    Continue,
    /// The member finished: `complete` gets `Ok(())`.
    Done,
    /// The member keeps its slot and charge but leaves the ready vector until
    /// `resume` (B-022, B-054).
    Blocked,
    /// The member failed with this error.
    Error(Error),
}

/// A synchronous step (`step` callback, B-002, B-030..B-038): called once per
/// iteration with the whole ready vector.
///
/// `results` has the same length as `items`, all `Unset` on entry. Returning
/// `Err(e)` fails every member of the vector with `e` (B-037); nothing is
/// retried (B-038).
pub trait Step<R> {
    /// Advances every member of the ready vector by one iteration.
    async fn step(&mut self, items: &mut [Item<'_, R>], results: &mut [StepResult]) -> Result<()>;
}

/// Adapter that turns a plain closure (one that never yields) into a [`Step`].
pub struct StepFn<F>(pub F);

/// Wraps a closure `FnMut(&mut [Item<R>], &mut [StepResult]) -> Result<()>` as
/// a [`Step`] (the closure form of the `step` callback).
pub fn step_fn<R, F>(f: F) -> StepFn<F>
where
    F: FnMut(&mut [Item<'_, R>], &mut [StepResult]) -> Result<()>,
{
    StepFn(f)
}

impl<R, F> Step<R> for StepFn<F>
where
    F: FnMut(&mut [Item<'_, R>], &mut [StepResult]) -> Result<()>,
{
    async fn step(&mut self, items: &mut [Item<'_, R>], results: &mut [StepResult]) -> Result<()> {
        (self.0)(items, results)
    }
}

/// The terminal callback (`complete`, B-039): exactly once per accepted
/// submit, with the request handed back by value.
///
/// `outcome` is `Ok(())` for DONE, `Err(Aborted)` for cancellation, or the
/// recorded failure. The invocation is recorded before this runs, so a killed
/// driver never starts the same notification twice.
pub trait Complete<R> {
    /// Receives one member's terminal outcome and its request.
    async fn complete(&mut self, handle: Handle, request: R, outcome: Result<()>);
}

impl<R, F> Complete<R> for F
where
    F: FnMut(Handle, R, Result<()>),
{
    async fn complete(&mut self, handle: Handle, request: R, outcome: Result<()>) {
        self(handle, request, outcome)
    }
}

/// How the operation launched by [`AsyncStep::submit`] is awaited
/// (`xtc_batch_exec_t`, B-065..B-079).
pub enum Exec {
    /// The work was done inside `submit`; `collect` runs at once (B-065).
    Inline,
    /// A pollable completion fence (sync_file, dma-fence, eventfd), awaited
    /// through the loop's fd readiness (B-066..B-070).
    ///
    /// Ownership is in the type (I/O safety): the application keeps its own
    /// clone of the `Rc` and so keeps owning the fd; the engine holds the
    /// clone it is handed for the wait and drops it after `collect` returns
    /// (also on timeout, close, kill and teardown), so the fd stays open for
    /// the whole wait whatever the application does meanwhile. The engine
    /// never dups or closes the fd (B-067): it is closed when the last clone
    /// is dropped, normally the application's. [`crate::accel::EventFence`],
    /// [`crate::accel::SyncFile`] and [`std::os::fd::OwnedFd`] are all
    /// [`AsFd`]. An fd the readiness path refuses (a regular file, an
    /// `O_PATH` fd) ends the wait `Failed(Inval)` (B-069); under [`rt::Sim`]
    /// the status is `Failed(Nosys)` (B-070).
    Fence(Rc<dyn AsFd>),
    /// The read half of an [`rt::future_pair`], consumed exactly once: awaited,
    /// or dropped on timeout or teardown (B-071..B-077).
    Future(rt::Future<()>),
    /// A closure run on the blocking pool; the driver parks until it returns
    /// (no timeout, close or kill ends the wait early, B-078, B-079, B-103).
    Blocking(Box<dyn FnOnce() -> Result<()> + Send>),
}

impl std::fmt::Debug for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exec::Inline => f.write_str("Inline"),
            Exec::Fence(fd) => write!(f, "Fence({})", fd.as_fd().as_raw_fd()),
            Exec::Future(_) => f.write_str("Future(..)"),
            Exec::Blocking(_) => f.write_str("Blocking(..)"),
        }
    }
}

/// The raw status of an awaited operation, handed to `collect` (B-085).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecStatus {
    /// The token fired: the operation finished; collect decides (B-088).
    Ok,
    /// `exec_timeout` elapsed first; DONE and ERROR are honoured, any other
    /// member ends `Again` (B-089).
    Timeout,
    /// Cancel-close, driver kill or teardown while outstanding: every member
    /// ends `Aborted` (B-090).
    Aborted,
    /// The engine could not await the operation (the manual page's negative
    /// status): every member ends with this error and `offload_errors` counts
    /// it (B-085, B-086).
    Failed(Error),
}

/// An asynchronous step: the split submit / collect pair of
/// `xtc_batch_create_async` (B-058..B-098).
///
/// Each iteration calls [`submit`](AsyncStep::submit) once with the ready
/// vector; the application launches ONE operation for all members and says how
/// to await it. [`collect`](AsyncStep::collect) then runs exactly once per
/// operation, on the driver, with the same frozen vector and the raw status,
/// also on teardown (B-083, B-101).
///
/// # Example: one blocking-pool operation per iteration
///
/// `submit` copies the ready vector's inputs into ONE job for the blocking
/// pool ([`Exec::Blocking`]; a device would return its fence as
/// [`Exec::Fence`]); the driver parks while it runs, and `collect` writes
/// each member's output and result:
///
/// ```
/// use std::sync::{Arc, Mutex};
///
/// use xtc::batch::{AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Item, StepResult};
/// use xtc::rt::Loop;
///
/// /// A request: an input and, once collected, its square.
/// struct Square {
///     x: u64,
///     y: Option<u64>,
/// }
///
/// #[derive(Default)]
/// struct SquareStep {
///     out: Arc<Mutex<Vec<u64>>>,
///     iterations: usize,
/// }
///
/// impl AsyncStep<Square> for SquareStep {
///     async fn submit(&mut self, items: &mut [Item<'_, Square>]) -> xtc::Result<Exec> {
///         self.iterations += 1;
///         let xs: Vec<u64> = items.iter().map(|i| i.request.x).collect();
///         let out = self.out.clone();
///         Ok(Exec::Blocking(Box::new(move || {
///             *out.lock().unwrap() = xs.iter().map(|x| x * x).collect();
///             Ok(())
///         })))
///     }
///
///     async fn collect(
///         &mut self,
///         items: &mut [Item<'_, Square>],
///         results: &mut [StepResult],
///         status: ExecStatus,
///     ) -> xtc::Result<()> {
///         assert_eq!(status, ExecStatus::Ok);
///         let out = self.out.lock().unwrap();
///         for ((item, result), y) in items.iter_mut().zip(results.iter_mut()).zip(out.iter()) {
///             item.request.y = Some(*y);
///             *result = StepResult::Done;
///         }
///         Ok(())
///     }
/// }
///
/// # fn main() -> xtc::Result<()> {
/// let lp = Loop::new()?;
/// let opts = AsyncOpts {
///     capacity: 4,
///     max_active: 4,
///     resource_capacity: 4,
///     ..AsyncOpts::default()
/// };
/// let done = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
/// let d = done.clone();
/// let group = Group::create_async(&lp, opts, SquareStep::default(), move |_h, sq: Square, r: xtc::Result<()>| {
///     assert!(r.is_ok());
///     d.borrow_mut().push((sq.x, sq.y));
/// })?;
/// for x in [2, 3, 4] {
///     group.submit(Square { x, y: None }, 1).map_err(|e| e.error)?;
/// }
/// group.close(CloseMode::Drain)?;
/// lp.run()?;
/// assert_eq!(group.stats().iterations, 1, "one operation for the whole vector");
/// assert_eq!(group.async_stats().offloads, 1);
/// group.destroy()?;
/// let mut done = done.borrow().clone();
/// done.sort();
/// assert_eq!(done, [(2, Some(4)), (3, Some(9)), (4, Some(16))]);
/// # Ok(())
/// # }
/// ```
pub trait AsyncStep<R> {
    /// Launches one operation covering every member. `Err(e)` fails the
    /// iteration's members with `e`; no operation is outstanding (B-080).
    async fn submit(&mut self, items: &mut [Item<'_, R>]) -> Result<Exec>;

    /// Sets each member's result after the operation, exactly as a step would
    /// (B-082). `Err(e)` fails the whole vector with `e`.
    async fn collect(
        &mut self,
        items: &mut [Item<'_, R>],
        results: &mut [StepResult],
        status: ExecStatus,
    ) -> Result<()>;

    /// Optional: fires once per member whose cancel the driver observes while
    /// its operation is outstanding, and for every in-flight member before a
    /// forced teardown's collect (B-094). Mutators return `Deadlk` meanwhile.
    async fn cancel_hint(&mut self, _handle: Handle) {}
}
