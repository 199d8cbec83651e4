//! Recording and submitting work: many dispatches and copies per command buffer, a batch
//! submitted at a sync point (a read, a `synchronize`) or every [`MAX_BATCH`] commands, each
//! batch signalling its number on the device's timeline semaphore.
//!
//! A barrier goes only where a command needs one: before a command that reads or writes a
//! buffer written since the last barrier, or writes one read since it ([`Hazards`], by buffer:
//! two windows of one buffer count as the same; what a kernel writes is what its code stores
//! into, `pipelines.rs`). It waits for compute and copies, not every stage. The record
//! survives submission: a barrier orders a command after everything earlier in submission
//! order, earlier batches included. On the H100 a dispatch that waits for the one before it
//! costs about 2.4 us more than one that may overlap it, and the state recorded with it (push
//! constants, push descriptors, another pipeline) adds nothing (`examples/dispatch_chain.rs`);
//! the barrier's form (compute-only, execution-only, buffer ranges) changes nothing either
//! (`benches/README.md`). What a chain of small launches, such as a decoding step, gains is
//! fewer dependent launches, or shorter ones: a wait also exposes the whole of each kernel's
//! latency, which overlapping launches hide.
//!
//! While a thread records a step for replay ([`Capture`]; `replay.rs` begins and ends it),
//! its dispatches go into the recording's command buffer instead of the batch; other
//! threads' work goes on into the batch.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use ash::vk;
use tessera_core::memory::Pool;
use tessera_core::{Buffer, KernelTotals, Result};
use tessera_wgsl::Binding;

use crate::memory::{vk_err, vulkan_buffer, Shared, SharedPool, Staging};
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
    /// The batch's command buffer, to reuse once it has finished (none for a replay).
    commands: Option<vk::CommandBuffer>,
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
pub(crate) struct Hazards {
    read: Vec<vk::Buffer>,
    written: Vec<vk::Buffer>,
    /// Whether the next command waits whatever it touches (work was submitted that these
    /// lists do not know: a replay).
    unknown: bool,
}

impl Hazards {
    /// Notes a command's accesses (`(buffer, writes)` pairs); true where the command must wait
    /// for the commands before it (then the record restarts with this command alone).
    fn access(&mut self, accesses: impl Iterator<Item = (vk::Buffer, bool)> + Clone) -> bool {
        let conflict = self.unknown
            || accesses.clone().any(|(buffer, writes)| {
                self.written.contains(&buffer) || (writes && self.read.contains(&buffer))
            });
        self.unknown = false;
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

/// A step being recorded by one thread for replay (`replay.rs`).
pub(crate) struct Capture {
    pub(crate) thread: ThreadId,
    pub(crate) commands: vk::CommandBuffer,
    pub(crate) hazards: Hazards,
    pub(crate) params: ParamBuffers,
    /// Where the recording thread's allocations come from.
    pub(crate) pool: SharedPool,
    /// The buffers from elsewhere that the step's dispatches touch, by handle.
    pub(crate) kept: HashMap<vk::Buffer, Arc<dyn Buffer>>,
}

impl Capture {
    /// A recording by the calling thread into `commands`, begun for simultaneous use.
    pub(crate) fn new(commands: vk::CommandBuffer) -> Capture {
        Capture {
            thread: std::thread::current().id(),
            commands,
            hazards: Hazards::default(),
            params: ParamBuffers::default(),
            pool: Arc::new(Mutex::new(Pool::for_recording())),
            kept: HashMap::new(),
        }
    }

    /// Keeps the buffers of `bindings` that are not the recording's own alive with it.
    pub(crate) fn keep(&mut self, bindings: &[Binding<'_>]) -> Result<()> {
        for b in bindings {
            let buffer = vulkan_buffer(b.buffer)?;
            if !buffer.returns_to(&self.pool) {
                self.kept
                    .entry(buffer.handle())
                    .or_insert_with(|| b.buffer.clone());
            }
        }
        Ok(())
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
    /// The step the calling thread may be recording for replay.
    pub(crate) capture: Option<Capture>,
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
            capture: None,
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
            None => self.allocate_commands(shared)?,
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
        if self.hazards.access(accesses) || self.profiler.is_some() {
            barrier(shared, cb);
        }
    }

    /// The calling thread's recording for replay, if it is recording one.
    pub(crate) fn capture_here(&mut self) -> Option<&mut Capture> {
        let here = std::thread::current().id();
        self.capture.as_mut().filter(|c| c.thread == here)
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
        let accesses = buffers
            .iter()
            .zip(&pipeline.writes)
            .map(|(b, &writes)| (b.buffer, writes));
        let (cb, param_set, captured) = match self.capture_here() {
            Some(capture) => {
                let cb = capture.commands;
                if capture.hazards.access(accesses) {
                    barrier(shared, cb);
                }
                let set = (!immediate)
                    .then(|| {
                        capture
                            .params
                            .push(shared, ctx.param_layout, ctx.align, params)
                    })
                    .transpose()?;
                (cb, set, true)
            }
            None => {
                let cb = self.begin(shared)?;
                self.barrier_for(shared, cb, accesses);
                let set = (!immediate)
                    .then(|| {
                        self.params
                            .push(shared, ctx.param_layout, ctx.align, params)
                    })
                    .transpose()?;
                (cb, set, false)
            }
        };
        if captured {
            record_dispatch(ctx, cb, pipeline, buffers, params, param_set, grid);
            return Ok(());
        }
        if let Some(profiler) = &mut self.profiler {
            profiler.stamp(&shared.device, cb, &pipeline.name, false);
        }
        record_dispatch(ctx, cb, pipeline, buffers, params, param_set, grid);
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
            submit_commands(ctx, cb, value)
        };
        self.commands = 0;
        self.in_flight.push_back(Submitted {
            commands: Some(cb),
            value,
            staging: std::mem::take(&mut self.staging),
            params: self.params.take_batch(),
        });
        submitted?;
        self.submitted_up_to(shared, value);
        if let Some(profiler) = &mut self.profiler {
            // The batch's timestamps are read before the next batch resets them.
            wait_for(shared, ctx.timeline, value)?;
            profiler.collect(&shared.device, &mut self.profile);
        }
        Ok(value)
    }

    /// Notes that batch `value` was submitted: memory let go from now on waits for the next.
    fn submitted_up_to(&mut self, shared: &Shared, value: u64) {
        self.submitted = value;
        shared
            .recording
            .store(value + 1, std::sync::atomic::Ordering::Release);
    }

    /// Submits the batch being recorded, then a recorded step's command buffer `cb`; the
    /// batch's next command waits for the step, whose accesses it does not know. Returns the
    /// number the queue signals when the step has finished.
    pub(crate) fn submit_replay(&mut self, ctx: &Queue<'_>, cb: vk::CommandBuffer) -> Result<u64> {
        self.submit(ctx)?;
        let value = self.submitted + 1;
        // SAFETY: `cb` was ended with simultaneous use allowed (`Capture`), and the queue is
        // used under the recorder's lock.
        unsafe { submit_commands(ctx, cb, value) }?;
        self.in_flight.push_back(Submitted {
            commands: None,
            value,
            staging: Vec::new(),
            params: Vec::new(),
        });
        self.submitted_up_to(ctx.shared, value);
        self.hazards.unknown = true;
        Ok(value)
    }

    /// A primary command buffer from the device's pool, in the initial state.
    pub(crate) fn allocate_commands(&mut self, shared: &Shared) -> Result<vk::CommandBuffer> {
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool belongs to this device and is used under the recorder's lock only.
        unsafe { shared.device.allocate_command_buffers(&info) }
            .map(|buffers| buffers[0])
            .map_err(|e| vk_err("vkAllocateCommandBuffers", e))
    }

    /// Frees a command buffer of the device's pool that no pending submission uses.
    pub(crate) fn free_commands(&mut self, shared: &Shared, cb: vk::CommandBuffer) {
        // SAFETY: `cb` came from this pool and is not pending (the caller waited for it).
        unsafe { shared.device.free_command_buffers(self.pool, &[cb]) };
    }

    /// Recycles the command buffers and staging memory of batches up to `completed`.
    pub(crate) fn reclaim(&mut self, shared: &Shared, completed: u64) {
        while self.in_flight.front().is_some_and(|s| s.value <= completed) {
            let Some(done) = self.in_flight.pop_front() else {
                break;
            };
            if let Some(cb) = done.commands {
                // SAFETY: the batch has finished, so its command buffer is no longer pending.
                let reset = unsafe {
                    shared
                        .device
                        .reset_command_buffer(cb, vk::CommandBufferResetFlags::empty())
                };
                if reset.is_ok() {
                    self.free.push(cb);
                }
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
        // A recording never ended: its command buffer goes with the pool.
        if let Some(mut capture) = self.capture.take() {
            capture.params.destroy(shared);
        }
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

/// Records a barrier that makes the commands after it wait for the compute work and copies
/// before it, in submission order (earlier batches and replays included).
pub(crate) fn barrier(shared: &Shared, cb: vk::CommandBuffer) {
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

/// Records one dispatch into `cb`: the pipeline, its buffers as a push descriptor set, its
/// parameters from `param_set` (set and dynamic offset) or as push constants.
fn record_dispatch(
    ctx: &Queue<'_>,
    cb: vk::CommandBuffer,
    pipeline: &Pipeline,
    buffers: &[vk::DescriptorBufferInfo],
    params: &[u32],
    param_set: Option<(vk::DescriptorSet, u32)>,
    grid: [u32; 3],
) {
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
    // SAFETY: `cb` is recording; the pipeline, its layout, the parameter set and every
    // buffer belong to this device and stay alive while the queue may run `cb` (buffers are
    // retired, not freed, while the queue may use them; parameter buffers stay with the batch
    // or the recording; a recording keeps the buffers it touches); `writes` and `bytes` live
    // through the calls.
    unsafe {
        let device = &ctx.shared.device;
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
}

/// Submits `cb`, signalling `value` on the timeline when it has finished.
///
/// # Safety
/// `cb` is executable (ended) and may be pending only if it was begun for simultaneous use;
/// the queue is used under the recorder's lock only.
unsafe fn submit_commands(ctx: &Queue<'_>, cb: vk::CommandBuffer, value: u64) -> Result<()> {
    let values = [value];
    let mut timeline = vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
    let semaphores = [ctx.timeline];
    let buffers = [cb];
    let submit = vk::SubmitInfo::default()
        .command_buffers(&buffers)
        .signal_semaphores(&semaphores)
        .push_next(&mut timeline);
    // SAFETY: the caller's contract; the arrays live through the call.
    unsafe {
        ctx.shared
            .device
            .queue_submit(ctx.queue, &[submit], vk::Fence::null())
    }
    .map_err(|e| vk_err("vkQueueSubmit", e))
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
