//! Reductions and softmax.
//!
//! - `Reduce { op, axes, keepdim }`: float `x` reduced over `axes` (sorted, distinct, each
//!   below the rank; empty `axes` copies). `Sum` of nothing is 0, `Mean` of nothing is NaN,
//!   `Max`/`Min` need at least one element per output. `Max`/`Min` propagate NaN. Every
//!   backend accumulates in f32 (f64 for f64) in a fixed order, so results are deterministic.
//! - `ArgMax { axis, keepdim }`: the index (i32) of the largest value along `axis`; the first
//!   one on ties; a NaN counts as the largest.
//! - `Softmax`, `LogSoftmax`: over the last axis, with the maximum subtracted first.
//! - `SoftmaxBackward`: `(y, dy)` to `dx = y * (dy - sum(dy * y))`.
//! - `LogSoftmaxBackward`: `(y, dy)` to `dx = dy - exp(y) * sum(dy)`, with `y` the log-softmax.

use super::{require_float, require_same_dtype, Op, TensorSpec};
use crate::{DType, Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min];

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

/// The output shape of reducing `shape` over `axes`.
pub fn reduced_shape(shape: &[usize], axes: &[usize], keepdim: bool) -> Vec<usize> {
    let mut out = Vec::with_capacity(shape.len());
    for (i, &d) in shape.iter().enumerate() {
        if axes.contains(&i) {
            if keepdim {
                out.push(1);
            }
        } else {
            out.push(d);
        }
    }
    out
}

pub(super) fn infer(op: &Op, name: &str, inputs: &[TensorSpec]) -> Result<Vec<TensorSpec>> {
    require_float(name, inputs, &[0])?;
    let x = &inputs[0];
    let rank = x.shape.len();
    let axis_err = |axis: usize| Error::Axis {
        op: name.into(),
        axis: axis as isize,
        rank,
        shape: x.shape.clone(),
    };
    Ok(match op {
        Op::Reduce {
            op: kind,
            axes,
            keepdim,
        } => {
            if let Some(&bad) = axes.iter().find(|&&a| a >= rank) {
                return Err(axis_err(bad));
            }
            if axes.windows(2).any(|w| w[0] >= w[1]) {
                return Err(Error::invalid(
                    name,
                    format!("axes must be sorted and distinct; got {axes:?}"),
                ));
            }
            let out = reduced_shape(&x.shape, axes, *keepdim);
            let reduced: usize = axes.iter().map(|&a| x.shape[a]).product();
            if matches!(kind, ReduceOp::Max | ReduceOp::Min)
                && reduced == 0
                && out.iter().product::<usize>() > 0
            {
                return Err(Error::Empty {
                    op: name.into(),
                    shape: x.shape.clone(),
                });
            }
            vec![TensorSpec::new(&out, x.dtype)]
        }
        Op::ArgMax { axis, keepdim } => {
            if *axis >= rank {
                return Err(axis_err(*axis));
            }
            if x.shape[*axis] == 0 {
                return Err(Error::Empty {
                    op: name.into(),
                    shape: x.shape.clone(),
                });
            }
            vec![TensorSpec::new(
                &reduced_shape(&x.shape, &[*axis], *keepdim),
                DType::I32,
            )]
        }
        Op::Softmax | Op::LogSoftmax | Op::SoftmaxBackward | Op::LogSoftmaxBackward => {
            if rank == 0 {
                return Err(axis_err(0));
            }
            if inputs.len() == 2 {
                require_float(name, inputs, &[1])?;
                require_same_dtype(name, inputs, &[0, 1])?;
                if inputs[1].shape != x.shape {
                    return Err(Error::shape(
                        name,
                        format!("y {:?} and dy {:?} differ", x.shape, inputs[1].shape),
                    ));
                }
            }
            vec![x.clone()]
        }
        _ => unreachable!("not a reduce op: {op:?}"),
    })
}
