//! Gather and scatter-add over windows of their operands, each part told where it lies.

use crate::{Layout, Op, Result, TensorRef};

use super::flat::flat_ranges;
use super::part::{halves, on_halves, too_large, Part, PartLauncher};

/// `layout` narrowed off `axis` to `extent`'s sizes: the part of `x` a gather reads, or of a
/// scatter-add's output its sources reach.
pub(super) fn within(layout: &Layout, extent: &Layout, axis: usize) -> Layout {
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
pub(super) fn gather_windows(
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
pub(super) fn gather_parts(
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
pub(super) fn halve_on_axis(
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
pub(super) fn scatter_add_windows(
    dev: &dyn PartLauncher,
    axis: usize,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    let (idx, src, out) = (inputs[0], inputs[1], outputs[0]);
    let zero = Op::Fill { dtype: out.dtype };
    match dev.fits(&outputs[..1]) {
        true => dev.launch_whole(&zero, &[], &outputs[..1], &[0.0])?,
        false => flat_ranges(dev, &zero, &[], &outputs[..1], &[0.0])?,
    }
    let reached = within(out.layout, idx.layout, axis);
    if reached.numel() == 0 || idx.layout.numel() == 0 {
        return Ok(());
    }
    scatter_add_parts(dev, axis, [idx, src, out.with_layout(&reached)], 0)
}

/// A scatter-add part `[index, src, out]`, `out` starting at target `first` along the axis.
pub(super) fn scatter_add_parts(
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

/// An index copy in halves of the outermost dimension longer than one (of `dst`, `src` and
/// the output alike), recursively, until each part fits; parts stay row-major, so that
/// dimension must come before `axis`. The index is whole in every part.
pub(super) fn index_copy_windows(
    dev: &dyn PartLauncher,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    if dev.fits(inputs) && dev.fits(outputs) {
        return dev.launch_whole(op, inputs, outputs, s);
    }
    let Op::IndexCopy { axis } = op else {
        return Err(too_large(dev, op, inputs, outputs));
    };
    let dst = &inputs[0].layout.shape;
    let dim = match (0..dst.len()).find(|&d| dst[d] > 1) {
        Some(d) if d < *axis => d,
        _ => return Err(too_large(dev, op, inputs, outputs)),
    };
    on_halves(
        dev,
        op,
        inputs,
        outputs,
        s,
        dst[dim],
        index_copy_windows,
        |start, len| {
            let li = inputs
                .iter()
                .enumerate()
                .map(|(k, t)| match k {
                    1 => t.layout.clone(),
                    _ => t.layout.narrow(dim, start, len),
                })
                .collect();
            (li, vec![outputs[0].layout.narrow(dim, start, len)])
        },
    )
}
