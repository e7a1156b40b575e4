//! [`Rig`]: a bench for single kernels, shared by the `vk_*` tests and the
//! `xtc ci` kernels suite. It holds the five kernel-ABI buffers in
//! host-visible memory, optionally the storage image of binding 7, one
//! binding set and a command pool; a caller writes inputs, records ops with
//! [`xtc_model::vulkan::ops::Ops::run`], and reads outputs back.

use std::sync::Arc;

use xtc_model::vulkan::ops::{Ops, Variant};
use xtc_vk::{
    BINDINGS, BindingSet, Buffer, CommandPool, Device, Kernels, Location, Recorder, StorageImage,
    Submission, VkError, VkResult, WINDOWS, Window,
};

/// The kernel ABI's buffers (0 weights f32, 1 activations f32, 2 KV cache
/// f32, 3 metadata u32, 4 tokens u32) in host-visible memory, an optional
/// storage image, a binding set over them and a command pool.
pub struct Rig {
    /// The ops in the rig's variant (replaceable, e.g. with windows off).
    pub ops: Ops,
    // Field order is drop order: the pool and set go before what they use.
    pool: CommandPool,
    set: BindingSet,
    image: Option<(StorageImage, bool)>,
    bufs: Vec<Buffer>,
    kernels: Arc<Kernels>,
}

impl std::fmt::Debug for Rig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rig")
            .field("variant", &self.ops.variant())
            .field(
                "sizes",
                &self.bufs.iter().map(Buffer::size).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Rig {
    /// Buffers of `elems[i]` 4-byte elements each (at least 1), on the
    /// device of `kernels`, running the ops of `variant`.
    ///
    /// # Errors
    /// As [`Buffer::new`], [`BindingSet::new`], [`CommandPool::new`].
    pub fn new(
        kernels: Arc<Kernels>,
        elems: [usize; BINDINGS as usize],
        variant: Variant,
    ) -> VkResult<Rig> {
        Rig::build(kernels, elems, variant, None)
    }

    /// As [`Rig::new`], with a storage image of `extent` (`[width, height,
    /// layers]` texels) at binding 7, moved to layout `GENERAL` by the first
    /// [`Rig::run`].
    ///
    /// # Errors
    /// As [`Rig::new`] and [`StorageImage::new`].
    pub fn with_image(
        kernels: Arc<Kernels>,
        elems: [usize; BINDINGS as usize],
        variant: Variant,
        extent: [u32; 3],
    ) -> VkResult<Rig> {
        Rig::build(kernels, elems, variant, Some(extent))
    }

    fn build(
        kernels: Arc<Kernels>,
        elems: [usize; BINDINGS as usize],
        variant: Variant,
        extent: Option<[u32; 3]>,
    ) -> VkResult<Rig> {
        let dev = kernels.device().clone();
        let ops = Ops::new(&kernels, variant)?;
        let bufs = elems
            .iter()
            .map(|&n| {
                let bytes = (n.max(1) as u64)
                    .checked_mul(4)
                    .ok_or_else(|| VkError::Inval(format!("rig buffer of {n} elements")))?;
                Buffer::new(&dev, bytes, Location::Readback, "rig")
            })
            .collect::<VkResult<Vec<_>>>()?;
        let image = match extent {
            Some([w, h, l]) => Some((StorageImage::new(&dev, w, h, l, "rig")?, false)),
            None => None,
        };
        let refs: Vec<&Buffer> = bufs.iter().collect();
        let set = BindingSet::with_image(&kernels, &refs, image.as_ref().map(|(i, _)| i))?;
        let pool = CommandPool::new(&dev)?;
        Ok(Rig {
            ops,
            pool,
            set,
            image,
            bufs,
            kernels,
        })
    }

    /// The device.
    pub fn device(&self) -> &Device {
        self.kernels.device()
    }

    /// The uniform windows of the rig's binding set (over buffers 0 and 1).
    pub fn windows(&self) -> [Window; WINDOWS as usize] {
        self.set.windows()
    }

    /// Elements (4 bytes each) of buffer `i`.
    pub fn len(&self, i: usize) -> usize {
        (self.bufs[i].size() / 4) as usize
    }

    /// Writes `data` at element `off` of buffer `i`.
    ///
    /// # Errors
    /// `Inval` for a range outside the buffer.
    pub fn write<T: bytemuck::Pod>(&mut self, i: usize, off: usize, data: &[T]) -> VkResult<()> {
        self.bufs[i].write((off * 4) as u64, data)
    }

    /// Reads `n` elements at element `off` of buffer `i`.
    ///
    /// # Errors
    /// `Inval` for a range outside the buffer.
    pub fn read<T: bytemuck::Pod + Default + Clone>(
        &self,
        i: usize,
        off: usize,
        n: usize,
    ) -> VkResult<Vec<T>> {
        let mut v = vec![T::default(); n];
        self.bufs[i].read((off * 4) as u64, &mut v)?;
        Ok(v)
    }

    /// Records `f` into one command buffer (after the image's layout
    /// transition on the first submission), ends it with a host barrier and
    /// submits it; the returned [`Submission`]'s fd signals completion. The
    /// next call waits for it (the pool is reset).
    ///
    /// # Errors
    /// What `f` returns, and as [`CommandPool::record`] / `submit`.
    pub fn submit<E: From<VkError>>(
        &mut self,
        f: impl FnOnce(&Ops, &mut Recorder<'_>) -> Result<(), E>,
    ) -> Result<Submission, E> {
        self.pool.reset()?;
        let mut rec = self.pool.record(&self.kernels, &self.set)?;
        if let Some((img, false)) = &self.image {
            rec.init_image(img);
        }
        f(&self.ops, &mut rec)?;
        rec.host_barrier();
        let cmd = rec.finish()?;
        let sub = self.pool.submit(vec![cmd])?;
        if let Some((_, inited)) = &mut self.image {
            *inited = true;
        }
        Ok(sub)
    }

    /// [`Rig::submit`], then waits for the work; returns the
    /// validation-layer error count of the process afterwards (0 when
    /// validation is off).
    ///
    /// # Errors
    /// As [`Rig::submit`] and [`Submission::wait`].
    pub fn run<E: From<VkError>>(
        &mut self,
        f: impl FnOnce(&Ops, &mut Recorder<'_>) -> Result<(), E>,
    ) -> Result<u64, E> {
        let sub = self.submit(f)?;
        sub.wait(None)?;
        Ok(xtc_vk::validation_errors())
    }
}
