//! `vk` layer: Vulkan compute through `ash`, with Mesa's lavapipe CPU device as
//! the embedded default so everything runs on a machine with no GPU.
//!
//! - [`device`]: physical-device discovery ([`enumerate`]) and choice
//!   (discrete > integrated > virtual > CPU, or by index / name / render node
//!   through [`Selector`]), the logical [`Device`] with one compute queue, the
//!   allocator (`gpu-allocator`), validation layers in debug builds, and
//!   [`DeviceOptions`] (forced staging, the pipeline cache's directory).
//! - [`memory`]: [`Buffer`], storage buffers in device-local or host-visible
//!   memory with staging upload and readback paths.
//! - [`pipeline`]: [`Kernels`] (one compute pipeline per entry point of
//!   `kernels/*.wgsl`, compiled to SPIR-V by `crates/vk/build.rs`), [`BindingSet`],
//!   [`CommandPool`] (one per loop: pools are externally synchronized) and the
//!   command [`Recorder`].
//! - [`pipeline_cache`]: the `VkPipelineCache` persisted per device UUID and
//!   driver version (header checked; a bad file is ignored with a warning).
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
pub mod pipeline_cache;
pub mod queue;
pub mod support;

pub use device::{
    Device, DeviceKind, DeviceOptions, Mask, PhysicalDeviceInfo, RenderNode, Selector, Validation,
    enumerate, fail_process_on_validation_errors, last_validation_error, validation_errors,
};
pub use image::{IMAGE_FORMAT, StorageImage, TEXEL_BYTES, TexelFormat};
pub use memory::{Buffer, Location, STAGING_PIECE};
pub use pipeline::{
    BINDINGS, BindingSet, CommandPool, IMAGE_BINDING, Kernel, Kernels, PUSH_BYTES, Recorded,
    Recorder, Timestamps, WEIGHT_IMAGE_BINDING, WINDOW_BYTES, WINDOWS, Window, subgroup_ops_of,
};
pub use queue::{FenceKind, HostGate, Submission};
pub use xtc::accel::EventFence;

pub mod kernels {
    //! SPIR-V of every kernel, compiled from `kernels/*.wgsl` by `crates/vk/build.rs`.
    //!
    //! `KERNELS` lists (entry point name, SPIR-V bytes, little-endian words);
    //! `SUBGROUP_OPS` lists, for the same entry points in the same order, the
    //! subgroup operations each one's SPIR-V declares (its
    //! `GroupNonUniform*` capabilities as `VkSubgroupFeatureFlags` bits; 0:
    //! none), so [`crate::Kernels::new`] builds only what a device runs.
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

use ash::vk;

/// Errors of the Vulkan backend, with kinds: result codes become
/// [`VkError::Lost`], [`VkError::OutOfMemory`] or [`VkError::Call`] through
/// the named mappers below, never by matching text. Converts into
/// [`xtc::Error`]: a missing loader, device or queue is `Nosys`, a selector
/// or argument that matches nothing is `Inval`, out of device/host memory is
/// `Nomem`, a lost device and any other failed Vulkan call is `Internal`.
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
    /// The device was lost (`VK_ERROR_DEVICE_LOST`): it ran into a fault,
    /// a reset or a hang; every later use of it fails too, and its work
    /// must be redone on a new one. Mapped by [`map_host_device_oom_and_lost_err`].
    #[error("{call} failed: the device was lost (VK_ERROR_DEVICE_LOST)")]
    Lost {
        /// The Vulkan entry point.
        call: &'static str,
    },
    /// Out of host or device memory (`VK_ERROR_OUT_OF_HOST_MEMORY`,
    /// `VK_ERROR_OUT_OF_DEVICE_MEMORY`; from the allocator, the device
    /// memory it could not get). Mapped by [`map_host_device_oom_err`].
    #[error("{call} failed: {result}")]
    OutOfMemory {
        /// The Vulkan entry point.
        call: &'static str,
        /// Which of the two codes.
        result: vk::Result,
    },
    /// A Vulkan call failed with a code none of the mappers expects.
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
    /// `XTC_VK_VALIDATION` asked for validation that cannot run here (layer
    /// not installed) or has a value it does not take.
    #[error("{0}")]
    Validation(String),
    /// `XTC_VK_MASK` names a capability that cannot be masked.
    #[error("{0}")]
    Mask(String),
    /// A kernel the device cannot run was asked for: its entry point uses
    /// subgroup operations the device lacks (or hides, `XTC_VK_MASK`), so
    /// [`Kernels::new`] did not build it.
    #[error(
        "kernel {kernel:?} was not built: it needs subgroup operations {needs:?}, and this device's compute stage has {has:?}"
    )]
    Unsupported {
        /// The entry point.
        kernel: String,
        /// The subgroup operations it uses.
        needs: vk::SubgroupFeatureFlags,
        /// Those the device reports (after its [`Mask`]).
        has: vk::SubgroupFeatureFlags,
    },
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
            VkError::NoMatch(_) | VkError::Inval(_) | VkError::Mask(_) => xtc::Error::Inval,
            VkError::Unsupported { .. } => xtc::Error::Nosys,
            VkError::Alloc(_) | VkError::OutOfMemory { .. } => xtc::Error::Nomem,
            VkError::Lost { .. }
            | VkError::Call { .. }
            | VkError::Validation(_)
            | VkError::Io(_)
            | VkError::Fence(_) => xtc::Error::Internal,
        }
    }
}

/// `Result` with [`VkError`].
pub type VkResult<T> = std::result::Result<T, VkError>;

impl VkError {
    /// Whether the machine has no Vulkan at all (no loader, a loader with
    /// no driver, no usable device): the one error a caller may answer by
    /// skipping or falling back to the CPU. Everything else (a selector that
    /// matches nothing, validation requested and missing, a failed call) is
    /// a failure.
    pub fn is_absent(&self) -> bool {
        matches!(
            self,
            VkError::Loader(_)
                | VkError::NoDevice
                | VkError::Call {
                    call: "vkCreateInstance",
                    result: vk::Result::ERROR_INCOMPATIBLE_DRIVER,
                }
        )
    }
}

/// Devices lost in this process (see [`device_lost`]).
static DEVICES_LOST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether a Vulkan call of this process returned `VK_ERROR_DEVICE_LOST`
/// (mapped to [`VkError::Lost`]): `xtc ci` ends a child whose device is gone,
/// whatever error type carried the loss up to the case.
pub fn device_lost() -> bool {
    DEVICES_LOST.load(std::sync::atomic::Ordering::Relaxed) > 0
}

/// Maps a result code of a call that may run out of host or device memory:
/// `ERROR_OUT_OF_HOST_MEMORY` and `ERROR_OUT_OF_DEVICE_MEMORY` are
/// [`VkError::OutOfMemory`]; any other code is [`VkError::Call`] (unexpected).
pub fn map_host_device_oom_err(call: &'static str, result: vk::Result) -> VkError {
    match result {
        vk::Result::ERROR_OUT_OF_HOST_MEMORY | vk::Result::ERROR_OUT_OF_DEVICE_MEMORY => {
            VkError::OutOfMemory { call, result }
        }
        _ => VkError::Call { call, result },
    }
}

/// Maps a result code of a call that may also lose the device (submits,
/// waits, queries, recording's end): `ERROR_DEVICE_LOST` is
/// [`VkError::Lost`], the rest as [`map_host_device_oom_err`].
pub fn map_host_device_oom_and_lost_err(call: &'static str, result: vk::Result) -> VkError {
    match result {
        vk::Result::ERROR_DEVICE_LOST => VkError::Lost { call },
        _ => map_host_device_oom_err(call, result),
    }
}

/// The error mapper of `call` for `map_err`: [`map_host_device_oom_and_lost_err`]
/// (every Vulkan call may return these codes), noting a lost device for
/// [`device_lost`].
pub(crate) fn call(call: &'static str) -> impl FnOnce(vk::Result) -> VkError {
    move |result| {
        let e = map_host_device_oom_and_lost_err(call, result);
        if matches!(e, VkError::Lost { .. }) {
            DEVICES_LOST.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        e
    }
}

/// Maps an allocator error: the allocator's out-of-memory (device memory it
/// could not allocate) is [`VkError::OutOfMemory`], the rest
/// [`VkError::Alloc`].
pub(crate) fn map_alloc_err(e: gpu_allocator::AllocationError) -> VkError {
    match e {
        gpu_allocator::AllocationError::OutOfMemory => VkError::OutOfMemory {
            call: "vkAllocateMemory",
            result: vk::Result::ERROR_OUT_OF_DEVICE_MEMORY,
        },
        other => VkError::Alloc(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_codes_map_to_kinds_by_code() {
        let lost = map_host_device_oom_and_lost_err("vkQueueSubmit", vk::Result::ERROR_DEVICE_LOST);
        assert!(
            matches!(
                lost,
                VkError::Lost {
                    call: "vkQueueSubmit"
                }
            ),
            "{lost:?}"
        );
        assert_eq!(xtc::Error::from(lost), xtc::Error::Internal);
        for code in [
            vk::Result::ERROR_OUT_OF_HOST_MEMORY,
            vk::Result::ERROR_OUT_OF_DEVICE_MEMORY,
        ] {
            let e = map_host_device_oom_and_lost_err("vkCreateBuffer", code);
            assert!(matches!(e, VkError::OutOfMemory { result, .. } if result == code));
            assert_eq!(xtc::Error::from(e), xtc::Error::Nomem);
        }
        // A call that cannot lose the device leaves the code unexpected.
        let e = map_host_device_oom_err("vkCreateBuffer", vk::Result::ERROR_DEVICE_LOST);
        assert!(matches!(e, VkError::Call { .. }), "{e:?}");
        let e = map_host_device_oom_and_lost_err(
            "vkCreateImage",
            vk::Result::ERROR_FORMAT_NOT_SUPPORTED,
        );
        assert!(matches!(e, VkError::Call { .. }), "{e:?}");
        assert_eq!(xtc::Error::from(e), xtc::Error::Internal);
        let e = map_alloc_err(gpu_allocator::AllocationError::OutOfMemory);
        assert_eq!(xtc::Error::from(e), xtc::Error::Nomem);
    }
}
