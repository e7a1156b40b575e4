//! `vk` layer: Vulkan compute through `ash`, with Mesa's lavapipe CPU device as
//! the embedded default so everything runs on a machine with no GPU.
//!
//! - [`device`]: physical-device discovery ([`enumerate`]) and choice
//!   (discrete > integrated > virtual > CPU, or by index / name / render node
//!   through [`Selector`]), the logical [`Device`] with one compute queue, the
//!   allocator (`gpu-allocator`) and validation layers in debug builds.
//! - [`memory`]: [`Buffer`], storage buffers in device-local or host-visible
//!   memory with a staging upload path.
//! - [`pipeline`]: [`Kernels`] (one compute pipeline per entry point of
//!   `kernels/*.wgsl`, compiled to SPIR-V by `crates/vk/build.rs`), [`BindingSet`],
//!   [`CommandPool`] (one per loop: pools are externally synchronized) and the
//!   command [`Recorder`].
//! - [`queue`]: submission of ONE command buffer per ready vector (or several in
//!   one `vkQueueSubmit`) returning a [`Submission`] whose completion is a
//!   pollable fd: an exported `SYNC_FD` sync_file where the driver supports it,
//!   else an eventfd signalled by the device's single waiter thread on a
//!   timeline semaphore (B-066).
//! - [`EventFence`] (re-exported from [`xtc::accel`]): the eventfd fence of
//!   the fallback path.
//!
//! Errors are [`VkError`], which converts into [`xtc::Error`].
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod device;
pub mod image;
pub mod memory;
pub mod pipeline;
pub mod queue;
pub mod support;

pub use device::{
    Device, DeviceKind, PhysicalDeviceInfo, RenderNode, Selector, enumerate, validation_errors,
};
pub use image::{IMAGE_FORMAT, StorageImage, TEXEL_BYTES, TexelFormat};
pub use memory::{Buffer, Location};
pub use pipeline::{
    BINDINGS, BindingSet, CommandPool, IMAGE_BINDING, Kernel, Kernels, PUSH_BYTES, Recorded,
    Recorder, Timestamps, WEIGHT_IMAGE_BINDING, WINDOW_BYTES, WINDOWS, Window,
};
pub use queue::{FenceKind, Submission};
pub use xtc::accel::EventFence;

pub mod kernels {
    //! SPIR-V of every kernel, compiled from `kernels/*.wgsl` by `crates/vk/build.rs`.
    //!
    //! `KERNELS` lists (entry point name, SPIR-V bytes, little-endian words).
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

use ash::vk;

/// Errors of the Vulkan backend. Converts into [`xtc::Error`]: a missing
/// loader, device or queue is `Nosys`, a selector or argument that matches
/// nothing is `Inval`, out of device/host memory is `Nomem`, any other failed
/// Vulkan call is `Internal`.
#[derive(Debug, thiserror::Error)]
pub enum VkError {
    /// `libvulkan.so.1` could not be opened.
    #[error("Vulkan loader not available: {0}")]
    Loader(String),
    /// No physical device (or none with a compute queue and timeline semaphores).
    #[error("no usable Vulkan device")]
    NoDevice,
    /// The [`Selector`] matched no device.
    #[error("no Vulkan device matches {0}")]
    NoMatch(String),
    /// A Vulkan call failed.
    #[error("{call} failed: {result}")]
    Call {
        /// The Vulkan entry point.
        call: &'static str,
        /// Its result code.
        result: vk::Result,
    },
    /// The memory allocator failed.
    #[error("device memory allocation failed: {0}")]
    Alloc(String),
    /// A malformed argument (size, offset, kernel name, unmapped buffer).
    #[error("invalid argument: {0}")]
    Inval(String),
    /// A system call of the fence plumbing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The eventfd fence could not be made or signalled (fd exhaustion).
    #[error("{0}")]
    Fence(#[from] xtc::accel::FenceError),
}

impl From<VkError> for xtc::Error {
    fn from(e: VkError) -> Self {
        match e {
            VkError::Loader(_) | VkError::NoDevice => xtc::Error::Nosys,
            VkError::NoMatch(_) | VkError::Inval(_) => xtc::Error::Inval,
            VkError::Alloc(_) => xtc::Error::Nomem,
            VkError::Call { result, .. }
                if result == vk::Result::ERROR_OUT_OF_HOST_MEMORY
                    || result == vk::Result::ERROR_OUT_OF_DEVICE_MEMORY =>
            {
                xtc::Error::Nomem
            }
            VkError::Call { .. } | VkError::Io(_) | VkError::Fence(_) => xtc::Error::Internal,
        }
    }
}

/// `Result` with [`VkError`].
pub type VkResult<T> = std::result::Result<T, VkError>;

/// Maps a raw `vk::Result` error to [`VkError::Call`] naming the entry point.
pub(crate) fn call(call: &'static str) -> impl FnOnce(vk::Result) -> VkError {
    move |result| VkError::Call { call, result }
}
