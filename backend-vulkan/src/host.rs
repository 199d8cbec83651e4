//! Copies between the host and device buffers, in order with the recorded work: a write goes
//! through a host-visible staging buffer copied by the batch being recorded; a read copies
//! into one and submits, and waits for that batch at once (`read`) or when its bytes are
//! asked for (`read_later`: decoding records step `t + 1` while token `t` is copied). Staging buffers are reused once their batch
//! has finished ([`StagingPool`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use ash::vk;
use gpu_allocator::vulkan::Allocation;
use gpu_allocator::MemoryLocation;
use tessera_core::{Buffer, Error, PendingBytes, Result};

use crate::context::Context;
use crate::memory::{lock, vulkan_buffer, Shared};

/// A host-visible buffer a batch copies through.
pub(crate) struct Staging {
    pub(crate) buffer: vk::Buffer,
    pub(crate) allocation: Allocation,
    location: MemoryLocation,
    capacity: u64,
}

/// Staging buffers whose batches have finished, kept for the next copies: a buffer made per
/// copy cost each decoding step a buffer and at times fresh driver memory for its token and
/// its read-back. Keeps at most [`KEPT_STAGING_BYTES`]; larger ones go back to the driver.
#[derive(Default)]
pub(crate) struct StagingPool {
    free: Mutex<Vec<Staging>>,
}

/// The most staging memory kept for reuse.
const KEPT_STAGING_BYTES: u64 = 64 << 20;
/// The smallest staging buffer made: small copies share a size.
const MIN_STAGING_BYTES: u64 = 64 << 10;

impl StagingPool {
    /// The smallest kept buffer in `location` that holds `bytes`.
    fn take(&self, bytes: u64, location: MemoryLocation) -> Option<Staging> {
        let mut free = lock(&self.free);
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, s)| s.location == location && s.capacity >= bytes)
            .min_by_key(|(_, s)| s.capacity)
            .map(|(i, _)| i)?;
        Some(free.swap_remove(best))
    }

    /// Keeps `staging` for reuse, or frees it where the pool is full. No pending work may use
    /// it.
    pub(crate) fn give_back(&self, shared: &Shared, staging: Staging) {
        let mut free = lock(&self.free);
        let kept: u64 = free.iter().map(|s| s.capacity).sum();
        if kept + staging.capacity <= KEPT_STAGING_BYTES {
            free.push(staging);
        } else {
            drop(free);
            shared.free_now(staging.buffer, staging.allocation);
        }
    }

    /// Everything kept, to be freed.
    pub(crate) fn drain(&self) -> Vec<Staging> {
        std::mem::take(&mut *lock(&self.free))
    }
}

impl Context {
    fn staging(&self, bytes: usize, location: MemoryLocation) -> Result<Staging> {
        let bytes = bytes as u64;
        if let Some(kept) = self.shared.staging.take(bytes, location) {
            return Ok(kept);
        }
        let capacity = bytes.max(MIN_STAGING_BYTES).next_power_of_two();
        let usage = vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST;
        let (buffer, allocation) = self.shared.create_buffer(capacity, usage, location)?;
        if allocation.mapped_ptr().is_none() {
            self.shared.free_now(buffer, allocation);
            return Err(Error::Backend {
                backend: "vulkan".into(),
                detail: "a staging buffer is not mapped to the host".into(),
            });
        }
        Ok(Staging {
            buffer,
            allocation,
            location,
            capacity,
        })
    }

    /// Queues a copy of `data` into `buffer` at `offset`, after the work recorded so far.
    pub(crate) fn write_bytes(
        &self,
        buffer: &Arc<dyn Buffer>,
        offset: usize,
        data: &[u8],
    ) -> Result<()> {
        let dst = vulkan_buffer(buffer)?.handle();
        let mut staging = self.staging(data.len(), MemoryLocation::CpuToGpu)?;
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
        let staging = self.staging(len, MemoryLocation::GpuToCpu)?;
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
    /// A read dropped unwaited leaves its staging buffer to the batch's end.
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
