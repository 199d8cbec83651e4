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
//!   is the sequence), attention and its backward the batch, then the key/value heads with
//!   their query heads: parts of whole heads;
//! - gather halves its index and output (and `x` off the axis), or `x` into windows of rows
//!   along the axis; scatter-add zeroes its output, then adds parts of its sources into parts
//!   of its targets (`gather_windows`, `scatter_add_windows`);
//! - ops whose split depends on how the backend's kernels compute them (matmul, the
//!   convolutions, embedding and its backward, concat, the squared norm) split themselves
//!   ([`PartLauncher::splits_itself`]), through this same trait.
//!
//! A part that cannot shrink (one element, one row of a row-wise op, one attention head wider
//! than a binding) is `Unsupported`, naming the size it met.

use std::sync::Arc;

use crate::{Buffer, DType, Error, Layout, Limits, Op, ReduceOp, Result, TensorRef, UnaryOp};

/// Where a part of a split op lies in the whole op: what its kernel adds to its own indices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Part {
    /// The part's first element in the whole op, counted as the op indexes: flat elements
    /// for creation and random ops (a random value depends on its index in the whole
    /// tensor), positions along the axis for argmax's input (the indices it returns), for
    /// gather's `x` (the rows its window holds) and for scatter-add's output (its targets).
    pub first: usize,
    /// Gather: rows of `x` along the axis in the whole op. An index past them is out of range
    /// (its output is zero); one inside them but outside the window is another part's.
    pub rows: Option<usize>,
    /// Scatter-add: add onto the output's values (zeroed first) instead of overwriting them.
    pub accumulate: bool,
}

impl Part {
    /// The whole op: nothing to offset.
    pub const WHOLE: Part = Part {
        first: 0,
        rows: None,
        accumulate: false,
    };

    /// A part starting at `first`.
    pub fn at(first: usize) -> Part {
        Part {
            first,
            ..Part::WHOLE
        }
    }
}

/// What splitting needs from a device whose kernels bind windows of buffers: its binding
/// limits, scratch memory, and a launch of one part whose operands all fit.
pub trait PartLauncher {
    /// The backend's name, for errors.
    fn backend(&self) -> &str;
    /// The device's limits: `max_binding_bytes` and `binding_align` decide the parts.
    fn limits(&self) -> &Limits;
    /// A scratch buffer of at least `bytes` (partial results), from the device's pool.
    fn scratch(&self, bytes: usize) -> Result<Arc<dyn Buffer>>;
    /// Whether the backend's launch of `op` binds windows of its large operands itself,
    /// because how it splits depends on its kernels (a matmul's split along K, a
    /// convolution's im2col columns).
    fn splits_itself(&self, op: &Op) -> bool;
    /// Launches `op` over operands that fit one binding each (or that the launch splits
    /// itself), as `part` of the whole op.
    fn launch_part(
        &self,
        op: &Op,
        inputs: &[TensorRef<'_>],
        outputs: &[TensorRef<'_>],
        scalars: &[f64],
        part: Part,
    ) -> Result<()>;

    /// [`PartLauncher::launch_part`] of a whole op.
    fn launch_whole(
        &self,
        op: &Op,
        inputs: &[TensorRef<'_>],
        outputs: &[TensorRef<'_>],
        scalars: &[f64],
    ) -> Result<()> {
        self.launch_part(op, inputs, outputs, scalars, Part::WHOLE)
    }

    /// The most bytes one binding may span.
    fn max_binding(&self) -> u64 {
        self.limits().max_binding_bytes as u64
    }

    /// Bytes a binding of `t` spans ([`binding_window`]).
    fn binding_bytes(&self, t: &TensorRef<'_>) -> u64 {
        binding_window(t.layout, t.dtype, self.limits().binding_align as u64).1
    }

    /// Whether every tensor of `tensors` fits one binding.
    fn fits(&self, tensors: &[TensorRef<'_>]) -> bool {
        tensors
            .iter()
            .all(|t| self.binding_bytes(t) <= self.max_binding())
    }
}

/// The bytes of its buffer that a binding of a tensor with `layout` spans, as (start, length):
/// from its first element, aligned down to `align`, to its last, rounded up to a 4-byte word
/// (at least one word).
pub fn binding_window(layout: &Layout, dtype: DType, align: u64) -> (u64, u64) {
    let size = dtype.size() as u64;
    let start = layout.offset as u64 * size;
    let aligned = start - start % align.max(1);
    let end = (layout.extent() as u64 * size).max(start + 4).div_ceil(4) * 4;
    (aligned, (end - aligned).max(4))
}

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
        Attention { .. } | AttentionBackward { .. } => {
            attention_windows(dev, op, inputs, outputs, s)
        }
        CrossEntropy | CrossEntropyBackward => {
            row_ranges(dev, op, inputs, outputs, s, inputs.len())
        }
        Gather { axis } => gather_windows(dev, *axis, inputs, outputs),
        ScatterAdd { axis } => scatter_add_windows(dev, *axis, inputs, outputs),
        SquaredNorm
        | Embedding
        | EmbeddingBackward
        | Concat { .. }
        | Matmul { .. }
        | Conv2d { .. }
        | Conv2dBackwardData { .. }
        | Conv2dBackwardWeight { .. } => Err(too_large(dev, op, inputs, outputs)),
    }
}

/// The error for an op whose operands cannot be bound in windows that fit.
pub fn too_large(
    dev: &dyn PartLauncher,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Error {
    let largest = inputs
        .iter()
        .chain(outputs)
        .map(|t| (dev.binding_bytes(t), &t.layout.shape))
        .max_by_key(|(bytes, _)| *bytes);
    let detail = match largest {
        Some((bytes, shape)) => format!(
            "{} over a tensor of shape {shape:?} spanning {bytes} bytes (the device binds at \
             most {} bytes at once, and this op does not run over windows of it)",
            op.name(),
            dev.max_binding()
        ),
        None => op.name(),
    };
    Error::unsupported(dev.backend(), detail)
}

/// An elementwise op (every operand of the output's shape, outputs written through their
/// strides too) in two halves of the dimension along which the operand with the widest binding
/// reaches furthest, recursively, until each part fits.
fn halve(
    dev: &dyn PartLauncher,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    if dev.fits(inputs) && dev.fits(outputs) {
        return dev.launch_whole(op, inputs, outputs, s);
    }
    let widest = inputs
        .iter()
        .chain(outputs)
        .max_by_key(|t| dev.binding_bytes(t));
    let Some(dim) = widest.and_then(|t| t.layout.furthest_dim()) else {
        return Err(too_large(dev, op, inputs, outputs));
    };
    let narrow = |list: &[TensorRef<'_>], start, len| -> Vec<Layout> {
        list.iter()
            .map(|t| t.layout.narrow(dim, start, len))
            .collect()
    };
    let size = outputs[0].layout.shape[dim];
    on_halves(dev, op, inputs, outputs, s, size, halve, |start, len| {
        (narrow(inputs, start, len), narrow(outputs, start, len))
    })
}

/// The signature of the functions that split an op's launch into parts.
type Windowed =
    fn(&dyn PartLauncher, &Op, &[TensorRef<'_>], &[TensorRef<'_>], &[f64]) -> Result<()>;

/// Runs `part` (which splits further where needed) on each half of `0..size`, with the
/// operands' layouts that `narrow` gives for a range of it.
#[allow(clippy::too_many_arguments)]
fn on_halves(
    dev: &dyn PartLauncher,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
    size: usize,
    part: Windowed,
    narrow: impl Fn(usize, usize) -> (Vec<Layout>, Vec<Layout>),
) -> Result<()> {
    for (start, len) in halves(size) {
        let (li, lo) = narrow(start, len);
        part(
            dev,
            op,
            &TensorRef::with_layouts(inputs, &li),
            &TensorRef::with_layouts(outputs, &lo),
            s,
        )?;
    }
    Ok(())
}

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

/// Elements per part of a flat range over `tensors` (row-major): as many as fit one binding
/// for the widest dtype, a multiple of 1,024.
pub fn flat_part(dev: &dyn PartLauncher, tensors: &[TensorRef<'_>]) -> usize {
    let widest = tensors.iter().map(|t| t.dtype.size()).max().unwrap_or(4);
    let bytes = dev
        .max_binding()
        .saturating_sub(dev.limits().binding_align as u64) as usize;
    (bytes / widest / 1024).max(1) * 1024
}

/// Row-wise ops over ranges of whole rows that fit. Inputs before `row_inputs` and every
/// output are row-major, one row (or one statistic) per row of the first input; later inputs
/// (a norm's weight and bias) are bound whole. A row wider than a binding is `Unsupported`.
fn row_ranges(
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
fn rows_of(t: &TensorRef<'_>, rows: usize, first: usize, len: usize) -> Layout {
    let per_row = t.layout.numel() / rows;
    let mut layout = Layout::contiguous(&[len, per_row]);
    layout.offset = t.layout.offset + first * per_row;
    layout
}

/// Layer and RMS norm backward over ranges of whole rows. `dx` comes out per range as in one
/// launch; the weight (and bias) gradients sum over every row, so each range writes its sums
/// to an f32 row of partial sums, and a reduction adds those rows in range order
/// (deterministic, rounded differently from one launch).
fn norm_backward_ranges(
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

/// A reduction (or argmax) over windows: halves of the dimension along which the input
/// reaches furthest, recursively, until each part fits. A kept dimension splits input and
/// output alike. A reduced one splits the input into two halves reduced into f32 partial
/// results (sums for a mean), which a reduction over the pair combines (a mean's sum then
/// scaled by one over the count): deterministic, and for sums and means rounded differently
/// from one launch. Argmax's halves give their maxima and the indices of those (counted from
/// `first`, the index of the input's first element along the reduced axis), and the argmax
/// of each pair of maxima picks one of the pair's indices: the first on ties, as one launch.
fn reduce_windows(
    dev: &dyn PartLauncher,
    op: &Op,
    x: TensorRef<'_>,
    out: TensorRef<'_>,
    first: usize,
) -> Result<()> {
    let (axes, keepdim) = match op {
        Op::Reduce { axes, keepdim, .. } => (&axes[..], *keepdim),
        Op::ArgMax { axis, keepdim } => (std::slice::from_ref(axis), *keepdim),
        _ => return Err(too_large(dev, op, &[x], &[out])),
    };
    if dev.fits(&[x, out]) {
        return match op {
            Op::ArgMax { .. } => dev.launch_part(op, &[x], &[out], &[], Part::at(first)),
            _ => dev.launch_whole(op, &[x], &[out], &[]),
        };
    }
    let l = x.layout;
    let Some(dim) = l.furthest_dim() else {
        return Err(too_large(dev, op, &[x], &[out]));
    };
    let halves = halves(l.shape[dim]);
    if !axes.contains(&dim) {
        let out_dim = match keepdim {
            true => dim,
            false => dim - axes.iter().filter(|&&a| a < dim).count(),
        };
        for (start, len) in halves {
            let (li, lo) = (
                l.narrow(dim, start, len),
                out.layout.narrow(out_dim, start, len),
            );
            let (x, part) = (x.with_layout(&li), out.with_layout(&lo));
            if lo.is_contiguous() {
                reduce_windows(dev, op, x, part, first)?;
                continue;
            }
            // The kernels write their outputs in order: reduce into a contiguous buffer, then
            // copy into the strided part of `out`.
            let bytes = (lo.numel() * out.dtype.size()).next_multiple_of(4);
            let buffer = dev.scratch(bytes)?;
            let layout = Layout::contiguous(&lo.shape);
            let dense = TensorRef {
                buffer: &buffer,
                layout: &layout,
                dtype: out.dtype,
            };
            reduce_windows(dev, op, x, dense, first)?;
            dev.launch_whole(&Op::Copy, &[dense], &[part], &[])?;
        }
        return Ok(());
    }
    let shape = &out.layout.shape;
    let numel = out.layout.numel();
    let parts: Vec<Layout> = (0..2)
        .map(|i| {
            let mut layout = Layout::contiguous(shape);
            layout.offset = i * numel;
            layout
        })
        .collect();
    let pair = Layout::contiguous(&[&[2], &shape[..]].concat());
    let partials = dev.scratch(4 * 2 * numel)?;
    let x_halves: Vec<Layout> = halves
        .iter()
        .map(|&(start, len)| l.narrow(dim, start, len))
        .collect();
    let (kind, part_op) = match op {
        Op::ArgMax { axis, .. } => {
            let maximum = Op::Reduce {
                op: ReduceOp::Max,
                axes: vec![*axis],
                keepdim,
            };
            let indices = dev.scratch(4 * 2 * numel)?;
            let index_of = |layout| TensorRef {
                buffer: &indices,
                layout,
                dtype: out.dtype,
            };
            for ((li, part), (start, _)) in x_halves.iter().zip(&parts).zip(halves) {
                let x = x.with_layout(li);
                reduce_windows(dev, &maximum, x, TensorRef::f32(&partials, part), 0)?;
                reduce_windows(dev, op, x, index_of(part), first + start)?;
            }
            // Which half wins, as a mask: the second where its maximum beats the first's.
            let dense = Layout::contiguous(shape);
            let which = dev.scratch(4 * numel)?;
            let which = TensorRef {
                buffer: &which,
                layout: &dense,
                dtype: DType::I32,
            };
            let second = dev.scratch(numel.next_multiple_of(4))?;
            let second = TensorRef {
                buffer: &second,
                layout: &dense,
                dtype: DType::Bool,
            };
            let pick = Op::ArgMax {
                axis: 0,
                keepdim: false,
            };
            dev.launch_whole(&pick, &[TensorRef::f32(&partials, &pair)], &[which], &[])?;
            dev.launch_whole(&Op::Cast { to: DType::Bool }, &[which], &[second], &[])?;
            let [first_half, second_half] = [0, 1].map(|i| index_of(&parts[i]));
            return dev.launch_whole(&Op::Where, &[second, second_half, first_half], &[out], &[]);
        }
        // A mean is the sum of its partial sums over the count.
        Op::Reduce {
            op: ReduceOp::Mean, ..
        } => (
            ReduceOp::Sum,
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: axes.to_vec(),
                keepdim,
            },
        ),
        Op::Reduce { op: kind, .. } => (*kind, op.clone()),
        _ => return Err(too_large(dev, op, &[x], &[out])),
    };
    for (li, part) in x_halves.iter().zip(&parts) {
        let partial = TensorRef::f32(&partials, part);
        reduce_windows(dev, &part_op, x.with_layout(li), partial, 0)?;
    }
    let combine = Op::Reduce {
        op: kind,
        axes: vec![0],
        keepdim: false,
    };
    let pair = TensorRef::f32(&partials, &pair);
    if part_op == *op {
        return dev.launch_whole(&combine, &[pair], &[out], &[]);
    }
    let total = dev.scratch(4 * numel)?;
    let dense = Layout::contiguous(shape);
    let sum = TensorRef::f32(&total, &dense);
    dev.launch_whole(&combine, &[pair], &[sum], &[])?;
    let count: usize = axes.iter().map(|&a| l.shape[a]).product();
    dev.launch_whole(
        &Op::Unary(UnaryOp::Affine),
        &[sum],
        &[out],
        &[1.0 / count as f64, 0.0],
    )
}

/// Halves of `0..size`.
fn halves(size: usize) -> [(usize, usize); 2] {
    [(0, size / 2), (size / 2, size - size / 2)]
}

/// Rotary embedding (`x [..., T, D]`, tables `[T, D/2]`, row-major) in halves of `x`'s
/// outermost dimension longer than one, recursively, until each part fits; where that is
/// the sequence, the tables' rows split with it.
fn rotary_windows(
    dev: &dyn PartLauncher,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    if dev.fits(inputs) && dev.fits(outputs) {
        return dev.launch_whole(op, inputs, outputs, s);
    }
    let x = inputs[0].layout;
    let r = x.rank();
    let Some(dim) = (0..r - 1).find(|&d| x.shape[d] > 1) else {
        return Err(too_large(dev, op, inputs, outputs));
    };
    let size = x.shape[dim];
    on_halves(
        dev,
        op,
        inputs,
        outputs,
        s,
        size,
        rotary_windows,
        |start, len| {
            let li = inputs
                .iter()
                .enumerate()
                .map(|(k, t)| match (k, dim == r - 2) {
                    (0, _) => t.layout.narrow(dim, start, len),
                    (_, true) => t.layout.narrow(0, start, len),
                    (_, false) => t.layout.clone(),
                })
                .collect();
            (li, vec![outputs[0].layout.narrow(dim, start, len)])
        },
    )
}

/// Attention or its backward in halves of the batch, then of the key/value heads (each with
/// its query heads), recursively, until each part fits: every part is whole heads, computed
/// as in one launch. A single head wider than a binding is `Unsupported`.
fn attention_windows(
    dev: &dyn PartLauncher,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    if dev.fits(inputs) && dev.fits(outputs) {
        return dev.launch_whole(op, inputs, outputs, s);
    }
    let (q, kv) = (&inputs[0].layout.shape, &inputs[1].layout.shape);
    let group = q[1] / kv[1].max(1);
    let (dim, size, per_query) = match (q[0], kv[1]) {
        (b, _) if b > 1 => (0, b, 1),
        (_, h) if h > 1 => (1, h, group),
        _ => return Err(too_large(dev, op, inputs, outputs)),
    };
    // Keys and values (and their gradients) are the tensors with the key/value heads.
    let backward = matches!(op, Op::AttentionBackward { .. });
    let of_keys = |output: bool, k: usize| matches!(k, 1 | 2) && (backward || !output);
    let narrow = |list: &[TensorRef<'_>], output: bool, start: usize, len: usize| {
        list.iter()
            .enumerate()
            .map(|(k, t)| match of_keys(output, k) {
                true => t.layout.narrow(dim, start, len),
                false => t.layout.narrow(dim, start * per_query, len * per_query),
            })
            .collect()
    };
    on_halves(
        dev,
        op,
        inputs,
        outputs,
        s,
        size,
        attention_windows,
        |start, len| {
            (
                narrow(inputs, false, start, len),
                narrow(outputs, true, start, len),
            )
        },
    )
}

/// Creation, random and optimizer ops over flat ranges that fit: row-major operands of the
/// output's element count are narrowed, others (an optimizer's gradient scale) bound whole.
fn flat_ranges(
    dev: &dyn PartLauncher,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    let all: Vec<TensorRef<'_>> = inputs.iter().chain(outputs).cloned().collect();
    if all.iter().any(|t| !t.layout.is_contiguous()) {
        return Err(too_large(dev, op, inputs, outputs));
    }
    let n = outputs[0].layout.numel();
    let part = flat_part(dev, &all);
    let range = |list: &[TensorRef<'_>], first: usize, len: usize| -> Vec<Layout> {
        list.iter()
            .map(|t| match t.layout.numel() == n {
                true => t.layout.flat().narrow(0, first, len),
                false => t.layout.clone(),
            })
            .collect()
    };
    for first in (0..n).step_by(part) {
        let len = part.min(n - first);
        let (li, lo) = (range(inputs, first, len), range(outputs, first, len));
        let (i, o) = (
            TensorRef::with_layouts(inputs, &li),
            TensorRef::with_layouts(outputs, &lo),
        );
        match op {
            Op::Fill { .. }
            | Op::Arange { .. }
            | Op::RandUniform { .. }
            | Op::RandNormal { .. } => dev.launch_part(op, &i, &o, s, Part::at(first))?,
            _ => dev.launch_whole(op, &i, &o, s)?,
        }
    }
    Ok(())
}

/// `layout` narrowed off `axis` to `extent`'s sizes: the part of `x` a gather reads, or of a
/// scatter-add's output its sources reach.
fn within(layout: &Layout, extent: &Layout, axis: usize) -> Layout {
    (0..layout.rank())
        .filter(|&d| d != axis)
        .fold(layout.clone(), |l, d| l.narrow(d, 0, extent.shape[d]))
}

/// Gather over windows. `x` is first narrowed off the axis to the index's extent (it reads
/// nothing beyond). Then halves of the dimension along which the widest operand reaches
/// furthest, recursively: off the axis, all three split alike; along it, the index and output
/// split with `x` whole, or `x` splits into windows of rows, each launch writing the outputs
/// whose indices fall in its window, as embedding does. Every output reads the element it
/// reads in one launch.
fn gather_windows(
    dev: &dyn PartLauncher,
    axis: usize,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    let (x, idx, out) = (inputs[0], inputs[1], outputs[0]);
    let rows = x.layout.shape[axis];
    let read = within(x.layout, idx.layout, axis);
    gather_parts(dev, axis, [x.with_layout(&read), idx, out], 0, rows)
}

/// A gather part `[x, index, out]`, `x` holding rows `first..` of `rows` along the axis.
fn gather_parts(
    dev: &dyn PartLauncher,
    axis: usize,
    parts: [TensorRef<'_>; 3],
    first: usize,
    rows: usize,
) -> Result<()> {
    let [x, idx, out] = parts;
    if dev.fits(&parts) {
        let part = Part {
            rows: Some(rows),
            ..Part::at(first)
        };
        return dev.launch_part(&Op::Gather { axis }, &[x, idx], &[out], &[], part);
    }
    let op = Op::Gather { axis };
    halve_on_axis(dev, &op, axis, parts, 0, first, &|parts, first| {
        gather_parts(dev, axis, parts, first, rows)
    })
}

/// Runs `part` on halves of a gather's or scatter-add's operands `parts` (inputs, then the
/// output) along the dimension that the widest reaches furthest, with the first row along
/// the axis of the `lone` operand's part (gather's `x`, scatter-add's output): off the axis
/// all three split alike; along it the `lone` operand splits alone where it is the widest,
/// else the other two do.
fn halve_on_axis(
    dev: &dyn PartLauncher,
    op: &Op,
    axis: usize,
    parts: [TensorRef<'_>; 3],
    lone: usize,
    first: usize,
    part: &dyn Fn([TensorRef<'_>; 3], usize) -> Result<()>,
) -> Result<()> {
    let widest = (0..3).max_by_key(|&k| dev.binding_bytes(&parts[k]));
    let Some((widest, dim)) = widest.and_then(|k| Some((k, parts[k].layout.furthest_dim()?)))
    else {
        return Err(too_large(dev, op, &parts[..2], &parts[2..]));
    };
    let alone = dim == axis && widest == lone;
    for (start, len) in halves(parts[widest].layout.shape[dim]) {
        let splits = |k: usize| dim != axis || (k == lone) == (widest == lone);
        let layouts: Vec<Layout> = (0..3)
            .map(|k| match splits(k) {
                true => parts[k].layout.narrow(dim, start, len),
                false => parts[k].layout.clone(),
            })
            .collect();
        let first = if alone { first + start } else { first };
        part([0, 1, 2].map(|k| parts[k].with_layout(&layouts[k])), first)?;
    }
    Ok(())
}

/// Scatter-add over windows: the output is zeroed, then its part that the sources reach (off
/// the axis, the index's extent) runs in halves of the dimension along which the widest
/// operand reaches furthest, recursively, each part adding its sums onto the output: off the
/// axis all three split alike; along it, the output splits into ranges of targets with the
/// sources whole, or the sources split with the output whole. Each output still adds its
/// sources in source order, so f32 results are those of one launch; 16-bit outputs round
/// between parts of the sources.
fn scatter_add_windows(
    dev: &dyn PartLauncher,
    axis: usize,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    let (idx, src, out) = (inputs[0], inputs[1], outputs[0]);
    launch(
        dev,
        &Op::Fill { dtype: out.dtype },
        &[],
        &outputs[..1],
        &[0.0],
    )?;
    let reached = within(out.layout, idx.layout, axis);
    if reached.numel() == 0 || idx.layout.numel() == 0 {
        return Ok(());
    }
    scatter_add_parts(dev, axis, [idx, src, out.with_layout(&reached)], 0)
}

/// A scatter-add part `[index, src, out]`, `out` starting at target `first` along the axis.
fn scatter_add_parts(
    dev: &dyn PartLauncher,
    axis: usize,
    parts: [TensorRef<'_>; 3],
    first: usize,
) -> Result<()> {
    let [idx, src, out] = parts;
    if dev.fits(&parts) {
        let part = Part {
            accumulate: true,
            ..Part::at(first)
        };
        return dev.launch_part(&Op::ScatterAdd { axis }, &[idx, src], &[out], &[], part);
    }
    let op = Op::ScatterAdd { axis };
    halve_on_axis(dev, &op, axis, parts, 2, first, &|parts, first| {
        scatter_add_parts(dev, axis, parts, first)
    })
}
