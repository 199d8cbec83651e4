//! Concatenation, embedding lookups, gather and scatter-add.

use super::Tensor;
use crate::layout::normalize_axis;
use crate::{Error, Op, Result};

impl Tensor {
    /// Joins tensors along `axis`.
    pub fn cat(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid("concat", "needs at least one tensor"))?;
        let axis = normalize_axis("concat", axis, first.shape())?;
        Ok(Tensor::apply(&Op::Concat { axis }, tensors, &[], None)?.remove(0))
    }

    /// Rows of this `[V, D]` table for `ids` of any shape: `ids.shape + [D]`. Ids outside
    /// `0..V` give zero rows: kernels cannot raise, and checking on the host would stall the
    /// device, so callers validate ids where they create them.
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(Tensor::apply(&Op::Embedding, &[self, ids], &[], None)?.remove(0))
    }

    /// `out[i][j] = self[i][index[i][j]]` along `axis` (torch.gather).
    pub fn gather(&self, axis: isize, index: &Tensor) -> Result<Tensor> {
        let axis = normalize_axis("gather", axis, self.shape())?;
        Ok(Tensor::apply(&Op::Gather { axis }, &[self, index], &[], None)?.remove(0))
    }

    /// Zeros of `shape` plus `src` added at `index` along `axis` (torch.scatter_add onto zeros),
    /// deterministically.
    pub fn scatter_add(
        shape: &[usize],
        axis: isize,
        index: &Tensor,
        src: &Tensor,
    ) -> Result<Tensor> {
        let axis = normalize_axis("scatter_add", axis, shape)?;
        Ok(Tensor::apply(&Op::ScatterAdd { axis }, &[index, src], &[], Some(shape))?.remove(0))
    }

    /// Entries `index` (1-D) along `axis`.
    pub fn index_select(&self, axis: isize, index: &Tensor) -> Result<Tensor> {
        let a = normalize_axis("index_select", axis, self.shape())?;
        if index.rank() != 1 {
            return Err(Error::shape(
                "index_select",
                format!(
                    "index must be 1-D; got {:?} {}",
                    index.shape(),
                    index.dtype()
                ),
            ));
        }
        let mut perm: Vec<usize> = vec![a];
        perm.extend((0..self.rank()).filter(|&i| i != a));
        let moved = self.permute(&perm)?;
        let rest: usize = moved.shape()[1..].iter().product();
        let table = moved.reshape(&[self.shape()[a], rest])?;
        let mut shape = moved.shape().to_vec();
        shape[0] = index.shape()[0];
        let picked = table.embedding(index)?.reshape(&shape)?;
        let mut inverse = vec![0; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p] = i;
        }
        picked.permute(&inverse)
    }
}
