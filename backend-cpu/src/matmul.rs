//! Batched matrix multiplication with bias, activation and residual epilogues, through the
//! `gemm` crate, which reads operands at any row and column strides.

use rayon::prelude::*;
use tessera_core::{contiguous_strides, numel, Error, Layout, Op, Result, TensorRef};

use crate::buffer::{read, read_layout, write};
use crate::elementwise::unary;
use crate::float::{computes_in_f64, Float};
use crate::wrong_family;

/// Products with at least this many multiply-adds use gemm's own rayon parallelism.
const PARALLEL_FLOPS: usize = 1 << 18;

/// A matrix inside a slice: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a, F> {
    pub data: &'a [F],
    pub rs: usize,
    pub cs: usize,
}

impl<'a, F> Mat<'a, F> {
    /// A row-major matrix with `cols` columns.
    pub fn rows(data: &'a [F], cols: usize) -> Self {
        Mat {
            data,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose of a row-major matrix with `cols` columns.
    pub fn transposed(data: &'a [F], cols: usize) -> Self {
        Mat {
            data,
            rs: 1,
            cs: cols,
        }
    }

    /// Whether a `rows x cols` matrix at these strides lies inside `data`.
    fn fits(&self, rows: usize, cols: usize) -> bool {
        let along =
            |len: usize, stride: usize| len.checked_sub(1).and_then(|l| l.checked_mul(stride));
        let last = along(rows, self.rs)
            .zip(along(cols, self.cs))
            .and_then(|(a, b)| a.checked_add(b));
        last.is_some_and(|l| l < self.data.len()) && isize::try_from(self.rs.max(self.cs)).is_ok()
    }
}

/// `dst = a @ b` for an `m x k` matrix `a` and a `k x n` matrix `b` into a row-major `m x n`
/// `dst`, or `dst += a @ b` with `accumulate`. Accumulates in `F`.
pub(crate) fn gemm_into<F: Float>(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_, F>,
    b: Mat<'_, F>,
    dst: &mut [F],
    accumulate: bool,
) -> Result<()> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    let fits = m.checked_mul(n).is_some_and(|mn| mn <= dst.len());
    if !fits || isize::try_from(n).is_err() {
        return Err(Error::shape(
            "matmul",
            format!("a {m}x{n} product does not fit {} outputs", dst.len()),
        ));
    }
    if k == 0 {
        if !accumulate {
            dst[..m * n].fill(F::zero());
        }
        return Ok(());
    }
    if !a.fits(m, k) || !b.fits(k, n) {
        return Err(Error::shape(
            "matmul",
            format!("operands of a {m}x{k} @ {k}x{n} product do not fit their data"),
        ));
    }
    let parallelism = if m.saturating_mul(n).saturating_mul(k) >= PARALLEL_FLOPS {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: `F` is f32 or f64 (the only `Float` impls), both supported by `gemm`, so it does
    // not panic. `dst` holds at least `m * n` elements written row-major (column stride 1, row
    // stride `n`), checked above. Every element `a` and `b` are read at, `(i, p)` for
    // `i < m, p < k` and `(p, j)` for `p < k, j < n`, lies inside their slices (`Mat::fits`),
    // and all strides fit in `isize`. `dst` is a unique borrow, so it overlaps neither operand.
    // With `read_dst` false, gemm writes `dst` without reading it; with true, `dst` is
    // initialized memory. gemm computes `dst = alpha dst + beta a b`, so alpha = beta = 1.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            F::one(),
            F::one(),
            false,
            false,
            false,
            parallelism,
        );
    }
    Ok(())
}

pub(crate) fn launch(op: &Op, inputs: &[TensorRef<'_>], outputs: &[TensorRef<'_>]) -> Result<()> {
    if computes_in_f64(inputs[0].dtype) {
        run::<f64>(op, inputs, outputs)
    } else {
        run::<f32>(op, inputs, outputs)
    }
}

/// An operand in host memory and the element strides of every dimension to walk it. Views
/// that cover most of their stored span (row-major, transposed in place, broadcast) are read as
/// that span in stored order and walked with their own strides, which gemm takes directly;
/// sparser views are gathered into a row-major copy.
fn read_operand<F: Float>(t: &TensorRef<'_>) -> Result<(Vec<F>, Vec<usize>)> {
    let layout = &t.layout;
    let distinct: usize = layout
        .shape
        .iter()
        .zip(&layout.strides)
        .filter(|(_, &s)| s != 0)
        .map(|(&d, _)| d)
        .product();
    let span = layout.extent() - layout.offset;
    if span <= 2 * distinct.max(1) {
        let stored = Layout {
            shape: vec![span],
            strides: vec![1],
            offset: layout.offset,
        };
        return Ok((
            read_layout(t.buffer, t.dtype, &stored)?,
            layout.strides.clone(),
        ));
    }
    let strides = contiguous_strides(&layout.shape);
    Ok((read_layout(t.buffer, t.dtype, layout)?, strides))
}

/// The offset of batch `index` (row-major over `shape`) in an operand with `strides`.
fn batch_offset(mut index: usize, shape: &[usize], strides: &[usize]) -> usize {
    let mut offset = 0;
    for d in (0..shape.len()).rev() {
        offset += (index % shape[d]) * strides[d];
        index /= shape[d];
    }
    offset
}

fn run<F: Float>(op: &Op, inputs: &[TensorRef<'_>], outputs: &[TensorRef<'_>]) -> Result<()> {
    let Op::Matmul {
        bias,
        activation,
        residual,
    } = op
    else {
        return Err(wrong_family(op));
    };
    let shape = &inputs[0].layout.shape;
    let r = shape.len();
    let (m, k, n) = (shape[r - 2], shape[r - 1], inputs[1].layout.shape[r - 1]);
    let batch_shape = &shape[..r - 2];
    let mn = m * n;
    let mut out = vec![F::zero(); numel(batch_shape) * mn];
    if mn > 0 && k > 0 {
        let (a, a_strides) = read_operand::<F>(&inputs[0])?;
        let (b, b_strides) = read_operand::<F>(&inputs[1])?;
        let one = |(i, dst): (usize, &mut [F])| {
            let a = Mat {
                data: &a[batch_offset(i, batch_shape, &a_strides)..],
                rs: a_strides[r - 2],
                cs: a_strides[r - 1],
            };
            let b = Mat {
                data: &b[batch_offset(i, batch_shape, &b_strides)..],
                rs: b_strides[r - 2],
                cs: b_strides[r - 1],
            };
            gemm_into(m, n, k, a, b, dst, false)
        };
        if mn.saturating_mul(k) >= PARALLEL_FLOPS {
            out.chunks_mut(mn).enumerate().try_for_each(one)?;
        } else {
            out.par_chunks_mut(mn).enumerate().try_for_each(one)?;
        }
    }
    let bias = if *bias {
        Some(read::<F>(&inputs[2])?)
    } else {
        None
    };
    let res = if *residual {
        Some(read::<F>(&inputs[inputs.len() - 1])?)
    } else {
        None
    };
    if bias.is_some() || activation.is_some() || res.is_some() {
        out.par_iter_mut()
            .enumerate()
            .with_min_len(crate::float::GRAIN)
            .for_each(|(i, v)| {
                if let Some(b) = &bias {
                    *v += b[i % n];
                }
                if let Some(act) = activation {
                    *v = unary(*act, *v, &[]);
                }
                if let Some(res) = &res {
                    *v += res[i];
                }
            });
    }
    write(&outputs[0], &out)
}
