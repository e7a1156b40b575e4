//! Command pools (one per loop), recording (`Recorder`: dispatches, windowed
//! dispatches, barriers, copies, fills) and `Timestamps` (per-kernel
//! profiling by `timestampValidBits` and `timestampPeriod`): what turns one
//! ready vector into ONE command buffer.
#![allow(unsafe_code)]

use super::*;

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
pub(super) fn ticks_to_ns(raw: &[u64], valid_bits: u32, period: f64) -> Vec<f64> {
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
        let row_bytes = u64::from(w) * crate::image::TEXEL_BYTES;
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

    /// Holds the rest of this command buffer back until the host opens
    /// `gate` ([`HostGate::open`]; `vkCmdWaitEvents` with the host stage as
    /// its source): the submission stays pending until then.
    ///
    /// # Errors
    /// `Inval` for a gate of another device.
    pub fn wait_gate(&mut self, gate: &HostGate) -> VkResult<()> {
        if !gate.device().same(&self.pool.dev) {
            return Err(VkError::Inval("host gate of another device".into()));
        }
        let events = [gate.raw()];
        let dst = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
        // SAFETY: recording state, outside any render pass (compute only),
        // so the event may be set by the host after submission; it is a live
        // event of this device that outlives the submission (the gate's
        // Drop opens it and waits for the device's work).
        unsafe {
            self.pool.dev.raw().cmd_wait_events(
                self.cmd,
                &events,
                vk::PipelineStageFlags::HOST,
                dst,
                &[],
                &[],
                &[],
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
