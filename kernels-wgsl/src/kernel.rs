//! The `Kernel` every backend running these kernels hands out: a catalog op bound to its input
//! dtypes, launched through the planners on the backend's [`Gpu`].

use std::fmt;
use std::sync::{Arc, Weak};

use tessera_core::ops::validate_kernel_launch;
use tessera_core::{DType, Error, Kernel, Op, Result, TensorRef};

use crate::dispatch::{check_supported, launch};
use crate::gpu::Gpu;

/// A catalog op bound to the input dtypes it was requested for, on the device `G`. It holds
/// the device weakly: a kernel kept after its device is dropped fails to launch.
pub struct WgslKernel<G> {
    op: Op,
    dtypes: Vec<DType>,
    backend: String,
    gpu: Weak<G>,
}

impl<G: Gpu + Send + Sync + 'static> WgslKernel<G> {
    /// The kernel for `op` on inputs of `dtypes`, or `Unsupported` where these kernels cannot
    /// run it on a device that stores `stored`.
    pub fn build(
        gpu: &Arc<G>,
        op: &Op,
        dtypes: &[DType],
        stored: &[DType],
    ) -> Result<Arc<dyn Kernel>> {
        check_supported(gpu.backend(), op, dtypes, stored)?;
        Ok(Arc::new(WgslKernel {
            op: op.clone(),
            dtypes: dtypes.to_vec(),
            backend: gpu.backend().to_string(),
            gpu: Arc::downgrade(gpu),
        }))
    }
}

impl<G> fmt::Debug for WgslKernel<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgslKernel")
            .field("backend", &self.backend)
            .field("op", &self.op)
            .field("dtypes", &self.dtypes)
            .finish()
    }
}

impl<G: Gpu + Send + Sync + 'static> Kernel for WgslKernel<G> {
    fn op(&self) -> &Op {
        &self.op
    }

    fn launch(
        &self,
        inputs: &[TensorRef<'_>],
        outputs: &[TensorRef<'_>],
        scalars: &[f64],
    ) -> Result<()> {
        validate_kernel_launch(&self.op, &self.dtypes, inputs, outputs, scalars)?;
        let gpu = self.gpu.upgrade().ok_or_else(|| Error::Backend {
            backend: self.backend.clone(),
            detail: "the device of this kernel was dropped".into(),
        })?;
        launch(&*gpu, &self.op, inputs, outputs, scalars)
    }
}
