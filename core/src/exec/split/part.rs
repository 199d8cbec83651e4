//! What splitting needs from a device, where a part lies in the whole op, and the helpers
//! every way of splitting shares.

use std::sync::Arc;

use crate::{Buffer, DType, Error, Layout, Limits, Op, Result, TensorRef};

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

/// The signature of the functions that split an op's launch into parts.
pub(super) type Windowed =
    fn(&dyn PartLauncher, &Op, &[TensorRef<'_>], &[TensorRef<'_>], &[f64]) -> Result<()>;

/// Runs `part` (which splits further where needed) on each half of `0..size`, with the
/// operands' layouts that `narrow` gives for a range of it.
#[allow(clippy::too_many_arguments)]
pub(super) fn on_halves(
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

/// Halves of `0..size`.
pub(super) fn halves(size: usize) -> [(usize, usize); 2] {
    [(0, size / 2), (size / 2, size - size / 2)]
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
