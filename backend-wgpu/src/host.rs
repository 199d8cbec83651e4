//! Copies between the host and device buffers. Writes go through the queue after the work
//! recorded so far; reads copy into a host-visible staging buffer, submit, and map it.

use std::sync::{mpsc, Arc};

use tessera_core::{Buffer, PendingBytes, Result};

use crate::batch::{Core, MAX_STAGING_BUFFERS};
use crate::buffer::{wgpu_buffer, WgpuBuffer};
use crate::sync::backend_err;

impl Core {
    /// Writes `data` at byte `offset` of `buffer`, after the work recorded so far.
    pub(crate) fn write_bytes(
        self: &Arc<Self>,
        buffer: &Arc<dyn Buffer>,
        offset: usize,
        data: &[u8],
    ) -> Result<()> {
        let buf = wgpu_buffer(buffer)?;
        let start = offset / 4 * 4;
        let end = (offset + data.len()).div_ceil(4) * 4;
        let mut bytes = vec![0u8; end - start];
        if start != offset || end != offset + data.len() {
            // The words at the edges hold bytes outside the write: keep them.
            let edge = (buf.capacity() as usize).min(end);
            self.read_into(buf, start, &mut bytes[..edge - start])?;
        }
        bytes[offset - start..offset - start + data.len()].copy_from_slice(data);
        let mut st = self.state();
        // Host writes land before the next submission: submit the kernels queued so far first.
        self.flush(&mut st);
        self.queue.write_buffer(&buf.buffer, start as u64, &bytes);
        st.dirty = true;
        Ok(())
    }

    pub(crate) fn read_into(
        self: &Arc<Self>,
        buf: &WgpuBuffer,
        offset: usize,
        out: &mut [u8],
    ) -> Result<()> {
        self.start_read(buf, offset, out.len())?.wait_into(out)
    }

    /// Records a copy of `len` bytes at `offset` into a host-visible staging buffer, submits
    /// it and starts mapping it.
    pub(crate) fn start_read(
        self: &Arc<Self>,
        buf: &WgpuBuffer,
        offset: usize,
        len: usize,
    ) -> Result<HostCopy> {
        let start = (offset as u64) / 4 * 4;
        let end = ((offset + len) as u64).div_ceil(4) * 4;
        let size = end - start;
        let mut st = self.state();
        let staging = match st.staging.iter().position(|s| s.size() >= size) {
            Some(i) => st.staging.swap_remove(i),
            None => self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tessera staging"),
                size: size.next_power_of_two().max(256),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        };
        st.pass = None;
        Self::encoder(&self.device, &mut st.encoder).copy_buffer_to_buffer(
            &buf.buffer,
            start,
            &staging,
            0,
            size,
        );
        st.dirty = true;
        self.flush(&mut st);
        let submission = st.submitted.clone();
        drop(st);
        let (tx, rx) = mpsc::channel();
        staging
            .slice(0..size)
            .map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        Ok(HostCopy {
            core: self.clone(),
            staging,
            submission,
            size,
            skip: (offset as u64 - start) as usize,
            len,
            mapped: rx,
        })
    }
}

/// A copy to the host on its way: submitted, its staging buffer being mapped.
pub(crate) struct HostCopy {
    core: Arc<Core>,
    staging: wgpu::Buffer,
    /// The submission that holds the copy: waiting for it waits for nothing queued later.
    submission: Option<wgpu::SubmissionIndex>,
    size: u64,
    skip: usize,
    len: usize,
    mapped: mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
}

impl HostCopy {
    pub(crate) fn wait_into(self, out: &mut [u8]) -> Result<()> {
        let core = &self.core;
        core.device
            .poll(wgpu::PollType::Wait {
                submission_index: self.submission.clone(),
                timeout: None,
            })
            .map_err(|e| backend_err(format!("poll: {e}")))?;
        core.check_errors()?;
        self.mapped
            .recv()
            .map_err(|_| backend_err("buffer mapping was dropped"))?
            .map_err(|e| backend_err(format!("mapping the staging buffer: {e}")))?;
        {
            let view = self
                .staging
                .slice(0..self.size)
                .get_mapped_range()
                .map_err(|e| backend_err(format!("reading the staging buffer: {e}")))?;
            out.copy_from_slice(&view[self.skip..self.skip + self.len]);
        }
        self.staging.unmap();
        let mut st = core.state();
        if st.staging.len() < MAX_STAGING_BUFFERS {
            st.staging.push(self.staging);
        }
        Ok(())
    }
}

impl PendingBytes for HostCopy {
    fn wait(self: Box<Self>) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.len];
        self.wait_into(&mut out)?;
        Ok(out)
    }
}
