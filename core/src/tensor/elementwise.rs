//! Elementwise arithmetic with NumPy broadcasting, comparisons and selection.

use super::Tensor;
use crate::{broadcast_shapes, BinaryOp, CompareOp, Error, Op, Result, UnaryOp};

impl Tensor {
    fn unary(&self, op: UnaryOp, scalars: &[f64]) -> Result<Tensor> {
        Ok(Tensor::apply(&Op::Unary(op), &[self], scalars, None)?.remove(0))
    }

    /// Broadcasts both operands to a common shape (views) before a binary op.
    fn broadcast_pair(&self, other: &Tensor, name: &str) -> Result<(Tensor, Tensor)> {
        let shape = broadcast_shapes(self.shape(), other.shape()).ok_or_else(|| {
            Error::shape(
                name,
                format!(
                    "{:?} {} and {:?} {} do not broadcast",
                    self.shape(),
                    self.dtype(),
                    other.shape(),
                    other.dtype()
                ),
            )
        })?;
        Ok((self.expand(&shape)?, other.expand(&shape)?))
    }

    fn binary(&self, other: &Tensor, op: BinaryOp) -> Result<Tensor> {
        let (a, b) = self.broadcast_pair(other, op.name())?;
        Ok(Tensor::apply(&Op::Binary(op), &[&a, &b], &[], None)?.remove(0))
    }

    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Add)
    }
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Sub)
    }
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Mul)
    }
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Div)
    }
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Maximum)
    }
    pub fn minimum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Minimum)
    }
    pub fn pow(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Pow)
    }

    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg, &[])
    }
    pub fn abs(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Abs, &[])
    }
    pub fn exp(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Exp, &[])
    }
    pub fn log(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Log, &[])
    }
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt, &[])
    }
    pub fn rsqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Rsqrt, &[])
    }
    pub fn recip(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Recip, &[])
    }
    pub fn square(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Square, &[])
    }
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh, &[])
    }
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid, &[])
    }
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu, &[])
    }
    /// GELU, tanh approximation.
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Gelu, &[])
    }
    pub fn silu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Silu, &[])
    }
    pub fn sin(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sin, &[])
    }
    pub fn cos(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Cos, &[])
    }
    /// `self * scale + shift`.
    pub fn affine(&self, scale: f64, shift: f64) -> Result<Tensor> {
        self.unary(UnaryOp::Affine, &[scale, shift])
    }
    pub fn add_scalar(&self, value: f64) -> Result<Tensor> {
        self.affine(1.0, value)
    }
    pub fn mul_scalar(&self, value: f64) -> Result<Tensor> {
        self.affine(value, 0.0)
    }
    pub fn powf(&self, exponent: f64) -> Result<Tensor> {
        self.unary(UnaryOp::PowScalar, &[exponent])
    }

    fn compare(&self, other: &Tensor, op: CompareOp) -> Result<Tensor> {
        let (a, b) = self.broadcast_pair(other, op.name())?;
        Ok(Tensor::apply(&Op::Compare(op), &[&a, &b], &[], None)?.remove(0))
    }

    pub fn eq(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, CompareOp::Eq)
    }
    pub fn ne(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, CompareOp::Ne)
    }
    pub fn lt(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, CompareOp::Lt)
    }
    pub fn le(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, CompareOp::Le)
    }
    pub fn gt(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, CompareOp::Gt)
    }
    pub fn ge(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, CompareOp::Ge)
    }

    /// `cond ? a : b` elementwise, broadcasting all three.
    pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let shape = broadcast_shapes(cond.shape(), a.shape())
            .and_then(|s| broadcast_shapes(&s, b.shape()))
            .ok_or_else(|| {
                Error::shape(
                    "where",
                    format!(
                        "{:?}, {:?} and {:?} do not broadcast",
                        cond.shape(),
                        a.shape(),
                        b.shape()
                    ),
                )
            })?;
        let (c, a, b) = (cond.expand(&shape)?, a.expand(&shape)?, b.expand(&shape)?);
        Ok(Tensor::apply(&Op::Where, &[&c, &a, &b], &[], None)?.remove(0))
    }

    /// `silu(gate) * up`, fused.
    pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        Ok(Tensor::apply(&Op::SwiGlu, &[gate, up], &[], None)?.remove(0))
    }
}
