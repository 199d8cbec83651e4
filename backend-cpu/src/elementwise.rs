//! Elementwise ops: casts, copies, unary and binary math, comparisons, select, SwiGLU.
//!
//! The formulas are `UnaryOp::eval`/`derivative` and `BinaryOp::eval` written in the compute
//! type, so f32 data is computed in f32 exactly as the catalog states them.

use rayon::prelude::*;
use tessera_core::{BinaryOp, Op, Result, TensorRef, UnaryOp};

use crate::buffer::{read, read_raw, write, write_raw};
use crate::float::{computes_in_f64, scalars, Float, GRAIN};
use crate::wrong_family;

/// `sqrt(2 / pi)`, the constant of the tanh GELU (`tessera_core::ops` `GELU_K`).
const GELU_K: f64 = 0.797_884_560_802_865_4;
const GELU_C: f64 = 0.044715;

pub(crate) fn launch(
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    match op {
        // Every dtype converts exactly to f64, and `write` rounds from there once, with the
        // catalog's cast rules.
        Op::Cast { .. } => write(&outputs[0], &read::<f64>(&inputs[0])?),
        Op::Copy => write_raw(&outputs[0], &read_raw(&inputs[0])?),
        Op::Compare(c) => {
            let (a, b) = (read::<f64>(&inputs[0])?, read::<f64>(&inputs[1])?);
            let out: Vec<f64> = a
                .iter()
                .zip(&b)
                .map(|(&x, &y)| f64::from(u8::from(c.eval(x, y))))
                .collect();
            write(&outputs[0], &out)
        }
        Op::Where => {
            let cond = read_raw(&inputs[0])?;
            let (a, b) = (read_raw(&inputs[1])?, read_raw(&inputs[2])?);
            let size = inputs[1].dtype.size();
            let mut out = b;
            for (i, &c) in cond.iter().enumerate() {
                if c != 0 {
                    out[i * size..(i + 1) * size].copy_from_slice(&a[i * size..(i + 1) * size]);
                }
            }
            write_raw(&outputs[0], &out)
        }
        _ if computes_in_f64(inputs[0].dtype) => float_op::<f64>(op, inputs, outputs, s),
        _ => float_op::<f32>(op, inputs, outputs, s),
    }
}

fn float_op<F: Float>(
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    let sc = scalars::<F>(s);
    let x = read::<F>(&inputs[0])?;
    match op {
        Op::Unary(u) => write(&outputs[0], &map(&x, |v| unary(*u, v, &sc))),
        Op::UnaryBackward(u) => {
            let dy = read::<F>(&inputs[1])?;
            write(
                &outputs[0],
                &zip_map(&x, &dy, |v, g| g * derivative(*u, v, &sc)),
            )
        }
        Op::Binary(b) => write(
            &outputs[0],
            &zip_map(&x, &read::<F>(&inputs[1])?, |p, q| binary(*b, p, q)),
        ),
        Op::SwiGlu => {
            let up = read::<F>(&inputs[1])?;
            write(
                &outputs[0],
                &zip_map(&x, &up, |g, u| unary(UnaryOp::Silu, g, &[]) * u),
            )
        }
        Op::SwiGluBackward => {
            let (up, dy) = (read::<F>(&inputs[1])?, read::<F>(&inputs[2])?);
            let dgate: Vec<F> = (0..x.len())
                .into_par_iter()
                .with_min_len(GRAIN)
                .map(|i| dy[i] * up[i] * derivative(UnaryOp::Silu, x[i], &[]))
                .collect();
            write(&outputs[0], &dgate)?;
            write(
                &outputs[1],
                &zip_map(&x, &dy, |g, d| d * unary(UnaryOp::Silu, g, &[])),
            )
        }
        _ => Err(wrong_family(op)),
    }
}

fn map<F: Float>(x: &[F], f: impl Fn(F) -> F + Sync) -> Vec<F> {
    x.par_iter().with_min_len(GRAIN).map(|&v| f(v)).collect()
}

fn zip_map<F: Float>(a: &[F], b: &[F], f: impl Fn(F, F) -> F + Sync) -> Vec<F> {
    a.par_iter()
        .zip(b)
        .with_min_len(GRAIN)
        .map(|(&p, &q)| f(p, q))
        .collect()
}

/// Scalar `i`, or 0 where an op has none (launches are validated, so this never triggers).
fn scalar<F: Float>(s: &[F], i: usize) -> F {
    s.get(i).copied().unwrap_or_else(F::zero)
}

fn sigmoid<F: Float>(x: F) -> F {
    F::one() / (F::one() + (-x).exp())
}

/// `UnaryOp::eval` in the compute type.
pub(crate) fn unary<F: Float>(op: UnaryOp, x: F, s: &[F]) -> F {
    let half = F::of_f64(0.5);
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => F::one() / x.sqrt(),
        UnaryOp::Recip => F::one() / x,
        UnaryOp::Square => x * x,
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Relu => {
            if x > F::zero() || x.is_nan() {
                x
            } else {
                F::zero()
            }
        }
        UnaryOp::Gelu => {
            let inner = F::of_f64(GELU_K) * (x + F::of_f64(GELU_C) * x * x * x);
            half * x * (F::one() + inner.tanh())
        }
        UnaryOp::Silu => x / (F::one() + (-x).exp()),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Affine => x * scalar(s, 0) + scalar(s, 1),
        UnaryOp::PowScalar => x.powf(scalar(s, 0)),
    }
}

/// `UnaryOp::derivative` in the compute type.
pub(crate) fn derivative<F: Float>(op: UnaryOp, x: F, s: &[F]) -> F {
    let (zero, one, half) = (F::zero(), F::one(), F::of_f64(0.5));
    match op {
        UnaryOp::Neg => -one,
        UnaryOp::Abs => {
            if x > zero {
                one
            } else if x < zero {
                -one
            } else {
                zero * x
            }
        }
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => one / x,
        UnaryOp::Sqrt => half / x.sqrt(),
        UnaryOp::Rsqrt => -half / (x * x.sqrt()),
        UnaryOp::Recip => -one / (x * x),
        UnaryOp::Square => F::of_f64(2.0) * x,
        UnaryOp::Tanh => one - x.tanh().powi(2),
        UnaryOp::Sigmoid => {
            let sg = sigmoid(x);
            sg * (one - sg)
        }
        UnaryOp::Relu => {
            if x > zero {
                one
            } else {
                zero * x
            }
        }
        UnaryOp::Gelu => {
            let k = F::of_f64(GELU_K);
            let c = F::of_f64(GELU_C);
            let t = (k * (x + c * x * x * x)).tanh();
            half * (one + t) + half * x * (one - t * t) * k * (one + F::of_f64(3.0) * c * x * x)
        }
        UnaryOp::Silu => {
            let sg = sigmoid(x);
            sg * (one + x * (one - sg))
        }
        UnaryOp::Sin => x.cos(),
        UnaryOp::Cos => -x.sin(),
        UnaryOp::Affine => scalar(s, 0),
        UnaryOp::PowScalar => {
            let e = scalar(s, 0);
            if e == zero {
                zero
            } else {
                e * x.powf(e - one)
            }
        }
    }
}

/// `BinaryOp::eval` in the compute type.
pub(crate) fn binary<F: Float>(op: BinaryOp, a: F, b: F) -> F {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Maximum => {
            if a.is_nan() || b.is_nan() {
                F::nan()
            } else {
                a.max(b)
            }
        }
        BinaryOp::Minimum => {
            if a.is_nan() || b.is_nan() {
                F::nan()
            } else {
                a.min(b)
            }
        }
        BinaryOp::Pow => a.powf(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f64 instantiation is the catalog's definition, bit for bit.
    #[test]
    fn f64_formulas_match_the_catalog() {
        let s = [1.5, -0.25];
        for op in UnaryOp::ALL {
            for x in [-2.5, -1.0, -0.0, 0.0, 0.3, 1.0, 4.0, f64::NAN] {
                let (want, got) = (op.eval(x, &s), unary(op, x, &s));
                assert!(
                    want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                    "{op:?}({x})"
                );
                let (want, got) = (op.derivative(x, &s), derivative(op, x, &s));
                assert!(
                    want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                    "{op:?}'({x})"
                );
            }
        }
        for op in BinaryOp::ALL {
            for (a, b) in [(1.0, 2.0), (-3.0, 0.5), (f64::NAN, 1.0), (2.0, -0.0)] {
                let (want, got) = (op.eval(a, b), binary(op, a, b));
                assert!(
                    want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                    "{op:?}"
                );
            }
        }
    }
}
