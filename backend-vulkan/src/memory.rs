//! Device memory: `VkBuffer`s over gpu-allocator, handed out through core's caching pool.
//!
//! Reuse is stream-ordered: every command runs on the device's one queue in recording order,
//! and a command that writes a buffer an earlier one read or wrote waits for it (`record.rs`),
//! so a freed block may serve the next allocation at once. A block
//! the pool lets go (trimming, a cap, `empty_cache`) may still be in use by submitted work,
//! so its memory is returned only once the queue has passed the batch that was being
//! recorded when it was let go ([`Shared::retire`]).
//!
//! Host copies go through mapped staging buffers, kept for reuse once their batch has
//! finished ([`StagingPool`]).

use std::any::Any;
use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ash::vk;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme, Allocator};
use gpu_allocator::MemoryLocation;
use tessera_core::memory::Pool;
use tessera_core::{Buffer, Error, Result};

use crate::instance::DEVICE_SETUP;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn vk_err(what: &str, e: vk::Result) -> Error {
    Error::Backend {
        backend: "vulkan".into(),
        detail: format!("{what}: {e}"),
    }
}

/// The logical device and its allocator, kept alive by the device and by every block: the
/// last of them to go destroys the device, after the queue has finished.
pub(crate) struct Shared {
    pub(crate) device: ash::Device,
    allocator: ManuallyDrop<Mutex<Allocator>>,
    /// Value of the timeline semaphore that the batch being recorded will signal.
    pub(crate) recording: AtomicU64,
    /// Memory let go while the queue may still use it, with the batch after which it is free.
    retired: Mutex<Vec<(u64, vk::Buffer, Allocation)>>,
    /// Host-visible buffers for copies, kept for reuse.
    pub(crate) staging: StagingPool,
}

impl Shared {
    pub(crate) fn new(device: ash::Device, allocator: Allocator) -> Self {
        Shared {
            device,
            allocator: ManuallyDrop::new(Mutex::new(allocator)),
            recording: AtomicU64::new(1),
            retired: Mutex::new(Vec::new()),
            staging: StagingPool::default(),
        }
    }

    /// A buffer of `bytes` in `location` with `usage`, bound to fresh memory.
    pub(crate) fn create_buffer(
        &self,
        bytes: u64,
        usage: vk::BufferUsageFlags,
        location: MemoryLocation,
    ) -> Result<(vk::Buffer, Allocation)> {
        let info = vk::BufferCreateInfo::default()
            .size(bytes.max(4))
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: the device is valid while `self` lives; `info` lives through the call.
        let buffer = unsafe { self.device.create_buffer(&info, None) }
            .map_err(|e| out_of_memory_or(bytes, "vkCreateBuffer", e))?;
        // SAFETY: `buffer` was just created on this device.
        let requirements = unsafe { self.device.get_buffer_memory_requirements(buffer) };
        let allocated = lock(&self.allocator).allocate(&AllocationCreateDesc {
            name: "tessera",
            requirements,
            location,
            linear: true,
            allocation_scheme: AllocationScheme::GpuAllocatorManaged,
        });
        let allocation = match allocated {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: the buffer is unused and bound to nothing.
                unsafe { self.device.destroy_buffer(buffer, None) };
                return Err(match e {
                    gpu_allocator::AllocationError::OutOfMemory => Error::OutOfMemory {
                        requested: bytes as usize,
                        in_use: 0,
                        limit: 0,
                    },
                    other => Error::Backend {
                        backend: "vulkan".into(),
                        detail: format!("allocating {bytes} bytes: {other}"),
                    },
                });
            }
        };
        // SAFETY: the memory was allocated for this buffer's requirements and is unbound.
        let bound = unsafe {
            self.device
                .bind_buffer_memory(buffer, allocation.memory(), allocation.offset())
        };
        if let Err(e) = bound {
            self.free_now(buffer, allocation);
            return Err(vk_err("vkBindBufferMemory", e));
        }
        Ok((buffer, allocation))
    }

    /// Frees a buffer the queue no longer uses.
    pub(crate) fn free_now(&self, buffer: vk::Buffer, allocation: Allocation) {
        // SAFETY: the caller guarantees no pending work uses `buffer`.
        unsafe { self.device.destroy_buffer(buffer, None) };
        let _ = lock(&self.allocator).free(allocation);
    }

    /// A mapped staging buffer in `location` holding at least `bytes`: a kept one, else new.
    pub(crate) fn staging(&self, bytes: u64, location: MemoryLocation) -> Result<Staging> {
        if let Some(kept) = self.staging.take(bytes, location) {
            return Ok(kept);
        }
        let capacity = bytes.max(MIN_STAGING_BYTES).next_power_of_two();
        let usage = vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST;
        let (buffer, allocation) = self.create_buffer(capacity, usage, location)?;
        if allocation.mapped_ptr().is_none() {
            self.free_now(buffer, allocation);
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

    /// Frees `buffer` once the batch being recorded now has finished.
    fn retire(&self, buffer: vk::Buffer, allocation: Allocation) {
        let after = self.recording.load(Ordering::Acquire);
        lock(&self.retired).push((after, buffer, allocation));
    }

    /// Frees the retired memory of batches up to `completed`.
    pub(crate) fn collect(&self, completed: u64) {
        let done: Vec<_> = {
            let mut retired = lock(&self.retired);
            let (done, pending) = std::mem::take(&mut *retired)
                .into_iter()
                .partition(|(after, _, _)| *after <= completed);
            *retired = pending;
            done
        };
        for (_, buffer, allocation) in done {
            self.free_now(buffer, allocation);
        }
    }
}

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

impl Drop for Shared {
    fn drop(&mut self) {
        let _setup = lock(&DEVICE_SETUP);
        // SAFETY: the last user of the device is gone; waiting for the queue makes every
        // retired buffer free to destroy, and the allocator's memory goes before the device.
        unsafe {
            let _ = self.device.device_wait_idle();
            let staging = self.staging.drain().into_iter();
            let retired = std::mem::take(&mut *lock(&self.retired)).into_iter();
            for (buffer, allocation) in staging
                .map(|s| (s.buffer, s.allocation))
                .chain(retired.map(|(_, b, a)| (b, a)))
            {
                self.device.destroy_buffer(buffer, None);
                let _ = lock(&self.allocator).free(allocation);
            }
            ManuallyDrop::drop(&mut self.allocator);
            self.device.destroy_device(None);
        }
    }
}

fn out_of_memory_or(bytes: u64, what: &str, e: vk::Result) -> Error {
    match e {
        vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
            Error::OutOfMemory {
                requested: bytes as usize,
                in_use: 0,
                limit: 0,
            }
        }
        other => vk_err(what, other),
    }
}

/// One device-local allocation; letting it go retires its memory.
pub(crate) struct Block {
    pub(crate) buffer: vk::Buffer,
    allocation: Option<Allocation>,
    /// Unique per allocation.
    pub(crate) id: u64,
    shared: Arc<Shared>,
}

impl Block {
    pub(crate) fn new(shared: &Arc<Shared>, bytes: usize, id: u64) -> Result<Block> {
        let usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        let (buffer, allocation) =
            shared.create_buffer(bytes as u64, usage, MemoryLocation::GpuOnly)?;
        Ok(Block {
            buffer,
            allocation: Some(allocation),
            id,
            shared: shared.clone(),
        })
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(allocation) = self.allocation.take() {
            self.shared.retire(self.buffer, allocation);
        }
    }
}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block").field("id", &self.id).finish()
    }
}

pub(crate) type SharedPool = Arc<Mutex<Pool<Block>>>;

/// A region of device memory. Dropping it returns the block to the pool.
pub struct VulkanBuffer {
    block: Option<Block>,
    len: usize,
    class: usize,
    pool: SharedPool,
}

impl VulkanBuffer {
    pub(crate) fn new(block: Block, len: usize, class: usize, pool: SharedPool) -> Self {
        VulkanBuffer {
            block: Some(block),
            len,
            class,
            pool,
        }
    }

    pub(crate) fn handle(&self) -> vk::Buffer {
        self.block.as_ref().map_or(vk::Buffer::null(), |b| b.buffer)
    }

    /// Bytes of the allocation (its size class).
    pub(crate) fn capacity(&self) -> u64 {
        self.class as u64
    }

    /// Whether the buffer goes back to `pool` (a recording's, say) when dropped.
    pub(crate) fn returns_to(&self, pool: &SharedPool) -> bool {
        Arc::ptr_eq(&self.pool, pool)
    }
}

impl fmt::Debug for VulkanBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanBuffer")
            .field("block", &self.block)
            .field("len", &self.len)
            .field("class", &self.class)
            .finish()
    }
}

impl Buffer for VulkanBuffer {
    fn len(&self) -> usize {
        self.len
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for VulkanBuffer {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            lock(&self.pool).release(block, self.class);
        }
    }
}

/// The Vulkan buffer behind a buffer handle, or an error for another backend's buffer.
pub(crate) fn vulkan_buffer(buffer: &Arc<dyn Buffer>) -> Result<&VulkanBuffer> {
    buffer
        .as_any()
        .downcast_ref::<VulkanBuffer>()
        .ok_or_else(|| Error::Backend {
            backend: "vulkan".into(),
            detail: format!(
                "{buffer:?} is not a Vulkan buffer; move the tensor to this device first"
            ),
        })
}
