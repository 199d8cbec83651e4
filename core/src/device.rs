//! The three traits a backend implements: [`Device`], [`Buffer`] and [`Kernel`].

use std::any::Any;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use crate::{DType, Layout, Op, Result};

/// What a device is and can do. Kernels read limits from here at run time, never from constants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Backend name as used in device names: `cpu`, `wgpu`, `vulkan`, `hip`, `cuda`.
    pub backend: String,
    /// Index among the backend's devices.
    pub ordinal: usize,
    /// Human-readable adapter name.
    pub name: String,
    /// Dtypes the device can store and compute.
    pub dtypes: Vec<DType>,
    pub features: Features,
    pub limits: Limits,
}

impl DeviceInfo {
    /// `backend:ordinal`, the name [`crate::open_device`] accepts.
    pub fn id(&self) -> String {
        format!("{}:{}", self.backend, self.ordinal)
    }

    /// Refuses `bytes` (`None`: a size that overflowed) of `what` that the device's memory
    /// cannot hold, before anything is allocated: the system answers an allocation it cannot
    /// serve by ending the process. Devices that do not report their memory accept any size.
    pub fn check_fits(&self, op: &str, what: &str, bytes: Option<usize>) -> crate::Result<()> {
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        match (bytes, self.limits.memory_bytes) {
            (None, _) => Err(crate::Error::invalid(
                op,
                format!("{what} would take more bytes than can be counted"),
            )),
            (Some(b), Some(memory)) if b > memory => Err(crate::Error::invalid(
                op,
                format!(
                    "{what} would take {b} bytes ({:.1} GiB), more than the {:.1} GiB of memory of {}",
                    gib(b),
                    gib(memory),
                    self.id()
                ),
            )),
            _ => Ok(()),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Features {
    pub f16: bool,
    pub bf16: bool,
    pub subgroups: bool,
    pub cooperative_matrix: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest single allocation in bytes.
    pub max_buffer_bytes: usize,
    /// Largest range one kernel binding can address, in bytes.
    pub max_binding_bytes: usize,
    /// Alignment in bytes of where a binding may start inside a buffer.
    pub binding_align: usize,
    pub max_workgroup_size: usize,
    pub max_workgroups_per_dim: usize,
    /// Memory the device has in all, where the backend can tell (the CPU: the machine's, or
    /// its container's limit), so that a model too large for it is refused before it is built.
    pub memory_bytes: Option<usize>,
}

/// Memory statistics of a device's caching allocator.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes handed out to live buffers (rounded to size classes).
    pub in_use: usize,
    /// Highest `in_use` since the device opened or `reset_peak`.
    pub peak: usize,
    /// Bytes held from the system: in use plus cached for reuse.
    pub reserved: usize,
    /// Allocation requests served.
    pub allocations: u64,
    /// Of those, served from the cache.
    pub reuses: u64,
    /// The cap on `reserved`, if any.
    pub limit: Option<usize>,
}

impl MemoryStats {
    pub fn reuse_rate(&self) -> f64 {
        if self.allocations == 0 {
            0.0
        } else {
            self.reuses as f64 / self.allocations as f64
        }
    }
}

/// Device memory. Dropping the last handle returns the memory to its device's pool, which hands
/// it out again only after every queued use of it has finished.
pub trait Buffer: Send + Sync + Debug {
    /// Usable size in bytes (at least what was requested).
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// For the owning backend to reach its concrete type.
    fn as_any(&self) -> &dyn Any;
}

/// A buffer region seen as a tensor: what a kernel launch reads or writes.
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    pub buffer: &'a Arc<dyn Buffer>,
    pub layout: &'a Layout,
    pub dtype: DType,
}

impl<'a> TensorRef<'a> {
    /// The same buffer and dtype seen through another layout (a part of an op, say).
    pub fn with_layout(&self, layout: &'a Layout) -> TensorRef<'a> {
        TensorRef {
            buffer: self.buffer,
            layout,
            dtype: self.dtype,
        }
    }

    /// `tensors` each seen through the matching one of `layouts`.
    pub fn with_layouts(tensors: &[TensorRef<'a>], layouts: &'a [Layout]) -> Vec<TensorRef<'a>> {
        tensors
            .iter()
            .zip(layouts)
            .map(|(t, layout)| t.with_layout(layout))
            .collect()
    }

    /// An f32 tensor of `buffer` (scratch for partial results, say) with `layout`.
    pub fn f32(buffer: &'a Arc<dyn Buffer>, layout: &'a Layout) -> TensorRef<'a> {
        TensorRef {
            buffer,
            layout,
            dtype: DType::F32,
        }
    }
}

/// One op descriptor compiled for one device.
pub trait Kernel: Send + Sync + Debug {
    fn op(&self) -> &Op;
    /// Enqueues the op. `scalars` are the op's run-time parameters, as its catalog entry lists
    /// them. Implementations call [`crate::ops::validate_kernel_launch`] before enqueueing anything.
    fn launch(
        &self,
        inputs: &[TensorRef<'_>],
        outputs: &[TensorRef<'_>],
        scalars: &[f64],
    ) -> Result<()>;
}

/// One GPU, or the CPU. It owns its memory pool, its kernel cache and its queue; nothing it
/// holds is shared with another device. Two threads may use one device at once.
pub trait Device: Send + Sync + Debug {
    fn info(&self) -> &DeviceInfo;
    /// Allocates at least `bytes` bytes; contents are unspecified.
    fn alloc(&self, bytes: usize) -> Result<Arc<dyn Buffer>>;
    /// Copies host bytes into `buffer` at `offset` (ordered after queued work).
    fn write(&self, buffer: &Arc<dyn Buffer>, offset: usize, data: &[u8]) -> Result<()>;
    /// Copies bytes out of `buffer` at `offset`; waits for queued work that writes it.
    fn read(&self, buffer: &Arc<dyn Buffer>, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Starts copying `len` bytes at `offset` to the host and returns without waiting: the
    /// bytes are those the buffer holds once the work queued so far has run, whatever is
    /// queued after. A caller queues more work meanwhile (decoding reads token `t` while step
    /// `t + 1` runs). By default it is a plain [`Device::read`].
    fn read_later(
        &self,
        buffer: &Arc<dyn Buffer>,
        offset: usize,
        len: usize,
    ) -> Result<Box<dyn PendingBytes>> {
        let mut out = vec![0u8; len];
        self.read(buffer, offset, &mut out)?;
        Ok(Box::new(ReadyBytes(out)))
    }
    /// The kernel for `op` with inputs of `input_dtypes`, compiled once and cached per device.
    /// A backend that cannot run it returns [`crate::Error::Unsupported`].
    fn kernel(&self, op: &Op, input_dtypes: &[DType]) -> Result<Arc<dyn Kernel>>;
    /// Waits until all queued work has finished.
    fn synchronize(&self) -> Result<()>;
    fn memory(&self) -> MemoryStats;
    /// Caps the bytes the pool may reserve (`None`: no cap). Allocations past it return
    /// [`crate::Error::OutOfMemory`].
    fn set_memory_limit(&self, limit: Option<usize>);
    /// Returns cached, unused memory to the system.
    fn empty_cache(&self);
    /// Resets the `peak` statistic to the current `in_use`.
    fn reset_peak(&self);
    /// Host synchronizations so far (reads and `synchronize` calls), for tests that count them.
    fn host_syncs(&self) -> u64;
    /// Starts or stops timing every kernel launch on the device (`tessera bench --profile`).
    /// Timing may serialize the queue, so speed is measured with it off. Starting clears the
    /// times gathered so far; a backend that cannot time kernels says `Unsupported`.
    fn set_profiling(&self, on: bool) -> Result<()> {
        let _ = on;
        Err(crate::Error::unsupported(
            &self.info().backend,
            "kernel profiling",
        ))
    }
    /// Device time per kernel since profiling started, slowest first.
    fn profile(&self) -> Vec<KernelTime> {
        Vec::new()
    }
    /// Starts recording the work the calling thread queues on this device: until
    /// [`Device::end_recording`], kernels are captured rather than run. Buffers allocated
    /// meanwhile come from memory that belongs to the recording, reused inside it in the
    /// order the work was queued, so replays find them as the recording left them; the
    /// recording also keeps alive every other buffer its work touches. A recorded step must
    /// not copy between host and device (reads and writes are refused) and takes its
    /// per-step values from device buffers. Its kernels must have run once before (a backend
    /// may be unable to load kernels while it records: the HIP backend refuses), as
    /// [`crate::ReplayedStep`] ensures by running a step eagerly before recording it. A
    /// backend that cannot replay work says
    /// `Unsupported` (the default); [`crate::ReplayedStep`] then runs steps eagerly.
    fn begin_recording(&self) -> Result<()> {
        Err(crate::Error::unsupported(
            &self.info().backend,
            "recording work for replay",
        ))
    }
    /// Ends the calling thread's recording and returns the work, ready to replay; nothing of
    /// it has run yet.
    fn end_recording(&self) -> Result<Box<dyn Recording>> {
        Err(crate::Error::unsupported(
            &self.info().backend,
            "recording work for replay",
        ))
    }
    /// Joins the world of `rendezvous` with this device: the collectives of data-parallel
    /// training ([`crate::dist`]), through the vendor's library (NCCL, RCCL). Every rank
    /// calls it once, at the same point. A backend without collectives says `Unsupported`
    /// (the default).
    fn join_collective(
        self: Arc<Self>,
        rendezvous: &Arc<crate::dist::Rendezvous>,
    ) -> Result<Arc<dyn crate::dist::Collective>> {
        let _ = rendezvous;
        Err(crate::Error::unsupported(
            &self.info().backend,
            "collectives (data-parallel training)",
        ))
    }
}

/// Work recorded by [`Device::end_recording`] (a CUDA graph, say).
pub trait Recording: Send + Sync + Debug {
    /// Queues the recorded work again, after the work queued so far, on the buffers it was
    /// recorded with: the values they hold now are its inputs.
    fn replay(&self) -> Result<()>;
}

/// Bytes on their way to the host, from [`Device::read_later`].
pub trait PendingBytes: Send {
    /// Waits for the copy (not for work queued after it was started) and returns the bytes.
    fn wait(self: Box<Self>) -> Result<Vec<u8>>;
}

/// Bytes already on the host: a read that finished at once.
pub struct ReadyBytes(pub Vec<u8>);

impl PendingBytes for ReadyBytes {
    fn wait(self: Box<Self>) -> Result<Vec<u8>> {
        Ok(self.0)
    }
}

/// The device time a kernel took over all its launches while profiling.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// The kernel: the op, its dtypes and the backend's variant.
    pub name: String,
    pub launches: u64,
    pub seconds: f64,
}

/// Launches and device seconds per kernel, gathered by a backend while profiling.
#[derive(Clone, Debug, Default)]
pub struct KernelTotals(HashMap<String, (u64, f64)>);

impl KernelTotals {
    /// Counts one launch of kernel `name` that took `seconds`.
    pub fn add(&mut self, name: &str, seconds: f64) {
        let entry = match self.0.get_mut(name) {
            Some(entry) => entry,
            None => self.0.entry(name.to_string()).or_insert((0, 0.0)),
        };
        entry.0 += 1;
        entry.1 += seconds;
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// The totals as kernel times, the longest first (what [`Device::profile`] returns).
    pub fn report(&self) -> Vec<KernelTime> {
        let mut times: Vec<KernelTime> = self
            .0
            .iter()
            .map(|(name, &(launches, seconds))| KernelTime {
                name: name.clone(),
                launches,
                seconds,
            })
            .collect();
        times.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        times
    }
}

/// Checks that `len` bytes at `offset` lie inside `buffer`, for a host copy `op`.
pub fn check_byte_range(
    op: &str,
    buffer: &Arc<dyn Buffer>,
    offset: usize,
    len: usize,
) -> crate::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= buffer.len() => Ok(()),
        _ => Err(crate::Error::invalid(
            op,
            format!(
                "{len} bytes at offset {offset} do not fit a buffer of {} bytes",
                buffer.len()
            ),
        )),
    }
}

/// Devices are compared by identity: two handles are the same device only if they point at the
/// same instance.
pub fn same_device(a: &Arc<dyn Device>, b: &Arc<dyn Device>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}
