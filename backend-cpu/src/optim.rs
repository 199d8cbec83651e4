//! Optimizer updates and the global squared gradient norm.
//!
//! Updates may write their outputs into their input buffers: every input is read into an
//! owned vector before any output is written.

use rayon::prelude::*;
use tessera_core::ops::{per_param_operands, updated_params};
use tessera_core::{Op, Result, TensorRef};

use crate::buffer::{read, write};
use crate::float::{computes_in_f64, fixed_sum, Float, GRAIN};
use crate::wrong_family;

pub(crate) fn launch(
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    // A group's Adam update: each parameter on its own.
    if updated_params(op, inputs.len()) > 1 {
        for (ins, outs) in per_param_operands(op, inputs, outputs) {
            launch(op, &ins, &outs, s)?;
        }
        return Ok(());
    }
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
    if let Op::SquaredNorm = op {
        let mut total = F::zero();
        for t in inputs {
            let x = read::<F>(t)?;
            total += fixed_sum(x.len(), |i| x[i] * x[i]);
        }
        return write(&outputs[0], &[total]);
    }
    let mut param = read::<F>(&inputs[0])?;
    let grad = read::<F>(&inputs[1])?;
    // SGD's last input is grad_scale; Adam's, the step's values, grad_scale first.
    let step_values = read::<F>(&inputs[inputs.len() - 1])?;
    let scale = step_values.first().copied().unwrap_or_else(F::one);
    match op {
        Op::AdamUpdate {
            decoupled_weight_decay,
        } => {
            let (mut m, mut v) = (read::<F>(&inputs[2])?, read::<F>(&inputs[3])?);
            let [beta1, beta2, eps, wd] = [s[0], s[1], s[2], s[3]];
            // The step's factors, formed on the host in f64 and rounded to f32 (`adam_factors`).
            let [step, decay, bc2_sqrt] = [step_values[1], step_values[2], step_values[3]];
            let (b1, b2, wd) = (F::of_f64(beta1), F::of_f64(beta2), F::of_f64(wd));
            let (c1, c2, eps) = (
                F::of_f64(1.0 - beta1),
                F::of_f64(1.0 - beta2),
                F::of_f64(eps),
            );
            param
                .par_iter_mut()
                .zip(m.par_iter_mut().zip(v.par_iter_mut()))
                .zip(&grad)
                .with_min_len(GRAIN)
                .for_each(|((p, (m, v)), &g)| {
                    let mut g = g * scale;
                    if *decoupled_weight_decay {
                        *p *= decay;
                    } else {
                        g += wd * *p;
                    }
                    *m = b1 * *m + c1 * g;
                    *v = b2 * *v + c2 * g * g;
                    *p -= step * (*m / (v.sqrt() / bc2_sqrt + eps));
                });
            write(&outputs[0], &param)?;
            write(&outputs[1], &m)?;
            write(&outputs[2], &v)
        }
        Op::SgdUpdate {
            momentum: has_momentum,
            nesterov,
        } => {
            let (lr, momentum, coef, wd) = (
                F::of_f64(s[0]),
                F::of_f64(s[1]),
                F::of_f64(s[2]),
                F::of_f64(s[3]),
            );
            let mut buf = if *has_momentum {
                read::<F>(&inputs[2])?
            } else {
                vec![F::zero(); param.len()]
            };
            param
                .par_iter_mut()
                .zip(buf.par_iter_mut())
                .zip(&grad)
                .with_min_len(GRAIN)
                .for_each(|((p, b), &g)| {
                    let mut d = g * scale + wd * *p;
                    if *has_momentum {
                        *b = momentum * *b + coef * d;
                        d = if *nesterov { d + momentum * *b } else { *b };
                    }
                    *p -= lr * d;
                });
            write(&outputs[0], &param)?;
            if *has_momentum {
                write(&outputs[1], &buf)?;
            }
            Ok(())
        }
        _ => Err(wrong_family(op)),
    }
}
