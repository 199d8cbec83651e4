//! The wgpu device: what `Device` asks of it, and its kernels, which validate a launch and
//! hand it to the shared WGSL planners.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tessera_core::exec::KernelCache;
use tessera_core::{
    check_byte_range, Buffer, DType, Device, DeviceInfo, Error, Kernel, KernelTime, MemoryStats,
    Op, PendingBytes, ReadyBytes, Result,
};
use tessera_wgsl::WgslKernel;

use crate::adapter::{adapters, WgpuOptions};
use crate::batch::{Core, MAX_BATCH};
use crate::buffer::wgpu_buffer;
use crate::profile::Profiler;
use crate::sync::lock;

/// One wgpu adapter opened as a device. Cheap to share: all state lives behind one `Arc`.
pub struct WgpuDevice {
    core: Arc<Core>,
    kernels: KernelCache,
}

impl fmt::Debug for WgpuDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgpuDevice")
            .field("info", &self.core.info)
            .field("memory", &self.memory())
            .finish()
    }
}

impl WgpuDevice {
    /// Bytes of launch parameters passed as immediates (0: all go through the parameter
    /// buffer).
    pub fn immediate_bytes(&self) -> usize {
        4 * self.core.caps.immediate_words
    }

    /// Whether workgroup reductions reduce within subgroups first.
    pub fn subgroup_reductions(&self) -> bool {
        self.core.caps.subgroups
    }

    /// Opens `adapter` with every limit it offers.
    pub fn open(adapter: wgpu::Adapter, ordinal: usize) -> Result<Self> {
        Self::open_adapter(adapter, ordinal, &WgpuOptions::default())
    }

    /// Opens adapter `ordinal` (the `N` of `wgpu:N`) as `options` say.
    pub fn open_with(ordinal: usize, options: &WgpuOptions) -> Result<Self> {
        let adapter = adapters()
            .into_iter()
            .nth(ordinal)
            .ok_or_else(|| Error::Device {
                name: format!("wgpu:{ordinal}"),
                detail: "no such wgpu adapter".into(),
            })?;
        Self::open_adapter(adapter, ordinal, options)
    }

    fn open_adapter(adapter: wgpu::Adapter, ordinal: usize, options: &WgpuOptions) -> Result<Self> {
        Ok(WgpuDevice {
            core: Arc::new(Core::open(adapter, ordinal, options)?),
            kernels: KernelCache::default(),
        })
    }
}

impl Device for WgpuDevice {
    fn info(&self) -> &DeviceInfo {
        &self.core.info
    }

    fn alloc(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        self.core.alloc(bytes)
    }

    fn write(&self, buffer: &Arc<dyn Buffer>, offset: usize, data: &[u8]) -> Result<()> {
        check_byte_range("write", buffer, offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.core.write_bytes(buffer, offset, data)
    }

    fn read(&self, buffer: &Arc<dyn Buffer>, offset: usize, out: &mut [u8]) -> Result<()> {
        self.core.syncs.fetch_add(1, Ordering::Relaxed);
        check_byte_range("read", buffer, offset, out.len())?;
        if out.is_empty() {
            return self.synchronize_inner();
        }
        self.core.read_into(wgpu_buffer(buffer)?, offset, out)
    }

    fn read_later(
        &self,
        buffer: &Arc<dyn Buffer>,
        offset: usize,
        len: usize,
    ) -> Result<Box<dyn PendingBytes>> {
        self.core.syncs.fetch_add(1, Ordering::Relaxed);
        check_byte_range("read_later", buffer, offset, len)?;
        if len == 0 {
            self.synchronize_inner()?;
            return Ok(Box::new(ReadyBytes(Vec::new())));
        }
        Ok(Box::new(self.core.start_read(
            wgpu_buffer(buffer)?,
            offset,
            len,
        )?))
    }

    fn kernel(&self, op: &Op, input_dtypes: &[DType]) -> Result<Arc<dyn Kernel>> {
        self.kernels.get_or_build(op, input_dtypes, || {
            WgslKernel::build(&self.core, op, input_dtypes, &self.core.info.dtypes)
        })
    }

    fn synchronize(&self) -> Result<()> {
        self.core.syncs.fetch_add(1, Ordering::Relaxed);
        self.synchronize_inner()
    }

    fn memory(&self) -> MemoryStats {
        lock(&self.core.pool).stats()
    }

    fn set_memory_limit(&self, limit: Option<usize>) {
        lock(&self.core.pool).set_limit(limit);
    }

    fn empty_cache(&self) {
        // Cached bind groups keep their buffers alive: drop them with the blocks. wgpu frees a
        // buffer's memory once the work already submitted or recorded with it is done.
        self.core.state().bind_groups.clear();
        lock(&self.core.pool).trim(|_| true);
    }

    fn reset_peak(&self) {
        lock(&self.core.pool).reset_peak();
    }

    fn host_syncs(&self) -> u64 {
        self.core.syncs.load(Ordering::Relaxed)
    }

    fn set_profiling(&self, on: bool) -> Result<()> {
        if on && !self.core.timestamps {
            return Err(Error::unsupported(
                "wgpu",
                "kernel profiling (the adapter has no timestamp queries)",
            ));
        }
        self.core.drain()?;
        let core = &self.core;
        let mut st = core.state();
        st.profiler = on.then(|| Profiler::new(&core.device, MAX_BATCH));
        if on {
            st.profile.clear();
        }
        Ok(())
    }

    fn profile(&self) -> Vec<KernelTime> {
        self.core.state().profile.report()
    }
}

impl WgpuDevice {
    fn synchronize_inner(&self) -> Result<()> {
        self.core.drain()
    }
}
