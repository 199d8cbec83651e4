//! The one seam between the backend and a vendor: everything the rest of the crate asks of a
//! GPU (memory, copies, compiling and launching kernels, GEMMs) through the [`Driver`] trait,
//! implemented for NVIDIA by [`cuda`] (the CUDA driver, NVRTC and cuBLASLt through cudarc) and
//! for AMD by [`amd`] (the HIP runtime and hiprtc, and [`hipblaslt`], loaded at run time).
//!
//! Every call is ordered on the device's one stream, so what one call writes the next reads,
//! and memory freed by one is reused safely by the next. A thread capturing a graph queues
//! on a capture stream of its own; graphs replay on the device's stream.

pub(crate) mod amd;
pub(crate) mod cuda;
pub(crate) mod hipblaslt;
pub(crate) mod nccl;

use tessera_core::{DType, Error, PendingBytes, Result};

/// A device address.
pub(crate) type DevicePtr = u64;

/// A loaded kernel function (the vendor's handle, kept as an integer so that it can be shared
/// between threads: the driver's functions are thread-safe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Function(pub(crate) usize);

/// An executable graph of captured work (the vendor's handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Graph(pub(crate) usize);

/// A recorded timing event (the vendor's handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Event(pub(crate) usize);

/// A launch's grid and block sizes and its dynamic shared memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grid {
    pub blocks: [u32; 3],
    pub threads: u32,
    pub shared_bytes: u32,
}

/// One GEMM for the vendor's BLAS: `d = op(a) @ op(b) (+ c)` in column-major terms as BLAS
/// sees them, batched with element strides; f16/bf16 data accumulate in f32.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gemm {
    /// The dtype of `a` and `b`.
    pub dtype: DType,
    /// The dtype of `c` and `d`: `dtype`, or f32 for an accumulator an epilogue reads.
    pub out_dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub a: DevicePtr,
    pub lda: usize,
    pub stride_a: usize,
    pub transpose_a: bool,
    pub b: DevicePtr,
    pub ldb: usize,
    pub stride_b: usize,
    pub transpose_b: bool,
    /// Added to the product where present (`beta = 1`): with the same layout as `d`.
    pub c: Option<DevicePtr>,
    /// Added to each column of `d` (one value per row of `d`, of `out_dtype`) where present,
    /// in the BLAS's epilogue: in f32, before the one rounding to `out_dtype`.
    pub bias: Option<DevicePtr>,
    pub d: DevicePtr,
    pub ldd: usize,
    pub stride_d: usize,
}

impl Gemm {
    /// The stored shapes of a, b and d as BLAS sees them (column-major): rows, columns,
    /// leading dimension and batch stride.
    pub(crate) fn stored_shapes(&self) -> [(usize, usize, usize, usize); 3] {
        let (ar, ac) = if self.transpose_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        let (br, bc) = if self.transpose_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        [
            (ar, ac, self.lda, self.stride_a),
            (br, bc, self.ldb, self.stride_b),
            (self.m, self.n, self.ldd, self.stride_d),
        ]
    }
}

/// A vendor's GPU, as the backend uses it. Implementations order every call on one stream.
pub(crate) trait Driver: Send + Sync + 'static {
    /// The backend name of the device's ids: `cuda` or `hip`.
    fn backend(&self) -> &'static str;
    fn name(&self) -> &str;
    /// The architecture kernels are compiled for: `sm_90a`, `gfx90a`.
    fn arch(&self) -> &str;
    /// Device memory in bytes.
    fn total_memory(&self) -> usize;
    /// The most shared memory one block may ask for, in bytes.
    fn max_shared_bytes(&self) -> usize;
    /// The compiler's name and version, part of the key of compiled kernels on disk.
    fn compiler(&self) -> String;
    /// Compiles `source` for [`Driver::arch`]; the error is the compiler's log.
    fn compile(&self, source: &str, name: &str) -> std::result::Result<Vec<u8>, String>;
    /// Loads a compiled image and returns its function `entry`.
    fn load(&self, image: &[u8], entry: &str) -> Result<Function>;
    /// Queues a kernel. With `start_early` its blocks may start before the kernel queued
    /// ahead of it has finished, where the device can (every kernel first waits for that one:
    /// `start_after_previous` in the prelude); elsewhere the flag changes nothing.
    fn launch(
        &self,
        function: Function,
        grid: Grid,
        params: &[u8],
        start_early: bool,
    ) -> Result<()>;
    /// Allocates `bytes`, ordered on the stream; `Ok(None)` when the device is out of memory.
    fn alloc(&self, bytes: usize) -> Result<Option<DevicePtr>>;
    /// Frees `ptr` once the work queued before has run.
    fn free(&self, ptr: DevicePtr);
    /// Copies host bytes to the device after queued work; `data` may be reused on return.
    fn upload(&self, dst: DevicePtr, data: &[u8]) -> Result<()>;
    /// Copies device bytes to the host once queued work has run, and waits for them.
    fn download(&self, src: DevicePtr, out: &mut [u8]) -> Result<()>;
    fn zero(&self, dst: DevicePtr, bytes: usize) -> Result<()>;
    fn gemm(&self, gemm: &Gemm) -> Result<()>;
    /// Starts copying device bytes to the host after queued work, without waiting.
    fn download_later(&self, src: DevicePtr, len: usize) -> Result<Box<dyn PendingBytes>>;
    /// Records a timing event at this point of the stream.
    fn event(&self) -> Result<Event>;
    /// The seconds between two events of [`Driver::event`], once the later has passed; both
    /// are released.
    fn seconds_between(&self, start: Event, end: Event) -> Result<f64>;
    /// Waits for all queued work.
    fn synchronize(&self) -> Result<()>;
    /// Starts capturing the work the calling thread queues into a graph, on a stream of its
    /// own (other threads' work still runs); allocations stay on the device's stream.
    fn begin_capture(&self) -> Result<()> {
        Err(Error::unsupported(self.backend(), "graph capture"))
    }
    /// Ends the calling thread's capture: the graph, instantiated, not yet run.
    fn end_capture(&self) -> Result<Graph> {
        Err(Error::unsupported(self.backend(), "graph capture"))
    }
    /// Queues `graph` on the device's stream.
    fn launch_graph(&self, graph: Graph) -> Result<()> {
        let _ = graph;
        Err(Error::unsupported(self.backend(), "graph replay"))
    }
    /// Makes the device current on the calling thread, before a vendor library (NCCL) that
    /// finds the device that way is called.
    fn bind(&self) -> Result<()>;
    /// The handle of the device's side stream, created on first use: work that runs beside
    /// the stream kernels queue on (collectives), ordered against it by
    /// [`Driver::side_after_queued`] and [`Driver::queued_after_side`].
    fn side_stream(&self) -> Result<usize> {
        Err(Error::unsupported(self.backend(), "a side stream"))
    }
    /// Makes the side stream wait for the work the calling thread has queued so far (on its
    /// capture stream while it captures: the side stream's work then joins the graph).
    fn side_after_queued(&self) -> Result<()> {
        Err(Error::unsupported(self.backend(), "a side stream"))
    }
    /// Makes work the calling thread queues from now on wait for the side stream's.
    fn queued_after_side(&self) -> Result<()> {
        Err(Error::unsupported(self.backend(), "a side stream"))
    }
    /// Releases `graph` once queued work has finished.
    fn destroy_graph(&self, graph: Graph) {
        let _ = graph;
    }
}

/// A kernel's parameter bytes as 8-byte-aligned words, for the launch call's one argument
/// (the struct, passed by value).
pub(crate) fn param_words(params: &[u8]) -> Vec<u64> {
    params
        .chunks(8)
        .map(|chunk| {
            let mut bytes = [0u8; 8];
            bytes[..chunk.len()].copy_from_slice(chunk);
            u64::from_ne_bytes(bytes)
        })
        .collect()
}

/// An error of `backend`'s driver in `what`.
pub(crate) fn driver_error(backend: &str, what: &str, detail: impl std::fmt::Display) -> Error {
    Error::Backend {
        backend: backend.into(),
        detail: format!("{what}: {detail}"),
    }
}
