//! The single-kernel bench of the `xtc ci` kernel suites ([`xtc_ci::Rig`])
//! as panicking wrappers, for the kernel tests of `cargo test`.
#![allow(dead_code)]

use std::sync::Arc;

use xtc_vk::Device;

/// A bench for single kernels ([`xtc_ci::Rig`]): the five kernel-ABI
/// buffers in host-visible memory (0 weights f32, 1 activations f32, 2 KV
/// cache f32, 3 metadata u32, 4 tokens u32), one binding set and a command
/// pool; these wrappers unwrap.
pub struct Rig(pub xtc_ci::Rig);

impl std::ops::Deref for Rig {
    type Target = xtc_ci::Rig;
    fn deref(&self) -> &xtc_ci::Rig {
        &self.0
    }
}

impl std::ops::DerefMut for Rig {
    fn deref_mut(&mut self) -> &mut xtc_ci::Rig {
        &mut self.0
    }
}

impl Rig {
    /// Buffers of `elems[i]` 4-byte elements each; the device's kernel variant.
    pub fn new(dev: &Device, elems: [usize; 5]) -> Rig {
        Rig::with_variant(
            dev,
            elems,
            xtc_model::vulkan::ops::Variant::for_device(dev).unwrap(),
        )
    }

    /// As [`Rig::new`] with the given kernel variant.
    pub fn with_variant(
        dev: &Device,
        elems: [usize; 5],
        variant: xtc_model::vulkan::ops::Variant,
    ) -> Rig {
        let kernels = Arc::new(xtc_vk::Kernels::new(dev).unwrap());
        Rig(xtc_ci::Rig::new(kernels, elems, variant).unwrap())
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
    pub fn run(&mut self, f: impl FnOnce(&xtc_model::vulkan::ops::Ops, &mut xtc_vk::Recorder<'_>)) {
        let errors = self
            .0
            .run(|ops, rec| -> Result<(), xtc_vk::VkError> {
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
