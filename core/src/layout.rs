//! Shapes and strided layouts.
//!
//! A [`Layout`] places a logical n-dimensional array in a flat buffer: element `idx` lives at
//! `offset + sum(idx[i] * strides[i])`, counted in elements of the buffer's dtype. Strides are
//! non-negative; a stride of 0 broadcasts a dimension. Views (transpose, slice, expand) change
//! the layout only and share the buffer.

use crate::{Error, Result};

/// Normalizes a possibly negative axis (`-1` is the last) against `rank`.
pub fn normalize_axis(op: &str, axis: isize, shape: &[usize]) -> Result<usize> {
    let rank = shape.len() as isize;
    let a = if axis < 0 { axis + rank } else { axis };
    if a < 0 || a >= rank {
        return Err(Error::Axis {
            op: op.into(),
            axis,
            rank: shape.len(),
            shape: shape.to_vec(),
        });
    }
    Ok(a as usize)
}

/// The number of elements of a shape.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Row-major strides for `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut s = 1;
    for i in (0..shape.len()).rev() {
        strides[i] = s;
        s *= shape[i].max(1);
    }
    strides
}

/// The shape two shapes broadcast to (NumPy rules), or `None`.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i < rank - a.len() {
            1
        } else {
            a[i - (rank - a.len())]
        };
        let db = if i < rank - b.len() {
            1
        } else {
            b[i - (rank - b.len())]
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
}

impl Layout {
    pub fn contiguous(shape: &[usize]) -> Layout {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    pub fn with_offset(mut self, offset: usize) -> Layout {
        self.offset = offset;
        self
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Row-major with no gaps (any offset). Size-1 dimensions may have any stride, and an empty
    /// layout (which [`Layout::contiguous`] gives strides computed with its zero dims as 1) is
    /// contiguous.
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1;
        for i in (0..self.shape.len()).rev() {
            if self.shape[i] != 1 && self.strides[i] != expected {
                return false;
            }
            expected *= self.shape[i];
        }
        true
    }

    /// Whether the last two dims are laid out row-major (rows contiguous and one after
    /// another) while the outer dims may have any strides: a view of fewer rows of a larger
    /// row-major tensor, such as a KV cache with room for more positions.
    pub fn rows_contiguous(&self) -> bool {
        let r = self.shape.len();
        if r < 2 || self.numel() == 0 {
            return self.is_contiguous();
        }
        let (rows, width) = (self.shape[r - 2], self.shape[r - 1]);
        (width == 1 || self.strides[r - 1] == 1) && (rows == 1 || self.strides[r - 2] == width)
    }

    /// One past the largest element index this layout touches (0 when empty).
    pub fn extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        self.offset
            + self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(&d, &s)| (d - 1) * s)
                .sum::<usize>()
            + 1
    }

    /// The flat element index of every logical element, in row-major order.
    pub fn indices(&self) -> impl Iterator<Item = usize> + '_ {
        let n = self.numel();
        let rank = self.rank();
        let mut idx = vec![0usize; rank];
        let mut pos = self.offset;
        (0..n).map(move |i| {
            if i > 0 {
                for d in (0..rank).rev() {
                    idx[d] += 1;
                    pos += self.strides[d];
                    if idx[d] < self.shape[d] {
                        break;
                    }
                    pos -= self.strides[d] * idx[d];
                    idx[d] = 0;
                }
            }
            pos
        })
    }

    pub fn transpose(&self, a: usize, b: usize) -> Layout {
        let mut l = self.clone();
        l.shape.swap(a, b);
        l.strides.swap(a, b);
        l
    }

    pub fn permute(&self, perm: &[usize]) -> Layout {
        Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        }
    }

    /// Restricts `axis` to `start..start + len` (caller checks bounds).
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Layout {
        let mut l = self.clone();
        if len > 0 {
            l.offset += start * l.strides[axis];
        }
        l.shape[axis] = len;
        l
    }

    /// Entry `index` of the first dimension, which the result no longer has (the keys or the
    /// values of a stacked KV cache; caller checks bounds).
    pub fn select_first(&self, index: usize) -> Layout {
        Layout {
            shape: self.shape[1..].to_vec(),
            strides: self.strides[1..].to_vec(),
            offset: self.offset + index * self.strides[0],
        }
    }

    /// Broadcasts to `shape` with stride-0 dimensions, or `None` if the shapes do not broadcast.
    pub fn broadcast_to(&self, shape: &[usize]) -> Option<Layout> {
        if shape.len() < self.rank() {
            return None;
        }
        let lead = shape.len() - self.rank();
        let mut strides = vec![0; shape.len()];
        for i in 0..self.rank() {
            let (have, want) = (self.shape[i], shape[lead + i]);
            strides[lead + i] = if have == want {
                self.strides[i]
            } else if have == 1 {
                0
            } else {
                return None;
            };
        }
        Some(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// A row-major layout as one dimension of its elements (same offset).
    pub fn flat(&self) -> Layout {
        Layout {
            shape: vec![self.numel()],
            strides: vec![1],
            offset: self.offset,
        }
    }

    /// The dimension along which this layout reaches furthest (the outermost of equals): the
    /// one whose halves shrink the span of memory it covers most. `None` for a single element.
    pub fn furthest_dim(&self) -> Option<usize> {
        let reach = |d: usize| self.strides[d] * self.shape[d].saturating_sub(1);
        (0..self.rank())
            .filter(|&d| reach(d) > 0)
            .max_by_key(|&d| (reach(d), std::cmp::Reverse(d)))
    }

    /// The same elements with a new shape, if expressible without copying: always for
    /// contiguous layouts; otherwise `None` and the caller copies first.
    pub fn reshape(&self, shape: &[usize]) -> Option<Layout> {
        if numel(shape) != self.numel() || !self.is_contiguous() {
            return None;
        }
        Some(Layout::contiguous(shape).with_offset(self.offset))
    }
}

/// `shape` and each operand's `strides` with size-1 dimensions dropped and neighbouring
/// dimensions merged wherever every operand steps through them as through one (contiguous
/// operands end up with a single dimension): what an elementwise kernel needs to walk all
/// operands together with the fewest divisions.
pub fn merge_dims(shape: &[usize], strides: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut dims: Vec<(usize, Vec<usize>)> = Vec::with_capacity(shape.len());
    for (d, &size) in shape.iter().enumerate() {
        if size == 1 {
            continue;
        }
        let inner: Vec<usize> = strides.iter().map(|s| s[d]).collect();
        if let Some((outer_size, outer)) = dims.last_mut() {
            if outer.iter().zip(&inner).all(|(&o, &i)| o == i * size) {
                *outer_size *= size;
                *outer = inner;
                continue;
            }
        }
        dims.push((size, inner));
    }
    let shape = dims.iter().map(|(size, _)| *size).collect();
    let strides = (0..strides.len())
        .map(|t| dims.iter().map(|(_, st)| st[t]).collect())
        .collect();
    (shape, strides)
}

#[cfg(test)]
mod tests {
    use super::merge_dims;

    #[test]
    fn contiguous_operands_merge_into_one_dimension() {
        let c = [12, 4, 1];
        assert_eq!(
            merge_dims(&[2, 3, 4], &[&c, &c]),
            (vec![24], vec![vec![1], vec![1]])
        );
    }

    #[test]
    fn a_narrowed_operand_keeps_the_dimension_it_skips_through() {
        // [2, 3, 4] read from rows of 8: the two outer dimensions merge, the last stays.
        let input = [24, 8, 1];
        let out = [12, 4, 1];
        assert_eq!(
            merge_dims(&[2, 3, 4], &[&input, &out]),
            (vec![6, 4], vec![vec![8, 1], vec![4, 1]])
        );
    }

    #[test]
    fn size_one_and_broadcast_dimensions() {
        let out = [4, 1, 1];
        let row = [0, 1, 0];
        assert_eq!(
            merge_dims(&[3, 4, 1], &[&row, &out]),
            (vec![3, 4], vec![vec![0, 1], vec![4, 1]])
        );
        assert_eq!(merge_dims(&[1, 1], &[&[1, 1]]), (vec![], vec![vec![]]));
    }
}
