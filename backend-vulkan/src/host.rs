//! Copies between the host and device buffers, in order with the recorded work: a write goes
//! through a host-visible staging buffer copied by the batch being recorded; a read copies
//! into one, submits, and waits for that batch.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ash::vk;
use gpu_allocator::MemoryLocation;
use tessera_core::{Buffer, Error, Result};

use crate::context::Context;
use crate::memory::vulkan_buffer;
use crate::record::Staging;

impl Context {
    fn staging(&self, bytes: usize, location: MemoryLocation) -> Result<Staging> {
        let usage = vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST;
        let (buffer, allocation) = self.shared.create_buffer(bytes as u64, usage, location)?;
        if allocation.mapped_ptr().is_none() {
            self.shared.free_now(buffer, allocation);
            return Err(Error::Backend {
                backend: "vulkan".into(),
                detail: "a staging buffer is not mapped to the host".into(),
            });
        }
        Ok(Staging { buffer, allocation })
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

    /// Copies `out.len()` bytes of `buffer` at `offset` to the host, after the work recorded
    /// so far.
    pub(crate) fn read_into(
        &self,
        buffer: &Arc<dyn Buffer>,
        offset: usize,
        out: &mut [u8],
    ) -> Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        let src = vulkan_buffer(buffer)?.handle();
        let staging = self.staging(out.len(), MemoryLocation::GpuToCpu)?;
        let region = vk::BufferCopy {
            src_offset: offset as u64,
            dst_offset: 0,
            size: out.len() as u64,
        };
        let recorded = {
            let mut recorder = self.recorder();
            let queue = self.queue();
            recorder
                .copy(&queue, src, staging.buffer, region, None)
                .and_then(|_| recorder.submit(&queue))
        };
        // The reader keeps its staging buffer: it is freed here, after the batch has finished
        // (or failed), never by another thread reclaiming the batch.
        let read = recorded.and_then(|value| self.wait(value));
        if read.is_ok() {
            if let Some(bytes) = staging.allocation.mapped_slice() {
                out.copy_from_slice(&bytes[..out.len()]);
            }
        }
        self.shared.free_now(staging.buffer, staging.allocation);
        read
    }
}
