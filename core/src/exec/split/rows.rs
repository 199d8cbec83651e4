//! Row-wise ops (softmax, norms, cross-entropy and their backward) over ranges of whole rows.

use crate::{Layout, Op, ReduceOp, Result, TensorRef};

use super::part::{too_large, PartLauncher};

/// Rows per part when the row-major tensors of `split`, one row of `n` elements (or one
/// statistic) per row, are bound over ranges of whole rows; `None` where one row does not fit
/// or a tensor is not row-major.
fn rows_per_part(dev: &dyn PartLauncher, n: usize, split: &[&TensorRef<'_>]) -> Option<usize> {
    let widest = split.iter().map(|t| t.dtype.size()).max().unwrap_or(4);
    let part = dev
        .max_binding()
        .saturating_sub(dev.limits().binding_align as u64) as usize
        / (n * widest);
    (part > 0 && split.iter().all(|t| t.layout.is_contiguous())).then_some(part)
}

/// Row-wise ops over ranges of whole rows that fit. Inputs before `row_inputs` and every
/// output are row-major, one row (or one statistic) per row of the first input; later inputs
/// (a norm's weight and bias) are bound whole. A row wider than a binding is `Unsupported`.
pub(super) fn row_ranges(
    dev: &dyn PartLauncher,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
    row_inputs: usize,
) -> Result<()> {
    let n = inputs[0].layout.shape.last().copied().unwrap_or(1).max(1);
    let rows = inputs[0].layout.numel() / n;
    let split: Vec<&TensorRef<'_>> = inputs[..row_inputs].iter().chain(outputs).collect();
    let Some(part) = rows_per_part(dev, n, &split) else {
        return Err(too_large(dev, op, inputs, outputs));
    };
    for first in (0..rows).step_by(part) {
        let len = part.min(rows - first);
        let li: Vec<Layout> = inputs
            .iter()
            .enumerate()
            .map(|(k, t)| match k < row_inputs {
                true => rows_of(t, rows, first, len),
                false => t.layout.clone(),
            })
            .collect();
        let lo: Vec<Layout> = outputs
            .iter()
            .map(|t| rows_of(t, rows, first, len))
            .collect();
        dev.launch_whole(
            op,
            &TensorRef::with_layouts(inputs, &li),
            &TensorRef::with_layouts(outputs, &lo),
            s,
        )?;
    }
    Ok(())
}

/// Rows `first..first + len` of `t` (row-major, `rows` rows) as a `[len, per_row]` matrix
/// (statistics `[len, 1]`: kernels take the row count and length from the first input).
pub(super) fn rows_of(t: &TensorRef<'_>, rows: usize, first: usize, len: usize) -> Layout {
    let per_row = t.layout.numel() / rows;
    let mut layout = Layout::contiguous(&[len, per_row]);
    layout.offset = t.layout.offset + first * per_row;
    layout
}

/// Layer and RMS norm backward over ranges of whole rows. `dx` comes out per range as in one
/// launch; the weight (and bias) gradients sum over every row, so each range writes its sums
/// to an f32 row of partial sums, and a reduction adds those rows in range order
/// (deterministic, rounded differently from one launch).
pub(super) fn norm_backward_ranges(
    dev: &dyn PartLauncher,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    // Inputs: x, weight, statistics..., dy; outputs: dx, then the weight-shaped gradients.
    let n = inputs[0].layout.shape.last().copied().unwrap_or(1).max(1);
    let rows = inputs[0].layout.numel() / n;
    let per_row = |k: usize| k != 1;
    let split: Vec<&TensorRef<'_>> = inputs
        .iter()
        .enumerate()
        .filter(|&(k, _)| per_row(k))
        .map(|(_, t)| t)
        .chain(&outputs[..1])
        .collect();
    let Some(part) = rows_per_part(dev, n, &split) else {
        return Err(too_large(dev, op, inputs, outputs));
    };
    let parts = rows.div_ceil(part);
    let grads = &outputs[1..];
    let sums = dev.scratch(4 * parts * n * grads.len())?;
    let partial = |g: usize, p: usize| Layout {
        shape: vec![n],
        strides: vec![1],
        offset: (g * parts + p) * n,
    };
    for (p, first) in (0..rows).step_by(part).enumerate() {
        let len = part.min(rows - first);
        let li: Vec<Layout> = inputs
            .iter()
            .enumerate()
            .map(|(k, t)| match per_row(k) {
                true => rows_of(t, rows, first, len),
                false => t.layout.clone(),
            })
            .collect();
        let dx = rows_of(&outputs[0], rows, first, len);
        let partials: Vec<Layout> = (0..grads.len()).map(|g| partial(g, p)).collect();
        let mut outs = vec![outputs[0].with_layout(&dx)];
        outs.extend(partials.iter().map(|l| TensorRef::f32(&sums, l)));
        dev.launch_whole(op, &TensorRef::with_layouts(inputs, &li), &outs, s)?;
    }
    let add_rows = Op::Reduce {
        op: ReduceOp::Sum,
        axes: vec![0],
        keepdim: false,
    };
    for (g, grad) in grads.iter().enumerate() {
        let stacked = Layout {
            shape: vec![parts, n],
            strides: vec![n, 1],
            offset: g * parts * n,
        };
        dev.launch_whole(
            &add_rows,
            &[TensorRef::f32(&sums, &stacked)],
            std::slice::from_ref(grad),
            &[],
        )?;
    }
    Ok(())
}
