//! Movement: concatenation, embedding, gather and deterministic scatter-add.
//!
//! - `Concat { axis }`: one or more inputs of one dtype (any) whose shapes agree except along
//!   `axis`, joined in order.
//! - `Embedding`: `(weight [V, D], ids [...] i32/u32)` to `[..., D]`, row `ids[i]` of `weight`.
//!   An id outside `0..V` gives a zero row (kernels cannot raise; the tensor API documents it).
//! - `EmbeddingBackward`: `(ids [...], dy [..., D])` to `dweight [V, D]` (V from the output
//!   shape): the sum of the `dy` rows of each id, in increasing position order, so the result
//!   is deterministic. Ids outside `0..V` are skipped.
//! - `Gather { axis }`: `(x, index)` of one rank, `index` i32/u32 with `index.shape[d] <=
//!   x.shape[d]` for `d != axis`; output of `index`'s shape with
//!   `out[i][j] = x[i][index[i][j]]` along `axis` (torch.gather). Out-of-range indices give 0.
//! - `ScatterAdd { axis }`: `(index, src)` of one shape to an output given by its shape (same
//!   rank, at least as large off `axis`): zeros, then `out[..index[i]..] += src[i]` along
//!   `axis` (torch.scatter_add onto zeros), summed in increasing source order. Out-of-range
//!   indices are skipped.
//! - `IndexCopy { axis }`: `(dst, index [T] i32/u32, src)`, `src` of `dst`'s shape except `T`
//!   along `axis`, one dtype (any), to `out` of `dst`'s spec: `dst` with
//!   `out[.., index[t], ..] = src[.., t, ..]` along `axis` (torch's `index_copy_`). It runs in
//!   place (`out` may be `dst` itself: only the indexed rows are written), which is how a
//!   replayed decoding step writes its keys and values at a position held on the device.
//!   Out-of-range indices are skipped; with a repeated index, which row lands is unspecified.

use super::{require_index, require_same_dtype, specs_str, Op, TensorSpec};
use crate::{Error, Result};

pub(super) fn infer(
    op: &Op,
    name: &str,
    inputs: &[TensorSpec],
    out_shape: Option<&[usize]>,
) -> Result<Vec<TensorSpec>> {
    let need_out = || Error::invalid(name, "the output shape must be given");
    Ok(match op {
        Op::Concat { axis } => {
            let first = inputs
                .first()
                .ok_or_else(|| Error::invalid(name, "needs at least one input"))?;
            let all: Vec<usize> = (0..inputs.len()).collect();
            require_same_dtype(name, inputs, &all)?;
            if *axis >= first.shape.len() {
                return Err(Error::Axis {
                    op: name.into(),
                    axis: *axis as isize,
                    rank: first.shape.len(),
                    shape: first.shape.clone(),
                });
            }
            let mut out = first.shape.clone();
            out[*axis] = 0;
            for s in inputs {
                let fits = s.shape.len() == out.len()
                    && s.shape
                        .iter()
                        .zip(&first.shape)
                        .enumerate()
                        .all(|(i, (a, b))| i == *axis || a == b);
                if !fits {
                    return Err(Error::shape(
                        name,
                        format!("shapes must agree off axis {axis}: {}", specs_str(inputs)),
                    ));
                }
                out[*axis] += s.shape[*axis];
            }
            vec![TensorSpec::new(&out, first.dtype)]
        }
        Op::Embedding => {
            require_index(name, inputs, 1)?;
            let w = &inputs[0].shape;
            if w.len() != 2 {
                return Err(Error::shape(
                    name,
                    format!("weight must be [V, D]; got {}", specs_str(inputs)),
                ));
            }
            let mut out = inputs[1].shape.clone();
            out.push(w[1]);
            vec![TensorSpec::new(&out, inputs[0].dtype)]
        }
        Op::EmbeddingBackward => {
            require_index(name, inputs, 0)?;
            let (ids, dy) = (&inputs[0].shape, &inputs[1].shape);
            if dy.len() != ids.len() + 1 || dy[..ids.len()] != ids[..] {
                return Err(Error::shape(
                    name,
                    format!("dy must be ids.shape + [D]; got {}", specs_str(inputs)),
                ));
            }
            let out = out_shape.ok_or_else(need_out)?;
            if out.len() != 2 || out[1] != dy[ids.len()] {
                return Err(Error::shape(
                    name,
                    format!("output must be [V, {}]; got {out:?}", dy[ids.len()]),
                ));
            }
            vec![TensorSpec::new(out, inputs[1].dtype)]
        }
        Op::Gather { axis } => {
            require_index(name, inputs, 1)?;
            let (x, idx) = (&inputs[0].shape, &inputs[1].shape);
            check_axis_and_bounds(name, *axis, idx, x, inputs)?;
            vec![TensorSpec::new(idx, inputs[0].dtype)]
        }
        Op::ScatterAdd { axis } => {
            require_index(name, inputs, 0)?;
            let (idx, src) = (&inputs[0].shape, &inputs[1].shape);
            if idx != src {
                return Err(Error::shape(
                    name,
                    format!(
                        "index and src must share a shape; got {}",
                        specs_str(inputs)
                    ),
                ));
            }
            let out = out_shape.ok_or_else(need_out)?;
            check_axis_and_bounds(name, *axis, idx, out, inputs)?;
            vec![TensorSpec::new(out, inputs[1].dtype)]
        }
        Op::IndexCopy { axis } => {
            require_index(name, inputs, 1)?;
            require_same_dtype(name, inputs, &[0, 2])?;
            let (dst, idx, src) = (&inputs[0].shape, &inputs[1].shape, &inputs[2].shape);
            let fits = *axis < dst.len()
                && idx.len() == 1
                && src.len() == dst.len()
                && (0..dst.len()).all(|d| src[d] == if d == *axis { idx[0] } else { dst[d] });
            if !fits {
                return Err(Error::shape(
                    name,
                    format!(
                        "along axis {axis}, need dst, a 1-D index [T] and src of dst's shape \
                         with T along the axis; got {}",
                        specs_str(inputs)
                    ),
                ));
            }
            vec![inputs[0].clone()]
        }
        _ => unreachable!("not a movement op: {op:?}"),
    })
}

fn check_axis_and_bounds(
    name: &str,
    axis: usize,
    idx: &[usize],
    full: &[usize],
    inputs: &[TensorSpec],
) -> Result<()> {
    if axis >= full.len() {
        return Err(Error::Axis {
            op: name.into(),
            axis: axis as isize,
            rank: full.len(),
            shape: full.to_vec(),
        });
    }
    let fits = idx.len() == full.len()
        && idx
            .iter()
            .zip(full)
            .enumerate()
            .all(|(d, (i, f))| d == axis || i <= f);
    if !fits {
        return Err(Error::shape(
            name,
            format!(
                "index {idx:?} must have rank {} and fit {full:?} off axis {axis} ({})",
                full.len(),
                specs_str(inputs)
            ),
        ));
    }
    Ok(())
}
