//! Optimizer updates and the global gradient norm.
//!
//! Every update reads `grad * grad_scale[0]`, where `grad_scale` is a `[1]` f32 tensor on the
//! device: gradient clipping and loss-scale removal multiply through it without a host round
//! trip. Updates write their outputs in place (outputs may be the input buffers).
//!
//! - `AdamUpdate { decoupled_weight_decay }`: `(param, grad, m, v, grad_scale)` to
//!   `(param, m, v)`, one float dtype for the first four. Scalars `lr, beta1, beta2, eps,
//!   weight_decay, bias_correction1, bias_correction2`, the corrections `1 - beta^t` computed
//!   on the host in f64. With `g = grad * scale`: AdamW (decoupled) first sets
//!   `param *= 1 - lr * weight_decay`; Adam instead uses `g += weight_decay * param`. Then
//!   `m = beta1 m + (1 - beta1) g`, `v = beta2 v + (1 - beta2) g^2`,
//!   `param -= (lr / bias_correction1) * m / (sqrt(v) / sqrt(bias_correction2) + eps)`,
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
    let p = &inputs[0];
    if let Some(bad) = state.iter().find(|&&i| inputs[i].shape != p.shape) {
        return Err(Error::shape(
            name,
            format!(
                "input {bad} must match the parameter's shape; got {}",
                specs_str(inputs)
            ),
        ));
    }
    let scale = &inputs[inputs.len() - 1];
    if scale.shape != [1] || scale.dtype != DType::F32 {
        return Err(Error::shape(
            name,
            format!("grad_scale must be [1] f32; got {}", specs_str(inputs)),
        ));
    }
    let outputs = match op {
        Op::AdamUpdate { .. } => 3,
        Op::SgdUpdate { momentum, .. } => 1 + usize::from(*momentum),
        _ => unreachable!("not an optimizer op: {op:?}"),
    };
    Ok(vec![p.clone(); outputs])
}
