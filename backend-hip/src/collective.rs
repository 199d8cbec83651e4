//! Collectives through NCCL (RCCL on AMD) on the device's side stream.
//!
//! Each call queues on the side stream after what the calling thread queued so far, so a
//! bucket of gradients is summed while the backward pass goes on queuing kernels on the
//! device's stream; `wait` makes later work wait for the side stream. While a thread
//! records a graph the same calls join the capture (the side stream waits on the capture
//! stream), so replayed training steps reduce their gradients too. The communicator is made
//! once per device and world, from the unique id rank 0 shares over the rendezvous links.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tessera_core::dist::{check_contiguous, Collective, Rendezvous};
use tessera_core::{Error, Result, TensorRef};

use crate::driver::nccl::{self, Call, Comm, Nccl, UniqueId, UNIQUE_ID_BYTES};
use crate::gpu::Gpu;
use crate::memory::lock;

/// One rank's NCCL communicator on one device.
pub(crate) struct NcclCollective {
    gpu: Arc<Gpu>,
    nccl: &'static Nccl,
    comm: Mutex<usize>,
    rank: usize,
    world_size: usize,
    /// Every rank passed a barrier since the last collective, so nothing is left in flight:
    /// the communicator is destroyed; otherwise (a failure) it is aborted, which waits for
    /// no peer.
    settled: AtomicBool,
}

// SAFETY: the communicator is an NCCL handle used under the `comm` lock, from any thread
// once the device is current (each call binds it first).
unsafe impl Send for NcclCollective {}
// SAFETY: as above.
unsafe impl Sync for NcclCollective {}

impl std::fmt::Debug for NcclCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclCollective")
            .field("library", &self.nccl.name)
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish()
    }
}

/// Joins the world of `rendezvous` on `gpu`: rank 0 makes the unique id and shares it, and
/// every rank makes its communicator.
pub(crate) fn join(gpu: &Arc<Gpu>, rendezvous: &Arc<Rendezvous>) -> Result<Arc<dyn Collective>> {
    let backend = gpu.backend();
    let nccl = nccl::library(backend).map_err(|why| {
        Error::unsupported(
            backend,
            format!("collectives (data-parallel training): {why}"),
        )
    })?;
    let mut id = UniqueId([0; UNIQUE_ID_BYTES]);
    if rendezvous.rank() == 0 {
        // SAFETY: ncclGetUniqueId writes one `ncclUniqueId`.
        nccl.check("ncclGetUniqueId", unsafe { (nccl.get_unique_id)(&mut id) })?;
    }
    let shared = rendezvous.share_from_root(&id.0)?;
    id.0 = shared.try_into().map_err(|_| Error::Collective {
        detail: "rank 0 shared a unique id of the wrong size".into(),
    })?;
    gpu.driver.bind()?;
    gpu.driver.side_stream()?;
    let mut comm: Comm = std::ptr::null_mut();
    // SAFETY: the device is current on this thread (NCCL takes the device from there); the
    // call writes one communicator handle and blocks until every rank has called it.
    nccl.check("ncclCommInitRank", unsafe {
        (nccl.comm_init_rank)(
            &mut comm,
            rendezvous.world_size() as i32,
            id,
            rendezvous.rank() as i32,
        )
    })?;
    Ok(Arc::new(NcclCollective {
        gpu: gpu.clone(),
        nccl,
        comm: Mutex::new(comm as usize),
        rank: rendezvous.rank(),
        world_size: rendezvous.world_size(),
        settled: AtomicBool::new(false),
    }))
}

/// The element count and NCCL dtype of a contiguous tensor.
fn operand(op: &str, t: &TensorRef<'_>) -> Result<(usize, i32)> {
    check_contiguous(op, t)?;
    Ok((t.layout.numel(), nccl::data_type(t.dtype)))
}

impl NcclCollective {
    /// Queues `call` (`ncclAllReduce` or `ncclBroadcast`, which take the same arguments)
    /// in place on every tensor, as one NCCL group on the side stream after the work
    /// queued so far; `arg` is the reduction or the root.
    fn grouped(&self, op: &str, tensors: &[TensorRef<'_>], call: Call, arg: i32) -> Result<()> {
        let operands: Vec<(u64, usize, i32)> = tensors
            .iter()
            .map(|t| {
                let (count, dtype) = operand(op, t)?;
                Ok((self.gpu.ptr(t)?, count, dtype))
            })
            .collect::<Result<_>>()?;
        self.gpu.keep(tensors);
        self.settled.store(false, Ordering::SeqCst);
        // One group at a time: every rank must queue its groups in the same order.
        let turn = lock(&self.comm);
        let comm = *turn as Comm;
        let driver = &self.gpu.driver;
        driver.side_after_queued()?;
        let stream = driver.side_stream()? as *mut c_void;
        let nccl = self.nccl;
        // SAFETY: each pointer addresses `count` elements of a live tensor of this device
        // (checked above; the caller keeps them alive until `wait`), sent and received in
        // place; the communicator is this device's, used under its lock, and the side
        // stream belongs to its context, current since the driver ordered the streams.
        unsafe {
            nccl.check("ncclGroupStart", (nccl.group_start)())?;
            let mut queued = Ok(());
            for &(ptr, count, dtype) in operands.iter().filter(|o| o.1 > 0) {
                let (send, recv) = (ptr as *const c_void, ptr as *mut c_void);
                queued = nccl.check(op, call(send, recv, count, dtype, arg, comm, stream));
                if queued.is_err() {
                    break;
                }
            }
            let ended = nccl.check("ncclGroupEnd", (nccl.group_end)());
            queued.and(ended)
        }
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce_sum(&self, tensors: &[TensorRef<'_>]) -> Result<()> {
        self.grouped("ncclAllReduce", tensors, self.nccl.all_reduce, nccl::SUM)
    }

    fn broadcast(&self, tensors: &[TensorRef<'_>], root: usize) -> Result<()> {
        if root >= self.world_size {
            return Err(Error::invalid(
                "broadcast",
                format!("root {root} is not a rank of {}", self.world_size),
            ));
        }
        self.grouped("ncclBroadcast", tensors, self.nccl.broadcast, root as i32)
    }

    fn wait(&self) -> Result<()> {
        self.gpu.driver.queued_after_side()
    }

    fn barrier(&self) -> Result<()> {
        let token = self.gpu.alloc(4)?;
        let layout = tessera_core::Layout::contiguous(&[1]);
        let t = TensorRef::f32(&token, &layout);
        self.gpu.driver.zero(self.gpu.ptr(&t)?, 4)?;
        self.all_reduce_sum(&[t])?;
        self.wait()?;
        self.gpu.driver.synchronize()?;
        self.settled.store(true, Ordering::SeqCst);
        Ok(())
    }
}

impl Drop for NcclCollective {
    fn drop(&mut self) {
        if self.gpu.driver.bind().is_err() {
            return;
        }
        let comm = *lock(&self.comm) as Comm;
        // SAFETY: the communicator is this rank's and unused after this; destroying waits
        // for its queued work, which after a barrier is none, and aborting waits for nothing.
        unsafe {
            if self.settled.load(Ordering::SeqCst) {
                (self.nccl.comm_destroy)(comm);
            } else {
                (self.nccl.comm_abort)(comm);
            }
        }
    }
}
