//! Reductions and softmax.

use super::Tensor;
use crate::layout::normalize_axis;
use crate::{Error, Op, ReduceOp, Result};

impl Tensor {
    fn reduce(&self, op: ReduceOp, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        let mut axes = axes.to_vec();
        axes.sort_unstable();
        axes.dedup();
        if let Some(&bad) = axes.iter().find(|&&a| a >= self.rank()) {
            return Err(Error::Axis {
                op: op.name().into(),
                axis: bad as isize,
                rank: self.rank(),
                shape: self.shape().to_vec(),
            });
        }
        Ok(Tensor::apply(&Op::Reduce { op, axes, keepdim }, &[self], &[], None)?.remove(0))
    }

    /// Sum over `axes` (any order; duplicates ignored).
    pub fn sum(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, axes, keepdim)
    }
    pub fn mean(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, axes, keepdim)
    }
    pub fn max(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, axes, keepdim)
    }
    pub fn min(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, axes, keepdim)
    }

    /// Sum of every element, as a rank-0 tensor.
    pub fn sum_all(&self) -> Result<Tensor> {
        let all: Vec<usize> = (0..self.rank()).collect();
        self.sum(&all, false)
    }

    /// Mean of every element, as a rank-0 tensor.
    pub fn mean_all(&self) -> Result<Tensor> {
        let all: Vec<usize> = (0..self.rank()).collect();
        self.mean(&all, false)
    }

    /// Index of the largest element along `axis` (i32; first on ties).
    pub fn argmax(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        let axis = normalize_axis("argmax", axis, self.shape())?;
        Ok(Tensor::apply(&Op::ArgMax { axis, keepdim }, &[self], &[], None)?.remove(0))
    }

    /// Softmax over the last axis.
    pub fn softmax(&self) -> Result<Tensor> {
        Ok(Tensor::apply(&Op::Softmax, &[self], &[], None)?.remove(0))
    }

    /// Log-softmax over the last axis.
    pub fn log_softmax(&self) -> Result<Tensor> {
        Ok(Tensor::apply(&Op::LogSoftmax, &[self], &[], None)?.remove(0))
    }
}
