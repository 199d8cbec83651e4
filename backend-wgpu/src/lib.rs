//! Tessera's `wgpu` backend: WGSL kernels over wgpu, on Vulkan.
//!
//! Every Vulkan adapter wgpu finds is a device (`wgpu:0`, `wgpu:1`, ...), software ones such as
//! lavapipe included, listed after the hardware ones. A missing Vulkan loader or driver means no
//! devices, never a panic.
//!
//! How a launch runs:
//! - Each op family has a WGSL file under `src/kernels/`. A pipeline is built from the file's
//!   shared part, one `// @kernel` section, and binding declarations generated for the launch's
//!   dtypes (`ldK`/`stK` load and store binding `K` as f32; `ldnK`/`stnK` in its native type).
//!   Pipelines are compiled once per device and cached by op, dtypes and variant.
//! - Launch parameters (sizes, strides, offsets, scalars) are `u32` words, the array `p` in
//!   every kernel, written into a per-submission parameter buffer (read-only storage: WGSL's
//!   uniform arrays would need 16-byte elements) and reached through a dynamic offset. With
//!   `WgpuOptions::immediates`, where the adapter has immediates (`IMMEDIATES`, Vulkan push
//!   constants), a launch of up to 64 words passes them as immediates instead; that is not the
//!   default because it measured slower on the H100 (see `WgpuOptions`). No buffer is created
//!   per dispatch. The parameter buffer is bind group 0 and the data bind group 1, so data bind
//!   groups are cached by the buffers they bind alone, and serve pipelines of both kinds. A
//!   buffer that fits one binding is bound whole (views reach their elements by offset), so
//!   launches over different parts of it, such as a KV cache growing by a row per decoded
//!   token, reuse one bind group.
//! - Dispatches are recorded into one command encoder and submitted at sync points: a read, a
//!   `synchronize`, a host write, or every 32 dispatches, so the GPU works while the host
//!   records the rest.
//! - Grids loop: kernels stride over work by the number of workgroups launched, and the grid is
//!   spread over two dimensions, so no size is capped at 65,535 workgroups.
//! - Buffers come from core's caching pool with stream-ordered reuse: a freed block serves the
//!   next allocation of its size class at once, since every use runs on the device's one queue
//!   in recording order (wgpu places barriers between dependent dispatches and submissions,
//!   and host writes submit the recorded work first). The pool therefore holds the live
//!   working set, whatever the GPU's lag; an allocation the driver refuses is retried once
//!   after the cached blocks of other classes are released.
//! - Data is f32, f16 (where the adapter has `SHADER_F16`) or bf16 (16 bits packed in `u32`
//!   words), with i32/u32 indices and bool masks; arithmetic is f32 and 16-bit results round
//!   once, to nearest even, when stored.
//! - Tensors larger than one storage binding run over windows that fit (`windows.rs`).
//! - With `Device::set_profiling(true)` every dispatch's pass writes GPU timestamps
//!   (`TIMESTAMP_QUERY`), summed per kernel for `Device::profile` (`tessera bench --profile`).

mod attention;
mod buffer;
mod conv;
mod device;
mod elementwise;
mod loss;
mod matmul;
mod movement;
mod norm;
mod optim;
mod random;
mod reduce;
mod shader;
mod windows;

use std::sync::Arc;

use tessera_core::{BackendEntry, Device, Result};

pub use buffer::WgpuBuffer;
pub use device::{WgpuDevice, WgpuOptions};

fn probe() -> Vec<String> {
    device::adapters()
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

tessera_core::inventory::submit! {
    BackendEntry { name: "wgpu", priority: 10, probe, open }
}
