//! A device's kernels by op and input dtypes, built once and shared by every launch.
//!
//! Backends compile finer-grained variants of a kernel underneath (a pipeline per tile shape
//! or head size, keyed by op, dtypes and variant name): what a variant is depends on the
//! kernels, so that cache belongs to the kernels' crate (`tessera_wgsl::PipelineCache`, for
//! the wgpu and Vulkan backends alike).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::{DType, Kernel, Op, Result};

/// An op descriptor and the input dtypes a kernel was built for.
type KernelKey = (Op, Vec<DType>);

/// Kernels by op descriptor and input dtypes.
#[derive(Default)]
pub struct KernelCache {
    kernels: Mutex<HashMap<KernelKey, Arc<dyn Kernel>>>,
}

impl KernelCache {
    /// The kernel of `op` for inputs of `dtypes`, from `build` the first time it is asked for
    /// (a failed build is not cached: the same error comes again next time).
    pub fn get_or_build(
        &self,
        op: &Op,
        dtypes: &[DType],
        build: impl FnOnce() -> Result<Arc<dyn Kernel>>,
    ) -> Result<Arc<dyn Kernel>> {
        let mut kernels = self.kernels.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (op.clone(), dtypes.to_vec());
        if let Some(kernel) = kernels.get(&key) {
            return Ok(kernel.clone());
        }
        let kernel = build()?;
        kernels.insert(key, kernel.clone());
        Ok(kernel)
    }
}

impl std::fmt::Debug for KernelCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.kernels.lock().map_or(0, |k| k.len());
        f.debug_struct("KernelCache").field("kernels", &n).finish()
    }
}
