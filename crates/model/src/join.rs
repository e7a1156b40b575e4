//! The join between a model and whatever drives it (the serving core
//! `xtc-kvbatch`, `xtc serve`, `xtc decode`'s benchmark): ONE trait,
//! [`Model`], and what crosses it.
//!
//! - [`Model`]: `launch(&BatchPlan)` starts one iteration (the whole ready
//!   vector) and returns an owned [`Completion`]; `finish()` then returns the
//!   sampled tokens. `config()` and `describe()` say what the model is.
//! - [`Completion`]: how the launched iteration completes — ready now, a fence
//!   fd the completion owns (`Rc<dyn AsFd>`), or host work for the blocking
//!   pool. It is the only "how to wait" type on the model side; a driver on
//!   the batch engine maps it onto the engine's `Exec` in one place
//!   (`xtc_replay::batch_driver`) and the local driver waits on it in the
//!   calling thread ([`Completion::wait_here`]).
//! - The vocabulary both sides speak: [`BatchPlan`] /
//!   [`SeqWork`](crate::SeqWork) (one iteration's token rows, positions and
//!   block tables) and [`Config`] (the model's shape:
//!   `vocab_size`, `seq_len`, ...). [`DeviceError`] is a launch or finish
//!   failure, by kind (lost, out of memory, unsupported, failed).
//!
//! # Invariants of the join
//! - One plan in flight per model: `launch`, then `finish` (which blocks
//!   until the device is done if the completion has not fired yet), then the
//!   next `launch`. `finish` always ends the iteration: after a timeout or an
//!   abort the driver still calls it, because the device may be running
//!   and owns the plan's buffers.
//! - A [`Completion::Fence`] fd stays open as long as the completion (or a
//!   clone of its `Rc`) lives, whatever the model does meanwhile; the model
//!   keeps its own handle on the submission for `finish`.
//! - A [`Completion::Host`] job's failure is not lost: the job stores it and
//!   `finish` returns it.

use std::os::fd::AsFd;
use std::rc::Rc;

use crate::{BatchPlan, Config};

/// How a launched iteration completes (see the module doc): what a driver
/// waits on before calling [`Model::finish`].
#[must_use = "a launched iteration must be waited for, then finished"]
pub enum Completion {
    /// Nothing to wait for: the result is already there.
    Ready,
    /// A pollable fd (sync_file or eventfd) that becomes readable when the
    /// device has run the plan (B-066). The completion owns it: it stays open
    /// as long as this `Rc` (or a clone) lives.
    Fence(Rc<dyn AsFd>),
    /// Host compute to run off the caller's loop, on the blocking pool (B-078),
    /// then `finish`; a failure inside is returned by `finish`.
    Host(Box<dyn FnOnce() + Send>),
}

impl Completion {
    /// Waits in the calling thread, for drivers without a loop: runs a
    /// [`Host`](Completion::Host) job here; [`Ready`](Completion::Ready) and
    /// [`Fence`](Completion::Fence) need nothing, since [`Model::finish`]
    /// blocks until the device is done.
    pub fn wait_here(self) {
        if let Completion::Host(job) = self {
            job();
        }
    }
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Completion::Ready => f.write_str("Ready"),
            Completion::Fence(fd) => write!(f, "Fence({:?})", fd.as_fd()),
            Completion::Host(_) => f.write_str("Host(..)"),
        }
    }
}

/// A model's launch or finish failure, by what the caller can do about it
/// (the kinds of wgpu-hal's `DeviceError`); each variant carries the
/// model's message. The serving side maps it onto the batch engine's code
/// with `xtc_replay::job::JobError::engine_code`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The device is gone (`VK_ERROR_DEVICE_LOST`, a driver reset): nothing
    /// in flight completes and no later launch will; reopen the device.
    #[error("device model: device lost: {0}")]
    Lost(String),
    /// Device or host memory ran out for the plan's buffers: a smaller
    /// batch or context may fit.
    #[error("device model: out of memory: {0}")]
    OutOfMemory(String),
    /// The plan or the model asks for what this device or model cannot run
    /// (a missing feature or limit, a format without a kernel).
    #[error("device model: unsupported: {0}")]
    Unsupported(String),
    /// Any other failure (a kernel fault, a misuse such as `finish` without
    /// a launch, a CPU reference error), with the model's message.
    #[error("device model: {0}")]
    Failed(String),
}

impl DeviceError {
    /// [`DeviceError::Failed`] with `msg`: the constructor for a failure of
    /// no other kind.
    pub fn failed(msg: impl Into<String>) -> DeviceError {
        DeviceError::Failed(msg.into())
    }

    /// [`DeviceError::Lost`] with `msg`.
    pub fn lost(msg: impl Into<String>) -> DeviceError {
        DeviceError::Lost(msg.into())
    }

    /// [`DeviceError::OutOfMemory`] with `msg`.
    pub fn out_of_memory(msg: impl Into<String>) -> DeviceError {
        DeviceError::OutOfMemory(msg.into())
    }

    /// [`DeviceError::Unsupported`] with `msg`.
    pub fn unsupported(msg: impl Into<String>) -> DeviceError {
        DeviceError::Unsupported(msg.into())
    }

    /// True for [`DeviceError::Lost`]: the device must be reopened before
    /// anything else runs on it (a CI runner moves to a fresh process).
    pub fn is_lost(&self) -> bool {
        matches!(self, DeviceError::Lost(_))
    }

    /// The model's message, without the kind.
    pub fn message(&self) -> &str {
        match self {
            DeviceError::Lost(m)
            | DeviceError::OutOfMemory(m)
            | DeviceError::Unsupported(m)
            | DeviceError::Failed(m) => m,
        }
    }
}

/// A model that runs one packed iteration at a time: the one trait between
/// the model and whatever drives it (see the module doc for its contract).
pub trait Model {
    /// The model's shape (`vocab_size` bounds prompt tokens, `seq_len` the
    /// positions of a request).
    fn config(&self) -> Config;
    /// One line naming the device and model (for the report).
    fn describe(&self) -> String;
    /// Starts the forward pass of `plan` (KV writes for every row, then the
    /// greedy next token of every sequence whose `sample` flag is set).
    ///
    /// # Errors
    /// The model's failure; nothing is in flight then.
    fn launch(&mut self, plan: &BatchPlan) -> Result<Completion, DeviceError>;
    /// The sampled tokens of the launched plan, in plan order. Called after the
    /// completion fired, or earlier: then it blocks until the device is done.
    ///
    /// # Errors
    /// The model's failure, or no plan in flight.
    fn finish(&mut self) -> Result<Vec<u32>, DeviceError>;
}

/// A boxed model is a model (what [`crate::open::open`] returns, wrapped by the
/// serving side as any other).
impl<M: Model + ?Sized> Model for Box<M> {
    fn config(&self) -> Config {
        (**self).config()
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn launch(&mut self, plan: &BatchPlan) -> Result<Completion, DeviceError> {
        (**self).launch(plan)
    }
    fn finish(&mut self) -> Result<Vec<u32>, DeviceError> {
        (**self).finish()
    }
}
