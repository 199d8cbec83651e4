//! Tessera's `vulkan` backend: the shared WGSL kernels (`tessera-wgsl`) compiled to SPIR-V by
//! naga, run over raw Vulkan through ash, with memory from gpu-allocator. Building it needs
//! nothing but Rust: no Vulkan SDK and no shader compiler.
//!
//! Devices are `vulkan:N`, the physical devices of the process's one instance that have
//! Vulkan 1.2, a compute queue, push descriptors, timeline semaphores and 16-bit storage;
//! without a Vulkan loader or driver the backend lists no devices.
//!
//! How it runs a kernel: parameters as push constants (or, past the device's push-constant
//! size, from the batch's parameter buffer: `params.rs`), data bindings as a push descriptor
//! set, many dispatches and copies per command buffer with a barrier only where a command
//! must wait for an earlier one (it reads or writes what that one wrote, or writes what it
//! read), a batch submitted at a sync point or every
//! `MAX_BATCH` commands, signalling its number on a timeline semaphore (`record.rs`). Memory
//! comes from core's caching pool over gpu-allocator (`memory.rs`); blocks the pool lets go
//! are freed once the queue has passed them, and staging buffers are reused.
//! Pipelines are compiled once per device and kept in the driver's pipeline cache on disk
//! (`driver_cache.rs`); the driver zeroes workgroup memory where it can (naga's zeroing code
//! in every kernel kept lavapipe recompiling the matmul kernels on each run, which made the
//! conformance suite take over an hour there; it takes about 7 minutes now).
//!
//! Steps are recorded once and replayed (`Device::begin_recording`, `replay.rs`): the
//! recording thread's dispatches go into a command buffer of their own that every replay
//! submits again, so the trainer's f32 and bf16 steps and generation's decoding step cost one
//! submission each after the second.
//!
//! Reads started early (`read_later`) let decoding record step `t + 1` while token `t` is
//! copied (`host.rs`); `Device::set_profiling` times each dispatch with timestamp queries
//! (`profile.rs`). Where the device multiplies 16x16x16 f16 cooperative matrices in
//! subgroups of 32 (`VK_KHR_cooperative_matrix`: NVIDIA's tensor cores), f16 matmuls run the
//! shared `coop` kernel, as on wgpu (`instance.rs`, `tensor_cores`), and so do bf16 matmuls
//! where it also offers `VK_KHR_shader_bfloat16` with bf16 matrices: the kernel's source is
//! marked `F16_IS_BF16`, and its SPIR-V gets the 16-bit float type re-encoded as bfloat16
//! (`bfloat16.rs`; ash 0.38 predates the extension, so its structure is declared there). Where
//! the device offers subgroup size control, kernels on cooperative matrices ask for full
//! subgroups of 32, so devices that may pick another size (AMD's 32 or 64) qualify too.
//!
//! Where the device also offers `VK_NV_cooperative_matrix2` (workgroup-scope matrices of
//! flexible sizes, loaded through tensor layouts) for the tiles of `TensorMatmul`, and Vulkan
//! 1.3 (the instance asks for 1.3 where the loader has it: the kernel is SPIR-V 1.6), f16 and
//! bf16 matmuls over output tiles run a kernel of their own instead, written as SPIR-V with
//! rspirv beside the shared source (`tensor_matmul.rs`; the extension's declarations in
//! `cooperative_matrix2.rs`): the driver stages its 128 x 256 tiles through workgroup memory,
//! which WGSL cannot ask for. The shared planner chooses it per launch (`Caps::tensor_matmul`)
//! and keeps split-K (f32 sums finished by its `sum_splits` kernel); a product in one part
//! gets its epilogue from the kernel's per-element function. Where its tiles cover a product
//! exactly, the kernel is compiled for the launch's sizes and strides (`Dispatch::specialize`),
//! which NVIDIA's compiler makes almost twice as fast: on the H100, 4096^3 from 151 to 283
//! TFLOP/s in f16.
//!
//! Where the device's workgroup-scope matrices also reduce rows and convert sums into operands
//! (`cooperativeMatrixReductions`, `cooperativeMatrixConversions`), attention's forward over
//! many query rows in f16 and bf16 runs flash attention on tensor cores, written the same way
//! (`tensor_attention.rs`, `Caps::tensor_attention`), compiled for the launch's sizes where its
//! rows and keys fill whole blocks: GPT-2's forward attention went from 11.4 to 3.1 ms a bf16
//! training step on the H200. Its backward runs as products (`tessera-wgsl`'s
//! `attention_products.rs`) around a kernel of the same kind that forms the scores'
//! probabilities and gradients in registers (`tensor_scores_gradient.rs`): 7.0 ms of that
//! step where two products and a row pass through memory took 9.9.
//!
//! Where the device offers `robustBufferAccess` (lavapipe and NVIDIA do), it is opened with
//! it and kernels are compiled without naga's clamps on buffer indices: the driver keeps every
//! access inside its buffer. Indices into workgroup and private arrays keep naga's clamps
//! (`pipelines.rs`) but in kernels marked `INDICES_IN_RANGE`, whose indices are in range by
//! construction (the matmuls: the tensor-core one went from 93 to 128 TFLOP/s without them).
//!
//! Measured (`benches/README.md`, "Every target on one tree"): every op conformant in f32, f16
//! and bf16; on an H200, beside PyTorch in the same call, GPT-2 124M training at 0.82x
//! PyTorch eager in f32 and 1.00x to 1.02x in bf16 (58.0 against 58.2 and 57.8 against 59.1
//! ms a step), decoding at 2,127 tokens/s in f16, matmul 4096^3 at 40.9 (f32), 280 (f16)
//! and 284 (bf16) TFLOP/s; on an H100, with older builds, 0.83x in f32 and 0.73x in bf16,
//! decoding at about 2,040 tokens/s, matmul at 41, 283 and 290 TFLOP/s.
//!
//! Not here: f16 matmuls at the 300 TFLOP/s. NVIDIA's own reference kernels reach 280
//! to 292 through Vulkan, and kernels that stage their own tiles are bound by a workgroup's 48
//! KiB (`tensor_matmul.rs` says what was tried). Where a bf16 step could still gain (its
//! profile is in `benches/README.md`): the copies of heads around attention (1.7 ms; attention
//! reading its heads through strides would drop them), the gradients' casts to f32 (0.9 ms in
//! 148 launches; an update reading 16-bit gradients would fold them), the bias gradients'
//! two-step column sums (1.2 ms), and a full flash backward (`tensor_attention.rs` says why it
//! needs 12 products a block pair).

mod bfloat16;
mod context;
mod cooperative_matrix2;
mod device;
mod driver_cache;
mod host;
mod instance;
mod memory;
mod params;
mod pipelines;
mod profile;
mod record;
mod replay;
mod tensor_attention;
mod tensor_matmul;
mod tensor_scores_gradient;

use std::sync::Arc;

use tessera_core::{BackendEntry, Device, Result};

pub use device::VulkanDevice;
pub use memory::VulkanBuffer;

/// The names of the devices the backend can open, in `vulkan:N` order.
fn probe() -> Vec<String> {
    match instance::instance() {
        Ok(instance) => instance.devices.iter().map(|d| d.name.clone()).collect(),
        Err(_) => Vec::new(),
    }
}

fn open(ordinal: usize) -> Result<Arc<dyn Device>> {
    Ok(Arc::new(VulkanDevice::open(ordinal)?))
}

/// Why no device is listed: the loader's or the instance's failure (a machine without the
/// loader or without a driver), or devices that lack what the backend needs.
fn why_absent() -> Option<String> {
    match instance::instance() {
        Err(why) => Some(why),
        Ok(instance) if instance.devices.is_empty() => Some(
            "none of the Vulkan loader's devices has what the backend needs: Vulkan 1.2, a \
             compute queue, push descriptors, timeline semaphores and 16-bit storage"
                .into(),
        ),
        Ok(_) => None,
    }
}

tessera_core::inventory::submit! {
    BackendEntry { name: "vulkan", priority: 5, probe, open, why_absent,
        why_no_collectives: || Some("the vulkan backend has no collective library".into()) }
}
