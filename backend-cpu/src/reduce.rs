//! Reductions over any axes, argmax, softmax and log-softmax with their backward ops.
//!
//! A reduction reads its input through a permuted layout that puts the kept axes first and the
//! reduced axes last, so each output element is the reduction of one contiguous run.

use rayon::prelude::*;
use tessera_core::{numel, Op, ReduceOp, Result, TensorRef};

use crate::buffer::{read, read_layout, write};
use crate::float::{computes_in_f64, fixed_sum, rows_per_task, Float};
use crate::wrong_family;

pub(crate) fn launch(op: &Op, inputs: &[TensorRef<'_>], outputs: &[TensorRef<'_>]) -> Result<()> {
    if computes_in_f64(inputs[0].dtype) {
        run::<f64>(op, inputs, outputs)
    } else {
        run::<f32>(op, inputs, outputs)
    }
}

fn run<F: Float>(op: &Op, inputs: &[TensorRef<'_>], outputs: &[TensorRef<'_>]) -> Result<()> {
    let x = &inputs[0];
    match op {
        Op::Reduce { op: kind, axes, .. } => {
            let (data, len) = read_reduced::<F>(x, axes)?;
            let outn = numel(&outputs[0].layout.shape);
            let out: Vec<F> = if len == 0 {
                let empty = match kind {
                    ReduceOp::Sum => F::zero(),
                    _ => F::nan(),
                };
                vec![empty; outn]
            } else {
                data.par_chunks(len)
                    .with_min_len(rows_per_task(len))
                    .map(|run| reduce(*kind, run))
                    .collect()
            };
            write(&outputs[0], &out)
        }
        Op::ArgMax { axis, .. } => {
            let (data, len) = read_reduced::<F>(x, &[*axis])?;
            let out: Vec<f64> = if len == 0 {
                Vec::new()
            } else {
                data.par_chunks(len)
                    .with_min_len(rows_per_task(len))
                    .map(|run| argmax(run) as f64)
                    .collect()
            };
            write(&outputs[0], &out)
        }
        Op::Softmax | Op::LogSoftmax | Op::SoftmaxBackward | Op::LogSoftmaxBackward => {
            let n = x.layout.shape.last().copied().unwrap_or(1);
            let mut y = read::<F>(x)?;
            if y.is_empty() {
                return Ok(());
            }
            let dy = if inputs.len() > 1 {
                read::<F>(&inputs[1])?
            } else {
                Vec::new()
            };
            let rows = rows_per_task(n);
            match op {
                Op::Softmax => y
                    .par_chunks_mut(n)
                    .with_min_len(rows)
                    .for_each(|r| softmax_row(r, false)),
                Op::LogSoftmax => y
                    .par_chunks_mut(n)
                    .with_min_len(rows)
                    .for_each(|r| softmax_row(r, true)),
                Op::SoftmaxBackward => y
                    .par_chunks_mut(n)
                    .zip(dy.par_chunks(n))
                    .with_min_len(rows)
                    .for_each(|(y, dy)| {
                        let dot = y
                            .iter()
                            .zip(dy)
                            .fold(F::zero(), |acc, (&a, &b)| acc + b * a);
                        for (v, &g) in y.iter_mut().zip(dy) {
                            *v *= g - dot;
                        }
                    }),
                _ => y
                    .par_chunks_mut(n)
                    .zip(dy.par_chunks(n))
                    .with_min_len(rows)
                    .for_each(|(y, dy)| {
                        let sum = dy.iter().fold(F::zero(), |acc, &g| acc + g);
                        for (v, &g) in y.iter_mut().zip(dy) {
                            *v = g - v.exp() * sum;
                        }
                    }),
            }
            write(&outputs[0], &y)
        }
        _ => Err(wrong_family(op)),
    }
}

/// The input with the kept axes first and `axes` last (row-major), and the length of the run
/// each output element reduces.
fn read_reduced<F: Float>(x: &TensorRef<'_>, axes: &[usize]) -> Result<(Vec<F>, usize)> {
    let rank = x.layout.rank();
    let perm: Vec<usize> = (0..rank)
        .filter(|d| !axes.contains(d))
        .chain(axes.iter().copied())
        .collect();
    let layout = x.layout.permute(&perm);
    let len = axes.iter().map(|&a| x.layout.shape[a]).product();
    Ok((read_layout::<F>(x.buffer, x.dtype, &layout)?, len))
}

fn reduce<F: Float>(kind: ReduceOp, run: &[F]) -> F {
    match kind {
        ReduceOp::Sum => fixed_sum(run.len(), |i| run[i]),
        ReduceOp::Mean => fixed_sum(run.len(), |i| run[i]) / F::of_f64(run.len() as f64),
        ReduceOp::Max | ReduceOp::Min => {
            let max = kind == ReduceOp::Max;
            run[1..].iter().fold(run[0], |acc, &v| {
                if acc.is_nan() || v.is_nan() {
                    F::nan()
                } else if max {
                    acc.max(v)
                } else {
                    acc.min(v)
                }
            })
        }
    }
}

/// The first index of the largest value; a NaN counts as the largest.
fn argmax<F: Float>(run: &[F]) -> usize {
    let mut best = 0;
    for (i, &v) in run.iter().enumerate().skip(1) {
        if run[best].is_nan() {
            break;
        }
        if v.is_nan() || v > run[best] {
            best = i;
        }
    }
    best
}

/// Softmax (or log-softmax) of one row in place, with the row maximum subtracted first.
pub(crate) fn softmax_row<F: Float>(row: &mut [F], log: bool) {
    let max = row.iter().fold(
        F::neg_infinity(),
        |m, &v| if v > m || v.is_nan() { v } else { m },
    );
    if log {
        let sum = row.iter().fold(F::zero(), |acc, &v| acc + (v - max).exp());
        let lse = sum.ln();
        for v in row.iter_mut() {
            *v = *v - max - lse;
        }
    } else {
        for v in row.iter_mut() {
            *v = (*v - max).exp();
        }
        let sum = row.iter().fold(F::zero(), |acc, &v| acc + v);
        for v in row.iter_mut() {
            *v /= sum;
        }
    }
}
