//! Steps recorded once and replayed (`Device::begin_recording`): the recording thread's
//! dispatches go into a command buffer of their own, begun for simultaneous use, which each
//! replay submits again after the batch recorded so far. Push descriptors and push constants
//! are stored in the command buffer; larger parameter blocks go to parameter buffers the
//! recording owns. The recording's allocations come from a pool of its own (reused inside
//! the step in recording order, as the hazard tracking orders them), and it keeps every
//! other buffer its dispatches touch, so nothing it uses returns to a pool while a replay
//! may run. Per-step values (token, position, step count) are read from device buffers by
//! the step's kernels, so replays see their new values.
//!
//! A recorded step cannot copy between host and device or wait for the device (refused),
//! and a device that is timing kernels does not record (each dispatch would need its own
//! timestamps in every replay).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ash::vk;
use tessera_core::{Buffer, Error, Recording, Result};

use crate::context::Context;
use crate::memory::{vk_err, SharedPool};
use crate::params::ParamBuffers;
use crate::record::{barrier, Capture};

impl Context {
    /// Starts recording the calling thread's work (`Device::begin_recording`).
    pub(crate) fn begin_recording(&self) -> Result<()> {
        let mut recorder = self.recorder();
        if recorder.profiler.is_some() {
            return Err(Error::unsupported(
                "vulkan",
                "recording work while kernels are profiled",
            ));
        }
        if recorder.capture.is_some() {
            return Err(Error::invalid(
                "begin_recording",
                "the device is already recording (one recording at a time)",
            ));
        }
        let commands = recorder.allocate_commands(&self.shared)?;
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::SIMULTANEOUS_USE);
        // SAFETY: `commands` is new, in the initial state, and used under the recorder's lock.
        let begun = unsafe { self.shared.device.begin_command_buffer(commands, &begin) };
        if let Err(e) = begun {
            recorder.free_commands(&self.shared, commands);
            return Err(vk_err("vkBeginCommandBuffer", e));
        }
        // Each replay waits for everything submitted before it (the previous replay too).
        barrier(&self.shared, commands);
        recorder.capture = Some(Capture::new(commands));
        Ok(())
    }

    /// Ends the calling thread's recording (`Device::end_recording`).
    pub(crate) fn end_recording(self: &Arc<Self>) -> Result<Box<dyn Recording>> {
        let here = std::thread::current().id();
        let mut recorder = self.recorder();
        let Some(mut capture) = recorder.capture.take_if(|c| c.thread == here) else {
            return Err(Error::invalid(
                "end_recording",
                "this thread is not recording on the device",
            ));
        };
        // SAFETY: the command buffer is recording; it and its pool are used under the
        // recorder's lock.
        let ended = unsafe { self.shared.device.end_command_buffer(capture.commands) };
        if let Err(e) = ended {
            recorder.free_commands(&self.shared, capture.commands);
            capture.params.destroy(&self.shared);
            return Err(vk_err("vkEndCommandBuffer", e));
        }
        drop(recorder);
        self.recording_pools.hold(&capture.pool);
        Ok(Box::new(VulkanRecording {
            ctx: self.clone(),
            commands: capture.commands,
            params: capture.params,
            last_replay: AtomicU64::new(0),
            _pool: capture.pool,
            _kept: capture.kept.into_values().collect(),
        }))
    }

    /// The pool of the calling thread's recording, if it is recording.
    pub(crate) fn recording_pool(&self) -> Option<SharedPool> {
        self.recorder().capture_here().map(|c| c.pool.clone())
    }

    /// Refuses host copies and waits while the calling thread records: a replay could not
    /// repeat them.
    pub(crate) fn no_host_copy(&self, what: &str) -> Result<()> {
        if self.recorder().capture_here().is_some() {
            return Err(Error::invalid(
                what,
                "a recorded step cannot copy between host and device or wait for the device",
            ));
        }
        Ok(())
    }
}

/// A recorded step: its command buffer, parameter buffers and memory. Dropping it waits for
/// its last replay.
pub(crate) struct VulkanRecording {
    ctx: Arc<Context>,
    commands: vk::CommandBuffer,
    params: ParamBuffers,
    /// The timeline value of the last replay (0: none yet).
    last_replay: AtomicU64,
    _pool: SharedPool,
    _kept: Vec<Arc<dyn Buffer>>,
}

impl std::fmt::Debug for VulkanRecording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanRecording")
            .field("commands", &self.commands)
            .field("buffers", &self._kept.len())
            .finish()
    }
}

impl Recording for VulkanRecording {
    fn replay(&self) -> Result<()> {
        let value = self
            .ctx
            .recorder()
            .submit_replay(&self.ctx.queue(), self.commands)?;
        self.last_replay.fetch_max(value, Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for VulkanRecording {
    fn drop(&mut self) {
        let last = self.last_replay.load(Ordering::Relaxed);
        if self.ctx.wait(last).is_err() {
            // The device is lost, and freeing what a submission may still name is not
            // allowed: the command buffer goes with the command pool, the parameter buffers'
            // memory with the allocator, when the device is dropped.
            return;
        }
        self.ctx
            .recorder()
            .free_commands(&self.ctx.shared, self.commands);
        self.params.destroy(&self.ctx.shared);
    }
}
