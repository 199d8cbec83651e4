//! From an op to its family's planner, as core's splitting asks for each part.

use std::sync::Arc;

use tessera_core::exec::{split, Part, PartLauncher};
use tessera_core::ops::{check_dtypes, unsupported_dtypes};
use tessera_core::{Buffer, DType, Error, Limits, Op, OpFamily, Result, TensorRef};

use crate::gpu::{Gpu, Planner};
use crate::{attention, conv, elementwise, loss, matmul, movement, norm, optim, random, reduce};

/// Launches `op` on `gpu`, over windows of its operands where one is larger than a binding.
pub fn launch(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    scalars: &[f64],
) -> Result<()> {
    // The kernels index elements with 32 bits.
    let too_big = inputs
        .iter()
        .chain(outputs)
        .any(|t| t.layout.extent() > u32::MAX as usize);
    if too_big {
        return Err(Error::unsupported(
            gpu.backend(),
            format!("{} on tensors past 2^32 elements", op.name()),
        ));
    }
    split::launch(&Planner(gpu), op, inputs, outputs, scalars)
}

/// Whether these kernels run `op` on inputs of `dtypes` on a device that stores `stored`: the
/// catalog's dtype rules, and beyond them integer data for gathers and scatters, which the
/// kernels move through f32 (rounding integers past 2^24), is `Unsupported`.
pub fn check_supported(backend: &str, op: &Op, dtypes: &[DType], stored: &[DType]) -> Result<()> {
    check_dtypes(backend, op, dtypes, stored)?;
    let data = match op {
        Op::Embedding | Op::Gather { .. } => dtypes.first(),
        Op::EmbeddingBackward | Op::ScatterAdd { .. } => dtypes.get(1),
        _ => None,
    };
    match data {
        Some(d) if !d.is_float() => Err(unsupported_dtypes(backend, op, dtypes)),
        _ => Ok(()),
    }
}

impl PartLauncher for Planner<'_> {
    fn backend(&self) -> &str {
        self.0.backend()
    }

    fn limits(&self) -> &Limits {
        &self.0.caps().limits
    }

    fn scratch(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        self.0.scratch(bytes)
    }

    /// Matmul splits along K into partial sums its own kernel adds with the epilogue (a
    /// normalized product that does not fit runs as its norm and its product, an appending
    /// attention as its cache write and its attention), the
    /// convolutions into parts of images and of their im2col columns, embedding and its
    /// backward into ranges of table rows and positions, concat into a copy per input, and
    /// the squared norm into chunks of partial sums.
    fn splits_itself(&self, op: &Op) -> bool {
        matches!(
            op,
            Op::SquaredNorm
                | Op::Embedding
                | Op::EmbeddingBackward
                | Op::Concat { .. }
                | Op::Matmul { .. }
                | Op::NormMatmul { .. }
                | Op::AppendAttention
                | Op::Conv2d { .. }
                | Op::Conv2dBackwardData { .. }
                | Op::Conv2dBackwardWeight { .. }
        )
    }

    fn launch_part(
        &self,
        op: &Op,
        i: &[TensorRef<'_>],
        o: &[TensorRef<'_>],
        s: &[f64],
        part: Part,
    ) -> Result<()> {
        let gpu = self.0;
        // What a fused op without its fused kernel here runs as: whole ops, each split itself.
        let whole =
            |op: &Op, i: &[TensorRef<'_>], o: &[TensorRef<'_>], s: &[f64]| launch(gpu, op, i, o, s);
        match (op, op.family()) {
            (_, OpFamily::Random) => random::launch(gpu, op, o, s, part.first),
            (_, OpFamily::Elementwise) => elementwise::launch(gpu, op, i, o, s),
            (Op::ArgMax { axis, .. }, _) => reduce::argmax(gpu, *axis, &i[0], &o[0], part.first),
            (_, OpFamily::Reduce) => reduce::launch(gpu, op, i, o),
            (Op::NormMatmul { .. }, _) => matmul::launch_normed(gpu, op, i, o, s, &whole),
            (Op::AppendAttention, _) => attention::launch_append(gpu, op, i, o, s, &whole),
            (_, OpFamily::Matmul) if gpu.fits(i) && gpu.fits(o) => matmul::launch(gpu, op, i, o),
            (_, OpFamily::Matmul) => matmul::launch_windows(gpu, op, i, o),
            (Op::Gather { axis }, _) if part != Part::WHOLE => {
                let rows = part.rows.unwrap_or(i[0].layout.shape[*axis]);
                movement::gather_part(gpu, *axis, &i[0], &i[1], &o[0], part.first, rows)
            }
            (Op::ScatterAdd { axis }, _) if part != Part::WHOLE => {
                let (idx, src, out) = (&i[0], &i[1], &o[0]);
                movement::scatter_add_part(gpu, *axis, idx, src, out, part.first, part.accumulate)
            }
            (_, OpFamily::Movement) => movement::launch(gpu, op, i, o),
            (_, OpFamily::Norm) => norm::launch(gpu, op, i, o, s),
            (_, OpFamily::Attention) => attention::launch(gpu, op, i, o, s),
            (_, OpFamily::Loss) => loss::launch(gpu, op, i, o),
            (_, OpFamily::Optim) => optim::launch(gpu, op, i, o, s),
            (_, OpFamily::Conv) => conv::launch(gpu, op, i, o),
        }
    }
}
