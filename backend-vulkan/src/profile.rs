//! Kernel timing while profiling (`Device::set_profiling`, `tessera bench --profile`): every
//! dispatch waits for the commands before it (a barrier), and timestamps written just before
//! and after it give its own device time. A batch is waited for when it is submitted, its
//! timestamps read and summed per kernel. The waits serialize the queue, so speed is measured
//! with profiling off.

use ash::vk;
use tessera_core::{Error, KernelTotals, Result};

use crate::memory::vk_err;

/// One device's timestamp queries and the kernels of the batch being recorded.
pub(crate) struct Profiler {
    queries: vk::QueryPool,
    /// Seconds per timestamp tick.
    tick: f64,
    /// Two timestamps per command of a batch.
    slots: u32,
    /// Kernels timed in the batch being recorded, in dispatch order.
    timed: Vec<String>,
}

impl Profiler {
    /// A profiler for batches of at most `batch` commands on a device whose timestamps tick
    /// every `period_ns` nanoseconds, or `Unsupported` where its compute queue has no
    /// timestamps (`valid_bits` 0).
    pub(crate) fn new(
        device: &ash::Device,
        batch: usize,
        period_ns: f32,
        valid_bits: u32,
    ) -> Result<Profiler> {
        if valid_bits == 0 {
            return Err(Error::unsupported(
                "vulkan",
                "kernel profiling (the compute queue has no timestamps)",
            ));
        }
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(2 * batch as u32);
        // SAFETY: the device is valid; `info` lives through the call.
        let queries = unsafe { device.create_query_pool(&info, None) }
            .map_err(|e| vk_err("vkCreateQueryPool", e))?;
        Ok(Profiler {
            queries,
            tick: f64::from(period_ns) * 1e-9,
            slots: 2 * batch as u32,
            timed: Vec::new(),
        })
    }

    /// Readies the queries for a new batch, recorded first in its command buffer `cb`.
    pub(crate) fn begin(&mut self, device: &ash::Device, cb: vk::CommandBuffer) {
        self.timed.clear();
        // SAFETY: `cb` is recording; the pool belongs to this device, and the previous batch
        // using it has finished (profiling waits for each batch at submission).
        unsafe { device.cmd_reset_query_pool(cb, self.queries, 0, self.slots) };
    }

    /// Writes the timestamp before (`end` false) or after a dispatch of kernel `name`.
    pub(crate) fn stamp(
        &mut self,
        device: &ash::Device,
        cb: vk::CommandBuffer,
        name: &str,
        end: bool,
    ) {
        if !end {
            self.timed.push(name.to_string());
        }
        let slot = 2 * (self.timed.len() as u32 - 1) + u32::from(end);
        // SAFETY: `cb` is recording; `slot` < `slots` (a batch holds at most `batch` commands)
        // and was reset at the batch's start.
        unsafe {
            device.cmd_write_timestamp(
                cb,
                vk::PipelineStageFlags::COMPUTE_SHADER,
                self.queries,
                slot,
            )
        };
    }

    /// Adds the times of the batch just finished to `totals`.
    pub(crate) fn collect(&mut self, device: &ash::Device, totals: &mut KernelTotals) {
        let timed = std::mem::take(&mut self.timed);
        if timed.is_empty() {
            return;
        }
        let mut ticks = vec![0u64; 2 * timed.len()];
        // SAFETY: the pool belongs to this device; the batch that wrote these queries has
        // finished; `ticks` holds one u64 per query read.
        let read = unsafe {
            device.get_query_pool_results(
                self.queries,
                0,
                &mut ticks,
                vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
            )
        };
        if read.is_ok() {
            for (name, pair) in timed.iter().zip(ticks.chunks_exact(2)) {
                let seconds = pair[1].saturating_sub(pair[0]) as f64 * self.tick;
                totals.add(name, seconds);
            }
        }
    }

    /// Frees the queries; no pending batch may use them.
    pub(crate) fn destroy(&self, device: &ash::Device) {
        // SAFETY: the caller guarantees no pending work uses the pool.
        unsafe { device.destroy_query_pool(self.queries, None) };
    }
}
