//! Parameter blocks too large for the device's push constants (lavapipe has 128 bytes, the
//! largest block 256): written into a host-visible buffer of the batch being recorded and bound
//! as set 0 at a dynamic offset. A batch's buffers are reused once it has finished.

use ash::vk;
use gpu_allocator::vulkan::Allocation;
use gpu_allocator::MemoryLocation;
use tessera_core::{Error, Result};

use crate::memory::{vk_err, Shared};

/// Bytes of one parameter buffer.
const BUFFER_BYTES: u64 = 256 * 1024;
/// The range bound for one dispatch: the largest parameter block (64 words).
pub(crate) const BLOCK_BYTES: u64 = 256;
/// Descriptor sets per descriptor pool (one set per parameter buffer, made once).
const SETS_PER_POOL: u32 = 32;

pub(crate) struct ParamBuffer {
    buffer: vk::Buffer,
    allocation: Allocation,
    set: vk::DescriptorSet,
    /// Bytes written in the batch being recorded.
    used: u64,
}

/// The parameter buffers of one device.
#[derive(Default)]
pub(crate) struct ParamBuffers {
    pools: Vec<vk::DescriptorPool>,
    sets_left: u32,
    current: Option<ParamBuffer>,
    /// Filled buffers of the batch being recorded.
    filled: Vec<ParamBuffer>,
    free: Vec<ParamBuffer>,
}

impl ParamBuffers {
    /// Writes `words` for the next dispatch of the batch being recorded; returns the set to
    /// bind and the dynamic offset of the words. `align` is the device's offset alignment.
    pub(crate) fn push(
        &mut self,
        shared: &Shared,
        layout: vk::DescriptorSetLayout,
        align: u64,
        words: &[u32],
    ) -> Result<(vk::DescriptorSet, u32)> {
        let bytes = 4 * words.len() as u64;
        if bytes > BLOCK_BYTES {
            return Err(Error::unsupported(
                "vulkan",
                format!("a parameter block of {bytes} bytes (at most {BLOCK_BYTES})"),
            ));
        }
        let fits = |p: &ParamBuffer| p.used + BLOCK_BYTES <= BUFFER_BYTES;
        if !self.current.as_ref().is_some_and(fits) {
            let next = self.next(shared, layout)?;
            self.filled.extend(self.current.replace(next));
        }
        let Some(current) = self.current.as_mut() else {
            return Err(vk_err("parameter buffer", vk::Result::ERROR_UNKNOWN));
        };
        let offset = current.used;
        let Some(mapped) = current.allocation.mapped_slice_mut() else {
            return Err(vk_err(
                "parameter buffer mapping",
                vk::Result::ERROR_MEMORY_MAP_FAILED,
            ));
        };
        let start = offset as usize;
        for (i, w) in words.iter().enumerate() {
            mapped[start + 4 * i..start + 4 * i + 4].copy_from_slice(&w.to_ne_bytes());
        }
        current.used = (offset + bytes.max(4)).next_multiple_of(align);
        Ok((current.set, offset as u32))
    }

    /// A free buffer, or a new one with its descriptor set.
    fn next(&mut self, shared: &Shared, layout: vk::DescriptorSetLayout) -> Result<ParamBuffer> {
        if let Some(mut p) = self.free.pop() {
            p.used = 0;
            return Ok(p);
        }
        let (buffer, allocation) = shared.create_buffer(
            BUFFER_BYTES,
            vk::BufferUsageFlags::STORAGE_BUFFER,
            MemoryLocation::CpuToGpu,
        )?;
        let set = match self.allocate_set(shared, layout) {
            Ok(set) => set,
            Err(e) => {
                shared.free_now(buffer, allocation);
                return Err(e);
            }
        };
        let info = [vk::DescriptorBufferInfo {
            buffer,
            offset: 0,
            range: BLOCK_BYTES,
        }];
        let write = vk::WriteDescriptorSet::default()
            .dst_set(set)
            .dst_binding(0)
            .descriptor_type(vk::DescriptorType::STORAGE_BUFFER_DYNAMIC)
            .buffer_info(&info);
        // SAFETY: the set is new and unused; the buffer belongs to this device.
        unsafe { shared.device.update_descriptor_sets(&[write], &[]) };
        Ok(ParamBuffer {
            buffer,
            allocation,
            set,
            used: 0,
        })
    }

    fn allocate_set(
        &mut self,
        shared: &Shared,
        layout: vk::DescriptorSetLayout,
    ) -> Result<vk::DescriptorSet> {
        if self.sets_left == 0 {
            let sizes = [vk::DescriptorPoolSize {
                ty: vk::DescriptorType::STORAGE_BUFFER_DYNAMIC,
                descriptor_count: SETS_PER_POOL,
            }];
            let info = vk::DescriptorPoolCreateInfo::default()
                .max_sets(SETS_PER_POOL)
                .pool_sizes(&sizes);
            // SAFETY: the device is valid; `info` lives through the call.
            let pool = unsafe { shared.device.create_descriptor_pool(&info, None) }
                .map_err(|e| vk_err("vkCreateDescriptorPool", e))?;
            self.pools.push(pool);
            self.sets_left = SETS_PER_POOL;
        }
        let layouts = [layout];
        let pool = self.pools[self.pools.len() - 1];
        let info = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(pool)
            .set_layouts(&layouts);
        // SAFETY: the pool has a set left; the layout belongs to this device.
        let sets = unsafe { shared.device.allocate_descriptor_sets(&info) }
            .map_err(|e| vk_err("vkAllocateDescriptorSets", e))?;
        self.sets_left -= 1;
        Ok(sets[0])
    }

    /// The buffers the batch being recorded wrote, to keep until it has finished.
    pub(crate) fn take_batch(&mut self) -> Vec<ParamBuffer> {
        let mut batch = std::mem::take(&mut self.filled);
        batch.extend(self.current.take());
        batch
    }

    /// Buffers of a finished batch, free again.
    pub(crate) fn recycle(&mut self, buffers: Vec<ParamBuffer>) {
        self.free.extend(buffers);
    }

    /// Frees every buffer and pool; the queue must be idle and every batch's buffers
    /// recycled.
    pub(crate) fn destroy(&mut self, shared: &Shared) {
        let all = self.take_batch().into_iter().chain(self.free.drain(..));
        for p in all.collect::<Vec<_>>() {
            shared.free_now(p.buffer, p.allocation);
        }
        for pool in self.pools.drain(..) {
            // SAFETY: the queue is idle (the caller's contract); freeing the pool frees its
            // sets.
            unsafe { shared.device.destroy_descriptor_pool(pool, None) };
        }
    }
}
