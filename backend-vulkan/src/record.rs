//! Recording and submitting work: many dispatches and copies per command buffer, a batch
//! submitted at a sync point (a read, a `synchronize`) or every [`MAX_BATCH`] commands, each
//! batch signalling its number on the device's timeline semaphore.
//!
//! A barrier goes only where a command needs one: before a command that reads or writes a
//! buffer written since the last barrier, or writes one read since it ([`Hazards`], by buffer:
//! two windows of one buffer count as the same). It waits for compute and copies, not every
//! stage. The record survives submission: a barrier orders a command after everything earlier
//! in submission order, earlier batches included.

use std::collections::VecDeque;

use ash::vk;
use tessera_core::{KernelTotals, Result};

use crate::memory::{vk_err, Shared, Staging};
use crate::params::{ParamBuffer, ParamBuffers};
use crate::pipelines::Pipeline;
use crate::profile::Profiler;

/// What recording and submitting use of the device.
pub(crate) struct Queue<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) push_descriptor: &'a ash::khr::push_descriptor::Device,
    pub(crate) queue: vk::Queue,
    /// Signalled with each batch's number when it has finished.
    pub(crate) timeline: vk::Semaphore,
    /// Set 0's layout for parameters from the parameter buffer.
    pub(crate) param_layout: vk::DescriptorSetLayout,
    /// Alignment of dynamic offsets.
    pub(crate) align: u64,
}

/// Commands recorded before a batch is submitted without waiting for a sync point.
pub(crate) const MAX_BATCH: usize = 256;

struct Submitted {
    commands: vk::CommandBuffer,
    value: u64,
    staging: Vec<Staging>,
    params: Vec<ParamBuffer>,
}

/// Waits until the queue has signalled `value` on `timeline`.
pub(crate) fn wait_for(shared: &Shared, timeline: vk::Semaphore, value: u64) -> Result<()> {
    let semaphores = [timeline];
    let values = [value];
    let info = vk::SemaphoreWaitInfo::default()
        .semaphores(&semaphores)
        .values(&values);
    // SAFETY: the semaphore belongs to this device; the info lives through the call.
    unsafe { shared.device.wait_semaphores(&info, u64::MAX) }
        .map_err(|e| vk_err("vkWaitSemaphores", e))
}

/// Buffers read and written since the last barrier.
#[derive(Default)]
struct Hazards {
    read: Vec<vk::Buffer>,
    written: Vec<vk::Buffer>,
}

impl Hazards {
    /// Notes a command's accesses (`(buffer, writes)` pairs); true where the command must wait
    /// for the commands before it (then the record restarts with this command alone).
    fn access(&mut self, accesses: impl Iterator<Item = (vk::Buffer, bool)> + Clone) -> bool {
        let conflict = accesses.clone().any(|(buffer, writes)| {
            self.written.contains(&buffer) || (writes && self.read.contains(&buffer))
        });
        if conflict {
            self.read.clear();
            self.written.clear();
        }
        for (buffer, writes) in accesses {
            let list = if writes {
                &mut self.written
            } else {
                &mut self.read
            };
            if !list.contains(&buffer) {
                list.push(buffer);
            }
        }
        conflict
    }
}

/// The batch being recorded and the batches in flight.
pub(crate) struct Recorder {
    pool: vk::CommandPool,
    current: Option<vk::CommandBuffer>,
    commands: usize,
    staging: Vec<Staging>,
    in_flight: VecDeque<Submitted>,
    free: Vec<vk::CommandBuffer>,
    params: ParamBuffers,
    hazards: Hazards,
    /// Timestamps around every dispatch, while profiling.
    pub(crate) profiler: Option<Profiler>,
    /// Launches and device time per kernel since profiling started.
    pub(crate) profile: KernelTotals,
    /// Number of the last batch submitted (0: none yet).
    submitted: u64,
}

impl Recorder {
    pub(crate) fn new(shared: &Shared, queue_family: u32) -> Result<Recorder> {
        let info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(queue_family)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: the device is valid; the info lives through the call.
        let pool = unsafe { shared.device.create_command_pool(&info, None) }
            .map_err(|e| vk_err("vkCreateCommandPool", e))?;
        Ok(Recorder {
            pool,
            current: None,
            commands: 0,
            staging: Vec::new(),
            in_flight: VecDeque::new(),
            free: Vec::new(),
            params: ParamBuffers::default(),
            hazards: Hazards::default(),
            profiler: None,
            profile: KernelTotals::default(),
            submitted: 0,
        })
    }

    /// The command buffer being recorded, begun if there was none.
    fn begin(&mut self, shared: &Shared) -> Result<vk::CommandBuffer> {
        if let Some(cb) = self.current {
            return Ok(cb);
        }
        let cb = match self.free.pop() {
            Some(cb) => cb,
            None => {
                let info = vk::CommandBufferAllocateInfo::default()
                    .command_pool(self.pool)
                    .level(vk::CommandBufferLevel::PRIMARY)
                    .command_buffer_count(1);
                // SAFETY: the pool belongs to this device and is used under the recorder's
                // lock only.
                unsafe { shared.device.allocate_command_buffers(&info) }
                    .map_err(|e| vk_err("vkAllocateCommandBuffers", e))?[0]
            }
        };
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: `cb` is in the initial state (new, or reset when its batch finished).
        unsafe { shared.device.begin_command_buffer(cb, &begin) }
            .map_err(|e| vk_err("vkBeginCommandBuffer", e))?;
        if let Some(profiler) = &mut self.profiler {
            profiler.begin(&shared.device, cb);
        }
        self.current = Some(cb);
        Ok(cb)
    }

    /// Records a barrier before a command with `accesses` where it needs one, and always
    /// while profiling (each dispatch timed alone).
    fn barrier_for(
        &mut self,
        shared: &Shared,
        cb: vk::CommandBuffer,
        accesses: impl Iterator<Item = (vk::Buffer, bool)> + Clone,
    ) {
        if !self.hazards.access(accesses) && self.profiler.is_none() {
            return;
        }
        let work = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
        let barrier = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(
                vk::AccessFlags::SHADER_READ
                    | vk::AccessFlags::SHADER_WRITE
                    | vk::AccessFlags::TRANSFER_READ
                    | vk::AccessFlags::TRANSFER_WRITE,
            )];
        // SAFETY: `cb` is recording; the barrier array lives through the call.
        unsafe {
            shared.device.cmd_pipeline_barrier(
                cb,
                work,
                work,
                vk::DependencyFlags::empty(),
                &barrier,
                &[],
                &[],
            )
        };
    }

    /// Records one kernel dispatch, its parameters as push constants where `immediate`, else
    /// from the batch's parameter buffer.
    pub(crate) fn dispatch(
        &mut self,
        ctx: &Queue<'_>,
        pipeline: &Pipeline,
        buffers: &[vk::DescriptorBufferInfo],
        params: &[u32],
        immediate: bool,
        grid: [u32; 3],
    ) -> Result<()> {
        let shared = ctx.shared;
        let cb = self.begin(shared)?;
        let accesses = buffers
            .iter()
            .zip(&pipeline.writes)
            .map(|(b, &writes)| (b.buffer, writes));
        self.barrier_for(shared, cb, accesses);
        let param_set = if immediate {
            None
        } else {
            Some(
                self.params
                    .push(shared, ctx.param_layout, ctx.align, params)?,
            )
        };
        let writes: Vec<vk::WriteDescriptorSet> = buffers
            .iter()
            .enumerate()
            .map(|(i, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_binding(i as u32 + 1)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(std::slice::from_ref(info))
            })
            .collect();
        let bytes: Vec<u8> = params.iter().flat_map(|w| w.to_ne_bytes()).collect();
        if let Some(profiler) = &mut self.profiler {
            profiler.stamp(&shared.device, cb, &pipeline.name, false);
        }
        // SAFETY: `cb` is recording; the pipeline, its layout, the parameter set and every
        // buffer belong to this device and stay alive until the batch has finished (buffers
        // are retired, not freed, while the queue may use them; parameter buffers stay with
        // the batch); `writes` and `bytes` live through the calls.
        unsafe {
            let device = &shared.device;
            device.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, pipeline.pipeline);
            if !writes.is_empty() {
                ctx.push_descriptor.cmd_push_descriptor_set(
                    cb,
                    vk::PipelineBindPoint::COMPUTE,
                    pipeline.layout,
                    1,
                    &writes,
                );
            }
            if let Some((set, offset)) = param_set {
                device.cmd_bind_descriptor_sets(
                    cb,
                    vk::PipelineBindPoint::COMPUTE,
                    pipeline.layout,
                    0,
                    &[set],
                    &[offset],
                );
            } else if !bytes.is_empty() {
                device.cmd_push_constants(
                    cb,
                    pipeline.layout,
                    vk::ShaderStageFlags::COMPUTE,
                    0,
                    &bytes,
                );
            }
            device.cmd_dispatch(cb, grid[0], grid[1], grid[2]);
        }
        if let Some(profiler) = &mut self.profiler {
            profiler.stamp(&shared.device, cb, &pipeline.name, true);
        }
        self.recorded(ctx)
    }

    /// Records a copy between buffers; `keep` (a write's staging buffer) is freed when the
    /// batch has finished.
    pub(crate) fn copy(
        &mut self,
        ctx: &Queue<'_>,
        src: vk::Buffer,
        dst: vk::Buffer,
        region: vk::BufferCopy,
        keep: Option<Staging>,
    ) -> Result<()> {
        let shared = ctx.shared;
        let cb = self.begin(shared)?;
        self.barrier_for(shared, cb, [(src, false), (dst, true)].into_iter());
        // SAFETY: `cb` is recording; both buffers belong to this device and outlive the batch
        // (the staging buffer is kept with it).
        unsafe { shared.device.cmd_copy_buffer(cb, src, dst, &[region]) };
        self.staging.extend(keep);
        self.recorded(ctx)
    }

    fn recorded(&mut self, ctx: &Queue<'_>) -> Result<()> {
        self.commands += 1;
        if self.commands >= MAX_BATCH {
            self.submit(ctx)?;
        }
        Ok(())
    }

    /// Submits the batch being recorded, if any, and returns the number the queue signals
    /// when everything submitted so far has finished.
    pub(crate) fn submit(&mut self, ctx: &Queue<'_>) -> Result<u64> {
        let Some(cb) = self.current.take() else {
            return Ok(self.submitted);
        };
        let shared = ctx.shared;
        let value = self.submitted + 1;
        // A barrier to the host, so that reads of staging buffers see the batch's copies.
        let to_host = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(vk::AccessFlags::HOST_READ)];
        // SAFETY: `cb` is recording; the arrays live through the calls; the queue is used
        // under the recorder's lock only.
        let submitted = unsafe {
            shared.device.cmd_pipeline_barrier(
                cb,
                vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &to_host,
                &[],
                &[],
            );
            shared
                .device
                .end_command_buffer(cb)
                .map_err(|e| vk_err("vkEndCommandBuffer", e))?;
            let values = [value];
            let mut timeline =
                vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
            let semaphores = [ctx.timeline];
            let buffers = [cb];
            let submit = vk::SubmitInfo::default()
                .command_buffers(&buffers)
                .signal_semaphores(&semaphores)
                .push_next(&mut timeline);
            shared
                .device
                .queue_submit(ctx.queue, &[submit], vk::Fence::null())
        };
        self.commands = 0;
        self.in_flight.push_back(Submitted {
            commands: cb,
            value,
            staging: std::mem::take(&mut self.staging),
            params: self.params.take_batch(),
        });
        submitted.map_err(|e| vk_err("vkQueueSubmit", e))?;
        self.submitted = value;
        shared
            .recording
            .store(value + 1, std::sync::atomic::Ordering::Release);
        if let Some(profiler) = &mut self.profiler {
            // The batch's timestamps are read before the next batch resets them.
            wait_for(shared, ctx.timeline, value)?;
            profiler.collect(&shared.device, &mut self.profile);
        }
        Ok(value)
    }

    /// Recycles the command buffers and staging memory of batches up to `completed`.
    pub(crate) fn reclaim(&mut self, shared: &Shared, completed: u64) {
        while self.in_flight.front().is_some_and(|s| s.value <= completed) {
            let Some(done) = self.in_flight.pop_front() else {
                break;
            };
            // SAFETY: the batch has finished, so its command buffer is no longer pending.
            let reset = unsafe {
                shared
                    .device
                    .reset_command_buffer(done.commands, vk::CommandBufferResetFlags::empty())
            };
            if reset.is_ok() {
                self.free.push(done.commands);
            }
            for s in done.staging {
                shared.staging.give_back(shared, s);
            }
            self.params.recycle(done.params);
        }
    }

    /// Frees the command pool and staging memory; the queue must be idle.
    ///
    /// # Safety
    /// No submitted batch may still be pending.
    pub(crate) unsafe fn destroy(&mut self, shared: &Shared) {
        self.reclaim(shared, u64::MAX);
        for s in std::mem::take(&mut self.staging) {
            shared.free_now(s.buffer, s.allocation);
        }
        self.params.destroy(shared);
        if let Some(profiler) = self.profiler.take() {
            profiler.destroy(&shared.device);
        }
        // SAFETY: the caller guarantees the queue is idle; freeing the pool frees its buffers.
        unsafe { shared.device.destroy_command_pool(self.pool, None) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ash::vk::Handle;

    fn buffer(n: u64) -> vk::Buffer {
        vk::Buffer::from_raw(n)
    }

    /// Whether a command with `accesses` gets a barrier after the commands noted so far.
    fn waits(hazards: &mut Hazards, accesses: &[(u64, bool)]) -> bool {
        hazards.access(accesses.iter().map(|&(b, w)| (buffer(b), w)))
    }

    #[test]
    fn barriers_go_only_where_an_access_conflicts() {
        let mut h = Hazards::default();
        assert!(!waits(&mut h, &[(1, false), (2, true)]), "first command");
        assert!(
            !waits(&mut h, &[(1, false), (3, true)]),
            "reads after reads, new writes"
        );
        assert!(waits(&mut h, &[(2, false), (4, true)]), "read after write");
        assert!(waits(&mut h, &[(5, false), (4, true)]), "write after write");
        assert!(waits(&mut h, &[(6, false), (5, true)]), "write after read");
        assert!(
            !waits(&mut h, &[(6, false), (7, true)]),
            "nothing shared with what was written"
        );
        assert!(
            waits(&mut h, &[(7, false), (7, true)]),
            "reads and writes what was written"
        );
    }
}
