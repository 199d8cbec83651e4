//! Device memory: buffers from core's caching pool over the driver's stream-ordered
//! allocations.
//!
//! Reuse is stream-ordered: every use of a buffer runs on the device's one stream in the
//! order it was queued, so a freed block serves the next allocation of its class at once,
//! even while queued work still reads it; blocks the pool lets go are freed on the stream
//! too (after that work). An allocation the driver refuses is retried once after the
//! cached blocks are released, then fails with `OutOfMemory`, leaving the device usable.

use std::any::Any;
use std::sync::{Arc, Mutex, PoisonError};

use tessera_core::memory::Pool;
use tessera_core::{Buffer, Error, Result, TensorRef};

use crate::driver::{DevicePtr, Driver};

/// One allocation from the driver, freed when the pool drops it.
#[derive(Debug)]
pub(crate) struct Block {
    ptr: DevicePtr,
    driver: Arc<dyn Driver>,
}

impl Drop for Block {
    fn drop(&mut self) {
        self.driver.free(self.ptr);
    }
}

impl std::fmt::Debug for dyn Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.backend(), self.name())
    }
}

pub(crate) type SharedPool = Arc<Mutex<Pool<Block>>>;

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A buffer of a `cuda` or `hip` device.
#[derive(Debug)]
pub struct HipBuffer {
    block: Option<Block>,
    class: usize,
    len: usize,
    pool: SharedPool,
}

impl HipBuffer {
    /// The buffer's device address.
    pub(crate) fn ptr(&self) -> DevicePtr {
        self.block.as_ref().map_or(0, |b| b.ptr)
    }
}

impl Buffer for HipBuffer {
    fn len(&self) -> usize {
        self.len
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for HipBuffer {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            lock(&self.pool).release(block, self.class);
        }
    }
}

/// Allocates `bytes` from `pool`, or from `driver` on a miss.
pub(crate) fn alloc(
    driver: &Arc<dyn Driver>,
    pool: &SharedPool,
    bytes: usize,
) -> Result<Arc<dyn Buffer>> {
    match alloc_block(driver, pool, bytes) {
        Err(Error::OutOfMemory { .. }) => {
            lock(pool).trim(|_| true);
            alloc_block(driver, pool, bytes)
        }
        other => other,
    }
}

fn alloc_block(
    driver: &Arc<dyn Driver>,
    pool: &SharedPool,
    bytes: usize,
) -> Result<Arc<dyn Buffer>> {
    let mut guard = lock(pool);
    let in_use = guard.stats().in_use;
    let (block, class) = guard.alloc(
        bytes,
        |_| true,
        |class| match driver.alloc(class)? {
            Some(ptr) => Ok(Block {
                ptr,
                driver: driver.clone(),
            }),
            None => Err(Error::OutOfMemory {
                requested: bytes,
                in_use,
                limit: driver.total_memory(),
            }),
        },
    )?;
    drop(guard);
    Ok(Arc::new(HipBuffer {
        block: Some(block),
        class,
        len: bytes,
        pool: pool.clone(),
    }))
}

/// Whether `buffer` came from `pool`.
pub(crate) fn from_pool(buffer: &Arc<dyn Buffer>, pool: &SharedPool) -> bool {
    buffer
        .as_any()
        .downcast_ref::<HipBuffer>()
        .is_some_and(|b| Arc::ptr_eq(&b.pool, pool))
}

/// The device address of a tensor's first element, for backend `backend` (whose buffers are
/// [`HipBuffer`]s).
pub(crate) fn address(backend: &str, t: &TensorRef<'_>) -> Result<DevicePtr> {
    let buffer = t
        .buffer
        .as_any()
        .downcast_ref::<HipBuffer>()
        .ok_or_else(|| Error::Backend {
            backend: backend.into(),
            detail: "a tensor of another backend's buffer was given to a kernel".into(),
        })?;
    Ok(buffer.ptr() + (t.layout.offset * t.dtype.size()) as u64)
}

/// The device address of `bytes` at `offset` of a buffer.
pub(crate) fn buffer_address(backend: &str, buffer: &Arc<dyn Buffer>) -> Result<DevicePtr> {
    buffer
        .as_any()
        .downcast_ref::<HipBuffer>()
        .map(HipBuffer::ptr)
        .ok_or_else(|| Error::Backend {
            backend: backend.into(),
            detail: "a buffer of another backend was given to this device".into(),
        })
}
