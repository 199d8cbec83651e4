//! The Vulkan device: what `Device` asks of it, and its kernels, which validate a launch and
//! hand it to the shared WGSL planners.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tessera_core::exec::KernelCache;
use tessera_core::{
    check_byte_range, Buffer, DType, Device, DeviceInfo, Kernel, KernelTime, MemoryStats, Op,
    PendingBytes, ReadyBytes, Recording, Result,
};
use tessera_wgsl::WgslKernel;

use crate::context::Context;
use crate::memory::lock;

/// One Vulkan physical device opened as a device. Cheap to share: all state lives behind one
/// `Arc`.
pub struct VulkanDevice {
    ctx: Arc<Context>,
    kernels: KernelCache,
}

impl fmt::Debug for VulkanDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanDevice")
            .field("info", &self.ctx.info)
            .field("memory", &self.memory())
            .finish()
    }
}

impl VulkanDevice {
    /// Opens physical device `ordinal` (the `N` of `vulkan:N`).
    pub fn open(ordinal: usize) -> Result<Self> {
        Ok(VulkanDevice {
            ctx: Arc::new(Context::open(ordinal)?),
            kernels: KernelCache::default(),
        })
    }
}

impl Device for VulkanDevice {
    fn info(&self) -> &DeviceInfo {
        &self.ctx.info
    }

    fn alloc(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        self.ctx.alloc(bytes)
    }

    fn write(&self, buffer: &Arc<dyn Buffer>, offset: usize, data: &[u8]) -> Result<()> {
        check_byte_range("write", buffer, offset, data.len())?;
        self.ctx.no_host_copy("write")?;
        if data.is_empty() {
            return Ok(());
        }
        self.ctx.write_bytes(buffer, offset, data)
    }

    fn read(&self, buffer: &Arc<dyn Buffer>, offset: usize, out: &mut [u8]) -> Result<()> {
        check_byte_range("read", buffer, offset, out.len())?;
        self.ctx.no_host_copy("read")?;
        if out.is_empty() {
            return self.synchronize();
        }
        self.ctx
            .start_read(buffer, offset, out.len())?
            .wait_into(out)
    }

    fn read_later(
        &self,
        buffer: &Arc<dyn Buffer>,
        offset: usize,
        len: usize,
    ) -> Result<Box<dyn PendingBytes>> {
        check_byte_range("read_later", buffer, offset, len)?;
        self.ctx.no_host_copy("read_later")?;
        if len == 0 {
            self.synchronize()?;
            return Ok(Box::new(ReadyBytes(Vec::new())));
        }
        Ok(Box::new(self.ctx.start_read(buffer, offset, len)?))
    }

    fn kernel(&self, op: &Op, input_dtypes: &[DType]) -> Result<Arc<dyn Kernel>> {
        self.kernels.get_or_build(op, input_dtypes, || {
            WgslKernel::build(&self.ctx, op, input_dtypes, &self.ctx.info.dtypes)
        })
    }

    fn synchronize(&self) -> Result<()> {
        self.ctx.no_host_copy("synchronize")?;
        self.ctx.syncs.fetch_add(1, Ordering::Relaxed);
        self.ctx.drain()
    }

    fn memory(&self) -> MemoryStats {
        self.ctx
            .recording_pools
            .add_to(lock(&self.ctx.pool).stats())
    }

    fn set_memory_limit(&self, limit: Option<usize>) {
        lock(&self.ctx.pool).set_limit(limit);
    }

    fn empty_cache(&self) {
        lock(&self.ctx.pool).trim(|_| true);
        if self.ctx.drain().is_ok() {
            if let Ok(done) = self.ctx.completed() {
                self.ctx.shared.collect(done);
            }
        }
    }

    fn reset_peak(&self) {
        lock(&self.ctx.pool).reset_peak();
    }

    fn host_syncs(&self) -> u64 {
        self.ctx.syncs.load(Ordering::Relaxed)
    }

    fn set_profiling(&self, on: bool) -> Result<()> {
        self.ctx.set_profiling(on)
    }

    fn profile(&self) -> Vec<KernelTime> {
        self.ctx.recorder().profile.report()
    }

    fn begin_recording(&self) -> Result<()> {
        self.ctx.begin_recording()
    }

    fn end_recording(&self) -> Result<Box<dyn Recording>> {
        self.ctx.end_recording()
    }
}
