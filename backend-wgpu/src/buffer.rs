//! Device buffers handed out by a [`crate::WgpuDevice`] from its caching pool.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use tessera_core::memory::Pool;
use tessera_core::{Buffer, Error, Result};

/// One raw allocation. The pool hands it out again as soon as it is freed: every use runs on
/// the device's one queue in recording order (see `Core::alloc_block`).
#[derive(Debug)]
pub(crate) struct Block {
    pub buffer: wgpu::Buffer,
    /// Unique per allocation, for bind group cache keys.
    pub id: u64,
}

pub(crate) type SharedPool = Arc<Mutex<Pool<Block>>>;

/// A region of device memory. Dropping it returns the block to the pool.
pub struct WgpuBuffer {
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) id: u64,
    len: usize,
    class: usize,
    pool: SharedPool,
}

impl WgpuBuffer {
    pub(crate) fn new(block: Block, len: usize, class: usize, pool: SharedPool) -> Self {
        WgpuBuffer {
            buffer: block.buffer,
            id: block.id,
            len,
            class,
            pool,
        }
    }

    /// Size of the underlying allocation (the size class, a multiple of 4 bytes).
    pub(crate) fn capacity(&self) -> u64 {
        self.buffer.size()
    }
}

impl fmt::Debug for WgpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgpuBuffer")
            .field("id", &self.id)
            .field("len", &self.len)
            .field("class", &self.class)
            .finish()
    }
}

impl Buffer for WgpuBuffer {
    fn len(&self) -> usize {
        self.len
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for WgpuBuffer {
    fn drop(&mut self) {
        let block = Block {
            buffer: self.buffer.clone(),
            id: self.id,
        };
        self.pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .release(block, self.class);
    }
}

/// The wgpu buffer behind a buffer handle, or an error for another backend's buffer.
pub(crate) fn wgpu_buffer(buffer: &Arc<dyn Buffer>) -> Result<&WgpuBuffer> {
    buffer
        .as_any()
        .downcast_ref::<WgpuBuffer>()
        .ok_or_else(|| Error::Backend {
            backend: "wgpu".into(),
            detail: format!(
                "{buffer:?} is not a wgpu buffer; move the tensor to this device first"
            ),
        })
}
