//! Integration with `batch`: an [`AsyncStep`] that runs a group's ready
//! vector as NPU tasks and returns [`Exec::Future`].
//!
//! Each iteration, every member of the ready vector contributes one task
//! ([`NpuWork::task`]) to one graph; the graph goes to the device service
//! thread ([`NpuDevice`]), which runs it on the emulated NPU (real scheduler
//! threads, batched publication) and resolves the iteration's promise from
//! that completion path. `collect` then checks each member's output slots:
//! exact → [`NpuWork::advance`] decides DONE or CONTINUE; otherwise the member
//! fails with [`Error::Internal`].

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::{Sender, unbounded};

use super::profile::DeviceProfile;
use super::scheduler::Scheduler;
use super::task::{Graph, RunOpts, RunReport, TaskSpec};
use xtc::batch::{AsyncStep, Exec, ExecStatus, Item, StepResult};
use xtc::rt::{self, Promise};
use xtc::{Error, Result};

/// A request whose iterations run on the NPU.
pub trait NpuWork {
    /// The task this member submits in the current iteration.
    fn task(&self) -> TaskSpec;
    /// Records one finished iteration; true when the member is done.
    fn advance(&mut self) -> bool;
}

type Slot = Arc<Mutex<Option<Result<RunReport>>>>;

struct Job {
    graph: Graph,
    slot: Slot,
    promise: Promise<()>,
}

/// The device service: one thread owning a [`Scheduler`] that runs submitted
/// graphs in order and resolves each one's promise when it completed.
pub struct NpuDevice {
    tx: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl NpuDevice {
    /// Maps the device and starts the service thread. Errors: those of
    /// [`Scheduler::new`].
    pub fn start(prof: DeviceProfile, opts: RunOpts) -> Result<NpuDevice> {
        let sched = Scheduler::new(prof)?;
        let (tx, rx) = unbounded::<Job>();
        let thread = std::thread::Builder::new()
            .name("npu-device".into())
            .spawn(move || {
                for job in rx {
                    let r = sched.run_threads(&job.graph, opts.clone());
                    *job.slot.lock().unwrap() = Some(r);
                    // Faults are reported per member by collect.
                    job.promise.set(Ok(()));
                }
            })
            .map_err(|_| Error::Nomem)?;
        Ok(NpuDevice {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    fn submit(&self, graph: Graph) -> Result<(rt::Future<()>, Slot)> {
        let (fut, promise) = rt::future_pair();
        let slot: Slot = Arc::new(Mutex::new(None));
        let job = Job {
            graph,
            slot: slot.clone(),
            promise,
        };
        self.tx
            .as_ref()
            .ok_or(Error::Again)?
            .send(job)
            .map_err(|_| Error::Again)?;
        Ok((fut, slot))
    }
}

impl Drop for NpuDevice {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The [`AsyncStep`]: one NPU graph per iteration of the ready vector.
pub struct NpuStep {
    device: Arc<NpuDevice>,
    inflight: Option<Slot>,
    runs: Arc<Mutex<Vec<usize>>>,
}

impl NpuStep {
    /// A step submitting to `device`.
    pub fn new(device: Arc<NpuDevice>) -> NpuStep {
        NpuStep {
            device,
            inflight: None,
            runs: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Ready-vector length of every graph submitted so far (shared handle).
    pub fn runs(&self) -> Arc<Mutex<Vec<usize>>> {
        self.runs.clone()
    }
}

impl<R: NpuWork> AsyncStep<R> for NpuStep {
    async fn submit(&mut self, items: &mut [Item<'_, R>]) -> Result<Exec> {
        let mut g = Graph::new();
        for it in items.iter() {
            g.add(it.request.task());
        }
        let (fut, slot) = self.device.submit(g)?;
        self.runs.lock().unwrap().push(items.len());
        self.inflight = Some(slot);
        Ok(Exec::Future(fut))
    }

    async fn collect(
        &mut self,
        items: &mut [Item<'_, R>],
        results: &mut [StepResult],
        status: ExecStatus,
    ) -> Result<()> {
        let report = self.inflight.take().and_then(|s| s.lock().unwrap().take());
        let fail = match (status, &report) {
            (ExecStatus::Ok, Some(Ok(_))) => None,
            (ExecStatus::Ok, Some(Err(e))) => Some(*e),
            (ExecStatus::Ok, None) => Some(Error::Internal),
            (ExecStatus::Timeout, _) => Some(Error::Again),
            (ExecStatus::Aborted, _) => Some(Error::Aborted),
            (ExecStatus::Failed(e), _) => Some(e),
        };
        for (i, (it, res)) in items.iter_mut().zip(results.iter_mut()).enumerate() {
            *res = match (fail, &report) {
                (Some(e), _) => StepResult::Error(e),
                (None, Some(Ok(rep))) if rep.task_exact(i) => {
                    if it.request.advance() {
                        StepResult::Done
                    } else {
                        StepResult::Continue
                    }
                }
                _ => StepResult::Error(Error::Internal),
            };
        }
        Ok(())
    }
}
