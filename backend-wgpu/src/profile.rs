//! Kernel timing while profiling: each dispatch's pass writes a timestamp at its start and its
//! end; at submission they are resolved, read back after the queue drains and summed per
//! kernel (`Device::profile`, `tessera bench --profile`).

use std::sync::mpsc;

use tessera_core::KernelTotals;

/// The query set and buffers of one device's timestamps, and the kernels of the batch being
/// recorded.
pub(crate) struct Profiler {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// Kernels recorded in the current batch, in dispatch order.
    recorded: Vec<String>,
}

impl Profiler {
    /// Room for two timestamps per dispatch of a batch of `batch` dispatches.
    pub(crate) fn new(device: &wgpu::Device, batch: usize) -> Profiler {
        let slots = 2 * batch as u64;
        let buffer = |label, usage| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: 8 * slots,
                usage,
                mapped_at_creation: false,
            })
        };
        Profiler {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("tessera profile"),
                ty: wgpu::QueryType::Timestamp,
                count: slots as u32,
            }),
            resolve: buffer(
                "tessera profile resolve",
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            ),
            readback: buffer(
                "tessera profile readback",
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            ),
            recorded: Vec::new(),
        }
    }

    /// The timestamps of the pass of the next dispatch, of kernel `name`.
    pub(crate) fn timestamp_writes(&mut self, name: &str) -> wgpu::ComputePassTimestampWrites<'_> {
        let at = 2 * self.recorded.len() as u32;
        self.recorded.push(name.to_string());
        wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: Some(at),
            end_of_pass_write_index: Some(at + 1),
        }
    }

    /// Dispatches timed in the batch being recorded.
    pub(crate) fn timed(&self) -> u64 {
        self.recorded.len() as u64
    }

    /// Records the copy of the batch's timestamps to the host-visible buffer.
    pub(crate) fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        let timed = self.timed();
        if timed > 0 {
            encoder.resolve_query_set(&self.queries, 0..2 * timed as u32, &self.resolve, 0);
            encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.readback, 0, 16 * timed);
        }
    }

    /// Waits for the batch just submitted and adds its kernels' times to `totals`.
    pub(crate) fn collect(
        &mut self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        totals: &mut KernelTotals,
    ) {
        let timed = self.timed();
        if timed == 0 {
            return;
        }
        let slice = self.readback.slice(0..16 * timed);
        let (tx, rx) = mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        let mapped = device.poll(wgpu::PollType::wait_indefinitely()).is_ok()
            && matches!(rx.recv(), Ok(Ok(())));
        let period = f64::from(queue.get_timestamp_period()) * 1e-9;
        let recorded = std::mem::take(&mut self.recorded);
        if mapped {
            if let Ok(view) = slice.get_mapped_range() {
                let ticks: Vec<u64> = view
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect();
                for (name, pair) in recorded.into_iter().zip(ticks.chunks_exact(2)) {
                    totals.add(&name, pair[1].saturating_sub(pair[0]) as f64 * period);
                }
            }
            self.readback.unmap();
        }
    }
}
