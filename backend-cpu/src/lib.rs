//! Tessera's CPU backend: the reference implementation of every catalog op, in f32, f64, f16
//! and bf16 (f16 and bf16 computed in f32), plus the integer and bool ops the catalog allows.
//!
//! Kernels are plain Rust, generic over the compute type (f32, or f64 for f64 data), one file per op
//! family as in `tessera_core::ops`: rayon across rows, the `gemm` crate for matrix products.
//! Every launch validates against the catalog first, then reads its inputs into owned
//! row-major vectors, computes, and writes its outputs.

mod attention;
mod buffer;
mod conv;
mod device;
mod elementwise;
mod float;
mod loss;
mod matmul;
mod movement;
mod norm;
mod optim;
mod random;
mod reduce;

use std::sync::Arc;

use tessera_core::{Device, Error, Op, Result};

pub use buffer::CpuBuffer;
pub use device::CpuDevice;

/// The error for an op dispatched to the wrong family file: unreachable through the device's
/// dispatch, but an error rather than a panic.
pub(crate) fn wrong_family(op: &Op) -> Error {
    Error::Backend {
        backend: "cpu".into(),
        detail: format!("{} dispatched to the wrong kernel family", op.name()),
    }
}

/// The CPU is always present, as one device.
fn probe() -> Vec<String> {
    vec![device::device_name()]
}

/// Opens a new CPU device (each with its own pool and kernel cache).
fn open(ordinal: usize) -> Result<Arc<dyn Device>> {
    if ordinal != 0 {
        return Err(Error::Device {
            name: format!("cpu:{ordinal}"),
            detail: "there is one cpu device, cpu:0".into(),
        });
    }
    Ok(Arc::new(CpuDevice::new()))
}

tessera_core::inventory::submit! {
    tessera_core::BackendEntry { name: "cpu", priority: 0, probe, open, why_absent: || None,
        why_no_collectives: || None }
}
