//! [`StorageImage`]: a 2D-array storage image of 16-byte texels (`rgba32f`
//! or `rgba32ui`, [`TexelFormat`]) in memory from `gpu-allocator`: the kernel
//! ABI's bindings [`super::IMAGE_BINDING`] (the KV cache, `rgba32f`) and
//! [`super::WEIGHT_IMAGE_BINDING`] (quantized weights, `rgba32ui`).
//!
//! Why an image: lavapipe (Mesa llvmpipe 22.x) reads a storage buffer lane by
//! lane with a bounds-checked branch per lane, but fetches image texels with
//! vectorised address arithmetic and gathers; data that kernels read at
//! scattered addresses (the paged KV cache) is cheaper to read from an image.
//!
//! # Safety
//! Raw Vulkan calls on images of the owning [`Device`]: an image is bound to
//! its allocation once, right after creation; its view is created after the
//! binding; both are destroyed (then the memory freed) only after every
//! submission on the device has completed. Kernels use the image in layout
//! `GENERAL`, which [`super::Recorder::init_image`] moves it to (from
//! `UNDEFINED`, discarding contents) before its first use.
#![allow(unsafe_code)]

use ash::vk;
use gpu_allocator::MemoryLocation;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme};

use super::device::Device;
use super::{VkError, VkResult, call};

/// Texel format of the KV-cache [`StorageImage`]: four f32 channels (16 bytes).
pub const IMAGE_FORMAT: vk::Format = vk::Format::R32G32B32A32_SFLOAT;

/// Bytes of one texel of every [`TexelFormat`].
pub const TEXEL_BYTES: u64 = 16;

/// The texel format of a [`StorageImage`]: four 32-bit channels either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TexelFormat {
    /// `rgba32f` ([`IMAGE_FORMAT`]): the KV cache (WGSL `rgba32float`).
    Rgba32F,
    /// `rgba32ui`: raw 16-byte words, e.g. quantized weight blocks (WGSL
    /// `rgba32uint`).
    Rgba32U,
}

impl TexelFormat {
    fn vk(self) -> vk::Format {
        match self {
            TexelFormat::Rgba32F => IMAGE_FORMAT,
            TexelFormat::Rgba32U => vk::Format::R32G32B32A32_UINT,
        }
    }
}

/// A `width x height x layers` 2D-array storage image of 16-byte texels,
/// device-local. Frees its memory on drop, after waiting for the device's
/// submitted work.
pub struct StorageImage {
    dev: Device,
    format: TexelFormat,
    raw: vk::Image,
    view: vk::ImageView,
    alloc: Option<Allocation>,
    extent: [u32; 3],
}

impl std::fmt::Debug for StorageImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageImage")
            .field("extent", &self.extent)
            .finish()
    }
}

impl StorageImage {
    /// An `rgba32f` image of `width x height` texels in each of `layers` layers.
    ///
    /// # Errors
    /// `Inval` for a zero extent or one above the device's
    /// `maxImageDimension2D` / `maxImageArrayLayers`; `Alloc` when memory
    /// runs out; `Call` otherwise.
    pub fn new(
        dev: &Device,
        width: u32,
        height: u32,
        layers: u32,
        name: &str,
    ) -> VkResult<StorageImage> {
        Self::with_format(dev, TexelFormat::Rgba32F, [width, height, layers], name)
    }

    /// An image of `format` with `extent = [width, height, layers]` texels.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_format(
        dev: &Device,
        format: TexelFormat,
        extent: [u32; 3],
        name: &str,
    ) -> VkResult<StorageImage> {
        let [width, height, layers] = extent;
        let (max_dim, max_layers) = dev.image_limits();
        if width == 0
            || height == 0
            || layers == 0
            || width > max_dim
            || height > max_dim
            || layers > max_layers
        {
            return Err(VkError::Inval(format!(
                "image {name}: {width}x{height}x{layers} (limits {max_dim}x{max_dim}x{max_layers})"
            )));
        }
        let d = dev.raw();
        let info = vk::ImageCreateInfo::default()
            .image_type(vk::ImageType::TYPE_2D)
            .format(format.vk())
            .extent(vk::Extent3D {
                width,
                height,
                depth: 1,
            })
            .mip_levels(1)
            .array_layers(layers)
            .samples(vk::SampleCountFlags::TYPE_1)
            .tiling(vk::ImageTiling::OPTIMAL)
            .usage(
                vk::ImageUsageFlags::STORAGE
                    | vk::ImageUsageFlags::TRANSFER_SRC
                    | vk::ImageUsageFlags::TRANSFER_DST,
            )
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .initial_layout(vk::ImageLayout::UNDEFINED);
        // SAFETY: valid create info for this device (extent checked above).
        let raw = unsafe { d.create_image(&info, None) }.map_err(call("vkCreateImage"))?;
        let mut img = StorageImage {
            dev: dev.clone(),
            format,
            raw,
            view: vk::ImageView::null(),
            alloc: None,
            extent: [width, height, layers],
        };
        // SAFETY: `raw` is an image of this device.
        let requirements = unsafe { d.get_image_memory_requirements(raw) };
        let desc = AllocationCreateDesc {
            name,
            requirements,
            location: MemoryLocation::GpuOnly,
            linear: false,
            allocation_scheme: AllocationScheme::GpuAllocatorManaged,
        };
        let alloc = dev.allocate(&desc)?;
        let alloc = img.alloc.insert(alloc);
        // SAFETY: the allocation satisfies `requirements`; the image is unbound.
        unsafe { d.bind_image_memory(raw, alloc.memory(), alloc.offset()) }
            .map_err(call("vkBindImageMemory"))?;
        let view = vk::ImageViewCreateInfo::default()
            .image(raw)
            .view_type(vk::ImageViewType::TYPE_2D_ARRAY)
            .format(format.vk())
            .subresource_range(Self::range(layers));
        // SAFETY: the image is bound to memory; the view covers its one level
        // and all its layers.
        img.view =
            unsafe { d.create_image_view(&view, None) }.map_err(call("vkCreateImageView"))?;
        Ok(img)
    }

    pub(crate) fn range(layers: u32) -> vk::ImageSubresourceRange {
        vk::ImageSubresourceRange::default()
            .aspect_mask(vk::ImageAspectFlags::COLOR)
            .level_count(1)
            .layer_count(layers)
    }

    /// The device the image belongs to.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// `[width, height, layers]` in texels.
    pub fn extent(&self) -> [u32; 3] {
        self.extent
    }

    /// The texel format.
    pub fn format(&self) -> TexelFormat {
        self.format
    }

    /// Texels the image holds: `width * height * layers`.
    pub fn texels(&self) -> u64 {
        self.extent.iter().map(|&n| u64::from(n)).product()
    }

    /// Fills the whole image with `data` (bytes, [`TEXEL_BYTES`] per texel, in
    /// linear texel order: x fastest, then rows, then layers; shorter data
    /// leaves the rest zero) through a host-visible staging buffer and
    /// `vkCmdCopyBufferToImage`, in pieces of at most `1 << 24` bytes, and
    /// leaves the image in layout `GENERAL` with the copy visible to later
    /// submissions' kernels. Returns after the copies completed. Discards the
    /// previous contents (the image goes through layout `UNDEFINED`), so no
    /// [`super::Recorder::init_image`] is needed afterwards.
    ///
    /// # Errors
    /// `Inval` for more data than the image holds or a length that is not a
    /// whole number of texels; allocation or submit errors.
    pub fn upload(&mut self, data: &[u8]) -> VkResult<()> {
        let [w, h, layers] = self.extent;
        let row_bytes = u64::from(w) * TEXEL_BYTES;
        if !(data.len() as u64).is_multiple_of(TEXEL_BYTES)
            || data.len() as u64 > self.texels() * TEXEL_BYTES
        {
            return Err(VkError::Inval(format!(
                "image upload of {} bytes into {}x{}x{} texels",
                data.len(),
                w,
                h,
                layers
            )));
        }
        // Whole rows per piece (rows counted across layers; the data's last
        // row padded with zeros, rows past the data written as zeros).
        let rows_total = u64::from(h) * u64::from(layers);
        let rows_per_piece = ((1u64 << 24) / row_bytes).max(1);
        let mut pool = super::CommandPool::new(&self.dev)?;
        let mut row = 0u64;
        while row < rows_total {
            let n = rows_per_piece.min(rows_total - row);
            let mut piece = vec![0u8; (n * row_bytes) as usize];
            let lo = ((row * row_bytes) as usize).min(data.len());
            let hi = (((row + n) * row_bytes) as usize).min(data.len());
            piece[..hi - lo].copy_from_slice(&data[lo..hi]);
            let mut staging = super::Buffer::new(
                &self.dev,
                piece.len() as u64,
                super::Location::Upload,
                "image staging",
            )?;
            staging.write(0, &piece)?;
            pool.reset()?;
            let mut rec = pool.record_plain()?;
            rec.copy_to_image(&staging, self, row, n, row == 0)?;
            let done = rec.finish()?;
            pool.submit(vec![done])?.wait(None)?;
            row += n;
        }
        Ok(())
    }

    pub(crate) fn raw(&self) -> vk::Image {
        self.raw
    }

    pub(crate) fn view(&self) -> vk::ImageView {
        self.view
    }
}

impl Drop for StorageImage {
    fn drop(&mut self) {
        let _ = self.dev.wait_submitted();
        let d = self.dev.raw();
        // SAFETY: no submitted work uses the image any more (waited above);
        // the view goes before the image, the image before its memory.
        unsafe {
            if self.view != vk::ImageView::null() {
                d.destroy_image_view(self.view, None);
            }
            d.destroy_image(self.raw, None);
        }
        if let Some(a) = self.alloc.take() {
            self.dev.free(a);
        }
    }
}
