//! The CPU device: its pool, its kernel cache, host copies, and kernel dispatch by op family.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tessera_core::dist::{Collective, HostCollective, Rendezvous};
use tessera_core::exec::unfused::{index_copy_then_attention, norm_then_matmul};
use tessera_core::exec::KernelCache;
use tessera_core::memory::Pool;
use tessera_core::ops::{check_dtypes, validate_kernel_launch};
use tessera_core::{
    Buffer, DType, Device, DeviceInfo, Error, Features, Kernel, Limits, MemoryStats, Op, OpFamily,
    Result, TensorRef,
};

use crate::buffer::{bytes, bytes_mut, cpu_buffer, CpuBuffer, SharedPool};
use crate::{attention, conv, elementwise, loss, matmul, movement, norm, optim, random, reduce};

/// The device name `probe` reports.
pub(crate) fn device_name() -> String {
    format!("CPU ({} threads)", rayon::current_num_threads())
}

/// The machine's memory (`MemTotal` of `/proc/meminfo`), or its control group's limit where
/// that is lower; `None` where neither can be read (other systems).
fn host_memory_bytes() -> Option<usize> {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    });
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|m| m.trim().parse::<usize>().ok());
    match (total, cgroup) {
        (Some(t), Some(c)) => Some(t.min(c)),
        (t, c) => t.or(c),
    }
}

/// The host CPU as a device. Work runs synchronously on the calling thread and rayon's pool,
/// so every cached block is ready for reuse as soon as its buffer is dropped.
pub struct CpuDevice {
    info: DeviceInfo,
    pool: SharedPool,
    kernels: KernelCache,
    syncs: AtomicU64,
}

impl fmt::Debug for CpuDevice {
    /// The pool's blocks are left out: they are raw memory.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuDevice")
            .field("info", &self.info)
            .field("memory", &self.memory())
            .finish()
    }
}

impl Default for CpuDevice {
    fn default() -> Self {
        CpuDevice::new()
    }
}

impl CpuDevice {
    pub fn new() -> Self {
        let info = DeviceInfo {
            backend: "cpu".into(),
            ordinal: 0,
            name: device_name(),
            dtypes: DType::ALL.to_vec(),
            features: Features {
                f16: true,
                bf16: true,
                subgroups: false,
                cooperative_matrix: false,
            },
            limits: Limits {
                max_buffer_bytes: isize::MAX as usize,
                max_binding_bytes: isize::MAX as usize,
                binding_align: 1,
                max_workgroup_size: usize::MAX,
                max_workgroups_per_dim: usize::MAX,
                memory_bytes: host_memory_bytes(),
            },
        };
        CpuDevice {
            info,
            pool: Arc::new(Mutex::new(Pool::default())),
            kernels: KernelCache::default(),
            syncs: AtomicU64::new(0),
        }
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Pool<Vec<u64>>> {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A buffer of at least `bytes` from `pool`, refused past `max` bytes.
fn alloc(pool: &SharedPool, bytes: usize, max: usize) -> Result<Arc<dyn Buffer>> {
    let mut guard = pool.lock().unwrap_or_else(PoisonError::into_inner);
    let stats = guard.stats();
    if bytes > max {
        return Err(Error::OutOfMemory {
            requested: bytes,
            in_use: stats.in_use,
            limit: max,
        });
    }
    let (block, class) = guard.alloc(
        bytes,
        |_| true,
        |class| {
            let words = class.div_ceil(8);
            let mut v = Vec::new();
            v.try_reserve_exact(words).map_err(|_| Error::OutOfMemory {
                requested: bytes,
                in_use: stats.in_use,
                limit: stats.limit.unwrap_or(usize::MAX),
            })?;
            v.resize(words, 0u64);
            Ok(v)
        },
    )?;
    drop(guard);
    Ok(Arc::new(CpuBuffer::new(block, bytes, class, pool.clone())))
}

fn byte_range(
    op: &str,
    buffer: &Arc<dyn Buffer>,
    offset: usize,
    len: usize,
) -> Result<std::ops::Range<usize>> {
    match offset.checked_add(len) {
        Some(end) if end <= buffer.len() => Ok(offset..end),
        _ => Err(Error::invalid(
            op,
            format!(
                "{len} bytes at offset {offset} do not fit a buffer of {} bytes",
                buffer.len()
            ),
        )),
    }
}

impl Device for CpuDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        alloc(&self.pool, bytes, self.info.limits.max_buffer_bytes)
    }

    fn write(&self, buffer: &Arc<dyn Buffer>, offset: usize, data: &[u8]) -> Result<()> {
        let range = byte_range("write", buffer, offset, data.len())?;
        cpu_buffer(buffer)?.write(|w| bytes_mut(w)[range].copy_from_slice(data));
        Ok(())
    }

    fn read(&self, buffer: &Arc<dyn Buffer>, offset: usize, out: &mut [u8]) -> Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        let range = byte_range("read", buffer, offset, out.len())?;
        cpu_buffer(buffer)?.read(|w| out.copy_from_slice(&bytes(w)[range]));
        Ok(())
    }

    fn kernel(&self, op: &Op, input_dtypes: &[DType]) -> Result<Arc<dyn Kernel>> {
        self.kernels.get_or_build(op, input_dtypes, || {
            check_dtypes("cpu", op, input_dtypes, &self.info.dtypes)?;
            Ok(Arc::new(CpuKernel {
                op: op.clone(),
                dtypes: input_dtypes.to_vec(),
                pool: self.pool.clone(),
                max_buffer_bytes: self.info.limits.max_buffer_bytes,
            }))
        })
    }

    fn synchronize(&self) -> Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn memory(&self) -> MemoryStats {
        self.pool().stats()
    }

    fn set_memory_limit(&self, limit: Option<usize>) {
        self.pool().set_limit(limit);
    }

    fn empty_cache(&self) {
        self.pool().trim(|_| true);
    }

    fn reset_peak(&self) {
        self.pool().reset_peak();
    }

    fn host_syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// The CPU's collectives go over the rendezvous links ([`HostCollective`]).
    fn join_collective(
        self: Arc<Self>,
        rendezvous: &Arc<Rendezvous>,
    ) -> Result<Arc<dyn Collective>> {
        Ok(Arc::new(HostCollective::new(self, rendezvous.clone())))
    }
}

/// A catalog op bound to the input dtypes it was requested for, with the device's pool for
/// the scratch of ops run as the ops they fuse.
struct CpuKernel {
    op: Op,
    dtypes: Vec<DType>,
    pool: SharedPool,
    max_buffer_bytes: usize,
}

impl fmt::Debug for CpuKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuKernel")
            .field("op", &self.op)
            .field("dtypes", &self.dtypes)
            .finish()
    }
}

impl Kernel for CpuKernel {
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
        // The reference computes fused ops as the ops they fuse.
        match self.op {
            Op::NormMatmul { .. } => {
                let scratch = |bytes| alloc(&self.pool, bytes, self.max_buffer_bytes);
                norm_then_matmul(&self.op, inputs, outputs, scalars, &scratch, &launch)
            }
            Op::AppendAttention => {
                index_copy_then_attention(&self.op, inputs, outputs, scalars, &launch)
            }
            _ => launch(&self.op, inputs, outputs, scalars),
        }
    }
}

/// Runs `op` on its family's code.
fn launch(
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    scalars: &[f64],
) -> Result<()> {
    match op.family() {
        OpFamily::Random => random::launch(op, outputs, scalars),
        OpFamily::Elementwise => elementwise::launch(op, inputs, outputs, scalars),
        OpFamily::Reduce => reduce::launch(op, inputs, outputs),
        OpFamily::Matmul => matmul::launch(op, inputs, outputs),
        OpFamily::Movement => movement::launch(op, inputs, outputs),
        OpFamily::Norm => norm::launch(op, inputs, outputs, scalars),
        OpFamily::Attention => attention::launch(op, inputs, outputs, scalars),
        OpFamily::Loss => loss::launch(op, inputs, outputs),
        OpFamily::Optim => optim::launch(op, inputs, outputs, scalars),
        OpFamily::Conv => conv::launch(op, inputs, outputs),
    }
}
