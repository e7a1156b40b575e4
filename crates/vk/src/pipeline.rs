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
use super::queue::Submission;
use super::{VkError, VkResult, call, kernels::KERNELS};

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
    /// `min(WINDOW_BYTES, maxUniformBufferRange, buffer size)`.
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
        let align = align.div_ceil(16) * 16;
        Window {
            range: WINDOW_BYTES.min(max_range).min(buffer),
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

/// Size of the push-constant range of the kernel ABI, in bytes.
pub const PUSH_BYTES: u32 = 64;

/// One compute pipeline (a kernel entry point). `Copy`; valid while its
/// [`Kernels`] lives.
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    pipeline: vk::Pipeline,
    /// Identity of the owning device (checked at dispatch).
    dev_id: usize,
}

/// Every kernel compiled from `kernels/` as a pipeline, with the shared
/// descriptor-set and pipeline layouts.
pub struct Kernels {
    dev: Device,
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    pipelines: Vec<(&'static str, vk::Pipeline)>,
}

impl Kernels {
    /// Builds a pipeline for every entry point in `vk::kernels::KERNELS`.
    ///
    /// # Errors
    /// `Call` if a layout, shader module or pipeline cannot be created.
    pub fn new(dev: &Device) -> VkResult<Kernels> {
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
        for (name, spv) in KERNELS {
            let p = me.build(name, spv)?;
            me.pipelines.push((name, p));
        }
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
        // layout (kernel ABI above); `info` lives across the call. The module
        // may be destroyed once the pipeline exists.
        let made = unsafe {
            let r = d.create_compute_pipelines(vk::PipelineCache::null(), &info, None);
            d.destroy_shader_module(module, None);
            r
        };
        made.map(|v| v[0])
            .map_err(|(_, e)| call("vkCreateComputePipelines")(e))
    }

    /// The kernel whose entry point is `name` (e.g. `"matmul"`).
    ///
    /// # Errors
    /// `Inval` for an unknown name.
    pub fn get(&self, name: &str) -> VkResult<Kernel> {
        let p = self.pipelines.iter().find(|(n, _)| *n == name);
        p.map(|&(_, pipeline)| Kernel {
            pipeline,
            dev_id: self.dev.id(),
        })
        .ok_or_else(|| VkError::Inval(format!("no kernel named {name:?}")))
    }

    /// Entry point names of all kernels.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.pipelines.iter().map(|(n, _)| *n)
    }

    /// The device these pipelines belong to.
    pub fn device(&self) -> &Device {
        &self.dev
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

/// A command pool: one per loop (or thread). `Send`, not `Sync`: Vulkan
/// command pools are externally synchronized.
pub struct CommandPool {
    dev: Device,
    pool: vk::CommandPool,
    free: Vec<vk::CommandBuffer>,
    used: Vec<vk::CommandBuffer>,
    last_value: u64,
    _not_sync: PhantomData<Cell<()>>,
}

/// A fully recorded command buffer of a [`CommandPool`], ready for
/// [`CommandPool::submit`] (once).
#[derive(Debug)]
pub struct Recorded(vk::CommandBuffer);

impl CommandPool {
    /// A new pool on the device's compute queue family.
    ///
    /// # Errors
    /// `Call` if the pool cannot be created.
    pub fn new(dev: &Device) -> VkResult<CommandPool> {
        let info = vk::CommandPoolCreateInfo::default().queue_family_index(dev.queue_family());
        // SAFETY: valid create info.
        let pool = unsafe { dev.raw().create_command_pool(&info, None) }
            .map_err(call("vkCreateCommandPool"))?;
        Ok(CommandPool {
            dev: dev.clone(),
            pool,
            free: vec![],
            used: vec![],
            last_value: 0,
            _not_sync: PhantomData,
        })
    }

    fn take(&mut self) -> VkResult<vk::CommandBuffer> {
        let cmd = match self.free.pop() {
            Some(c) => c,
            None => {
                let info = vk::CommandBufferAllocateInfo::default()
                    .command_pool(self.pool)
                    .level(vk::CommandBufferLevel::PRIMARY)
                    .command_buffer_count(1);
                // SAFETY: the pool is ours and borrowed mutably.
                unsafe { self.dev.raw().allocate_command_buffers(&info) }
                    .map_err(call("vkAllocateCommandBuffers"))?[0]
            }
        };
        self.used.push(cmd);
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: `cmd` is in the initial state (fresh or after a pool reset).
        unsafe { self.dev.raw().begin_command_buffer(cmd, &begin) }
            .map_err(call("vkBeginCommandBuffer"))?;
        Ok(cmd)
    }

    /// Begins recording a command buffer that dispatches `kernels` with `set`.
    ///
    /// # Errors
    /// `Inval` for kernels or a binding set of another device; `Call` if
    /// allocation or `vkBeginCommandBuffer` fails.
    pub fn record<'a>(
        &'a mut self,
        kernels: &'a Kernels,
        set: &'a BindingSet,
    ) -> VkResult<Recorder<'a>> {
        if !kernels.dev.same(&self.dev) || !set.dev.same(&self.dev) {
            return Err(VkError::Inval(
                "kernels or binding set of another device".into(),
            ));
        }
        let cmd = self.take()?;
        // SAFETY: `cmd` is recording; set and layout are live and compatible.
        unsafe {
            self.dev.raw().cmd_bind_descriptor_sets(
                cmd,
                vk::PipelineBindPoint::COMPUTE,
                kernels.layout,
                0,
                &[set.set],
                &[0; WINDOWS as usize],
            );
        }
        Ok(Recorder {
            pool: self,
            cmd,
            layout: kernels.layout,
            set: Some((set.set, set.windows)),
        })
    }

    /// Begins recording a command buffer for transfers only (no kernels).
    ///
    /// # Errors
    /// As [`record`](Self::record).
    pub fn record_plain(&mut self) -> VkResult<Recorder<'_>> {
        let cmd = self.take()?;
        Ok(Recorder {
            pool: self,
            cmd,
            layout: vk::PipelineLayout::null(),
            set: None,
        })
    }

    /// Submits `cmds` (recorded from this pool) in ONE `vkQueueSubmit`.
    ///
    /// # Errors
    /// `Inval` for a command buffer of another pool; submit errors.
    pub fn submit(&mut self, cmds: Vec<Recorded>) -> VkResult<Submission> {
        if cmds.iter().any(|c| !self.used.contains(&c.0)) {
            return Err(VkError::Inval("command buffer of another pool".into()));
        }
        let raw: Vec<vk::CommandBuffer> = cmds.iter().map(|c| c.0).collect();
        // SAFETY: each buffer was fully recorded from this pool (a `Recorded`
        // exists only after vkEndCommandBuffer) and is consumed here, so it is
        // submitted once; the pool is borrowed mutably during the call.
        let sub = unsafe { self.dev.submit(&raw) }?;
        self.last_value = sub.value();
        Ok(sub)
    }

    /// Waits for this pool's last submission, then resets every command buffer
    /// for reuse.
    ///
    /// # Errors
    /// Device lost.
    pub fn reset(&mut self) -> VkResult<()> {
        self.dev.wait_value(self.last_value)?;
        // SAFETY: no command buffer of the pool is pending (waited above).
        unsafe {
            self.dev
                .raw()
                .reset_command_pool(self.pool, vk::CommandPoolResetFlags::empty())
        }
        .map_err(call("vkResetCommandPool"))?;
        self.free.append(&mut self.used);
        Ok(())
    }
}

impl Drop for CommandPool {
    fn drop(&mut self) {
        let _ = self.dev.wait_value(self.last_value);
        // SAFETY: no command buffer of the pool is pending (waited above).
        unsafe { self.dev.raw().destroy_command_pool(self.pool, None) };
    }
}

/// A pool of `count` timestamp queries ([`Recorder::timestamp`]): for
/// profiling where one command buffer's time goes. Destroyed after the
/// device's submitted work completed.
pub struct Timestamps {
    dev: Device,
    raw: vk::QueryPool,
    count: u32,
}

impl Timestamps {
    /// A pool of `count` timestamps.
    ///
    /// # Errors
    /// `Inval` for `count == 0` or a device whose compute queue cannot write
    /// timestamps ([`Device::timestamp_period`]); `Call` otherwise.
    pub fn new(dev: &Device, count: u32) -> VkResult<Timestamps> {
        if count == 0 || dev.timestamp_period().is_none() {
            return Err(VkError::Inval(
                "no timestamps on this device (or count 0)".into(),
            ));
        }
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(count);
        // SAFETY: valid create info.
        let raw = unsafe { dev.raw().create_query_pool(&info, None) }
            .map_err(call("vkCreateQueryPool"))?;
        Ok(Timestamps {
            dev: dev.clone(),
            raw,
            count,
        })
    }

    /// The queries' capacity.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The first `n` timestamps in nanoseconds after the first one (so the
    /// first is 0), waiting until they are available (call after the
    /// submission that wrote them): ticks counted modulo
    /// `2^timestampValidBits` (a counter that wrapped between two
    /// timestamps still gives their true distance) times `timestampPeriod`.
    ///
    /// # Errors
    /// `Inval` for `n` above the capacity; `Call` for a failed read.
    pub fn read_ns(&self, n: u32) -> VkResult<Vec<f64>> {
        if n > self.count {
            return Err(VkError::Inval(format!("{n} of {} timestamps", self.count)));
        }
        let mut raw = vec![0u64; n as usize];
        if n > 0 {
            // SAFETY: the pool is live; `raw` holds `n` 64-bit results.
            unsafe {
                self.dev.raw().get_query_pool_results(
                    self.raw,
                    0,
                    &mut raw,
                    vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
                )
            }
            .map_err(call("vkGetQueryPoolResults"))?;
        }
        let period = self.dev.timestamp_period().unwrap_or(1.0);
        Ok(ticks_to_ns(&raw, self.dev.timestamp_valid_bits(), period))
    }
}

/// Timestamps `raw` (ticks, of which the low `valid_bits` are meaningful) as
/// nanoseconds after `raw[0]`: each step is taken modulo `2^valid_bits`, so a
/// counter that wrapped between two timestamps still gives their distance.
fn ticks_to_ns(raw: &[u64], valid_bits: u32, period: f64) -> Vec<f64> {
    let mask = match valid_bits {
        0 | 64.. => u64::MAX,
        b => (1u64 << b) - 1,
    };
    let mut at = 0u64;
    let mut out = Vec::with_capacity(raw.len());
    for (i, &t) in raw.iter().enumerate() {
        if i > 0 {
            at = at.wrapping_add(t.wrapping_sub(raw[i - 1]) & mask);
        }
        out.push(at as f64 * period);
    }
    out
}

impl Drop for Timestamps {
    fn drop(&mut self) {
        let _ = self.dev.wait_submitted();
        // SAFETY: no submitted work uses the pool any more (waited above).
        unsafe { self.dev.raw().destroy_query_pool(self.raw, None) };
    }
}

/// Records one command buffer: kernel dispatches, barriers and copies.
pub struct Recorder<'a> {
    pool: &'a mut CommandPool,
    cmd: vk::CommandBuffer,
    layout: vk::PipelineLayout,
    /// The bound set and its windows (`None` for a transfer-only recorder).
    set: Option<(vk::DescriptorSet, [Window; WINDOWS as usize])>,
}

impl Recorder<'_> {
    /// The uniform windows of the bound [`BindingSet`] (`None` for a
    /// transfer-only recorder).
    pub fn windows(&self) -> Option<[Window; WINDOWS as usize]> {
        self.set.map(|(_, w)| w)
    }

    /// Rebinds the uniform windows at byte offsets `offsets` (window `i` then
    /// covers `offsets[i] .. offsets[i] + range` of storage binding `i`'s
    /// buffer), then dispatches as [`dispatch`](Self::dispatch). Kernels
    /// dispatched later without windows ignore the offsets.
    ///
    /// # Errors
    /// `Inval` for an offset that is not a multiple of [`Window::align`] or
    /// whose window would end past its buffer, a transfer-only recorder, and
    /// everything [`dispatch`](Self::dispatch) refuses.
    pub fn dispatch_windowed<P: bytemuck::Pod>(
        &mut self,
        kernel: Kernel,
        push: &P,
        groups: [u32; 3],
        offsets: [u64; WINDOWS as usize],
    ) -> VkResult<()> {
        let Some((set, windows)) = self.set else {
            return Err(VkError::Inval(
                "windowed dispatch on a transfer-only recorder".into(),
            ));
        };
        let mut dynamic = [0u32; WINDOWS as usize];
        for (i, (&off, w)) in offsets.iter().zip(&windows).enumerate() {
            let fits = off.is_multiple_of(w.align)
                && off.checked_add(w.range).is_some_and(|end| end <= w.buffer);
            dynamic[i] = u32::try_from(off)
                .ok()
                .filter(|_| fits)
                .ok_or_else(|| VkError::Inval(format!("window {i} at offset {off} ({w:?})")))?;
        }
        // SAFETY: recording state; the set and layout are live and
        // compatible; each dynamic offset is aligned and keeps its window
        // inside its buffer (checked above).
        unsafe {
            self.pool.dev.raw().cmd_bind_descriptor_sets(
                self.cmd,
                vk::PipelineBindPoint::COMPUTE,
                self.layout,
                0,
                &[set],
                &dynamic,
            );
        }
        self.dispatch(kernel, push, groups)
    }

    /// Dispatches `kernel` over `groups` workgroups with `push` as its
    /// push constants (at most [`PUSH_BYTES`] bytes, a multiple of 4).
    ///
    /// # Errors
    /// `Inval` for a bad push-constant size, a zero or too large grid, or a
    /// transfer-only recorder.
    pub fn dispatch<P: bytemuck::Pod>(
        &mut self,
        kernel: Kernel,
        push: &P,
        groups: [u32; 3],
    ) -> VkResult<()> {
        let bytes = bytemuck::bytes_of(push);
        if bytes.len() > PUSH_BYTES as usize
            || !bytes.len().is_multiple_of(4)
            || self.layout == vk::PipelineLayout::null()
            || kernel.dev_id != self.pool.dev.id()
        {
            return Err(VkError::Inval(format!(
                "dispatch with {} push-constant bytes (or a kernel of another device or a transfer-only recorder)",
                bytes.len()
            )));
        }
        let max = self.pool.dev.0.limits.max_compute_work_group_count;
        if groups.iter().zip(max).any(|(g, m)| *g == 0 || *g > m) {
            return Err(VkError::Inval(format!("grid {groups:?} (limit {max:?})")));
        }
        let d = self.pool.dev.raw();
        // SAFETY: recording state; pipeline and layout are live and compatible.
        unsafe {
            d.cmd_bind_pipeline(self.cmd, vk::PipelineBindPoint::COMPUTE, kernel.pipeline);
            d.cmd_push_constants(
                self.cmd,
                self.layout,
                vk::ShaderStageFlags::COMPUTE,
                0,
                bytes,
            );
            d.cmd_dispatch(self.cmd, groups[0], groups[1], groups[2]);
        }
        Ok(())
    }

    fn memory_barrier(
        &mut self,
        src: vk::PipelineStageFlags,
        dst: vk::PipelineStageFlags,
        dst_access: vk::AccessFlags,
    ) {
        let b = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(dst_access)];
        // SAFETY: recording state; the barrier array lives across the call.
        unsafe {
            self.pool.dev.raw().cmd_pipeline_barrier(
                self.cmd,
                src,
                dst,
                vk::DependencyFlags::empty(),
                &b,
                &[],
                &[],
            )
        };
    }

    /// Moves `image` from layout `UNDEFINED` (contents discarded) to
    /// `GENERAL`, where kernels read and write it and copies write it; record
    /// it once, before the image's first use (or to discard its contents).
    ///
    /// The transition is a write: it waits for earlier compute and transfer
    /// work on the image (a re-upload after kernels used it), and later
    /// dispatches AND copies wait for it (`copy_to_image` writes with a
    /// transfer: a second scope of compute work alone left the copy racing
    /// the transition, SYNC-HAZARD-WRITE-AFTER-WRITE).
    pub fn init_image(&mut self, image: &StorageImage) {
        let stages = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
        let b = [vk::ImageMemoryBarrier::default()
            .old_layout(vk::ImageLayout::UNDEFINED)
            .new_layout(vk::ImageLayout::GENERAL)
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(BARRIER_READS_WRITES)
            .src_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
            .dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
            .image(image.raw())
            .subresource_range(StorageImage::range(image.extent()[2]))];
        // SAFETY: recording state; the image is live and of this device (the
        // caller keeps it alive until the command buffer completed).
        unsafe {
            self.pool.dev.raw().cmd_pipeline_barrier(
                self.cmd,
                stages,
                stages,
                vk::DependencyFlags::empty(),
                &[],
                &[],
                &b,
            )
        };
    }

    /// Copies rows `first_row .. first_row + n_rows` of `image` (rows counted
    /// across layers: row `r` is row `r % height` of layer `r / height`) from
    /// the start of `src` (tightly packed texels), in layout `GENERAL`; with
    /// `discard`, first moves the whole image from `UNDEFINED` to `GENERAL`
    /// (contents discarded). Ends with a [`barrier`](Self::barrier), so later
    /// kernels and copies see the texels.
    ///
    /// # Errors
    /// `Inval` for rows outside the image, a source smaller than the rows, or
    /// a buffer or image of another device.
    pub fn copy_to_image(
        &mut self,
        src: &Buffer,
        image: &StorageImage,
        first_row: u64,
        n_rows: u64,
        discard: bool,
    ) -> VkResult<()> {
        let [w, h, layers] = image.extent();
        let row_bytes = u64::from(w) * super::image::TEXEL_BYTES;
        let end = first_row.checked_add(n_rows);
        let same = src.device().same(&self.pool.dev) && image.device().same(&self.pool.dev);
        if n_rows == 0
            || end.is_none_or(|e| e > u64::from(h) * u64::from(layers))
            || n_rows.saturating_mul(row_bytes) > src.size()
            || !same
        {
            return Err(VkError::Inval(format!(
                "copy of {n_rows} rows from row {first_row} into a {w}x{h}x{layers} image"
            )));
        }
        if discard {
            self.init_image(image);
        }
        let mut regions = vec![];
        let (mut row, mut at) = (first_row, 0u64);
        while row < first_row + n_rows {
            let (layer, y) = ((row / u64::from(h)) as u32, (row % u64::from(h)) as u32);
            let n = (u64::from(h - y)).min(first_row + n_rows - row) as u32;
            regions.push(
                vk::BufferImageCopy::default()
                    .buffer_offset(at)
                    .image_subresource(
                        vk::ImageSubresourceLayers::default()
                            .aspect_mask(vk::ImageAspectFlags::COLOR)
                            .base_array_layer(layer)
                            .layer_count(1),
                    )
                    .image_offset(vk::Offset3D {
                        x: 0,
                        y: y as i32,
                        z: 0,
                    })
                    .image_extent(vk::Extent3D {
                        width: w,
                        height: n,
                        depth: 1,
                    }),
            );
            row += u64::from(n);
            at += u64::from(n) * row_bytes;
        }
        // SAFETY: recording state; the buffer and image are live and of this
        // device (checked above) and outlive the submission; every region lies
        // inside both (rows and sizes checked above); the image is in layout
        // GENERAL (moved there by `init_image` here or earlier).
        unsafe {
            self.pool.dev.raw().cmd_copy_buffer_to_image(
                self.cmd,
                src.raw(),
                image.raw(),
                vk::ImageLayout::GENERAL,
                &regions,
            )
        };
        self.barrier();
        Ok(())
    }

    /// Resets every query of `ts` (record before the first [`timestamp`](Self::timestamp)).
    pub fn reset_timestamps(&mut self, ts: &Timestamps) {
        // SAFETY: recording state; the pool is live and of this device.
        unsafe {
            self.pool
                .dev
                .raw()
                .cmd_reset_query_pool(self.cmd, ts.raw, 0, ts.count)
        };
    }

    /// Writes timestamp `i` of `ts` once all earlier commands completed.
    ///
    /// # Errors
    /// `Inval` for `i` beyond the pool or a pool of another device.
    pub fn timestamp(&mut self, ts: &Timestamps, i: u32) -> VkResult<()> {
        if i >= ts.count || !ts.dev.same(&self.pool.dev) {
            return Err(VkError::Inval(format!("timestamp {i} of {}", ts.count)));
        }
        // SAFETY: recording state; the pool is live, of this device, and `i`
        // is inside it (checked above); it was reset earlier in this buffer.
        unsafe {
            self.pool.dev.raw().cmd_write_timestamp(
                self.cmd,
                vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                ts.raw,
                i,
            )
        };
        Ok(())
    }

    /// Makes all earlier compute and transfer writes visible to later
    /// dispatches and copies (between dependent kernels).
    pub fn barrier(&mut self) {
        let stages = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
        self.memory_barrier(stages, stages, BARRIER_READS_WRITES);
    }

    /// Makes all earlier writes visible to the host once the submission's
    /// fence signals (end every command buffer whose results the CPU reads).
    pub fn host_barrier(&mut self) {
        let src = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
        self.memory_barrier(
            src,
            vk::PipelineStageFlags::HOST,
            vk::AccessFlags::HOST_READ,
        );
    }

    /// Copies `len` bytes from `src` at `src_off` to `dst` at `dst_off`.
    ///
    /// # Errors
    /// `Inval` for an empty range, a range outside either buffer, or a buffer
    /// of another device.
    pub fn copy(
        &mut self,
        src: &Buffer,
        src_off: u64,
        dst: &Buffer,
        dst_off: u64,
        len: u64,
    ) -> VkResult<()> {
        let inside = |b: &Buffer, off: u64| off.checked_add(len).is_some_and(|e| e <= b.size());
        let same = src.device().same(&self.pool.dev) && dst.device().same(&self.pool.dev);
        if len == 0 || !inside(src, src_off) || !inside(dst, dst_off) || !same {
            return Err(VkError::Inval(format!(
                "copy of {len} bytes at {src_off} -> {dst_off}"
            )));
        }
        let region = [vk::BufferCopy::default()
            .src_offset(src_off)
            .dst_offset(dst_off)
            .size(len)];
        // SAFETY: recording state; both ranges lie inside live buffers of this
        // device (checked above), which outlive the submission (their Drop
        // waits for submitted work).
        unsafe {
            self.pool
                .dev
                .raw()
                .cmd_copy_buffer(self.cmd, src.raw(), dst.raw(), &region)
        };
        Ok(())
    }

    /// Fills `len` bytes of `dst` from byte `offset` with the 32-bit word
    /// `value` on the device (`vkCmdFillBuffer`; no host memory of that
    /// size). Follow it with a [`barrier`](Self::barrier) before kernels or
    /// copies use the range.
    ///
    /// # Errors
    /// `Inval` for an empty range, an offset or length that is not a multiple
    /// of 4, a range outside the buffer, or a buffer of another device.
    pub fn fill(&mut self, dst: &Buffer, offset: u64, len: u64, value: u32) -> VkResult<()> {
        let inside = offset.checked_add(len).is_some_and(|e| e <= dst.size());
        if len == 0
            || !offset.is_multiple_of(4)
            || !len.is_multiple_of(4)
            || !inside
            || !dst.device().same(&self.pool.dev)
        {
            return Err(VkError::Inval(format!(
                "fill of {len} bytes at {offset} in a {}-byte buffer",
                dst.size()
            )));
        }
        // SAFETY: recording state; the range lies inside a live buffer of this
        // device (checked above, offset and size multiples of 4), created with
        // TRANSFER_DST, which outlives the submission (its Drop waits).
        unsafe {
            self.pool
                .dev
                .raw()
                .cmd_fill_buffer(self.cmd, dst.raw(), offset, len, value)
        };
        Ok(())
    }

    /// Ends recording.
    ///
    /// # Errors
    /// `Call` if `vkEndCommandBuffer` fails (out of memory).
    pub fn finish(self) -> VkResult<Recorded> {
        // SAFETY: recording state.
        unsafe { self.pool.dev.raw().end_command_buffer(self.cmd) }
            .map_err(call("vkEndCommandBuffer"))?;
        Ok(Recorded(self.cmd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kernels read activations written by the previous dispatch through the
    /// uniform windows; the barrier between them must name uniform reads
    /// (`SHADER_READ` does not cover uniform buffers).
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
