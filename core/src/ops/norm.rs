//! Layer norm and RMS norm over the last axis, forward and backward.
//!
//! - `LayerNorm`: `(x [..., N], weight [N], bias [N])`, scalar `eps`, to
//!   `(y [..., N], mean [...], rstd [...])` with `mean` and the biased variance `var` of each
//!   row, `rstd = 1 / sqrt(var + eps)` (eps inside the root, as PyTorch), and
//!   `y = (x - mean) * rstd * weight + bias`. Statistics are f32 (f64 for f64). `N >= 1`.
//! - `LayerNormBackward`: `(x, weight, mean, rstd, dy)` to `(dx, dweight, dbias)`; `dweight`
//!   and `dbias` sum over rows in a fixed order (two-pass, deterministic).
//! - `RmsNorm`: `(x [..., N], weight [N])`, scalar `eps`, to `(y, rstd [...])` with
//!   `rstd = 1 / sqrt(mean(x^2) + eps)` and `y = x * rstd * weight` (Llama's convention:
//!   normalized in f32, weight applied after).
//! - `RmsNormBackward`: `(x, weight, rstd, dy)` to `(dx, dweight)`.

use super::{require_float, require_same_dtype, specs_str, stats_dtype, Op, TensorSpec};
use crate::{Error, Result};

/// The normalization a `NormMatmul` applies to the rows of its `a` (`ops::matmul`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormKind {
    /// `LayerNorm`: a weight and a bias.
    Layer,
    /// `RmsNorm`: a weight.
    Rms,
}

impl NormKind {
    /// The norm's own parameters (weight, then bias for a layer norm).
    pub fn params(self) -> usize {
        match self {
            NormKind::Layer => 2,
            NormKind::Rms => 1,
        }
    }

    /// The statistics the norm op outputs beside `y` (mean and rstd, or rstd).
    pub fn statistics(self) -> usize {
        match self {
            NormKind::Layer => 2,
            NormKind::Rms => 1,
        }
    }

    /// The catalog op that computes this norm alone.
    pub fn op(self) -> Op {
        match self {
            NormKind::Layer => Op::LayerNorm,
            NormKind::Rms => Op::RmsNorm,
        }
    }
}

pub(super) fn infer(op: &Op, name: &str, inputs: &[TensorSpec]) -> Result<Vec<TensorSpec>> {
    let x = &inputs[0];
    let r = x.shape.len();
    if r == 0 || x.shape[r - 1] == 0 {
        return Err(Error::Empty {
            op: name.into(),
            shape: x.shape.clone(),
        });
    }
    let n = x.shape[r - 1];
    let rows = x.shape[..r - 1].to_vec();
    let stats = TensorSpec::new(&rows, stats_dtype(x.dtype));
    let expect = |i: usize, shape: &[usize], what: &str| -> Result<()> {
        if inputs[i].shape != shape {
            return Err(Error::shape(
                name,
                format!("{what} must be {shape:?}; got {}", specs_str(inputs)),
            ));
        }
        Ok(())
    };
    let (data, stat_inputs): (Vec<usize>, Vec<usize>) = match op {
        Op::LayerNorm => (vec![0, 1, 2], vec![]),
        Op::LayerNormBackward => (vec![0, 1, 4], vec![2, 3]),
        Op::RmsNorm => (vec![0, 1], vec![]),
        Op::RmsNormBackward => (vec![0, 1, 3], vec![2]),
        _ => unreachable!("not a norm op: {op:?}"),
    };
    require_float(name, inputs, &data)?;
    require_same_dtype(name, inputs, &data)?;
    expect(1, &[n], "weight")?;
    for &i in &stat_inputs {
        expect(i, &rows, "statistics")?;
        if inputs[i].dtype != stats.dtype {
            return Err(Error::dtype(
                name,
                format!(
                    "statistics must be {}; got {}",
                    stats.dtype,
                    specs_str(inputs)
                ),
            ));
        }
    }
    let w = TensorSpec::new(&[n], x.dtype);
    Ok(match op {
        Op::LayerNorm => {
            expect(2, &[n], "bias")?;
            vec![x.clone(), stats.clone(), stats]
        }
        Op::LayerNormBackward => {
            expect(4, &x.shape, "dy")?;
            vec![x.clone(), w.clone(), w]
        }
        Op::RmsNorm => vec![x.clone(), stats],
        _ => {
            expect(3, &x.shape, "dy")?;
            vec![x.clone(), w]
        }
    })
}
