//! Fused cross-entropy, forward and backward, one parallel task per block of rows.

use rayon::prelude::*;
use tessera_core::{Op, Result, TensorRef};

use crate::buffer::{read, read_index, write};
use crate::float::{computes_in_f64, rows_per_task, Float};
use crate::wrong_family;

pub(crate) fn launch(op: &Op, inputs: &[TensorRef<'_>], outputs: &[TensorRef<'_>]) -> Result<()> {
    if computes_in_f64(inputs[0].dtype) {
        run::<f64>(op, inputs, outputs)
    } else {
        run::<f32>(op, inputs, outputs)
    }
}

/// The target column of a row, or `None` for targets outside `0..V` (ignored rows).
fn target(t: i64, vocab: usize) -> Option<usize> {
    usize::try_from(t).ok().filter(|&t| t < vocab)
}

fn run<F: Float>(op: &Op, inputs: &[TensorRef<'_>], outputs: &[TensorRef<'_>]) -> Result<()> {
    let vocab = inputs[0].layout.shape[1].max(1);
    let logits = read::<F>(&inputs[0])?;
    let targets = read_index(&inputs[1])?;
    let per_task = rows_per_task(vocab);
    match op {
        Op::CrossEntropy => {
            let (loss, lse): (Vec<F>, Vec<F>) = logits
                .par_chunks(vocab)
                .zip(&targets)
                .with_min_len(per_task)
                .map(|(row, &t)| {
                    let max =
                        row.iter().fold(
                            F::neg_infinity(),
                            |m, &v| if v > m || v.is_nan() { v } else { m },
                        );
                    let sum = row.iter().fold(F::zero(), |acc, &v| acc + (v - max).exp());
                    let lse = max + sum.ln();
                    let loss = target(t, vocab).map_or(F::zero(), |t| lse - row[t]);
                    (loss, lse)
                })
                .unzip();
            write(&outputs[0], &loss)?;
            write(&outputs[1], &lse)
        }
        Op::CrossEntropyBackward => {
            let (lse, dloss) = (read::<F>(&inputs[2])?, read::<F>(&inputs[3])?);
            let mut dlogits = logits;
            dlogits
                .par_chunks_mut(vocab)
                .enumerate()
                .with_min_len(per_task)
                .for_each(|(r, row)| {
                    let Some(t) = target(targets[r], vocab) else {
                        row.fill(F::zero());
                        return;
                    };
                    for (j, v) in row.iter_mut().enumerate() {
                        let onehot = if j == t { F::one() } else { F::zero() };
                        *v = ((*v - lse[r]).exp() - onehot) * dloss[r];
                    }
                });
            write(&outputs[0], &dlogits)
        }
        _ => Err(wrong_family(op)),
    }
}
