//! 2-D convolution (groups = 1), by im2col and matmul on every backend.
//!
//! - `Conv2d { params, bias }`: `(x [N, C, H, W], w [O, C, KH, KW], [bias [O]])` to
//!   `y [N, O, OH, OW]` with `OH = (H + 2 pad_h - dil_h (KH - 1) - 1) / stride_h + 1` (floor)
//!   and zero padding: cross-correlation, as PyTorch's `conv2d`.
//! - `Conv2dBackwardData { params }`: `(dy, w)` to `dx` of the given shape `[N, C, H, W]`.
//! - `Conv2dBackwardWeight { params }`: `(x, dy)` to `dw` of the given shape `[O, C, KH, KW]`.
//!   The bias gradient is a sum of `dy` over `N, OH, OW`.

use super::{require_float, require_same_dtype, specs_str, Op, TensorSpec};
use crate::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
        }
    }
}

impl Conv2dParams {
    /// Output spatial size for input `[h, w]` and kernel `[kh, kw]`, or `None` if empty.
    pub fn output_size(&self, input: [usize; 2], kernel: [usize; 2]) -> Option<[usize; 2]> {
        let mut out = [0; 2];
        for i in 0..2 {
            let span = self.dilation[i] * (kernel[i].max(1) - 1) + 1;
            let padded = input[i] + 2 * self.padding[i];
            if padded < span || self.stride[i] == 0 {
                return None;
            }
            out[i] = (padded - span) / self.stride[i] + 1;
        }
        Some(out)
    }
}

pub(super) fn infer(
    op: &Op,
    name: &str,
    inputs: &[TensorSpec],
    out_shape: Option<&[usize]>,
) -> Result<Vec<TensorSpec>> {
    let all: Vec<usize> = (0..inputs.len()).collect();
    require_float(name, inputs, &all)?;
    require_same_dtype(name, inputs, &all)?;
    let err = |what: String| Error::shape(name, format!("{what}; got {}", specs_str(inputs)));
    let four = |s: &[usize]| -> Result<[usize; 4]> {
        s.try_into().map_err(|_| err("tensors must be 4-D".into()))
    };
    let dtype = inputs[0].dtype;
    let (x, w, params) = match op {
        Op::Conv2d { params, bias } => {
            let (x, w) = (four(&inputs[0].shape)?, four(&inputs[1].shape)?);
            if *bias && inputs[2].shape != [w[0]] {
                return Err(err(format!("bias must be [{}]", w[0])));
            }
            (x, w, params)
        }
        Op::Conv2dBackwardData { params } => {
            let x = four(
                out_shape.ok_or_else(|| Error::invalid(name, "the output shape must be given"))?,
            )?;
            (x, four(&inputs[1].shape)?, params)
        }
        Op::Conv2dBackwardWeight { params } => {
            let w = four(
                out_shape.ok_or_else(|| Error::invalid(name, "the output shape must be given"))?,
            )?;
            (four(&inputs[0].shape)?, w, params)
        }
        _ => unreachable!("not a conv op: {op:?}"),
    };
    if x[1] != w[1] {
        return Err(err(format!(
            "x has {} channels but w expects {}",
            x[1], w[1]
        )));
    }
    let [oh, ow] = params
        .output_size([x[2], x[3]], [w[2], w[3]])
        .ok_or_else(|| err("kernel larger than the padded input, or stride 0".into()))?;
    let y = [x[0], w[0], oh, ow];
    match op {
        Op::Conv2d { .. } => Ok(vec![TensorSpec::new(&y, dtype)]),
        Op::Conv2dBackwardData { .. } => {
            if inputs[0].shape != y {
                return Err(err(format!("dy must be {y:?}")));
            }
            Ok(vec![TensorSpec::new(&x, dtype)])
        }
        _ => {
            if inputs[1].shape != y {
                return Err(err(format!("dy must be {y:?}")));
            }
            Ok(vec![TensorSpec::new(&w, dtype)])
        }
    }
}
