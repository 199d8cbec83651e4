//! Ops over tensors larger than one storage binding (128 MiB on lavapipe).
//!
//! An op whose operands all fit runs as one launch. Otherwise it runs as several, each
//! binding windows of its operands that fit. Every output element is computed by the same
//! code from the same inputs, so results are those of one launch, except where a sum is
//! split (matmul along K, embedding backward over ranges of positions): the parts' sums are
//! added in a fixed order, deterministic but rounded differently. How each op splits:
//! - elementwise ops halve the dimension along which their widest operand reaches furthest
//!   until every operand of a part fits (a part is one launch);
//! - creation, random and optimizer ops run over flat ranges of their row-major operands,
//!   random values keeping their element's index in the whole tensor;
//! - row-wise ops (the softmax family and its backward, layer and RMS norm, cross-entropy
//!   and its backward) run over ranges of whole rows;
//! - the squared norm, embedding and embedding backward (ranges of table rows and of
//!   positions), concat (a copy per input) and matmul split their work themselves
//!   (`optim.rs`, `movement.rs`, `matmul.rs`);
//! - any other op returns `Unsupported`, naming the size it met.
//!
//! A part that cannot shrink (one element, or one row of an embedding, wider than a binding)
//! is `Unsupported` too.

use tessera_core::{Error, Layout, Op, Result, TensorRef};

use crate::device::{launch_family, Core};
use crate::{matmul, random};

/// Launches `op`, over windows where an operand is larger than one binding.
pub(crate) fn launch(
    core: &Core,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    use Op::*;
    let fits = core.fits(inputs) && core.fits(outputs);
    match op {
        // These bind windows of their large operands themselves.
        SquaredNorm | Embedding | EmbeddingBackward | Concat { .. } => {
            launch_family(core, op, inputs, outputs, s)
        }
        _ if fits => launch_family(core, op, inputs, outputs, s),
        Cast { .. }
        | Copy
        | Unary(_)
        | UnaryBackward(_)
        | Binary(_)
        | Compare(_)
        | Where
        | SwiGlu
        | SwiGluBackward => halve(core, op, inputs, outputs, s),
        Fill { .. }
        | Arange { .. }
        | RandUniform { .. }
        | RandNormal { .. }
        | AdamUpdate { .. }
        | SgdUpdate { .. } => flat_ranges(core, op, inputs, outputs, s),
        Matmul { .. } => matmul::launch_windows(core, op, inputs, outputs),
        Softmax | LogSoftmax | SoftmaxBackward | LogSoftmaxBackward => {
            row_ranges(core, op, inputs, outputs, s, inputs.len())
        }
        LayerNorm | RmsNorm => row_ranges(core, op, inputs, outputs, s, 1),
        CrossEntropy | CrossEntropyBackward => {
            row_ranges(core, op, inputs, outputs, s, inputs.len())
        }
        _ => Err(too_large(core, op, inputs, outputs)),
    }
}

/// The error for an op whose operands cannot be bound in windows that fit.
pub(crate) fn too_large(
    core: &Core,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Error {
    let largest = inputs
        .iter()
        .chain(outputs)
        .map(|t| (core.binding_bytes(t), &t.layout.shape))
        .max_by_key(|(bytes, _)| *bytes);
    let detail = match largest {
        Some((bytes, shape)) => format!(
            "{} over a tensor of shape {shape:?} spanning {bytes} bytes (the adapter binds at \
             most {} bytes at once, and this op does not run over windows of it)",
            op.name(),
            core.max_binding()
        ),
        None => op.name(),
    };
    Error::unsupported("wgpu", detail)
}

/// `t` with another layout.
pub(crate) fn with_layout<'a>(t: &TensorRef<'a>, layout: &'a Layout) -> TensorRef<'a> {
    TensorRef {
        buffer: t.buffer,
        layout,
        dtype: t.dtype,
    }
}

/// `tensors` with each layout replaced by the matching one of `layouts`.
pub(crate) fn with_layouts<'a>(
    tensors: &[TensorRef<'a>],
    layouts: &'a [Layout],
) -> Vec<TensorRef<'a>> {
    tensors
        .iter()
        .zip(layouts)
        .map(|(t, layout)| with_layout(t, layout))
        .collect()
}

/// An elementwise op (every operand of the output's shape, outputs written through their
/// strides too) in two halves of the dimension along which the operand with the widest binding
/// reaches furthest, recursively, until each part fits.
fn halve(
    core: &Core,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    if core.fits(inputs) && core.fits(outputs) {
        return launch_family(core, op, inputs, outputs, s);
    }
    let widest = inputs
        .iter()
        .chain(outputs)
        .max_by_key(|t| core.binding_bytes(t))
        .map(|t| t.layout);
    let reach = |l: &Layout, d: usize| l.strides[d] * l.shape[d].saturating_sub(1);
    let dim = widest.and_then(|l| {
        (0..l.rank())
            .filter(|&d| reach(l, d) > 0)
            .max_by_key(|&d| (reach(l, d), std::cmp::Reverse(d)))
    });
    let Some(dim) = dim else {
        return Err(too_large(core, op, inputs, outputs));
    };
    let size = outputs[0].layout.shape[dim];
    let half = size / 2;
    for (start, len) in [(0, half), (half, size - half)] {
        let narrow = |list: &[TensorRef<'_>]| -> Vec<Layout> {
            list.iter()
                .map(|t| t.layout.narrow(dim, start, len))
                .collect()
        };
        let (li, lo) = (narrow(inputs), narrow(outputs));
        halve(
            core,
            op,
            &with_layouts(inputs, &li),
            &with_layouts(outputs, &lo),
            s,
        )?;
    }
    Ok(())
}

/// Elements per part of a flat range over `tensors` (row-major): as many as fit one binding
/// for the widest dtype, a multiple of 1,024.
pub(crate) fn flat_part(core: &Core, tensors: &[TensorRef<'_>]) -> usize {
    let widest = tensors.iter().map(|t| t.dtype.size()).max().unwrap_or(4);
    let bytes = core.max_binding().saturating_sub(core.align()) as usize;
    (bytes / widest / 1024).max(1) * 1024
}

/// A row-major layout as one dimension of its elements.
pub(crate) fn flat(layout: &Layout) -> Layout {
    Layout {
        shape: vec![layout.numel()],
        strides: vec![1],
        offset: layout.offset,
    }
}

/// Row-wise ops over ranges of whole rows that fit. Inputs before `row_inputs` and every
/// output are row-major, one row (or one statistic) per row of the first input; later inputs
/// (a norm's weight and bias) are bound whole. A row wider than a binding is `Unsupported`.
fn row_ranges(
    core: &Core,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
    row_inputs: usize,
) -> Result<()> {
    let n = inputs[0].layout.shape.last().copied().unwrap_or(1).max(1);
    let rows = inputs[0].layout.numel() / n;
    let split: Vec<&TensorRef<'_>> = inputs[..row_inputs].iter().chain(outputs).collect();
    let widest = split.iter().map(|t| t.dtype.size()).max().unwrap_or(4);
    let part = core.max_binding().saturating_sub(core.align()) as usize / (n * widest);
    if part == 0 || split.iter().any(|t| !t.layout.is_contiguous()) {
        return Err(too_large(core, op, inputs, outputs));
    }
    // Rows `first..first + len` of `t` as a `[len, per_row]` matrix (statistics `[len, 1]`:
    // kernels take the row count and length from the first input).
    let rows_of = |t: &TensorRef<'_>, first: usize, len: usize| -> Layout {
        let per_row = t.layout.numel() / rows;
        let mut layout = Layout::contiguous(&[len, per_row]);
        layout.offset = t.layout.offset + first * per_row;
        layout
    };
    for first in (0..rows).step_by(part) {
        let len = part.min(rows - first);
        let li: Vec<Layout> = inputs
            .iter()
            .enumerate()
            .map(|(k, t)| match k < row_inputs {
                true => rows_of(t, first, len),
                false => t.layout.clone(),
            })
            .collect();
        let lo: Vec<Layout> = outputs.iter().map(|t| rows_of(t, first, len)).collect();
        launch_family(
            core,
            op,
            &with_layouts(inputs, &li),
            &with_layouts(outputs, &lo),
            s,
        )?;
    }
    Ok(())
}

/// Creation, random and optimizer ops over flat ranges that fit: row-major operands of the
/// output's element count are narrowed, others (an optimizer's gradient scale) bound whole.
fn flat_ranges(
    core: &Core,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    let all: Vec<TensorRef<'_>> = inputs.iter().chain(outputs).cloned().collect();
    if all.iter().any(|t| !t.layout.is_contiguous()) {
        return Err(too_large(core, op, inputs, outputs));
    }
    let n = outputs[0].layout.numel();
    let part = flat_part(core, &all);
    let range = |list: &[TensorRef<'_>], first: usize, len: usize| -> Vec<Layout> {
        list.iter()
            .map(|t| match t.layout.numel() == n {
                true => flat(t.layout).narrow(0, first, len),
                false => t.layout.clone(),
            })
            .collect()
    };
    for first in (0..n).step_by(part) {
        let len = part.min(n - first);
        let (li, lo) = (range(inputs, first, len), range(outputs, first, len));
        let (i, o) = (with_layouts(inputs, &li), with_layouts(outputs, &lo));
        match op {
            Op::Fill { .. }
            | Op::Arange { .. }
            | Op::RandUniform { .. }
            | Op::RandNormal { .. } => random::launch(core, op, &o, s, first)?,
            _ => launch_family(core, op, &i, &o, s)?,
        }
    }
    Ok(())
}
