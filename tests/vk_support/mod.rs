//! Shared helpers of the `vk_*` tests: thin panicking wrappers over the
//! crate's own (`xtc::ci::Rig`, `xtc::ci::support`), which `xtc ci` uses too.
#![allow(dead_code)]

use std::sync::Arc;

use xtc::vk::{Device, Selector};

/// The default Vulkan device (lavapipe in CI), or `None` (test skipped) when
/// the machine has no Vulkan and `CI` is unset. With `CI` set a missing
/// device fails; any other error (validation requested and not installed)
/// fails always.
pub fn device() -> Option<Device> {
    match Device::open(&Selector::Auto) {
        Ok(d) => Some(d),
        Err(e) if e.is_absent() && std::env::var_os("CI").is_none() => {
            eprintln!("skipping: no Vulkan device ({e}); set CI=1 to make this a failure");
            None
        }
        Err(e) => panic!("CI is set but no Vulkan device opened: {e}"),
    }
}

/// Open fds of this process (entries of /proc/self/fd).
pub fn fd_count() -> usize {
    xtc::ci::support::open_fds().unwrap()
}

/// Largest absolute difference between two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Blocks in poll(2) until `fd` is readable; asserts POLLIN.
pub fn wait_readable(fd: std::os::fd::BorrowedFd<'_>) {
    assert!(
        xtc::ci::support::poll_readable(fd, None).unwrap(),
        "fence fd readable"
    );
}

/// A bench for single kernels ([`xtc::ci::Rig`]): the five kernel-ABI
/// buffers in host-visible memory (0 weights f32, 1 activations f32, 2 KV
/// cache f32, 3 metadata u32, 4 tokens u32), one binding set and a command
/// pool; these wrappers unwrap.
pub struct Rig(pub xtc::ci::Rig);

impl std::ops::Deref for Rig {
    type Target = xtc::ci::Rig;
    fn deref(&self) -> &xtc::ci::Rig {
        &self.0
    }
}

impl std::ops::DerefMut for Rig {
    fn deref_mut(&mut self) -> &mut xtc::ci::Rig {
        &mut self.0
    }
}

impl Rig {
    /// Buffers of `elems[i]` 4-byte elements each; the device's kernel variant.
    pub fn new(dev: &Device, elems: [usize; 5]) -> Rig {
        Rig::with_variant(
            dev,
            elems,
            xtc::decode::model::ops::Variant::for_device(dev),
        )
    }

    /// As [`Rig::new`] with the given kernel variant.
    pub fn with_variant(
        dev: &Device,
        elems: [usize; 5],
        variant: xtc::decode::model::ops::Variant,
    ) -> Rig {
        let kernels = Arc::new(xtc::vk::Kernels::new(dev).unwrap());
        Rig(xtc::ci::Rig::new(kernels, elems, variant).unwrap())
    }

    /// Writes `data` at element `off` of buffer `i`.
    pub fn write<T: bytemuck::Pod>(&mut self, i: usize, off: usize, data: &[T]) {
        self.0.write(i, off, data).unwrap();
    }

    /// Reads `n` elements at element `off` of buffer `i`.
    pub fn read<T: bytemuck::Pod + Default + Clone>(
        &self,
        i: usize,
        off: usize,
        n: usize,
    ) -> Vec<T> {
        self.0.read(i, off, n).unwrap()
    }

    /// Records `f` into one command buffer, submits it and waits for it;
    /// asserts the validation layer (on in debug builds) reported nothing.
    pub fn run(
        &mut self,
        f: impl FnOnce(&xtc::decode::model::ops::Ops, &mut xtc::vk::Recorder<'_>),
    ) {
        let errors = self
            .0
            .run(|ops, rec| -> Result<(), xtc::vk::VkError> {
                f(ops, rec);
                Ok(())
            })
            .unwrap();
        assert_eq!(errors, 0, "Vulkan validation errors");
    }
}

/// `n` seeded uniform values in `[-1, 1)`.
pub fn rand_vec(rng: &mut fastrand::Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.f32() * 2.0 - 1.0).collect()
}
