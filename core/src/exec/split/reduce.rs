//! Reductions and argmax over windows, with partial results along reduced dimensions.

use crate::{DType, Layout, Op, ReduceOp, Result, TensorRef, UnaryOp};

use super::part::{halves, too_large, Part, PartLauncher};

/// A reduction (or argmax) over windows: halves of the dimension along which the input
/// reaches furthest, recursively, until each part fits. A kept dimension splits input and
/// output alike. A reduced one splits the input into two halves reduced into f32 partial
/// results (sums for a mean), which a reduction over the pair combines (a mean's sum then
/// scaled by one over the count): deterministic, and for sums and means rounded differently
/// from one launch. Argmax's halves give their maxima and the indices of those (counted from
/// `first`, the index of the input's first element along the reduced axis), and the argmax
/// of each pair of maxima picks one of the pair's indices: the first on ties, as one launch.
pub(super) fn reduce_windows(
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
