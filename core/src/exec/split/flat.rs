//! Elementwise ops in halves; creation, random and optimizer ops over flat ranges.

use crate::{Layout, Op, Result, TensorRef};

use super::part::{flat_part, on_halves, too_large, Part, PartLauncher};

/// An elementwise op (every operand of the output's shape, outputs written through their
/// strides too) in two halves of the dimension along which the operand with the widest binding
/// reaches furthest, recursively, until each part fits.
pub(super) fn halve(
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

/// Creation, random and optimizer ops over flat ranges that fit: row-major operands of the
/// output's element count are narrowed, others (an optimizer's gradient scale) bound whole.
pub(super) fn flat_ranges(
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
