//! [`Buffer`]: a storage buffer in memory from `gpu-allocator`.
//!
//! # Safety
//! Raw Vulkan calls on buffers of the owning [`Device`]: a buffer is bound to
//! its allocation once, right after creation, and destroyed (then its memory
//! freed) only after every submission on the device has completed.
#![allow(unsafe_code)]

use ash::vk;
use gpu_allocator::MemoryLocation;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme};

use super::device::Device;
use super::pipeline::CommandPool;
use super::{VkError, VkResult, call};

/// Where a buffer's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// Device-local (weights, activations, KV cache); host access only where
    /// the memory happens to be mappable (lavapipe) and staging is not
    /// forced ([`Device::force_staging`]), else through staging buffers.
    Device,
    /// Host-visible, written by the CPU each iteration (per-token metadata).
    Upload,
    /// Host-visible, read back by the CPU (sampled tokens, logits).
    Readback,
}

/// A storage buffer (also a transfer source and destination). Frees its memory
/// on drop, after waiting for the device's submitted work.
pub struct Buffer {
    dev: Device,
    raw: vk::Buffer,
    alloc: Option<Allocation>,
    size: u64,
    /// The mapping is not used (forced staging on a device whose memory is
    /// all host-visible).
    hidden: bool,
}

/// Largest staging buffer [`Buffer::upload_staged`] and
/// [`Buffer::download_staged`] allocate: longer transfers go in pieces of
/// this size (one copy each), so a multi-GiB upload needs no host-visible
/// buffer of its size.
pub const STAGING_PIECE: u64 = 16 << 20;

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("size", &self.size)
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

impl Buffer {
    /// A buffer of `size` bytes at `loc`; `name` labels the allocation.
    ///
    /// # Errors
    /// `Inval` for size 0, `Alloc` when memory runs out, `Call` otherwise.
    pub fn new(dev: &Device, size: u64, loc: Location, name: &str) -> VkResult<Buffer> {
        if size == 0 {
            return Err(VkError::Inval(format!("buffer {name}: size 0")));
        }
        let d = &dev.0.device;
        // UNIFORM_BUFFER: bindings 0 and 1 are also viewed through the
        // kernel ABI's uniform windows (`vk::pipeline::WINDOWS`).
        let usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::UNIFORM_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: valid create info for this device.
        let raw = unsafe { d.create_buffer(&info, None) }.map_err(call("vkCreateBuffer"))?;
        let hidden = loc == Location::Device && dev.force_staging();
        let mut buf = Buffer {
            dev: dev.clone(),
            raw,
            alloc: None,
            size,
            hidden,
        };
        // SAFETY: `raw` is a buffer of this device.
        let mut requirements = unsafe { d.get_buffer_memory_requirements(raw) };
        let device_only = requirements.memory_type_bits & dev.0.device_only_types;
        if hidden && device_only != 0 {
            // Forced staging where the device has memory the host cannot
            // see: only those types (else the mapping is hidden above).
            requirements.memory_type_bits = device_only;
        }
        let location = match loc {
            Location::Device => MemoryLocation::GpuOnly,
            Location::Upload => MemoryLocation::CpuToGpu,
            Location::Readback => MemoryLocation::GpuToCpu,
        };
        let desc = AllocationCreateDesc {
            name,
            requirements,
            location,
            linear: true,
            allocation_scheme: AllocationScheme::GpuAllocatorManaged,
        };
        let alloc = buf.alloc.insert(dev.allocate(&desc)?);
        // SAFETY: the allocation satisfies `requirements`; the buffer is unbound.
        unsafe { d.bind_buffer_memory(raw, alloc.memory(), alloc.offset()) }
            .map_err(call("vkBindBufferMemory"))?;
        Ok(buf)
    }

    /// A buffer of `size` bytes (a multiple of 4) at `loc`, zeroed on the
    /// device (`vkCmdFillBuffer`, then a barrier so later kernels and copies
    /// see the zeros): no host buffer of its size, whether or not its memory
    /// is mappable. Returns after the fill completed.
    ///
    /// # Errors
    /// As [`new`](Self::new); `Inval` for a size that is not a multiple of 4;
    /// submit errors.
    pub fn zeroed(dev: &Device, size: u64, loc: Location, name: &str) -> VkResult<Buffer> {
        let buf = Buffer::new(dev, size, loc, name)?;
        let mut pool = CommandPool::new(dev)?;
        let mut rec = pool.record_plain()?;
        rec.fill(&buf, 0, size, 0)?;
        rec.barrier();
        let done = rec.finish()?;
        pool.submit(vec![done])?.wait(None)?;
        Ok(buf)
    }

    /// The device the buffer belongs to.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The raw handle.
    pub fn raw(&self) -> vk::Buffer {
        self.raw
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether the host can read and write it directly ([`write`](Self::write),
    /// [`read`](Self::read)): host-visible memory, and not a
    /// [`Location::Device`] buffer under forced staging.
    pub fn is_mapped(&self) -> bool {
        !self.hidden
            && self
                .alloc
                .as_ref()
                .is_some_and(|a| a.mapped_ptr().is_some())
    }

    fn range(&self, offset: u64, len: usize) -> VkResult<std::ops::Range<usize>> {
        let end = offset.checked_add(len as u64).filter(|e| *e <= self.size);
        let end = end.ok_or_else(|| {
            VkError::Inval(format!(
                "range {offset}+{len} outside a {}-byte buffer",
                self.size
            ))
        })?;
        Ok(offset as usize..end as usize)
    }

    /// Writes `data` at byte `offset` through the mapping.
    ///
    /// # Errors
    /// `Inval` if the buffer is not mapped or the range is outside it.
    pub fn write<T: bytemuck::Pod>(&mut self, offset: u64, data: &[T]) -> VkResult<()> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let r = self.range(offset, bytes.len())?;
        let map = self.alloc.as_mut().filter(|_| !self.hidden);
        let map = map.and_then(|a| a.mapped_slice_mut());
        let map = map.ok_or_else(|| VkError::Inval("buffer is not host-mapped".into()))?;
        map[r].copy_from_slice(bytes);
        Ok(())
    }

    /// Reads `out.len()` elements at byte `offset` through the mapping. Call it
    /// after the submission that wrote them completed (its command buffer
    /// ending with a host barrier).
    ///
    /// # Errors
    /// `Inval` if the buffer is not mapped or the range is outside it.
    pub fn read<T: bytemuck::Pod>(&self, offset: u64, out: &mut [T]) -> VkResult<()> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        let r = self.range(offset, bytes.len())?;
        let map = self.alloc.as_ref().filter(|_| !self.hidden);
        let map = map.and_then(|a| a.mapped_slice());
        let map = map.ok_or_else(|| VkError::Inval("buffer is not host-mapped".into()))?;
        bytes.copy_from_slice(&map[r]);
        Ok(())
    }

    /// Writes `data` at byte `offset`: directly when mapped, else through a
    /// staging buffer and a copy on the queue ([`upload_staged`](Self::upload_staged)).
    ///
    /// # Errors
    /// As [`write`](Self::write) / [`upload_staged`](Self::upload_staged).
    pub fn upload<T: bytemuck::Pod>(&mut self, offset: u64, data: &[T]) -> VkResult<()> {
        if self.is_mapped() {
            self.write(offset, data)
        } else {
            self.upload_staged(offset, data)
        }
    }

    /// Writes `data` at byte `offset` through a host-visible staging buffer
    /// of at most [`STAGING_PIECE`] bytes and one `vkCmdCopyBuffer` per piece
    /// on the queue; returns after the last copy completed. Later
    /// submissions' kernels and copies see the data.
    ///
    /// # Errors
    /// `Inval` for a range outside the buffer; allocation or submit errors.
    pub fn upload_staged<T: bytemuck::Pod>(&mut self, offset: u64, data: &[T]) -> VkResult<()> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        self.range(offset, bytes.len())?;
        if bytes.is_empty() {
            return Ok(());
        }
        let piece = STAGING_PIECE.min(bytes.len() as u64);
        let mut staging = Buffer::new(&self.dev, piece, Location::Upload, "upload staging")?;
        let mut pool = CommandPool::new(&self.dev)?;
        for (i, chunk) in bytes.chunks(piece as usize).enumerate() {
            pool.reset()?;
            staging.write(0, chunk)?;
            let mut rec = pool.record_plain()?;
            let at = offset + i as u64 * piece;
            rec.copy(&staging, 0, self, at, chunk.len() as u64)?;
            // The copy's writes must be visible to the kernels of later
            // submissions on this queue (a barrier's second scope reaches
            // commands later in submission order; waiting on the host does
            // not make device writes visible to later device reads).
            rec.barrier();
            let done = rec.finish()?;
            pool.submit(vec![done])?.wait(None)?;
        }
        Ok(())
    }

    /// Reads `out.len()` elements at byte `offset`: directly when mapped
    /// ([`read`](Self::read)), else through staging
    /// ([`download_staged`](Self::download_staged)).
    ///
    /// # Errors
    /// As [`read`](Self::read) / [`download_staged`](Self::download_staged).
    pub fn download<T: bytemuck::Pod>(&self, offset: u64, out: &mut [T]) -> VkResult<()> {
        if self.is_mapped() {
            self.read(offset, out)
        } else {
            self.download_staged(offset, out)
        }
    }

    /// Reads `out.len()` elements at byte `offset` through a host-visible
    /// staging buffer of at most [`STAGING_PIECE`] bytes: per piece, a
    /// barrier (earlier submissions' kernel and copy writes become visible
    /// to the copy), a `vkCmdCopyBuffer`, a host barrier, a wait. Call it
    /// after the work that wrote the range was submitted.
    ///
    /// # Errors
    /// `Inval` for a range outside the buffer; allocation or submit errors.
    pub fn download_staged<T: bytemuck::Pod>(&self, offset: u64, out: &mut [T]) -> VkResult<()> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        self.range(offset, bytes.len())?;
        if bytes.is_empty() {
            return Ok(());
        }
        let piece = STAGING_PIECE.min(bytes.len() as u64);
        let staging = Buffer::new(&self.dev, piece, Location::Readback, "readback staging")?;
        let mut pool = CommandPool::new(&self.dev)?;
        for (i, chunk) in bytes.chunks_mut(piece as usize).enumerate() {
            pool.reset()?;
            let mut rec = pool.record_plain()?;
            let at = offset + i as u64 * piece;
            rec.barrier();
            rec.copy(self, at, &staging, 0, chunk.len() as u64)?;
            rec.host_barrier();
            let done = rec.finish()?;
            pool.submit(vec![done])?.wait(None)?;
            staging.read(0, chunk)?;
        }
        Ok(())
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let _ = self.dev.wait_submitted();
        // SAFETY: no submitted work uses the buffer any more (waited above);
        // it is destroyed before its memory is freed.
        unsafe { self.dev.0.device.destroy_buffer(self.raw, None) };
        if let Some(a) = self.alloc.take() {
            self.dev.free(a);
        }
    }
}
