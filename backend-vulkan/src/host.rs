//! Copies between the host and device buffers, in order with the recorded work: a write goes
//! through a host-visible staging buffer copied by the batch being recorded; a read copies
//! into one and submits, and waits for that batch at once (`read`) or when its bytes are
//! asked for (`read_later`: decoding records step `t + 1` while token `t` is copied).
//! Staging buffers come from the device's pool of them (`memory.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ash::vk;
use gpu_allocator::MemoryLocation;
use tessera_core::{Buffer, PendingBytes, Result};

use crate::context::Context;
use crate::memory::{vulkan_buffer, Staging};

impl Context {
    /// Queues a copy of `data` into `buffer` at `offset`, after the work recorded so far.
    pub(crate) fn write_bytes(
        &self,
        buffer: &Arc<dyn Buffer>,
        offset: usize,
        data: &[u8],
    ) -> Result<()> {
        let dst = vulkan_buffer(buffer)?.handle();
        let mut staging = self
            .shared
            .staging(data.len() as u64, MemoryLocation::CpuToGpu)?;
        if let Some(mapped) = staging.allocation.mapped_slice_mut() {
            mapped[..data.len()].copy_from_slice(data);
        }
        let region = vk::BufferCopy {
            src_offset: 0,
            dst_offset: offset as u64,
            size: data.len() as u64,
        };
        self.recorder()
            .copy(&self.queue(), staging.buffer, dst, region, Some(staging))
    }

    /// Starts copying `len` bytes of `buffer` at `offset` to the host, after the work recorded
    /// so far, and submits it; [`PendingRead::wait`] waits for that batch alone.
    pub(crate) fn start_read(
        self: &Arc<Self>,
        buffer: &Arc<dyn Buffer>,
        offset: usize,
        len: usize,
    ) -> Result<PendingRead> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        let src = vulkan_buffer(buffer)?.handle();
        let staging = self.shared.staging(len as u64, MemoryLocation::GpuToCpu)?;
        let region = vk::BufferCopy {
            src_offset: offset as u64,
            dst_offset: 0,
            size: len as u64,
        };
        let recorded = {
            let mut recorder = self.recorder();
            let queue = self.queue();
            recorder
                .copy(&queue, src, staging.buffer, region, None)
                .and_then(|_| recorder.submit(&queue))
        };
        match recorded {
            Ok(batch) => Ok(PendingRead {
                ctx: self.clone(),
                staging: Some(staging),
                batch,
                len,
            }),
            Err(e) => {
                // Nothing submitted copies into it: a failed record or submission left the
                // copy unsubmitted.
                self.shared.free_now(staging.buffer, staging.allocation);
                Err(e)
            }
        }
    }
}

/// A copy to the host on its way: the reader keeps its staging buffer until the copy's batch
/// has finished (never freed by another thread reclaiming the batch), then gives it back.
pub(crate) struct PendingRead {
    ctx: Arc<Context>,
    staging: Option<Staging>,
    batch: u64,
    len: usize,
}

impl PendingRead {
    /// Waits for the copy's batch and copies the bytes into `out` (`len` of them).
    pub(crate) fn wait_into(mut self, out: &mut [u8]) -> Result<()> {
        let waited = self.ctx.wait(self.batch);
        let Some(staging) = self.staging.take() else {
            return waited;
        };
        match waited {
            Ok(()) => {
                if let Some(bytes) = staging.allocation.mapped_slice() {
                    out.copy_from_slice(&bytes[..self.len]);
                }
                self.ctx.shared.staging.give_back(&self.ctx.shared, staging);
                Ok(())
            }
            Err(e) => {
                self.ctx.shared.free_now(staging.buffer, staging.allocation);
                Err(e)
            }
        }
    }
}

impl PendingBytes for PendingRead {
    fn wait(self: Box<Self>) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.len];
        self.wait_into(&mut out)?;
        Ok(out)
    }
}

impl Drop for PendingRead {
    /// A read dropped unwaited waits for its batch before giving its staging buffer back.
    fn drop(&mut self) {
        if let Some(staging) = self.staging.take() {
            if self.ctx.wait(self.batch).is_ok() {
                self.ctx.shared.staging.give_back(&self.ctx.shared, staging);
            } else {
                self.ctx.shared.free_now(staging.buffer, staging.allocation);
            }
        }
    }
}
