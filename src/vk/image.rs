//! [`StorageImage`]: a 2D-array storage image of `rgba32f` texels in memory
//! from `gpu-allocator`, the kernel ABI's binding [`super::IMAGE_BINDING`].
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

/// Texel format of every [`StorageImage`]: four f32 channels (16 bytes).
pub const IMAGE_FORMAT: vk::Format = vk::Format::R32G32B32A32_SFLOAT;

/// A `width x height x layers` 2D-array storage image of `rgba32f` texels,
/// device-local. Frees its memory on drop, after waiting for the device's
/// submitted work.
pub struct StorageImage {
    dev: Device,
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
    /// An image of `width x height` texels in each of `layers` layers.
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
            .format(IMAGE_FORMAT)
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
            .format(IMAGE_FORMAT)
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
