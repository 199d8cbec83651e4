//! Matrix multiplication with fused epilogues.
//!
//! `Matmul { bias, activation, residual }`: inputs `a [..., M, K]`, `b [..., K, N]`, then
//! `bias [N]` if `bias`, then `residual [..., M, N]` if `residual`. The batch dims of `a` and
//! `b` are equal (broadcast with stride-0 layouts); either operand may be transposed in place
//! through its strides. Output `[..., M, N] = act(a @ b + bias) + residual`, accumulated in f32
//! (f64 for f64). `activation` is one of relu, gelu (tanh) or silu. `K = 0` gives
//! `act(bias) + residual`.
//!
//! `NormMatmul { norm, bias, activation, residual }`: a matmul whose `a` is first normalized
//! row by row, as a pre-norm transformer feeds each projection. Inputs `x [M, K]`, `b [K, N]`,
//! the norm's `weight [K]` (and `shift [K]` for a layer norm, the norm op's bias), then `bias
//! [N]` and `residual [M, N]` as for `Matmul`; scalar `eps`. Output `act(y @ b + bias) +
//! residual` where `y` is what `LayerNorm` or `RmsNorm` computes for `x` (`K >= 1`): what the
//! two ops compute, one launch fewer. A backend may take `y` in f32 (a fused kernel) or
//! rounded to `x`'s dtype as the norm op stores it (the norm, then the product); in f16 and
//! bf16 the two differ by that rounding. Inference only (no backward); `x` is read row-major,
//! `b` through its strides.

use super::{require_float, require_same_dtype, specs_str, Op, TensorSpec};
use crate::{Error, Result};

pub(super) fn infer(op: &Op, name: &str, inputs: &[TensorSpec]) -> Result<Vec<TensorSpec>> {
    if let Op::NormMatmul { .. } = op {
        return infer_normed(op, name, inputs);
    }
    let Op::Matmul {
        bias,
        activation,
        residual,
    } = *op
    else {
        return Err(Error::invalid(name, "not a matmul"));
    };
    let all: Vec<usize> = (0..inputs.len()).collect();
    require_float(name, inputs, &all)?;
    require_same_dtype(name, inputs, &all)?;
    if let Some(act) = activation {
        if !act.is_epilogue_activation() {
            return Err(Error::invalid(
                name,
                format!("{} is not an epilogue activation", act.name()),
            ));
        }
    }
    let (a, b) = (&inputs[0].shape, &inputs[1].shape);
    if a.len() < 2 || b.len() != a.len() {
        return Err(Error::shape(
            name,
            format!(
                "need a [..., M, K] and b [..., K, N] of one rank >= 2; got {}",
                specs_str(inputs)
            ),
        ));
    }
    let r = a.len();
    let (m, k, k2, n) = (a[r - 2], a[r - 1], b[r - 2], b[r - 1]);
    if k != k2 || a[..r - 2] != b[..r - 2] {
        return Err(Error::shape(
            name,
            format!(
                "a [..., M, K] and b [..., K, N] do not fit: {}",
                specs_str(inputs)
            ),
        ));
    }
    let mut out = a[..r - 2].to_vec();
    out.extend([m, n]);
    let mut next = 2;
    if bias {
        if inputs[next].shape != [n] {
            return Err(Error::shape(
                name,
                format!("bias must be [{n}]; got {}", specs_str(inputs)),
            ));
        }
        next += 1;
    }
    if residual && inputs[next].shape != out {
        return Err(Error::shape(
            name,
            format!("residual must be {out:?}; got {}", specs_str(inputs)),
        ));
    }
    Ok(vec![TensorSpec::new(&out, inputs[0].dtype)])
}

fn infer_normed(op: &Op, name: &str, inputs: &[TensorSpec]) -> Result<Vec<TensorSpec>> {
    let Op::NormMatmul {
        norm,
        bias,
        activation,
        residual,
    } = *op
    else {
        return Err(Error::invalid(name, "not a norm_matmul"));
    };
    let all: Vec<usize> = (0..inputs.len()).collect();
    require_float(name, inputs, &all)?;
    require_same_dtype(name, inputs, &all)?;
    if let Some(act) = activation.filter(|act| !act.is_epilogue_activation()) {
        return Err(Error::invalid(
            name,
            format!("{} is not an epilogue activation", act.name()),
        ));
    }
    let (x, b) = (&inputs[0].shape, &inputs[1].shape);
    let (&[m, k], &[k2, n]) = (&x[..], &b[..]) else {
        return Err(Error::shape(
            name,
            format!("need x [M, K] and b [K, N]; got {}", specs_str(inputs)),
        ));
    };
    if k != k2 || k == 0 {
        return Err(Error::shape(
            name,
            format!(
                "x [M, K] and b [K, N] must share K >= 1: {}",
                specs_str(inputs)
            ),
        ));
    }
    let mut expected = vec![vec![k]; norm.params()];
    if bias {
        expected.push(vec![n]);
    }
    if residual {
        expected.push(vec![m, n]);
    }
    if inputs[2..]
        .iter()
        .zip(&expected)
        .any(|(t, e)| t.shape != *e)
    {
        return Err(Error::shape(
            name,
            format!(
                "the norm's parameters must be [{k}], a bias [{n}], a residual [{m}, {n}]; got {}",
                specs_str(inputs)
            ),
        ));
    }
    Ok(vec![TensorSpec::new(&[m, n], inputs[0].dtype)])
}
