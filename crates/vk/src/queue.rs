//! Submission on the compute queue and completion as a pollable fd (B-066).
//!
//! Every submission signals the device's timeline semaphore with the next
//! value, so completion can always be checked or waited on directly
//! ([`Submission::wait`]). The fd the driver polls is, per device:
//! - [`FenceKind::SyncFile`]: a `VkFence` created exportable and exported as a
//!   `SYNC_FD` sync_file (`VK_KHR_external_fence_fd`). An exported -1 means
//!   "already signalled" and is never polled or closed: an already-signalled
//!   [`EventFence`] stands in for it.
//! - [`FenceKind::EventFd`] (lavapipe, which has neither fence nor semaphore
//!   fd export): a fresh [`EventFence`] per submission, signalled by ONE waiter
//!   thread per device that walks the timeline values in submission order.
//!
//! No fd leaks: each submission's fd is closed when the [`Submission`] and the
//! waiter thread (right after signalling) have both dropped it.
//!
//! # Safety
//! Raw Vulkan calls. Invariants: the `vk::Queue` is used only under the
//! queue mutex (queues are externally synchronized); command buffers passed to
//! [`Device::submit`] are executable and not pending elsewhere (the caller's
//! recording contract); the timeline semaphore and per-submission fences are
//! destroyed only after the work that signals them completed.
#![allow(unsafe_code)]

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ash::vk;
use crossbeam_channel::{Sender, unbounded};

use super::device::Device;
use super::{VkResult, call};
use xtc::accel::EventFence;

enum WaitReq {
    Signal(u64, Arc<EventFence>),
    Flush(Sender<()>),
}

struct Waiter {
    tx: Sender<WaitReq>,
    thread: JoinHandle<()>,
}

struct Slot {
    queue: vk::Queue,
    last: u64,
    waiter: Option<Waiter>,
}

/// The device's queue, timeline semaphore and (lazily started) waiter thread.
pub(crate) struct QueueState {
    slot: Mutex<Slot>,
    timeline: vk::Semaphore,
    /// An eventfd signalled at creation: the fd of a sync_file export of -1.
    signalled: Arc<EventFence>,
}

impl QueueState {
    pub(crate) fn new(device: &ash::Device, family: u32) -> VkResult<QueueState> {
        let signalled = Arc::new(EventFence::new()?);
        signalled.signal()?;
        let mut ty = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let info = vk::SemaphoreCreateInfo::default().push_next(&mut ty);
        // SAFETY: the device was created with one queue in `family` and the
        // timelineSemaphore feature; `info` lives across the call.
        let (queue, timeline) = unsafe {
            let q = device.get_device_queue(family, 0);
            let s = device
                .create_semaphore(&info, None)
                .map_err(call("vkCreateSemaphore"))?;
            (q, s)
        };
        Ok(QueueState {
            signalled,
            slot: Mutex::new(Slot {
                queue,
                last: 0,
                waiter: None,
            }),
            timeline,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn wait_idle(&self, device: &ash::Device) -> VkResult<()> {
        let slot = self.lock();
        // SAFETY: the queue is used under its mutex.
        unsafe { device.queue_wait_idle(slot.queue) }.map_err(call("vkQueueWaitIdle"))
    }

    /// Waits for the queue, then stops and joins the waiter thread.
    pub(crate) fn shutdown(&self, device: &ash::Device) {
        let _ = self.wait_idle(device);
        let waiter = self.lock().waiter.take();
        if let Some(w) = waiter {
            drop(w.tx);
            let _ = w.thread.join();
        }
    }

    /// # Safety
    /// After [`shutdown`](Self::shutdown); the semaphore is not used again.
    pub(crate) unsafe fn destroy(&self, device: &ash::Device) {
        // SAFETY: per the contract, no pending work signals the semaphore.
        unsafe { device.destroy_semaphore(self.timeline, None) };
    }
}

/// How a submission's completion fd is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceKind {
    /// An exported `SYNC_FD` sync_file (POLLIN once signalled).
    SyncFile,
    /// An eventfd signalled by the device's waiter thread.
    EventFd,
}

enum Done {
    Event(Arc<EventFence>),
    SyncFile(OwnedFd),
}

/// One `vkQueueSubmit` in flight. Its [`fence_fd`](Self::fence_fd) becomes
/// readable when the work completes. Dropping it before completion waits for
/// the work (the fence object must outlive it); it never leaks the fd.
pub struct Submission {
    dev: Device,
    value: u64,
    done: Done,
    fence: vk::Fence,
}

impl std::fmt::Debug for Submission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Submission")
            .field("value", &self.value)
            .field("kind", &self.kind())
            .finish()
    }
}

impl Device {
    /// The fence kind this device's submissions use.
    pub fn fence_kind(&self) -> FenceKind {
        if self.0.fence_fd.is_some() {
            FenceKind::SyncFile
        } else {
            FenceKind::EventFd
        }
    }

    /// Submits `cmds` in ONE `vkQueueSubmit` (one ready vector's command
    /// buffer, or several groups' at once) and returns its completion.
    ///
    /// The command buffers must have been recorded on this device (e.g. with a
    /// [`super::Recorder`]) and not be pending; keep them unchanged until the
    /// submission completes.
    ///
    /// # Errors
    /// `Io` if no eventfd can be made (fd exhaustion), `Call` for a failed
    /// submit or fence export (device lost, out of memory).
    ///
    /// # Safety
    /// Each command buffer is a valid, fully recorded command buffer of this
    /// device, not pending on the queue, and its pool is not used by another
    /// thread during the call. [`super::CommandPool::submit`] is the safe way.
    pub unsafe fn submit(&self, cmds: &[vk::CommandBuffer]) -> VkResult<Submission> {
        match &self.0.fence_fd {
            Some(_) => self.submit_sync_file(cmds),
            None => self.submit_eventfd(cmds),
        }
    }

    fn submit_eventfd(&self, cmds: &[vk::CommandBuffer]) -> VkResult<Submission> {
        let ev = Arc::new(EventFence::new()?);
        let mut slot = self.0.queue.lock();
        let value = self.queue_submit(&slot, cmds, vk::Fence::null())?;
        slot.last = value;
        let tx = self.waiter_tx(&mut slot);
        // The receiver lives as long as the waiter (joined only at shutdown).
        let _ = tx.send(WaitReq::Signal(value, ev.clone()));
        Ok(Submission {
            dev: self.clone(),
            value,
            done: Done::Event(ev),
            fence: vk::Fence::null(),
        })
    }

    fn submit_sync_file(&self, cmds: &[vk::CommandBuffer]) -> VkResult<Submission> {
        let dev = &self.0.device;
        let mut export = vk::ExportFenceCreateInfo::default()
            .handle_types(vk::ExternalFenceHandleTypeFlags::SYNC_FD);
        let info = vk::FenceCreateInfo::default().push_next(&mut export);
        // SAFETY: the device enabled VK_KHR_external_fence_fd; `info` lives across the call.
        let fence = unsafe { dev.create_fence(&info, None) }.map_err(call("vkCreateFence"))?;
        let value = {
            let mut slot = self.0.queue.lock();
            let v = self.queue_submit(&slot, cmds, fence);
            if let Ok(v) = v {
                slot.last = v;
            }
            v
        };
        let value = value.inspect_err(|_| {
            // SAFETY: the submit failed, so nothing refers to the fence.
            unsafe { dev.destroy_fence(fence, None) };
        })?;
        // Until the export succeeds the device's always-signalled eventfd stands
        // in (it is also the answer to an export of -1, "already signalled").
        let mut sub = Submission {
            dev: self.clone(),
            value,
            done: Done::Event(self.0.queue.signalled.clone()),
            fence,
        };
        let get = vk::FenceGetFdInfoKHR::default()
            .fence(fence)
            .handle_type(vk::ExternalFenceHandleTypeFlags::SYNC_FD);
        let ext = self
            .0
            .fence_fd
            .as_ref()
            .expect("sync_file path only with the extension");
        // SAFETY: the fence has a pending signal operation (just submitted)
        // (VUID-VkFenceGetFdInfoKHR-handleType-01454).
        let fd = unsafe { ext.get_fence_fd(&get) }.map_err(call("vkGetFenceFdKHR"))?;
        match fd {
            -1 => {}
            // SAFETY: a fd >= 0 returned by vkGetFenceFdKHR is a new sync_file
            // fd owned by the caller.
            fd => sub.done = Done::SyncFile(unsafe { OwnedFd::from_raw_fd(fd) }),
        }
        Ok(sub)
    }

    /// Submits under the queue lock held by the caller; returns the timeline value.
    fn queue_submit(
        &self,
        slot: &Slot,
        cmds: &[vk::CommandBuffer],
        fence: vk::Fence,
    ) -> VkResult<u64> {
        let value = slot.last + 1;
        let values = [value];
        let sems = [self.0.queue.timeline];
        let mut tl = vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
        let submit = vk::SubmitInfo::default()
            .command_buffers(cmds)
            .signal_semaphores(&sems)
            .push_next(&mut tl);
        // SAFETY: the queue is used under its mutex (held by the caller); the
        // command buffers follow the submit contract above; arrays live here.
        unsafe { self.0.device.queue_submit(slot.queue, &[submit], fence) }
            .map_err(call("vkQueueSubmit"))?;
        Ok(value)
    }

    fn waiter_tx(&self, slot: &mut Slot) -> Sender<WaitReq> {
        if slot.waiter.is_none() {
            let (tx, rx) = unbounded::<WaitReq>();
            let dev = self.0.device.clone();
            let sem = self.0.queue.timeline;
            let thread = std::thread::Builder::new()
                .name("xtc-vk-waiter".into())
                .spawn(move || {
                    for req in rx {
                        match req {
                            WaitReq::Signal(v, ev) => {
                                wait_value(&dev, sem, v, u64::MAX).ok();
                                // A failed write (a corrupted fd) leaves the fence flagged;
                                // Submission::wait still reads the timeline.
                                let _ = ev.signal();
                            }
                            WaitReq::Flush(ack) => drop(ack.send(())),
                        }
                    }
                })
                .expect("spawn the vk waiter thread");
            slot.waiter = Some(Waiter { tx, thread });
        }
        slot.waiter
            .as_ref()
            .map(|w| w.tx.clone())
            .expect("waiter started")
    }

    /// Returns once the waiter thread has handled every submission made so far
    /// and dropped its reference to their eventfds (tests count fds after it).
    pub fn sync_waiter(&self) {
        let tx = self.0.queue.lock().waiter.as_ref().map(|w| w.tx.clone());
        if let Some(tx) = tx {
            let (ack_tx, ack_rx) = crossbeam_channel::bounded(1);
            if tx.send(WaitReq::Flush(ack_tx)).is_ok() {
                let _ = ack_rx.recv();
            }
        }
    }

    /// Waits until everything submitted on this device so far has completed
    /// (used before destroying objects a pending command buffer may use).
    ///
    /// # Errors
    /// Device lost.
    pub fn wait_submitted(&self) -> VkResult<()> {
        let last = self.0.queue.lock().last;
        wait_value(&self.0.device, self.0.queue.timeline, last, u64::MAX).map(|_| ())
    }

    /// Waits until this device's timeline reaches `value`.
    pub(crate) fn wait_value(&self, value: u64) -> VkResult<()> {
        wait_value(&self.0.device, self.0.queue.timeline, value, u64::MAX).map(|_| ())
    }

    /// Current value of the device's timeline semaphore (the last completed
    /// submission's value).
    ///
    /// # Errors
    /// A failed `vkGetSemaphoreCounterValue` (device lost).
    pub fn completed_value(&self) -> VkResult<u64> {
        // SAFETY: the semaphore is a timeline semaphore of this device.
        unsafe {
            self.0
                .device
                .get_semaphore_counter_value(self.0.queue.timeline)
        }
        .map_err(call("vkGetSemaphoreCounterValue"))
    }
}

fn wait_value(
    dev: &ash::Device,
    sem: vk::Semaphore,
    value: u64,
    timeout_ns: u64,
) -> VkResult<bool> {
    let sems = [sem];
    let values = [value];
    let info = vk::SemaphoreWaitInfo::default()
        .semaphores(&sems)
        .values(&values);
    // SAFETY: `sem` is a live timeline semaphore of `dev` (destroyed only after
    // the waiter thread is joined / all submissions dropped); arrays live here.
    match unsafe { dev.wait_semaphores(&info, timeout_ns) } {
        Ok(()) => Ok(true),
        Err(vk::Result::TIMEOUT) => Ok(false),
        Err(e) => Err(call("vkWaitSemaphores")(e)),
    }
}

impl Submission {
    /// The pollable completion fd (POLLIN once the work is done): a sync_file
    /// or an eventfd, see [`kind`](Self::kind). Valid while `self` lives.
    pub fn fence_fd(&self) -> BorrowedFd<'_> {
        match &self.done {
            Done::Event(e) => e.as_fd(),
            Done::SyncFile(fd) => fd.as_fd(),
        }
    }

    /// What [`fence_fd`](Self::fence_fd) is.
    pub fn kind(&self) -> FenceKind {
        match self.done {
            Done::Event(_) => FenceKind::EventFd,
            Done::SyncFile(_) => FenceKind::SyncFile,
        }
    }

    /// The timeline value this submission signals.
    pub fn value(&self) -> u64 {
        self.value
    }

    /// Whether the work has completed (no blocking).
    ///
    /// # Errors
    /// Device lost.
    pub fn is_complete(&self) -> VkResult<bool> {
        Ok(self.dev.completed_value()? >= self.value)
    }

    /// Blocks up to `timeout` (`None`: forever) for the work; returns whether
    /// it completed. Device writes are visible to the host afterwards when the
    /// command buffer ended with [`super::Recorder::host_barrier`].
    ///
    /// # Errors
    /// Device lost.
    pub fn wait(&self, timeout: Option<Duration>) -> VkResult<bool> {
        let ns = timeout.map_or(u64::MAX, |d| {
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
        });
        wait_value(
            &self.dev.0.device,
            self.dev.0.queue.timeline,
            self.value,
            ns,
        )
    }
}

/// The completion fd ([`Submission::fence_fd`]), so a submission can be
/// handed to `batch::Exec::Fence` as an `Rc<dyn AsFd>` (or `Arc`) whose fd
/// stays open until the last clone drops.
impl AsFd for Submission {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fence_fd()
    }
}

impl Drop for Submission {
    fn drop(&mut self) {
        if self.fence != vk::Fence::null() {
            let _ = self.wait(None);
            // SAFETY: the submission that signals the fence has completed.
            unsafe { self.dev.0.device.destroy_fence(self.fence, None) };
        }
    }
}

/// An event the host sets: a command buffer that records
/// [`super::Recorder::wait_gate`] does no work past that point, so its
/// submission is pending, and its completion fd not readable, until the host
/// calls [`open`](Self::open) (`vkSetEvent`; `vkCmdWaitEvents` on an event
/// the host sets after the submission, allowed outside a render pass). For
/// tests of completion fds: a pending state that does not depend on timing.
pub struct HostGate {
    dev: Device,
    event: vk::Event,
}

impl std::fmt::Debug for HostGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostGate").finish_non_exhaustive()
    }
}

impl HostGate {
    /// A closed gate (an unsignalled `VkEvent`) on `dev`.
    ///
    /// # Errors
    /// A failed `vkCreateEvent` (out of memory).
    pub fn new(dev: &Device) -> VkResult<HostGate> {
        let info = vk::EventCreateInfo::default();
        // SAFETY: valid create info for this device.
        let event =
            unsafe { dev.0.device.create_event(&info, None) }.map_err(call("vkCreateEvent"))?;
        Ok(HostGate {
            dev: dev.clone(),
            event,
        })
    }

    /// The device the gate belongs to.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    pub(crate) fn raw(&self) -> vk::Event {
        self.event
    }

    /// Whether [`open`](Self::open) ran.
    ///
    /// # Errors
    /// A failed `vkGetEventStatus` (device lost).
    pub fn is_open(&self) -> VkResult<bool> {
        // SAFETY: a live event of this device.
        unsafe { self.dev.0.device.get_event_status(self.event) }.map_err(call("vkGetEventStatus"))
    }

    /// Opens the gate from the host (`vkSetEvent`): work waiting on it may
    /// go on. Opening an open gate does nothing.
    ///
    /// # Errors
    /// A failed `vkSetEvent` (out of memory).
    pub fn open(&self) -> VkResult<()> {
        // SAFETY: a live event of this device; events may be set by the host
        // while command buffers wait on them.
        unsafe { self.dev.0.device.set_event(self.event) }.map_err(call("vkSetEvent"))
    }
}

impl Drop for HostGate {
    fn drop(&mut self) {
        // Work still waiting on the gate would never finish (and the event
        // may not be destroyed while pending work uses it): open it first.
        let _ = self.open();
        let _ = self.dev.wait_submitted();
        // SAFETY: no pending command buffer uses the event any more (opened,
        // then every submission of the device completed).
        unsafe { self.dev.0.device.destroy_event(self.event, None) };
    }
}
