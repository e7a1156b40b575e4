//! The process table and the wake inbox of one loop.
//!
//! The table maps a pid's sequence number to the `async-task` handle of the
//! process. Sequence numbers only grow, so pids are never reused. An entry
//! stays until the process's future has been dropped (completion, or the run
//! after a kill), so "absent from the table" means "every exit hook has run".
//!
//! The inbox is the only part of a loop other threads touch: a waker (from any
//! thread) pushes the woken process's `Runnable` there; if the loop is parked
//! in `epoll_wait`, the push also writes the loop's eventfd. The parked flag and
//! the queue share one mutex, so a wake is never lost between "queue empty"
//! and "parked".
//!
//! Fast path: a wake issued on the thread where the woken process's loop is
//! current (a process waking another of its loop, or itself in `yield_now`)
//! goes to a thread-local queue without touching the mutex; the loop drains
//! it with its inbox, and the current-loop guard hands whatever is left to the
//! loop's ready set when the loop stops being current.

use async_task::{Runnable, Task};
use rustix::fd::OwnedFd;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    /// Wakes for the loop current on this thread: (its inbox's address, queue).
    static LOCAL: RefCell<(usize, Vec<ProcRunnable>)> = const { RefCell::new((0, Vec::new())) };
}

/// The thread-local wake queue's owner and contents saved by a nested
/// current-loop guard.
pub(crate) type LocalSaved = (usize, Vec<ProcRunnable>);

/// Makes `inbox` the owner of this thread's local wake queue, queueing into
/// `buf` (the loop's kept buffer, so a wake allocates nothing once it has
/// grown); returns the previous owner and its queued wakes, for [`local_exit`].
pub(crate) fn local_enter(inbox: &Inbox, buf: Vec<ProcRunnable>) -> LocalSaved {
    let addr = inbox as *const Inbox as usize;
    debug_assert!(buf.is_empty());
    LOCAL.with(|l| std::mem::replace(&mut *l.borrow_mut(), (addr, buf)))
}

/// Restores `saved`; returns the wakes queued for the owner that is leaving
/// (in its buffer, for the loop to keep).
pub(crate) fn local_exit(saved: LocalSaved) -> Vec<ProcRunnable> {
    LOCAL
        .try_with(|l| std::mem::replace(&mut *l.borrow_mut(), saved).1)
        .unwrap_or_default()
}

/// Appends the local wakes of `inbox` (if it owns the local queue) to `out`.
fn local_drain(inbox: &Inbox, out: &mut Vec<ProcRunnable>) {
    let addr = inbox as *const Inbox as usize;
    let _ = LOCAL.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut()
            && l.0 == addr
        {
            out.append(&mut l.1);
        }
    });
}

/// What a task cell carries: its pid sequence and scheduling-class index.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProcMeta {
    pub(crate) seq: u64,
    pub(crate) class: u32,
}

pub(crate) type ProcRunnable = Runnable<ProcMeta>;
pub(crate) type ProcTask = Task<(), ProcMeta>;

/// Multiplicative (Fibonacci) hash of a sequence number.
#[derive(Default)]
pub(crate) struct SeqHasher(u64);

impl Hasher for SeqHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// One live process.
struct Entry {
    /// `None` once killed: the task handle was dropped (cell closed) and the
    /// future is dropped by the loop's next run of the process.
    task: Option<ProcTask>,
}

/// The process table.
#[derive(Default)]
pub(crate) struct ProcTable {
    entries: HashMap<u64, Entry, BuildHasherDefault<SeqHasher>>,
    next_seq: u64,
    /// Processes whose future completed since the last reap (reap hint).
    finished: Vec<u64>,
    /// Killed processes still in the table (reap hint).
    killed_pending: usize,
}

impl ProcTable {
    /// The sequence number the next process will get.
    pub(crate) fn next_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    pub(crate) fn insert(&mut self, seq: u64, task: ProcTask) {
        self.entries.insert(seq, Entry { task: Some(task) });
    }

    pub(crate) fn contains(&self, seq: u64) -> bool {
        self.entries.contains_key(&seq)
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Kill: takes the task handle out (the caller drops it, which closes the
    /// cell). `None` for an unknown pid; `Some(None)` when already killed.
    pub(crate) fn take_for_kill(&mut self, seq: u64) -> Option<Option<ProcTask>> {
        let taken = self.entries.get_mut(&seq).map(|e| e.task.take());
        if let Some(Some(_)) = &taken {
            self.killed_pending += 1;
        }
        taken
    }

    /// Called by a process's future as it completes.
    pub(crate) fn note_finished(&mut self, seq: u64) {
        self.finished.push(seq);
    }

    /// After a run of `seq`: reaps it and every process noted finished, if
    /// the hints say any may be gone (the common case, a process that just
    /// parked or yielded, costs no table lookup). Returns the removed pids'
    /// sequence numbers with their handles, for the caller to drop outside
    /// any borrow.
    pub(crate) fn reap_after_run(&mut self, seq: u64) -> Vec<(u64, Option<ProcTask>)> {
        let mut gone = Vec::new();
        if self.killed_pending == 0 && self.finished.is_empty() {
            return gone;
        }
        let mut candidates = std::mem::take(&mut self.finished);
        candidates.push(seq);
        for s in candidates {
            if let (true, task) = self.reap(s) {
                gone.push((s, task));
            }
        }
        gone
    }

    /// After a run of `seq`: removes the entry if its future is gone (finished,
    /// or killed: a killed cell's future is dropped by the run). Returns the
    /// removed handle for the caller to drop outside any borrow, and whether an
    /// entry was removed.
    fn reap(&mut self, seq: u64) -> (bool, Option<ProcTask>) {
        let done = match self.entries.get(&seq) {
            None => return (false, None),
            Some(e) => e.task.as_ref().is_none_or(|t| t.is_finished()),
        };
        if !done {
            return (false, None);
        }
        let task = self.entries.remove(&seq).and_then(|e| e.task);
        if task.is_none() {
            self.killed_pending -= 1;
        }
        (true, task)
    }

    /// Takes every task handle (loop teardown).
    pub(crate) fn drain(&mut self) -> Vec<ProcTask> {
        self.entries.drain().filter_map(|(_, e)| e.task).collect()
    }

    /// Sequence numbers of the live processes, ascending.
    pub(crate) fn seqs(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.entries.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

struct InboxState {
    runnables: Vec<ProcRunnable>,
    parked: bool,
}

/// Woken processes waiting to be moved into the loop's ready set.
pub(crate) struct Inbox {
    state: Mutex<InboxState>,
    /// Set (under the lock) by a push; lets a drain skip the lock when clear.
    maybe_queued: AtomicBool,
    /// The real loop's eventfd (written when a push finds the loop parked).
    wake_fd: Option<OwnedFd>,
}

impl Inbox {
    pub(crate) fn new(wake_fd: Option<OwnedFd>) -> Inbox {
        Inbox {
            state: Mutex::new(InboxState {
                runnables: Vec::new(),
                parked: false,
            }),
            maybe_queued: AtomicBool::new(false),
            wake_fd,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, InboxState> {
        // A panic while holding this lock cannot leave the Vec inconsistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a woken process; wakes the loop if it is parked.
    pub(crate) fn push(&self, r: ProcRunnable) {
        let Some(r) = self.push_local(r) else {
            return;
        };
        let was_parked = {
            let mut s = self.lock();
            s.runnables.push(r);
            self.maybe_queued.store(true, Ordering::Release);
            std::mem::replace(&mut s.parked, false)
        };
        if was_parked && let Some(fd) = &self.wake_fd {
            // An eventfd write fails only when the counter would overflow,
            // which still leaves it readable: the loop wakes either way.
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }

    /// The local fast path: queues `r` thread-locally if this inbox's loop is
    /// current on this thread, else hands it back.
    fn push_local(&self, r: ProcRunnable) -> Option<ProcRunnable> {
        let addr = self as *const Inbox as usize;
        let mut r = Some(r);
        let _ = LOCAL.try_with(|l| {
            if let Ok(mut l) = l.try_borrow_mut()
                && l.0 == addr
            {
                l.1.extend(r.take());
            }
        });
        r
    }

    /// Moves every queued runnable (thread-local wakes first) into `out`,
    /// which must be empty (swapping buffers, no allocation).
    pub(crate) fn drain_into(&self, out: &mut Vec<ProcRunnable>) {
        if self.maybe_queued.load(Ordering::Acquire) {
            let mut s = self.lock();
            self.maybe_queued.store(false, Ordering::Relaxed);
            std::mem::swap(&mut s.runnables, out);
        }
        local_drain(self, out);
    }

    /// Marks the loop parked unless something is queued; returns whether it may park.
    pub(crate) fn try_park(&self) -> bool {
        let mut s = self.lock();
        if s.runnables.is_empty() {
            s.parked = true;
        }
        s.parked
    }

    /// Clears the parked flag after `epoll_wait` returned.
    pub(crate) fn unpark(&self) {
        self.lock().parked = false;
    }

    pub(crate) fn wake_fd(&self) -> Option<&OwnedFd> {
        self.wake_fd.as_ref()
    }
}
