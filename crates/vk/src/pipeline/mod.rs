//! Compute pipelines ([`Kernels`]), their buffer bindings ([`BindingSet`]),
//! command pools ([`CommandPool`], one per loop) and recording ([`Recorder`]).
//!
//! Kernel ABI (shared by every `kernels/*.wgsl`): descriptor set 0 with
//! [`BINDINGS`] storage buffers, then [`WINDOWS`] dynamic uniform buffers
//! (bindings `BINDINGS..BINDINGS + WINDOWS`, the *uniform windows*: window
//! `i` views the buffer of storage binding `i` — weights and activations —
//! over at most [`WINDOW_BYTES`] from a dynamic offset chosen per dispatch),
//! then one storage image ([`IMAGE_BINDING`], an `rgba32f` 2D array, see
//! [`StorageImage`]; optional: bound only by sets made with
//! [`BindingSet::with_image`], and only kernels that read it need it), then
//! a second one ([`WEIGHT_IMAGE_BINDING`], an `rgba32ui` 2D array holding
//! quantized weights on CPU devices, read only; optional likewise,
//! [`BindingSet::with_images`]),
//! and a push-constant block of at most [`PUSH_BYTES`] bytes, so one pipeline
//! layout and one descriptor set serve every kernel and a whole iteration
//! binds its buffers once.
//!
//! Why windows: lavapipe (Mesa llvmpipe 22.x) issues every storage-buffer load
//! lane by lane with a bounds check, while a uniform-buffer load is one vector
//! gather, or one scalar load broadcast when the address is the same in every
//! lane. Kernels whose operands fit a window ([`Window::place`]) read them
//! through it ([`Recorder::dispatch_windowed`]); on that device the windowed
//! matmul runs 3-4x faster than the best storage-buffer form.
//!
//! # Safety
//! Raw Vulkan calls. Invariants: a command buffer is recorded only through a
//! [`Recorder`], which borrows its [`CommandPool`] mutably (pools are
//! externally synchronized; `CommandPool` is `!Sync`); a pool is reset or
//! destroyed only after its last submission completed (it remembers the
//! timeline value); pipelines, layouts and descriptor sets are destroyed only
//! after the device's submitted work completed.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::marker::PhantomData;

use ash::vk;

use super::device::{Device, c_name};
use super::image::StorageImage;
use super::memory::Buffer;
use super::queue::{HostGate, Submission};
use super::{
    VkError, VkResult, call,
    kernels::{INT8, INTEGER_DOT, KERNELS, SUBGROUP_OPS},
};

mod command;

pub use command::{CommandPool, Recorded, Recorder, Timestamps};

/// Storage-buffer bindings of the kernel ABI (set 0, bindings `0..BINDINGS`).
pub const BINDINGS: u32 = 5;
/// Uniform windows of the kernel ABI: binding `BINDINGS + i` is a dynamic
/// uniform buffer viewing the buffer of storage binding `i` (0: weights,
/// 1: activations). See [`Window`].
pub const WINDOWS: u32 = 2;
/// Binding of the kernel ABI's storage image (after the uniform windows).
pub const IMAGE_BINDING: u32 = BINDINGS + WINDOWS;
/// Binding of the kernel ABI's weight image: an `rgba32ui` 2D-array storage
/// image that kernels only read (quantized weight blocks on CPU devices,
/// where texel fetches are vectorised and storage-buffer loads are not).
pub const WEIGHT_IMAGE_BINDING: u32 = IMAGE_BINDING + 1;

/// Bytes a uniform window covers at most: the kernels declare their window
/// blocks as `array<vec4<f32>, 4096>` (64 KiB, llvmpipe's
/// `maxUniformBufferRange`); smaller on a device whose limit is smaller, or
/// over a smaller buffer.
pub const WINDOW_BYTES: u64 = 65536;

/// Geometry of one uniform window over a [`BindingSet`]'s buffer: what
/// [`Recorder::dispatch_windowed`] may be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Bytes the window covers from its offset:
    /// `min(WINDOW_BYTES, maxUniformBufferRange, buffer size)`, less up to
    /// `align - 16` so that a window can end at the buffer's end
    /// ([`Window::for_buffer`]).
    pub range: u64,
    /// Dynamic offsets are multiples of this many bytes: the device's
    /// `minUniformBufferOffsetAlignment` rounded up to a multiple of 16 (one
    /// `vec4`, so window-relative `vec4` indices stay exact).
    pub align: u64,
    /// Size of the viewed buffer in bytes (`offset + range` stays within it).
    pub buffer: u64,
}

impl Window {
    fn new(dev: &Device, buffer: u64) -> Window {
        let (max_range, align) = dev.uniform_limits();
        Window::for_buffer(max_range, align, buffer)
    }

    /// The window over a buffer of `buffer` bytes on a device whose
    /// `maxUniformBufferRange` is `max_range` and whose
    /// `minUniformBufferOffsetAlignment` is `align` (bytes; rounded up to a
    /// multiple of 16). Its range is `min(WINDOW_BYTES, max_range, buffer)`,
    /// shortened by less than `align` where needed so that `buffer - range`
    /// is a multiple of `align`: the last legal offset then ends exactly at
    /// the buffer's end, and [`place`](Self::place) reaches every byte. (With
    /// the full range and a 64-byte alignment, as on an NVIDIA H200, the last
    /// offset stopped up to 48 bytes short of the end, and an operand that
    /// ends the buffer got no windowed form.)
    ///
    /// ```
    /// use xtc_vk::{Window, WINDOW_BYTES};
    /// // 16-byte offsets (lavapipe): the full window.
    /// let w = Window::for_buffer(65536, 16, 82_224);
    /// assert_eq!(w.range, WINDOW_BYTES);
    /// // 64-byte offsets: 16 bytes shorter, so the last window ends the buffer.
    /// let w = Window::for_buffer(65536, 64, 82_224);
    /// assert_eq!((w.range, w.align), (65_520, 64));
    /// assert_eq!(w.place(82_208), Some((82_224 - 65_520, 16)));
    /// ```
    pub fn for_buffer(max_range: u64, align: u64, buffer: u64) -> Window {
        let align = align.max(1).div_ceil(16) * 16;
        let mut range = WINDOW_BYTES.min(max_range).min(buffer);
        let short = (buffer - range) % align;
        if short != 0 && range > align {
            range -= align - short;
        }
        Window {
            range,
            align,
            buffer,
        }
    }

    /// The dynamic offset (bytes) of a window that starts at or below byte
    /// `start` and covers as much as possible after it, with the number of
    /// bytes from `start` that it covers; `None` when `start` is not a
    /// multiple of 16 or lies outside the buffer.
    ///
    /// ```
    /// use xtc_vk::Window;
    /// // A 1 MiB buffer seen through a 64 KiB window with 256-byte offsets.
    /// let w = Window { range: 65536, align: 256, buffer: 1 << 20 };
    /// assert_eq!(w.place(16_000), Some((15_872, 65_408)));
    /// // Near the end the window cannot move past the buffer: it covers less.
    /// assert_eq!(w.place((1 << 20) - 64), Some(((1 << 20) - 65536, 64)));
    /// // Not a multiple of 16 bytes, or outside the buffer: no placement.
    /// assert_eq!(w.place(8), None);
    /// assert_eq!(w.place(1 << 20), None);
    /// // A buffer smaller than a window: one placement at 0.
    /// let small = Window { range: 4096, align: 16, buffer: 4096 };
    /// assert_eq!(small.place(4080), Some((0, 16)));
    /// ```
    pub fn place(&self, start: u64) -> Option<(u64, u64)> {
        if !start.is_multiple_of(16) || start >= self.buffer || self.range == 0 {
            return None;
        }
        // The highest legal offset keeps `offset + range` inside the buffer.
        let last = (self.buffer - self.range) / self.align * self.align;
        let off = (start / self.align * self.align).min(last);
        let covered = (off + self.range).checked_sub(start)?;
        Some((off, covered))
    }
}
/// Accesses that [`Recorder::barrier`] makes earlier writes visible to:
/// shader and transfer reads and writes, and uniform reads (the windows):
/// `SHADER_READ` covers storage buffers and images but not uniform buffers,
/// which only `UNIFORM_READ` names.
const BARRIER_READS_WRITES: vk::AccessFlags = vk::AccessFlags::from_raw(
    vk::AccessFlags::UNIFORM_READ.as_raw()
        | vk::AccessFlags::SHADER_READ.as_raw()
        | vk::AccessFlags::SHADER_WRITE.as_raw()
        | vk::AccessFlags::TRANSFER_READ.as_raw()
        | vk::AccessFlags::TRANSFER_WRITE.as_raw(),
);

/// Size of the push-constant range of the kernel ABI, in bytes: Vulkan's
/// guaranteed minimum of `maxPushConstantsSize` (the quantized products'
/// parameters take 76).
pub const PUSH_BYTES: u32 = 128;

/// One compute pipeline (a kernel entry point). `Copy`; valid while its
/// [`Kernels`] lives.
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    pipeline: vk::Pipeline,
    /// Identity of the owning device (checked at dispatch).
    dev_id: usize,
}

/// Every kernel compiled from `kernels/` that the device can run, as a
/// pipeline, with the shared descriptor-set and pipeline layouts.
pub struct Kernels {
    dev: Device,
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    pipelines: Vec<(&'static str, vk::Pipeline)>,
}

/// The subgroup operations the SPIR-V of entry point `name` uses
/// (`vk::kernels::SUBGROUP_OPS`; empty for an unknown name).
pub fn subgroup_ops_of(name: &str) -> vk::SubgroupFeatureFlags {
    let bits = SUBGROUP_OPS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |e| e.1);
    vk::SubgroupFeatureFlags::from_raw(bits)
}

impl Kernels {
    /// Builds a pipeline for every entry point in `vk::kernels::KERNELS`
    /// that the device can run, through the device's pipeline cache, then
    /// writes that cache back to its file ([`Device::save_pipeline_cache`];
    /// a failed write is a warning on stderr), except the int8-activation
    /// products and their quantizer (`vk::kernels::INT8`, see
    /// [`with_int8`](Self::with_int8)). An entry point whose SPIR-V
    /// uses subgroup operations ([`subgroup_ops_of`]) is built only when they
    /// are all among [`Device::subgroup_operations`] (so a device without
    /// subgroups, or with them masked, never compiles one); [`Kernels::get`]
    /// of an entry point left out is [`VkError::Unsupported`].
    ///
    /// # Errors
    /// `Call` if a layout, shader module or pipeline cannot be created.
    pub fn new(dev: &Device) -> VkResult<Kernels> {
        Kernels::build_where(dev, false, |_| true)
    }

    /// As [`new`](Self::new), with the int8-activation entry points too
    /// (`vk::kernels::INT8`; about a third more build time on lavapipe).
    /// Those using `OpSDot` (`vk::kernels::INTEGER_DOT`) are built only
    /// where [`Device::integer_dot_product`]; their `_poly` twins always.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_int8(dev: &Device) -> VkResult<Kernels> {
        Kernels::build_where(dev, true, |_| true)
    }

    /// As [`new`](Self::new), building only the entry points named in
    /// `names` (and that the device can run; int8 entry points included
    /// when named): a cheap set for a probe or a single-kernel test.
    ///
    /// # Errors
    /// As [`new`](Self::new); `Inval` for a name not in `kernels/`.
    pub fn only(dev: &Device, names: &[&str]) -> VkResult<Kernels> {
        if let Some(n) = names.iter().find(|n| !KERNELS.iter().any(|(k, _)| k == *n)) {
            return Err(VkError::Inval(format!("no kernel named {n:?}")));
        }
        Kernels::build_where(dev, true, |n| names.contains(&n))
    }

    fn build_where(dev: &Device, int8: bool, wanted: impl Fn(&str) -> bool) -> VkResult<Kernels> {
        let d = dev.raw();
        let bindings: Vec<_> = (0..BINDINGS)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .chain((0..WINDOWS).map(|i| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(BINDINGS + i)
                    .descriptor_type(vk::DescriptorType::UNIFORM_BUFFER_DYNAMIC)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            }))
            .chain([IMAGE_BINDING, WEIGHT_IMAGE_BINDING].map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_IMAGE)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            }))
            .collect();
        let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
        // SAFETY: valid create info; the array lives across the call.
        let set_layout = unsafe { d.create_descriptor_set_layout(&info, None) }
            .map_err(call("vkCreateDescriptorSetLayout"))?;
        let mut me = Kernels {
            dev: dev.clone(),
            set_layout,
            layout: vk::PipelineLayout::null(),
            pipelines: vec![],
        };
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .size(PUSH_BYTES)];
        let layouts = [set_layout];
        let info = vk::PipelineLayoutCreateInfo::default()
            .set_layouts(&layouts)
            .push_constant_ranges(&ranges);
        // SAFETY: valid create info; arrays live across the call.
        me.layout = unsafe { d.create_pipeline_layout(&info, None) }
            .map_err(call("vkCreatePipelineLayout"))?;
        let has = dev.subgroup_operations();
        for (name, spv) in KERNELS {
            let skip_int8 = INT8.contains(name)
                && (!int8 || (INTEGER_DOT.contains(name) && !dev.integer_dot_product()));
            if !skip_int8 && wanted(name) && has.contains(subgroup_ops_of(name)) {
                let p = me.build(name, spv)?;
                me.pipelines.push((name, p));
            }
        }
        save_pipeline_cache(dev);
        Ok(me)
    }

    fn build(&self, name: &str, spv: &[u8]) -> VkResult<vk::Pipeline> {
        let d = self.dev.raw();
        let words = ash::util::read_spv(&mut std::io::Cursor::new(spv))?;
        let info = vk::ShaderModuleCreateInfo::default().code(&words);
        // SAFETY: `words` is SPIR-V from naga (magic checked by read_spv).
        let module =
            unsafe { d.create_shader_module(&info, None) }.map_err(call("vkCreateShaderModule"))?;
        let entry = c_name(name)?;
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(&entry);
        let info = [vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(self.layout)];
        // SAFETY: module and layout are live; the shader's interface matches the
        // layout (kernel ABI above); `info` lives across the call; the
        // device's pipeline cache is live and internally synchronized. The
        // module may be destroyed once the pipeline exists.
        let made = unsafe {
            let r = d.create_compute_pipelines(self.dev.raw_pipeline_cache(), &info, None);
            d.destroy_shader_module(module, None);
            r
        };
        made.map(|v| v[0])
            .map_err(|(_, e)| call("vkCreateComputePipelines")(e))
    }

    /// The kernel whose entry point is `name` (e.g. `"matmul"`).
    ///
    /// # Errors
    /// [`VkError::Unsupported`] for an entry point the device cannot run
    /// (not built, see [`Kernels::new`]); `Inval` for an unknown name or one
    /// left out of a [`Kernels::only`] set.
    pub fn get(&self, name: &str) -> VkResult<Kernel> {
        let p = self.pipelines.iter().find(|(n, _)| *n == name);
        p.map(|&(_, pipeline)| Kernel {
            pipeline,
            dev_id: self.dev.id(),
        })
        .ok_or_else(|| {
            let (needs, has) = (subgroup_ops_of(name), self.dev.subgroup_operations());
            if !has.contains(needs) {
                VkError::Unsupported {
                    kernel: name.to_owned(),
                    needs,
                    has,
                }
            } else if KERNELS.iter().any(|(n, _)| *n == name) {
                VkError::Inval(format!(
                    "kernel {name:?} is not in this set (Kernels::only)"
                ))
            } else {
                VkError::Inval(format!("no kernel named {name:?}"))
            }
        })
    }

    /// Entry point names of the kernels built (those the device can run).
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.pipelines.iter().map(|(n, _)| *n)
    }

    /// The device these pipelines belong to.
    pub fn device(&self) -> &Device {
        &self.dev
    }
}

/// Persists the device's pipeline cache after pipelines were built; a cache
/// that cannot be written is a warning, never a failure.
fn save_pipeline_cache(dev: &Device) {
    if let Err(e) = dev.save_pipeline_cache() {
        eprintln!("warning: pipeline cache not saved: {e}");
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        let _ = self.dev.wait_submitted();
        let d = self.dev.raw();
        // SAFETY: no submitted work uses these objects any more (waited above).
        unsafe {
            for (_, p) in self.pipelines.drain(..) {
                d.destroy_pipeline(p, None);
            }
            d.destroy_pipeline_layout(self.layout, None);
            d.destroy_descriptor_set_layout(self.set_layout, None);
        }
    }
}

/// A descriptor set binding [`BINDINGS`] buffers (binding `i` = `bufs[i]`,
/// whole size) and the [`WINDOWS`] uniform windows over `bufs[0]` and
/// `bufs[1]`, for use with every kernel.
pub struct BindingSet {
    dev: Device,
    pool: vk::DescriptorPool,
    set: vk::DescriptorSet,
    windows: [Window; WINDOWS as usize],
}

impl BindingSet {
    /// Binds `bufs` (exactly [`BINDINGS`] of them, in binding order). The
    /// buffers must outlive every command buffer recorded with this set.
    ///
    /// # Errors
    /// `Inval` for a wrong count or a buffer of another device; `Call` otherwise.
    pub fn new(kernels: &Kernels, bufs: &[&Buffer]) -> VkResult<BindingSet> {
        BindingSet::with_image(kernels, bufs, None)
    }

    /// As [`new`](Self::new), with `image` at [`IMAGE_BINDING`] (in layout
    /// `GENERAL`: see [`Recorder::init_image`]). Without an image the binding
    /// stays empty and kernels that read it must not be dispatched with this
    /// set. The image must outlive every command buffer recorded with it.
    ///
    /// # Errors
    /// As [`new`](Self::new); `Inval` for an image of another device.
    pub fn with_image(
        kernels: &Kernels,
        bufs: &[&Buffer],
        image: Option<&StorageImage>,
    ) -> VkResult<BindingSet> {
        BindingSet::with_images(kernels, bufs, image, None)
    }

    /// As [`with_image`](Self::with_image), also with `weights` at
    /// [`WEIGHT_IMAGE_BINDING`] (an [`super::TexelFormat::Rgba32U`] image in
    /// layout `GENERAL`, e.g. after [`StorageImage::upload`]).
    ///
    /// # Errors
    /// As [`new`](Self::new); `Inval` for an image of another device or a
    /// weight image that is not `Rgba32U` (or a KV image that is not `Rgba32F`).
    pub fn with_images(
        kernels: &Kernels,
        bufs: &[&Buffer],
        image: Option<&StorageImage>,
        weights: Option<&StorageImage>,
    ) -> VkResult<BindingSet> {
        use super::TexelFormat;
        if bufs.iter().any(|b| !b.device().same(&kernels.dev))
            || image.is_some_and(|i| !i.device().same(&kernels.dev))
            || weights.is_some_and(|i| !i.device().same(&kernels.dev))
        {
            return Err(VkError::Inval("buffer or image of another device".into()));
        }
        if image.is_some_and(|i| i.format() != TexelFormat::Rgba32F)
            || weights.is_some_and(|i| i.format() != TexelFormat::Rgba32U)
        {
            return Err(VkError::Inval("image of the wrong texel format".into()));
        }
        if bufs.len() != BINDINGS as usize {
            return Err(VkError::Inval(format!(
                "{} buffers for {BINDINGS} bindings",
                bufs.len()
            )));
        }
        let d = kernels.dev.raw();
        let sizes = [
            vk::DescriptorPoolSize::default()
                .ty(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(BINDINGS),
            vk::DescriptorPoolSize::default()
                .ty(vk::DescriptorType::UNIFORM_BUFFER_DYNAMIC)
                .descriptor_count(WINDOWS),
            vk::DescriptorPoolSize::default()
                .ty(vk::DescriptorType::STORAGE_IMAGE)
                .descriptor_count(2),
        ];
        let info = vk::DescriptorPoolCreateInfo::default()
            .max_sets(1)
            .pool_sizes(&sizes);
        // SAFETY: valid create info.
        let pool = unsafe { d.create_descriptor_pool(&info, None) }
            .map_err(call("vkCreateDescriptorPool"))?;
        let windows = [0, 1].map(|i| Window::new(&kernels.dev, bufs[i].size()));
        let mut me = BindingSet {
            dev: kernels.dev.clone(),
            pool,
            set: vk::DescriptorSet::null(),
            windows,
        };
        let layouts = [kernels.set_layout];
        let info = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(pool)
            .set_layouts(&layouts);
        // SAFETY: the pool has room for one set of this layout.
        me.set = unsafe { d.allocate_descriptor_sets(&info) }
            .map_err(call("vkAllocateDescriptorSets"))?[0];
        let infos: Vec<[vk::DescriptorBufferInfo; 1]> = bufs
            .iter()
            .map(|b| {
                [vk::DescriptorBufferInfo::default()
                    .buffer(b.raw())
                    .range(vk::WHOLE_SIZE)]
            })
            .collect();
        let writes: Vec<_> = infos
            .iter()
            .enumerate()
            .map(|(i, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(me.set)
                    .dst_binding(i as u32)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(info)
            })
            .collect();
        let window_infos: Vec<[vk::DescriptorBufferInfo; 1]> = (0..WINDOWS as usize)
            .map(|i| {
                [vk::DescriptorBufferInfo::default()
                    .buffer(bufs[i].raw())
                    .range(me.windows[i].range)]
            })
            .collect();
        let writes: Vec<_> = writes
            .into_iter()
            .chain(window_infos.iter().enumerate().map(|(i, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(me.set)
                    .dst_binding(BINDINGS + i as u32)
                    .descriptor_type(vk::DescriptorType::UNIFORM_BUFFER_DYNAMIC)
                    .buffer_info(info)
            }))
            .collect();
        let image_infos: Vec<(u32, [vk::DescriptorImageInfo; 1])> =
            [(IMAGE_BINDING, image), (WEIGHT_IMAGE_BINDING, weights)]
                .into_iter()
                .filter_map(|(b, i)| {
                    let info = vk::DescriptorImageInfo::default()
                        .image_view(i?.view())
                        .image_layout(vk::ImageLayout::GENERAL);
                    Some((b, [info]))
                })
                .collect();
        let writes: Vec<_> = writes
            .into_iter()
            .chain(image_infos.iter().map(|(b, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(me.set)
                    .dst_binding(*b)
                    .descriptor_type(vk::DescriptorType::STORAGE_IMAGE)
                    .image_info(info)
            }))
            .collect();
        // SAFETY: the set is not in use by any command buffer yet; buffers and
        // the image view are live; each window's range is at most its buffer's
        // size.
        unsafe { d.update_descriptor_sets(&writes, &[]) };
        Ok(me)
    }

    /// The uniform windows over bindings 0 and 1.
    pub fn windows(&self) -> [Window; WINDOWS as usize] {
        self.windows
    }
}

impl Drop for BindingSet {
    fn drop(&mut self) {
        let _ = self.dev.wait_submitted();
        // SAFETY: no submitted work uses the set any more; destroying the pool frees it.
        unsafe { self.dev.raw().destroy_descriptor_pool(self.pool, None) };
    }
}

#[cfg(test)]
mod tests {
    use super::command::ticks_to_ns;
    use super::*;

    /// Timestamps are counted modulo `timestampValidBits` and scaled by
    /// `timestampPeriod` (ns per tick).
    #[test]
    fn timestamps_count_modulo_the_valid_bits_and_scale_by_the_period() {
        // 36 valid bits: garbage above them is ignored, and the counter
        // wrapping between the second and third timestamp still gives 16 ticks.
        let top = (1u64 << 36) - 8;
        let raw = [
            (top - 4) | (0xabc << 40),
            top | (0x123 << 40),
            8 | (0x77 << 50),
        ];
        assert_eq!(ticks_to_ns(&raw, 36, 2.5), vec![0.0, 10.0, 50.0]);
        assert_eq!(ticks_to_ns(&[5, 9, 100], 64, 1.0), vec![0.0, 4.0, 95.0]);
        assert_eq!(ticks_to_ns(&[], 64, 1.0), Vec::<f64>::new());
    }

    /// Kernels read activations written by the previous dispatch through the
    /// uniform windows; the barrier between them must name uniform reads
    /// (`SHADER_READ` does not cover uniform buffers).
    #[test]
    fn the_barrier_makes_writes_visible_to_uniform_window_reads() {
        for a in [
            vk::AccessFlags::UNIFORM_READ,
            vk::AccessFlags::SHADER_READ,
            vk::AccessFlags::SHADER_WRITE,
            vk::AccessFlags::TRANSFER_READ,
            vk::AccessFlags::TRANSFER_WRITE,
        ] {
            assert!(BARRIER_READS_WRITES.contains(a), "{a:?}");
        }
    }
}
