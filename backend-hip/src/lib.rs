//! Tessera's HIP backend: HIP C++ kernels compiled at run time, the way HIP itself targets
//! two vendors. On NVIDIA (`cuda:N`) through the CUDA driver, NVRTC and cuBLASLt, loaded by
//! cudarc; on AMD (`hip:N`) through the HIP runtime and hiprtc, loaded with libloading.
//! Building it needs nothing but Rust: no CUDA toolkit, nvcc or ROCm.
//!
//! Layout: `driver/` is the one seam to a vendor (the [`driver`] trait, `cuda.rs`, `amd.rs`);
//! `kernels/` holds the C++ sources, a prelude that defines integers, 16-bit floats, shuffles
//! and the warp size for both compilers, and a file per op family; `src/ops/` has the planner
//! of each family, which turns a launch into a kernel key, its source and its parameter
//! struct (`params.rs` declares each struct once for Rust and C++); `gpu.rs` compiles, caches
//! (in memory and on disk) and launches; `memory.rs` is core's caching pool over the driver's
//! stream-ordered allocations.
//!
//! A missing driver library means no devices are listed, never a panic (cudarc panics when
//! a library it loads is absent, so each is looked for first), and `tessera devices` names
//! the library.
//!
//! Status: on NVIDIA every catalog op runs, forward and backward, in f32, f16 and bf16, and
//! matches the CPU in the conformance suite on an H100 (`benches/README.md` has the speed).
//! Attention forward and backward run on tensor cores for 16-bit data with head dims up to
//! 128 (`mma.sync`, NVIDIA only), and in f32 with head dims 64 and 128 as tiled CUDA-core
//! kernels (exact f32, no TF32; about 80% of PyTorch's f32 SDPA); everything else but the
//! GEMMs runs on CUDA cores. In bf16 GPT-2 training the GEMMs cost most, then attention (at
//! 35-43% of PyTorch's SDPA) and the copies of heads into attention's layout. Large 16-bit
//! GEMMs with sizes off multiples of 8 run on zero-padded copies (`ops/matmul.rs`). Adam
//! updates a group's parameters 16 to a launch. Memory-bound kernels move 16 bytes per load
//! where their operands allow: elementwise ops over rows of 16-byte groups (strided views
//! too), column sums (bias gradients), and the norms' backward, one warp per row.
//!
//! Kernels start early (programmatic dependent launch, Hopper on): every kernel's first
//! statement waits for the kernel queued ahead of it (`start_after_previous` in the prelude;
//! a unit test holds every entry to it), so a launch may ask for its blocks to become
//! resident while that kernel still runs, hiding the gap between kernels; few-row products
//! and norms prefetch their weights into L2 before they wait (a hint, safe whatever runs
//! ahead). Off while profiling, and with `TESSERA_EARLY_LAUNCH=0`.
//!
//! Recording (core's `Device::begin_recording`) is stream capture into a CUDA graph: the
//! recording thread queues on a capture stream of its own, allocates from a pool that the
//! graph keeps (reused inside it in queue order; counted as in use in the device's memory
//! statistics), and the graph holds every other buffer its kernels touch (`gpu.rs`). Greedy
//! decoding and the trainer's bf16 and f32 steps replay this way. Decoding products of up
//! to eight rows with a linear layer's weight skip cuBLASLt for our `few_rows` kernel (a warp
//! per output column); what remains per token is about 107 short kernels, each mostly
//! latency (`benches/README.md` has the profile). A norm fused into the product after it was
//! tried and was slower: each block repeats the norm, on the critical path (branch
//! `experiment/norm-matmul`); one per step, in the epilogue that writes the residual stream,
//! is the idea left.
//! On AMD the same recording is HIP stream capture into a HIP graph (unrun).
//!
//! Data-parallel training (`collective.rs`): NCCL, or RCCL on AMD (the same C API), loaded
//! with libloading (`driver/nccl.rs`); a communicator per device from the unique id rank 0
//! shares over core's rendezvous; gradient buckets summed on the device's side stream, which
//! waits for the backward kernels queued before each bucket and which later work waits for
//! (events), inside recorded graphs too. RCCL's path, like the rest of AMD's, is unrun.
//! On AMD every kernel compiles with hiprtc for `gfx90a` (wave64) and `gfx1030` (wave32) in
//! the tests, without a GPU; the runtime (`driver/amd.rs`: the HIP runtime, HIP graphs,
//! events, and GEMMs through hipBLASLt in `driver/hipblaslt.rs`) is written against the
//! headers of the HIP runtime and hipBLASLt (ROCm 6 and 7), but no AMD GPU has run it. An
//! AMD device opens without hipBLASLt; its matmuls then say `Unsupported`, naming the
//! library, and `tessera devices` notes it beside the device.
//!
//! The cuBLASLt GEMMs add split-K partial sums in f32 only: letting them add in the 16-bit
//! output type made f16 products with long, cancelling sums miss the CPU's by 10%. hipBLASLt
//! has no such preference; how it adds split-K sums on AMD is untested.

mod collective;
mod device;
mod driver;
mod gpu;
mod memory;
mod ops;
mod params;

use std::sync::Arc;

use tessera_core::{BackendEntry, Device, Result};

pub use device::HipDevice;
pub use memory::HipBuffer;

fn probe_cuda() -> Vec<String> {
    driver::cuda::probe()
}

fn open_cuda(ordinal: usize) -> Result<Arc<dyn Device>> {
    let driver = driver::cuda::CudaDriver::open(ordinal)?;
    Ok(Arc::new(HipDevice::new(Arc::new(driver), ordinal)))
}

fn probe_hip() -> Vec<String> {
    driver::amd::probe()
}

fn open_hip(ordinal: usize) -> Result<Arc<dyn Device>> {
    let driver = driver::amd::AmdDriver::open(ordinal)?;
    Ok(Arc::new(HipDevice::new(Arc::new(driver), ordinal)))
}

/// The NVIDIA libraries that are not installed, as `tessera devices` says it.
fn cuda_absent() -> Option<String> {
    let missing = driver::cuda::missing();
    (!missing.is_empty()).then(|| format!("not installed: {}", missing.join(", ")))
}

/// Why `cuda` devices cannot join collectives: the NVIDIA libraries and NCCL that are not
/// installed.
fn cuda_without_collectives() -> Option<String> {
    let mut missing = driver::cuda::missing();
    if driver::nccl::library("cuda").is_err() {
        missing.push(driver::nccl::describe("cuda"));
    }
    (!missing.is_empty()).then(|| format!("not installed: {}", missing.join(", ")))
}

/// Why `hip` devices cannot join collectives: the HIP runtime, hipBLASLt (without which
/// the steps' matmuls cannot run, as cuBLASLt's absence rules out NVIDIA's devices) or RCCL
/// not installed.
fn hip_without_collectives() -> Option<String> {
    let mut missing: Vec<&str> = driver::amd::missing().into_iter().collect();
    if driver::amd::matmul_missing().is_some() {
        missing.push(driver::hipblaslt::DESCRIPTION);
    }
    if driver::nccl::library("hip").is_err() {
        missing.push(driver::nccl::describe("hip"));
    }
    (!missing.is_empty()).then(|| format!("not installed: {}", missing.join(", ")))
}

/// Why `hip` lists no devices: the HIP runtime not installed (and hipBLASLt, which matmuls
/// need, where it is absent too). A device present without hipBLASLt is listed, saying so.
fn hip_absent() -> Option<String> {
    let runtime = driver::amd::missing()?;
    let mut missing = vec![runtime.to_string()];
    if driver::amd::matmul_missing().is_some() {
        missing.push(format!("{} (for matmul)", driver::hipblaslt::DESCRIPTION));
    }
    Some(format!("not installed: {}", missing.join(", ")))
}

tessera_core::inventory::submit! {
    BackendEntry {
        name: "cuda",
        priority: 30,
        probe: probe_cuda,
        open: open_cuda,
        why_absent: cuda_absent,
        why_no_collectives: cuda_without_collectives,
    }
}

tessera_core::inventory::submit! {
    BackendEntry {
        name: "hip",
        priority: 30,
        probe: probe_hip,
        open: open_hip,
        why_absent: hip_absent,
        why_no_collectives: hip_without_collectives,
    }
}
