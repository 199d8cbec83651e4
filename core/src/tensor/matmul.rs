//! Matrix products.

use super::{is_grad_enabled, Tensor};
use crate::ops::NormKind;
use crate::{broadcast_shapes, Error, Op, Result, UnaryOp};

impl Tensor {
    /// `self @ other` for operands of rank >= 2; batch dimensions broadcast.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        self.matmul_fused(other, None, None, None)
    }

    /// `act(self @ other + bias) + residual`, in one kernel. `bias` is `[N]`; `residual` has
    /// the output's shape; `activation` is relu, gelu or silu.
    pub fn matmul_fused(
        &self,
        other: &Tensor,
        bias: Option<&Tensor>,
        activation: Option<UnaryOp>,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (a, b) = (self.shape(), other.shape());
        if a.len() < 2 || b.len() < 2 {
            return Err(Error::shape(
                "matmul",
                format!(
                    "operands need rank >= 2; got {a:?} {} and {b:?} {}",
                    self.dtype(),
                    other.dtype()
                ),
            ));
        }
        let batch = broadcast_shapes(&a[..a.len() - 2], &b[..b.len() - 2]).ok_or_else(|| {
            Error::shape(
                "matmul",
                format!(
                    "batch dimensions of {a:?} {} and {b:?} {} do not broadcast",
                    self.dtype(),
                    other.dtype()
                ),
            )
        })?;
        let with = |mut batch: Vec<usize>, rows: usize, cols: usize| {
            batch.extend([rows, cols]);
            batch
        };
        let lhs = self.expand(&with(batch.clone(), a[a.len() - 2], a[a.len() - 1]))?;
        let rhs = other.expand(&with(batch, b[b.len() - 2], b[b.len() - 1]))?;
        let mut inputs = vec![&lhs, &rhs];
        inputs.extend(bias);
        inputs.extend(residual);
        let op = Op::Matmul {
            bias: bias.is_some(),
            activation,
            residual: residual.is_some(),
        };
        Ok(Tensor::apply(&op, &inputs, &[], None)?.remove(0))
    }

    /// `self @ weight^T + bias` with `weight` stored `[out, in]`, as PyTorch's `Linear`.
    /// Leading dimensions of `self` are flattened into rows when they can be.
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        self.linear_fused(weight, bias, None, None)
    }

    /// [`Tensor::linear`] with an activation and then a residual (of the output's shape) added
    /// in the matmul's epilogue.
    pub fn linear_fused(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        activation: Option<UnaryOp>,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (x2, residual, shape) = self.linear_rows("linear", weight, residual)?;
        let y = x2.matmul_fused(
            &weight.transpose(0, 1)?,
            bias,
            activation,
            residual.as_ref(),
        )?;
        y.reshape(&shape)
    }

    /// `act(norm(self) @ weight^T + bias) + residual` as one op (`NormMatmul`): a linear layer
    /// fed by a layer norm (`norm_params`: its weight and bias) or an RMS norm (its weight),
    /// as a pre-norm transformer feeds its projections. Leading dimensions of `self` are
    /// flattened into rows. Inference only: the op has no gradient, so where one would be
    /// recorded it is an error (the norm and [`Tensor::linear_fused`] are the same thing
    /// with gradients).
    #[allow(clippy::too_many_arguments)]
    pub fn norm_linear(
        &self,
        norm: NormKind,
        norm_params: &[&Tensor],
        eps: f64,
        weight: &Tensor,
        bias: Option<&Tensor>,
        activation: Option<UnaryOp>,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        let tracked = [self, weight]
            .into_iter()
            .chain(norm_params.iter().copied())
            .chain(bias)
            .chain(residual)
            .any(|t| t.tracks_grad());
        if is_grad_enabled() && tracked {
            return Err(Error::invalid(
                "norm_linear",
                "has no gradient: run it under no_grad, or the norm and linear apart",
            ));
        }
        if norm_params.len() != norm.params() {
            return Err(Error::invalid(
                "norm_linear",
                format!(
                    "a {norm:?} norm has {} parameters; got {}",
                    norm.params(),
                    norm_params.len()
                ),
            ));
        }
        let (x2, residual, shape) = self.linear_rows("norm_linear", weight, residual)?;
        let b = weight.transpose(0, 1)?;
        let mut inputs = vec![&x2, &b];
        inputs.extend(norm_params);
        inputs.extend(bias);
        inputs.extend(residual.as_ref());
        let op = Op::NormMatmul {
            norm,
            bias: bias.is_some(),
            activation,
            residual: residual.is_some(),
        };
        Tensor::apply(&op, &inputs, &[eps], None)?
            .remove(0)
            .reshape(&shape)
    }

    /// A linear layer's operands as a product of rows: `self [..., in]` as `[rows, in]`, the
    /// residual (of the output's shape) as `[rows, out]`, and the output's shape `[..., out]`.
    fn linear_rows(
        &self,
        name: &str,
        weight: &Tensor,
        residual: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>, Vec<usize>)> {
        if self.rank() < 1 || weight.rank() != 2 {
            return Err(Error::shape(
                name,
                format!(
                    "need x [..., in] and weight [out, in]; got {:?} and {:?}",
                    self.shape(),
                    weight.shape()
                ),
            ));
        }
        let k = self.shape()[self.rank() - 1];
        let rows = self.numel() / k.max(1);
        let n = weight.shape()[0];
        let mut shape = self.shape().to_vec();
        *shape.last_mut().expect("rank >= 1") = n;
        let residual = match residual {
            Some(r) if r.shape() != shape.as_slice() => {
                return Err(Error::shape(
                    name,
                    format!(
                        "the residual must have the output's shape {shape:?}; got {:?} {}",
                        r.shape(),
                        r.dtype()
                    ),
                ))
            }
            Some(r) => Some(r.reshape(&[rows, n])?),
            None => None,
        };
        Ok((self.reshape(&[rows, k])?, residual, shape))
    }
}
