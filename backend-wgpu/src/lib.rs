//! Tessera's `wgpu` backend: WGSL kernels over wgpu, on Vulkan.
//!
//! Every Vulkan adapter wgpu finds is a device (`wgpu:0`, `wgpu:1`, ...), software ones such as
//! lavapipe included, listed after the hardware ones. A missing Vulkan loader or driver means no
//! devices, never a panic.
//!
//! The kernels, their planners and the splitting of ops past one binding are not here: they
//! are the `tessera-wgsl` crate's (and core's `exec::split`), shared with the Vulkan backend.
//! This crate implements their [`tessera_wgsl::Gpu`] over wgpu and keeps what is wgpu's own,
//! a file per job:
//! - `adapter.rs`: finding adapters (hardware first; any failure means none) and opening one:
//!   features and limits become the kernels' capabilities.
//! - `batch.rs`: the device's state and the batch being recorded. Dispatches go into one
//!   compute pass of one command encoder, submitted at sync points (a read, a `synchronize`, a
//!   host write) or every 128 dispatches, so the GPU works while the host records the rest.
//!   Launch parameters are `u32` words in a per-submission parameter buffer (read-only
//!   storage: WGSL's uniform arrays would need 16-byte elements) reached through a dynamic
//!   offset, or immediates with `WgpuOptions::immediates` (not the default: slower on the
//!   H100, see `WgpuOptions`). Data bind groups are cached by the buffers they bind; a buffer
//!   that fits one binding is bound whole, so launches over parts of it (a KV cache growing by
//!   a row per token) reuse one bind group.
//! - `pipelines.rs`: compiled pipelines per kernel key and their layouts.
//! - `memory.rs`, `buffer.rs`: buffers from core's caching pool with stream-ordered reuse (one
//!   queue, recording order); an allocation the driver refuses is retried once after the
//!   cached blocks of other classes are released.
//! - `host.rs`: copies between host and device.
//! - `profile.rs`: with `Device::set_profiling(true)` every dispatch's pass writes GPU
//!   timestamps (`TIMESTAMP_QUERY`), summed per kernel for `Device::profile`.
//! - `device.rs`: the `Device` and `Kernel` implementations; the catalog's dtype rules for
//!   what the adapter stores (f16 only with `SHADER_F16`).

mod adapter;
mod batch;
mod buffer;
mod device;
mod host;
mod memory;
mod pipelines;
mod profile;
mod sync;

use std::sync::Arc;

use tessera_core::{BackendEntry, Device, Result};

pub use adapter::WgpuOptions;
pub use buffer::WgpuBuffer;
pub use device::WgpuDevice;

fn probe() -> Vec<String> {
    adapter::adapters()
        .iter()
        .map(|a| a.get_info().name)
        .collect()
}

fn open(ordinal: usize) -> Result<Arc<dyn Device>> {
    Ok(Arc::new(WgpuDevice::open_with(
        ordinal,
        &WgpuOptions::default(),
    )?))
}

/// Why no device is listed: wgpu, which this backend runs over Vulkan, finds no adapter.
fn why_absent() -> Option<String> {
    probe()
        .is_empty()
        .then(|| "wgpu finds no Vulkan adapter (no Vulkan loader or driver)".into())
}

tessera_core::inventory::submit! {
    BackendEntry { name: "wgpu", priority: 10, probe, open, why_absent,
        why_no_collectives: || Some("the wgpu backend has no collective library".into()) }
}
