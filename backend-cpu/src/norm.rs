//! Layer norm and RMS norm over the last axis, forward and backward.
//!
//! Rows run in parallel. The weight and bias gradients are sums over rows; they are taken per
//! block of columns, each block looping over the rows in order, so they are deterministic.

use rayon::prelude::*;
use tessera_core::{Op, Result, TensorRef};

use crate::buffer::{read, write};
use crate::float::{computes_in_f64, rows_per_task, Float};
use crate::wrong_family;

/// Columns per task when summing weight gradients over rows.
const COLUMN_BLOCK: usize = 64;

pub(crate) fn launch(
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    if computes_in_f64(inputs[0].dtype) {
        run::<f64>(op, inputs, outputs, s)
    } else {
        run::<f32>(op, inputs, outputs, s)
    }
}

fn run<F: Float>(
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    let n = inputs[0].layout.shape.last().copied().unwrap_or(1).max(1);
    let x = read::<F>(&inputs[0])?;
    let w = read::<F>(&inputs[1])?;
    let rows = x.len() / n;
    let per_task = rows_per_task(n);
    let nf = F::of_f64(n as f64);
    match op {
        Op::LayerNorm => {
            let eps = F::of_f64(s[0]);
            let b = read::<F>(&inputs[2])?;
            let mut y = vec![F::zero(); x.len()];
            let mut mean = vec![F::zero(); rows];
            let mut rstd = vec![F::zero(); rows];
            y.par_chunks_mut(n)
                .zip(x.par_chunks(n))
                .zip(mean.par_iter_mut().zip(rstd.par_iter_mut()))
                .with_min_len(per_task)
                .for_each(|((y, x), (mean, rstd))| {
                    let mu = x.iter().fold(F::zero(), |a, &v| a + v) / nf;
                    let var = x.iter().fold(F::zero(), |a, &v| a + (v - mu) * (v - mu)) / nf;
                    let r = F::one() / (var + eps).sqrt();
                    for (j, out) in y.iter_mut().enumerate() {
                        *out = (x[j] - mu) * r * w[j] + b[j];
                    }
                    (*mean, *rstd) = (mu, r);
                });
            write(&outputs[0], &y)?;
            write(&outputs[1], &mean)?;
            write(&outputs[2], &rstd)
        }
        Op::RmsNorm => {
            let eps = F::of_f64(s[0]);
            let mut y = vec![F::zero(); x.len()];
            let mut rstd = vec![F::zero(); rows];
            y.par_chunks_mut(n)
                .zip(x.par_chunks(n))
                .zip(rstd.par_iter_mut())
                .with_min_len(per_task)
                .for_each(|((y, x), rstd)| {
                    let ms = x.iter().fold(F::zero(), |a, &v| a + v * v) / nf;
                    let r = F::one() / (ms + eps).sqrt();
                    for (j, out) in y.iter_mut().enumerate() {
                        *out = x[j] * r * w[j];
                    }
                    *rstd = r;
                });
            write(&outputs[0], &y)?;
            write(&outputs[1], &rstd)
        }
        Op::LayerNormBackward | Op::RmsNormBackward => {
            let layer = matches!(op, Op::LayerNormBackward);
            let (mean, rstd, dy) = if layer {
                (
                    read::<F>(&inputs[2])?,
                    read::<F>(&inputs[3])?,
                    read::<F>(&inputs[4])?,
                )
            } else {
                (
                    vec![F::zero(); rows],
                    read::<F>(&inputs[2])?,
                    read::<F>(&inputs[3])?,
                )
            };
            let xhat = |row: usize, j: usize| (x[row * n + j] - mean[row]) * rstd[row];
            // dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy w; RMS norm has no
            // mean term.
            let mut dx = vec![F::zero(); x.len()];
            dx.par_chunks_mut(n)
                .enumerate()
                .with_min_len(per_task)
                .for_each(|(row, dx)| {
                    let dy = &dy[row * n..(row + 1) * n];
                    let (mut sum_g, mut sum_gx) = (F::zero(), F::zero());
                    for j in 0..n {
                        let g = dy[j] * w[j];
                        sum_g += g;
                        sum_gx += g * xhat(row, j);
                    }
                    let mean_g = if layer { sum_g / nf } else { F::zero() };
                    let mean_gx = sum_gx / nf;
                    for (j, out) in dx.iter_mut().enumerate() {
                        *out = rstd[row] * (dy[j] * w[j] - mean_g - xhat(row, j) * mean_gx);
                    }
                });
            let mut dw = vec![F::zero(); n];
            let mut db = vec![F::zero(); n];
            dw.par_chunks_mut(COLUMN_BLOCK)
                .zip(db.par_chunks_mut(COLUMN_BLOCK))
                .enumerate()
                .for_each(|(block, (dw, db))| {
                    let start = block * COLUMN_BLOCK;
                    for row in 0..rows {
                        for (c, (dw, db)) in dw.iter_mut().zip(db.iter_mut()).enumerate() {
                            let j = start + c;
                            let g = dy[row * n + j];
                            *dw += g * xhat(row, j);
                            *db += g;
                        }
                    }
                });
            write(&outputs[0], &dx)?;
            write(&outputs[1], &dw)?;
            if layer {
                write(&outputs[2], &db)?;
            }
            Ok(())
        }
        _ => Err(wrong_family(op)),
    }
}
