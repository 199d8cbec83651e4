//! Optimizer updates and the global gradient norm.
//!
//! Every update reads `grad * grad_scale`, where `grad_scale` is an f32 on the device (the
//! first element of its last input): gradient clipping and loss-scale removal multiply
//! through it without a host round trip. Updates write their outputs in place (outputs may be
//! the input buffers).
//!
//! - `AdamUpdate { decoupled_weight_decay }`: the parameters of a group in one launch:
//!   `(param_1..param_n, grad_1..grad_n, m_1..m_n, v_1..v_n, step)` to
//!   `(param_1..param_n, m_1..m_n, v_1..v_n)`, n >= 1, each parameter's four tensors of one
//!   shape, all of one float dtype; each parameter updates on its own. Scalars `beta1,
//!   beta2, eps, weight_decay`. What changes from step to step comes from the device, so
//!   that a recorded step replays with new values: `step` is `[4]` of the statistics dtype (f32; f64 for f64 parameters),
//!   `[grad_scale, step_size, decay, sqrt_bc2]`, the last three `[lr / bias_correction1,
//!   1 - lr * weight_decay, sqrt(bias_correction2)]` formed on the host in f64 from the
//!   corrections `1 - beta^t` ([`adam_factors`]) and rounded once to that dtype.
//!   With `g = grad * grad_scale`: AdamW (decoupled) first sets `param *= decay`; Adam
//!   instead uses `g += weight_decay * param`. Then `m = beta1 m + (1 - beta1) g`,
//!   `v = beta2 v + (1 - beta2) g^2`, `param -= step_size * m / (sqrt(v) / sqrt_bc2 + eps)`,
//!   exactly PyTorch's formula.
//! - `SgdUpdate { momentum, nesterov }`: `(param, grad, [buf,] grad_scale)` to
//!   `(param, [buf])`. Scalars `lr, momentum, grad_coef, weight_decay`. With
//!   `d = grad * scale + weight_decay * param`: if `momentum`, `buf = momentum buf + grad_coef d`
//!   (`grad_coef` is `1 - dampening`, or 1 on the first step, where PyTorch copies `d`) and `d`
//!   becomes `d + momentum buf` (Nesterov) or `buf`. Then `param -= lr d`.
//! - `SquaredNorm`: one or more float tensors of one dtype to `[1]`, the sum of the squares of
//!   all their elements (f32, f64 for f64), accumulated in a fixed order.

use super::{require_float, require_same_dtype, specs_str, stats_dtype, Op, TensorSpec};
use crate::{DType, Error, Result};

pub(super) fn infer(op: &Op, name: &str, inputs: &[TensorSpec]) -> Result<Vec<TensorSpec>> {
    if inputs.is_empty() {
        return Err(Error::invalid(name, "needs at least one input"));
    }
    let all: Vec<usize> = (0..inputs.len()).collect();
    if matches!(op, Op::SquaredNorm) {
        require_float(name, inputs, &all)?;
        require_same_dtype(name, inputs, &all)?;
        return Ok(vec![TensorSpec::new(&[1], stats_dtype(inputs[0].dtype))]);
    }
    let state = &all[..inputs.len() - 1];
    require_float(name, inputs, state)?;
    require_same_dtype(name, inputs, state)?;
    // Inputs per parameter: (param, grad, m, v) for Adam, one tensor per role, the roles in
    // blocks of `params`; SGD updates one parameter.
    let params = match op {
        Op::AdamUpdate { .. } if state.len().is_multiple_of(4) => state.len() / 4,
        Op::AdamUpdate { .. } => {
            return Err(Error::invalid(
                name,
                format!(
                    "needs a parameter, a gradient, m and v for each parameter, then the step's values; got {}",
                    specs_str(inputs)
                ),
            ))
        }
        _ => 1,
    };
    let bad = state
        .iter()
        .find(|&&i| inputs[i].shape != inputs[i % params].shape);
    if let Some(bad) = bad {
        return Err(Error::shape(
            name,
            format!(
                "input {bad} must match the shape of parameter {}; got {}",
                bad % params,
                specs_str(inputs)
            ),
        ));
    }
    let scale = &inputs[inputs.len() - 1];
    let (len, dtype, what) = match op {
        Op::AdamUpdate { .. } => (
            4,
            stats_dtype(inputs[0].dtype),
            "the step's values must be [4] of the statistics dtype (f32; f64 for f64 parameters): grad scale, step size, decay, sqrt of bias correction 2",
        ),
        _ => (1, DType::F32, "grad_scale must be [1] f32"),
    };
    if scale.shape != [len] || scale.dtype != dtype {
        return Err(Error::shape(
            name,
            format!("{what}; got {}", specs_str(inputs)),
        ));
    }
    let roles = match op {
        Op::AdamUpdate { .. } => 3,
        Op::SgdUpdate { momentum, .. } => 1 + usize::from(*momentum),
        _ => unreachable!("not an optimizer op: {op:?}"),
    };
    Ok((0..roles)
        .flat_map(|_| inputs[..params].iter().cloned())
        .collect())
}

/// The last three of `AdamUpdate`'s step values for learning rate `lr`, weight decay
/// `weight_decay` and bias corrections `1 - beta^t`: `[lr / bc1, 1 - lr * weight_decay,
/// sqrt(bc2)]`, in f64 (the step tensor rounds them once to its dtype).
pub fn adam_factors(lr: f64, weight_decay: f64, bc1: f64, bc2: f64) -> [f64; 3] {
    [lr / bc1, 1.0 - lr * weight_decay, bc2.sqrt()]
}
