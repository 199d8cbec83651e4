//! Ops over tensors larger than one kernel binding, written once for every backend whose
//! kernels bind windows of buffers (wgpu and Vulkan: 128 MiB on lavapipe, 2 or 4 GiB on most
//! GPUs). Backends that address whole allocations (the CPU, HIP) never split.
//!
//! An op whose operands all fit runs as one launch. Otherwise it runs as several, each
//! binding windows of its operands that fit. Every output element is computed by the same
//! code from the same inputs, so results are those of one launch, except where a sum is
//! split (embedding backward over ranges of positions, norm weight gradients over ranges of
//! rows, reductions along a reduced dimension, 16-bit scatter-adds over parts of their
//! sources, and the kernels' own matmul splits along K): the parts' sums are added in a fixed
//! order, deterministic but rounded differently. How each op splits:
//! - elementwise ops halve the dimension along which their widest operand reaches furthest
//!   until every operand of a part fits (a part is one launch);
//! - creation, random and optimizer ops run over flat ranges of their row-major operands,
//!   random values keeping their element's index in the whole tensor ([`Part::first`]);
//! - row-wise ops (the softmax family and its backward, layer and RMS norm and their
//!   backward, cross-entropy and its backward) run over ranges of whole rows;
//! - reductions and argmax halve their input along kept dimensions, and along reduced ones
//!   into partial results (`reduce_windows`);
//! - rotary embedding halves its rows' outermost dimension (with the tables' rows where that
//!   is the sequence), attention (cached too) and its backward the batch, then the key/value
//!   heads with their query heads: parts of whole heads;
//! - gather halves its index and output (and `x` off the axis), or `x` into windows of rows
//!   along the axis; scatter-add zeroes its output, then adds parts of its sources into parts
//!   of its targets (`gather_windows`, `scatter_add_windows`); an index copy halves its
//!   destination and source along a dimension before the axis (`index_copy_windows`);
//! - ops whose split depends on how the backend's kernels compute them (matmul, the
//!   convolutions, embedding and its backward, concat, the squared norm) split themselves
//!   ([`PartLauncher::splits_itself`]), through this same trait.
//!
//! A part that cannot shrink (one element, one row of a row-wise op, one attention head wider
//! than a binding) is `Unsupported`, naming the size it met.

mod flat;
mod heads;
mod indexed;
mod part;
mod reduce;
mod rows;

pub use part::{binding_window, flat_part, too_large, Part, PartLauncher};

use crate::ops::{per_param_operands, updated_params};
use crate::{Op, Result, TensorRef};

use flat::{flat_ranges, halve};
use heads::{attention_windows, rotary_windows};
use indexed::{gather_windows, index_copy_windows, scatter_add_windows};
use reduce::reduce_windows;
use rows::{norm_backward_ranges, row_ranges};

/// Launches `op`, over windows where an operand is larger than one binding.
pub fn launch(
    dev: &dyn PartLauncher,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    use Op::*;
    let fits = dev.fits(inputs) && dev.fits(outputs);
    if fits || dev.splits_itself(op) {
        return dev.launch_whole(op, inputs, outputs, s);
    }
    match op {
        Cast { .. }
        | Copy
        | Unary(_)
        | UnaryBackward(_)
        | Binary(_)
        | Compare(_)
        | Where
        | SwiGlu
        | SwiGluBackward => halve(dev, op, inputs, outputs, s),
        AdamUpdate { .. } if updated_params(op, inputs.len()) > 1 => {
            each_param(dev, op, inputs, outputs, s)
        }
        Fill { .. }
        | Arange { .. }
        | RandUniform { .. }
        | RandNormal { .. }
        | AdamUpdate { .. }
        | SgdUpdate { .. } => flat_ranges(dev, op, inputs, outputs, s),
        Softmax | LogSoftmax | SoftmaxBackward | LogSoftmaxBackward => {
            row_ranges(dev, op, inputs, outputs, s, inputs.len())
        }
        LayerNorm | RmsNorm => row_ranges(dev, op, inputs, outputs, s, 1),
        LayerNormBackward | RmsNormBackward => norm_backward_ranges(dev, op, inputs, outputs, s),
        Reduce { .. } | ArgMax { .. } => reduce_windows(dev, op, inputs[0], outputs[0], 0),
        Rotary => rotary_windows(dev, op, inputs, outputs, s),
        Attention { .. } | AttentionBackward { .. } | CachedAttention => {
            attention_windows(dev, op, inputs, outputs, s)
        }
        CrossEntropy | CrossEntropyBackward => {
            row_ranges(dev, op, inputs, outputs, s, inputs.len())
        }
        Gather { axis } => gather_windows(dev, *axis, inputs, outputs),
        ScatterAdd { axis } => scatter_add_windows(dev, *axis, inputs, outputs),
        IndexCopy { .. } => index_copy_windows(dev, op, inputs, outputs, s),
        SquaredNorm
        | Embedding
        | EmbeddingBackward
        | Concat { .. }
        | Matmul { .. }
        | NormMatmul { .. }
        | AppendAttention
        | Conv2d { .. }
        | Conv2dBackwardData { .. }
        | Conv2dBackwardWeight { .. } => Err(too_large(dev, op, inputs, outputs)),
    }
}

/// An update of a group of parameters that does not fit one launch, as one update per
/// parameter (each over flat ranges where it does not fit either).
fn each_param(
    dev: &dyn PartLauncher,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    for (ins, outs) in per_param_operands(op, inputs, outputs) {
        launch(dev, op, &ins, &outs, s)?;
    }
    Ok(())
}
