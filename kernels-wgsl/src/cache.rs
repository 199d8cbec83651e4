//! Compiled kernels by pipeline key, for every backend that runs these kernels: a kernel's
//! source depends on its key ([`crate::Dispatch::key`]: op, dtypes, variant) and on whether it
//! reads its parameters as immediates, and on nothing else of the launch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tessera_core::Result;

/// Pipelines of type `P` (the backend's compiled kernel) by key, reading their parameters from
/// the parameter buffer (`[0]`) or as immediates (`[1]`).
pub struct PipelineCache<P> {
    pipelines: Mutex<[HashMap<String, Arc<P>>; 2]>,
}

impl<P> Default for PipelineCache<P> {
    fn default() -> Self {
        PipelineCache {
            pipelines: Mutex::new([HashMap::new(), HashMap::new()]),
        }
    }
}

impl<P> PipelineCache<P> {
    /// The pipeline cached under `key`, built by `build` on a miss. The lock is not held while
    /// building (compiling takes long): two threads missing at once both build, and the first
    /// to finish is kept.
    pub fn get_or_build(
        &self,
        key: &str,
        immediate: bool,
        build: impl FnOnce() -> Result<P>,
    ) -> Result<Arc<P>> {
        let slot = usize::from(immediate);
        let lock = || {
            self.pipelines
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        if let Some(p) = lock()[slot].get(key) {
            return Ok(p.clone());
        }
        let built = Arc::new(build()?);
        Ok(lock()[slot].entry(key.to_string()).or_insert(built).clone())
    }
}
