//! Creation and random ops. All take their output shape from the caller.
//!
//! - `Fill { dtype }`: every element `value` (converted as `Cast` converts).
//! - `Arange { dtype }`: 1-D, element `i` is `start + i * step` computed in f64, then converted.
//! - `RandUniform { dtype }`, `RandNormal { dtype }`: element `i` (row-major) comes from
//!   [`crate::rng::philox4x32`] with key `(key_lo, key_hi)` and counter
//!   `(i mod 2^32, i / 2^32, counter_lo, counter_hi)`; the 32-bit words are identical on every
//!   backend. Uniform: `low + (high - low) * (w0 >> 8) * 2^-24`, in `[low, high)`. Normal:
//!   Box-Muller, `mean + std * sqrt(2 L) * -cos(2 pi (u2 - 1/2))` (that is, `cos(2 pi u2)`)
//!   with `L = -ln u1`, `u1 = ((w0 >> 8) + 1) 2^-24` and `u2 = (w1 >> 8) 2^-24`, computed in
//!   f32 (f64 for f64). The cosine's argument stays in `[-pi, pi)` and `L` is taken from its
//!   series `d + d^2/2 + ...` (`d = 1 - u1`) when `d < 1/16`: GPU logarithms and cosines
//!   bound only their absolute error there, which would dominate small results.

use super::{Op, TensorSpec};
use crate::{Error, Result};

pub(super) fn infer(op: &Op, name: &str, out_shape: Option<&[usize]>) -> Result<Vec<TensorSpec>> {
    let (Op::Fill { dtype }
    | Op::Arange { dtype }
    | Op::RandUniform { dtype }
    | Op::RandNormal { dtype }) = *op
    else {
        return Err(Error::invalid(name, "not a creation op"));
    };
    let shape = out_shape.ok_or_else(|| Error::invalid(name, "the output shape must be given"))?;
    match op {
        Op::Arange { .. } if shape.len() != 1 => {
            return Err(Error::shape(
                name,
                format!("output must be 1-D; got {shape:?}"),
            ));
        }
        Op::RandUniform { .. } | Op::RandNormal { .. } if !dtype.is_float() => {
            return Err(Error::dtype(
                name,
                format!("random values need a float dtype; got {dtype}"),
            ));
        }
        _ => {}
    }
    Ok(vec![TensorSpec::new(shape, dtype)])
}
