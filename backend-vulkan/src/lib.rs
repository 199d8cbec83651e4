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
//! set, many dispatches and copies per command buffer with a full memory barrier after each,
//! a batch submitted at a sync point or every `MAX_BATCH` commands, signalling its number on a
//! timeline semaphore (`record.rs`). Memory comes from core's caching pool over gpu-allocator
//! (`memory.rs`); blocks the pool lets go are freed once the queue has passed them.
//!
//! Status: on lavapipe a tiny model trains to the loss wgpu reaches and the Hugging Face
//! fixtures and error tests pass, but the op conformance suite (`TESSERA_DEVICES=vulkan cargo
//! test -p tessera-conformance --features vulkan --test ops`) ran 75 minutes at full CPU
//! without finishing (wgpu: about 7), so something here is far slower on lavapipe; not yet
//! profiled. Suspects, in order: naga's `Restrict` bounds checks on every buffer access
//! (wgpu uses `Unchecked` where the device has `robustBufferAccess2`, as lavapipe does), a
//! staging buffer allocated per host read and write, the full barrier after every command,
//! and the row samples with grids past 65,535 workgroups. `target/conformance/timings.json`
//! of a run narrowed with `TESSERA_OPS` shows where the time goes. Unrun on the H100.
//!
//! Not yet here (the backend's issue lists them): cooperative matrices (tensor cores), a
//! pipeline cache on disk, barriers only where needed, timestamp profiling, asynchronous reads,
//! and replaying recorded steps.

mod context;
mod device;
mod host;
mod instance;
mod memory;
mod params;
mod pipelines;
mod record;

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

tessera_core::inventory::submit! {
    BackendEntry { name: "vulkan", priority: 5, probe, open }
}
