//! Fused cross-entropy.
//!
//! - `CrossEntropy`: `(logits [N, V], targets [N] i32/u32)` to `(loss [N], lse [N])`, both f32
//!   (f64 for f64): `lse = log(sum(exp(logits)))` computed with the row maximum subtracted, and
//!   `loss = lse - logits[target]`. A target outside `0..V` (PyTorch's `ignore_index = -100`)
//!   gives loss 0; the tensor API's mean divides by the number of counted rows. Any V.
//! - `CrossEntropyBackward`: `(logits, targets, lse, dloss [N])` to
//!   `dlogits = (softmax(logits) - onehot(target)) * dloss`, zero for ignored rows.

use super::{require_float, require_index, specs_str, stats_dtype, Op, TensorSpec};
use crate::{Error, Result};

pub(super) fn infer(op: &Op, name: &str, inputs: &[TensorSpec]) -> Result<Vec<TensorSpec>> {
    require_float(name, inputs, &[0])?;
    require_index(name, inputs, 1)?;
    let l = &inputs[0].shape;
    if l.len() != 2 || inputs[1].shape != [l[0]] {
        return Err(Error::shape(
            name,
            format!(
                "need logits [N, V] and targets [N]; got {}",
                specs_str(inputs)
            ),
        ));
    }
    if l[1] == 0 {
        return Err(Error::Empty {
            op: name.into(),
            shape: l.clone(),
        });
    }
    let stats = TensorSpec::new(&[l[0]], stats_dtype(inputs[0].dtype));
    match op {
        Op::CrossEntropy => Ok(vec![stats.clone(), stats]),
        _ => {
            if inputs[2] != stats || inputs[3] != stats {
                return Err(Error::shape(
                    name,
                    format!(
                        "lse and dloss must be {:?} {}; got {}",
                        stats.shape,
                        stats.dtype,
                        specs_str(inputs)
                    ),
                ));
            }
            Ok(vec![inputs[0].clone()])
        }
    }
}
