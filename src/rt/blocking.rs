//! The blocking pool (`xtc_blocking_run`, B-078/B-079): closures run on pool threads and
//! resolve a [`Future`](super::Future) the caller awaits on its loop.
//!
//! Jobs travel through a bounded `crossbeam-channel`; a full queue or a shut
//! down pool refuses the closure with `Again` *before* running it, so the
//! caller sees an error, never a hang. A closure that panics drops its promise,
//! so its future resolves with `Aborted`. Pool threads block in `recv`: no
//! polling, no periodic wake.

use super::future_pair::{Future, future_pair};
use crate::{Error, Result};
use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use std::panic::AssertUnwindSafe;
use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Threads of the process-wide default pool used by [`blocking_run`].
pub const DEFAULT_BLOCKING_THREADS: usize = 4;
/// Queue capacity (closures waiting for a thread) of the default pool used by
/// [`blocking_run`]: with [`DEFAULT_BLOCKING_THREADS`] closures running and
/// this many queued, the next [`blocking_run`] is refused with `Again`.
pub const DEFAULT_BLOCKING_QUEUE: usize = 1024;

/// A pool of threads running blocking closures.
#[derive(Debug)]
pub struct BlockingPool {
    jobs: Mutex<Option<Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl BlockingPool {
    /// A pool of `threads` threads with a queue of `queue_cap` waiting closures.
    ///
    /// # Errors
    /// `Inval` for 0 threads; `Internal` when the OS refuses a thread.
    pub fn new(threads: usize, queue_cap: usize) -> Result<BlockingPool> {
        if threads == 0 {
            return Err(Error::Inval);
        }
        let (tx, rx) = bounded::<Job>(queue_cap);
        let pool = BlockingPool {
            jobs: Mutex::new(Some(tx)),
            threads: Mutex::new(Vec::with_capacity(threads)),
        };
        for i in 0..threads {
            let rx = rx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("xtc-blocking-{i}"))
                .spawn(move || worker(rx))
                .map_err(|_| Error::Internal)?;
            pool.threads
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(handle);
        }
        Ok(pool)
    }

    /// Queues `f`; its result resolves the returned future.
    ///
    /// # Errors
    /// `Again` when the queue is full or the pool is shut down; `f` is dropped
    /// without running.
    pub fn run<T, F>(&self, f: F) -> Result<Future<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (fut, promise) = future_pair::<T>();
        let job: Job = Box::new(move || promise.set(Ok(f())));
        let guard = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = guard.as_ref() else {
            return Err(Error::Again);
        };
        match tx.try_send(job) {
            Ok(()) => Ok(fut),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => Err(Error::Again),
        }
    }

    /// Refuses new closures, lets queued ones finish, joins the threads.
    /// Idempotent. Called from one of the pool's own threads (a closure
    /// shutting its pool down), it joins the others and leaves its own thread
    /// to exit after the closure returns, so it never waits on itself.
    pub fn shutdown(&self) {
        drop(self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take());
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        let me = std::thread::current().id();
        for t in threads {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }

    /// Whether [`shutdown`](BlockingPool::shutdown) was called.
    pub fn is_shut_down(&self) -> bool {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }
}

impl Drop for BlockingPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn worker(rx: Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        // A panicking closure drops its promise: the future sees `Aborted`.
        let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
    }
}

/// Runs `f` on the process-wide default pool (4 threads, 1024 queued closures,
/// started on first use) and returns a future of its result.
///
/// # Errors
/// `Again` when the closure is refused (queue full); `Internal` when the pool
/// threads could not be started.
pub fn blocking_run<T, F>(f: F) -> Result<Future<T>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    static POOL: OnceLock<Result<BlockingPool>> = OnceLock::new();
    let pool =
        POOL.get_or_init(|| BlockingPool::new(DEFAULT_BLOCKING_THREADS, DEFAULT_BLOCKING_QUEUE));
    pool.as_ref().map_err(|e| *e)?.run(f)
}
