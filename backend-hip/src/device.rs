//! `cuda:N` and `hip:N` devices: the core traits over a [`Driver`].

use std::fmt;
use std::sync::{Arc, Weak};

use tessera_core::dist::{Collective, Rendezvous};
use tessera_core::exec::KernelCache;
use tessera_core::ops::validate_kernel_launch;
use tessera_core::{
    check_byte_range, Buffer, DType, Device, DeviceInfo, Error, Features, Kernel, KernelTime,
    Limits, MemoryStats, Op, PendingBytes, Recording, Result, TensorRef,
};

use crate::driver::Driver;
use crate::gpu::Gpu;
use crate::memory::{buffer_address, lock};
use crate::ops;

/// A GPU of the HIP backend.
pub struct HipDevice {
    gpu: Arc<Gpu>,
    kernels: KernelCache,
}

impl HipDevice {
    pub(crate) fn new(driver: Arc<dyn Driver>, ordinal: usize) -> HipDevice {
        let memory = driver.total_memory();
        let info = DeviceInfo {
            backend: driver.backend().into(),
            ordinal,
            name: driver.name().into(),
            dtypes: vec![
                DType::F32,
                DType::F16,
                DType::BF16,
                DType::I32,
                DType::U32,
                DType::Bool,
            ],
            features: Features {
                f16: true,
                bf16: true,
                subgroups: true,
                cooperative_matrix: false,
            },
            limits: Limits {
                max_buffer_bytes: memory,
                max_binding_bytes: memory,
                binding_align: 256,
                max_workgroup_size: 1024,
                max_workgroups_per_dim: 65_535,
                memory_bytes: Some(memory),
            },
        };
        HipDevice {
            gpu: Arc::new(Gpu::new(driver, info)),
            kernels: KernelCache::default(),
        }
    }
}

impl fmt::Debug for HipDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HipDevice")
            .field("id", &self.gpu.info.id())
            .field("name", &self.gpu.info.name)
            .finish()
    }
}

impl Device for HipDevice {
    fn info(&self) -> &DeviceInfo {
        &self.gpu.info
    }

    fn alloc(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        self.gpu.info.check_fits("alloc", "a buffer", Some(bytes))?;
        self.gpu.alloc(bytes)
    }

    fn write(&self, buffer: &Arc<dyn Buffer>, offset: usize, data: &[u8]) -> Result<()> {
        self.no_host_copy("write")?;
        check_byte_range("write", buffer, offset, data.len())?;
        let base = buffer_address(self.gpu.backend(), buffer)?;
        self.gpu.driver.upload(base + offset as u64, data)
    }

    fn read(&self, buffer: &Arc<dyn Buffer>, offset: usize, out: &mut [u8]) -> Result<()> {
        self.no_host_copy("read")?;
        check_byte_range("read", buffer, offset, out.len())?;
        let base = buffer_address(self.gpu.backend(), buffer)?;
        self.gpu.count_sync();
        self.gpu.driver.download(base + offset as u64, out)
    }

    fn read_later(
        &self,
        buffer: &Arc<dyn Buffer>,
        offset: usize,
        len: usize,
    ) -> Result<Box<dyn PendingBytes>> {
        self.no_host_copy("read_later")?;
        check_byte_range("read_later", buffer, offset, len)?;
        let base = buffer_address(self.gpu.backend(), buffer)?;
        self.gpu.count_sync();
        self.gpu.driver.download_later(base + offset as u64, len)
    }

    fn kernel(&self, op: &Op, input_dtypes: &[DType]) -> Result<Arc<dyn Kernel>> {
        self.kernels.get_or_build(op, input_dtypes, || {
            ops::check_supported(&self.gpu, op, input_dtypes)?;
            Ok(Arc::new(HipKernel {
                op: op.clone(),
                dtypes: input_dtypes.to_vec(),
                gpu: Arc::downgrade(&self.gpu),
            }))
        })
    }

    fn synchronize(&self) -> Result<()> {
        self.no_host_copy("synchronize")?;
        self.gpu.count_sync();
        self.gpu.driver.synchronize()
    }

    fn memory(&self) -> MemoryStats {
        self.gpu.memory()
    }

    fn set_memory_limit(&self, limit: Option<usize>) {
        lock(&self.gpu.pool).set_limit(limit);
    }

    fn empty_cache(&self) {
        lock(&self.gpu.pool).trim(|_| true);
    }

    fn reset_peak(&self) {
        lock(&self.gpu.pool).reset_peak();
    }

    fn host_syncs(&self) -> u64 {
        self.gpu.syncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn set_profiling(&self, on: bool) -> Result<()> {
        self.gpu.set_profiling(on)
    }

    fn profile(&self) -> Vec<KernelTime> {
        self.gpu.profile()
    }

    fn join_collective(
        self: Arc<Self>,
        rendezvous: &Arc<Rendezvous>,
    ) -> Result<Arc<dyn Collective>> {
        crate::collective::join(&self.gpu, rendezvous)
    }

    fn begin_recording(&self) -> Result<()> {
        self.gpu.begin_recording()
    }

    fn end_recording(&self) -> Result<Box<dyn Recording>> {
        self.gpu.end_recording()
    }
}

impl HipDevice {
    /// Refuses host copies and waits while the calling thread records: they cannot be part
    /// of a graph.
    fn no_host_copy(&self, what: &str) -> Result<()> {
        if self.gpu.recording_here() {
            return Err(Error::invalid(
                what,
                "a recorded step cannot copy between host and device or wait for the device",
            ));
        }
        Ok(())
    }
}

/// A catalog op bound to its input dtypes. It holds its device weakly: a kernel kept after
/// its device is dropped fails to launch.
struct HipKernel {
    op: Op,
    dtypes: Vec<DType>,
    gpu: Weak<Gpu>,
}

impl fmt::Debug for HipKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HipKernel")
            .field("op", &self.op)
            .field("dtypes", &self.dtypes)
            .finish()
    }
}

impl Kernel for HipKernel {
    fn op(&self) -> &Op {
        &self.op
    }

    fn launch(
        &self,
        inputs: &[TensorRef<'_>],
        outputs: &[TensorRef<'_>],
        scalars: &[f64],
    ) -> Result<()> {
        validate_kernel_launch(&self.op, &self.dtypes, inputs, outputs, scalars)?;
        let gpu = self.gpu.upgrade().ok_or_else(|| Error::Backend {
            backend: "hip".into(),
            detail: "the device of this kernel was dropped".into(),
        })?;
        gpu.keep(inputs);
        gpu.keep(outputs);
        ops::launch(&gpu, &self.op, inputs, outputs, scalars)
    }
}
