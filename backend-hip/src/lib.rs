//! Tessera's `hip` backend: HIP kernels on AMD (ROCm) and NVIDIA (CUDA).
//!
//! Not implemented yet: the crate registers the backend so that `tessera devices` and device
//! selection know it, and its probe reports no devices, so nothing ever runs on it and nothing
//! falls back silently. Its kernels land with the backend's own issue.

use std::sync::Arc;

use tessera_core::{BackendEntry, Device, Error, Result};

fn probe() -> Vec<String> {
    Vec::new()
}

fn open(ordinal: usize) -> Result<Arc<dyn Device>> {
    Err(Error::Device {
        name: format!("hip:{ordinal}"),
        detail: "the hip backend has no kernels yet".into(),
    })
}

tessera_core::inventory::submit! {
    BackendEntry { name: "hip", priority: 30, probe, open }
}
