//! Concatenation, embedding lookups, gather and scatter-add.

use super::Tensor;
use crate::layout::normalize_axis;
use crate::{is_grad_enabled, Error, Op, Result};

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

    /// Writes `src`'s entries `t` along `axis` into this tensor's entries `index[t]`, in place
    /// (torch's `index_copy_`): every tensor sharing the buffer sees them. `index` is a 1-D
    /// device tensor (i32 or u32), so the rows written may be chosen on the device; indices
    /// outside the axis are skipped. This tensor must be row-major; not recorded.
    pub fn index_copy(&self, axis: isize, index: &Tensor, src: &Tensor) -> Result<()> {
        let axis = normalize_axis("index_copy", axis, self.shape())?;
        if self.tracks_grad() || (is_grad_enabled() && src.tracks_grad()) {
            return Err(Error::invalid(
                "index_copy",
                "in-place writes are not recorded; use them on tensors without gradients",
            ));
        }
        let src = src.contiguous()?;
        let index = index.contiguous()?;
        Tensor::apply_in_place(&Op::IndexCopy { axis }, &[self, &index, &src], &[self], &[])
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
