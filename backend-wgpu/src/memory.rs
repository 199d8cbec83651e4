//! Device memory: buffers from core's caching pool, created on a miss.
//!
//! Reuse is stream-ordered: a freed block serves the next allocation of its size class at
//! once, since every use runs on the device's one queue in recording order. An allocation
//! the driver refuses is retried once after the cached blocks of other classes are released.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tessera_core::{Buffer, Error, Result};

use crate::batch::Core;
use crate::buffer::{Block, WgpuBuffer};
use crate::sync::lock;

impl Core {
    pub(crate) fn alloc(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        let class = tessera_core::memory::size_class(bytes);
        if class as u64 > self.info.limits.max_buffer_bytes as u64 {
            let stats = lock(&self.pool).stats();
            return Err(Error::OutOfMemory {
                requested: bytes,
                in_use: stats.in_use,
                limit: self.info.limits.max_buffer_bytes,
            });
        }
        match self.alloc_block(bytes) {
            Err(Error::OutOfMemory { .. }) => {
                // Cached blocks of other classes go back to the driver, then one more try.
                lock(&self.pool).trim(|_| true);
                self.alloc_block(bytes)
            }
            other => other,
        }
    }

    fn alloc_block(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        let mut pool = lock(&self.pool);
        let in_use = pool.stats().in_use;
        // Stream-ordered reuse: every use of a buffer runs on this device's one queue in
        // recording order, and wgpu orders each use after the previous ones (barriers between
        // dispatches and submissions; host writes submit the recorded work first), so a freed
        // block may serve the next allocation at once, even while queued work still reads it.
        let (block, class) = pool.alloc(
            bytes,
            |_| true,
            |class| {
                let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
                let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("tessera"),
                    size: class as u64,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                if pollster::block_on(scope.pop()).is_some() {
                    return Err(Error::OutOfMemory {
                        requested: bytes,
                        in_use,
                        limit: self.info.limits.max_buffer_bytes,
                    });
                }
                Ok(Block {
                    buffer,
                    id: self.next_id.fetch_add(1, Ordering::Relaxed),
                })
            },
        )?;
        drop(pool);
        Ok(Arc::new(WgpuBuffer::new(
            block,
            bytes,
            class,
            self.pool.clone(),
        )))
    }
}
