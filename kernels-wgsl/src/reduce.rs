//! Reductions over any axes (a workgroup per output with a tree reduction, a thread per output
//! when the reduced extent is short, or chunks of rows over 64 neighbouring outputs at a time
//! when those are a matrix's columns), argmax, and softmax over rows.

use tessera_core::{merge_dims, DType, Error, Layout, Op, ReduceOp, Result, TensorRef};

use crate::gpu::Gpu;
use crate::params::{offsets, param_block, MAX_BINDINGS};
use crate::source::{groups_for, key, no_subst, run, unsupported};

const SRC: &str = include_str!("../kernels/reduce.wgsl");

/// Argmax over at most this many rows of at least two chunks splits each row into chunks of
/// [`ARGMAX_CHUNK`] elements, a workgroup each, then picks the best of the chunks: one
/// workgroup walking a vocabulary of 50k waits on its loads' latency fifty times over.
const ARGMAX_CHUNKED_ROWS: usize = 64;
/// Elements per chunk of a chunked argmax: eight loads per thread, issued four at a time.
const ARGMAX_CHUNK: usize = 2048;

/// Reduced extents shorter than this use one thread per output.
const THREAD_REDUCE_MAX: usize = 64;

/// Rows a workgroup of `reduce_columns` (and of the norms' `norm_dw_chunks`) takes: 64 per
/// thread.
pub(crate) const COLUMN_CHUNK: usize = 256;
/// The most chunks those kernels split the rows into (their finishing threads walk them).
pub(crate) const MAX_COLUMN_CHUNKS: usize = 128;
/// Outputs a workgroup of `reduce_columns_finish` takes, sixteen threads each.
const FINISH_OUTPUTS: usize = 16;

/// The chunks `reduce_columns` splits a reduction's rows into, where it applies: one reduced
/// dimension that is not contiguous, at least [`THREAD_REDUCE_MAX`] long, over at least 64
/// outputs lying next to each other in the input, with the chunks' results fitting a binding.
fn column_chunks(gpu: &dyn Gpu, params: &ReduceParams) -> Option<usize> {
    let (nout, nred) = (params.rows as usize, params.row_len as usize);
    let columns = params.kept_rank == 1
        && params.kept_strides[0] == 1
        && params.reduced_rank == 1
        && params.reduced_strides[0] > 1;
    let chunks = nred.div_ceil(COLUMN_CHUNK).clamp(1, MAX_COLUMN_CHUNKS);
    (columns
        && nred >= THREAD_REDUCE_MAX
        && nout >= 64
        && (4 * chunks * nout) as u64 <= gpu.max_binding())
    .then_some(chunks)
}

/// `params` with the bindings' offsets, once they are known.
fn with_offsets(params: ReduceParams) -> impl Fn(&[usize]) -> ReduceParams {
    move |o| {
        let mut params = params;
        params.offsets = offsets(o);
        params
    }
}

/// A reduction over the rows of a matrix in two steps (`reduce_columns`, then
/// `reduce_columns_finish`), through the f32 results of `chunks` chunks of rows.
fn reduce_columns(
    gpu: &dyn Gpu,
    op: &Op,
    subst: &[(&'static str, String)],
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    params: ReduceParams,
    chunks: usize,
) -> Result<()> {
    let (nout, nred) = (params.rows as usize, params.row_len as usize);
    let parts = gpu.scratch(4 * chunks * nout)?;
    let layout = Layout::contiguous(&[chunks * nout]);
    let outs = [
        outputs[0],
        TensorRef {
            buffer: &parts,
            layout: &layout,
            dtype: DType::F32,
        },
    ];
    let params = ReduceParams {
        chunks: chunks as u32,
        chunk_len: nred.div_ceil(chunks) as u32,
        ..params
    };
    let steps = [
        ("reduce_columns", (nout.div_ceil(64) * chunks) as u64),
        (
            "reduce_columns_finish",
            nout.div_ceil(FINISH_OUTPUTS) as u64,
        ),
    ];
    for (section, groups) in steps {
        run(
            gpu,
            &key(op, inputs, &outs, section),
            SRC,
            section,
            || Ok(subst.to_vec()),
            inputs,
            &outs,
            groups,
            with_offsets(params),
        )?;
    }
    Ok(())
}

/// Dimensions of the kept and of the reduced part of a reduction's input, each after merging
/// those the input steps through alike.
const MAX_DIMS: usize = 8;

param_block! {
    /// A reduction's, argmax's or softmax's parameters. Reductions and argmax: `rows` outputs
    /// each over `row_len` elements, the input's kept and reduced dimensions, and (argmax) the
    /// index of the input's first element along the axis in the whole op, and the chunks a
    /// long row is split into (`chunks` of `chunk_len`). Softmax: `rows` rows of `row_len`.
    ReduceParams {
        rows: u32,
        row_len: u32,
        kept_rank: u32,
        reduced_rank: u32,
        first: u32,
        chunks: u32,
        chunk_len: u32,
        kept_shape: [u32; MAX_DIMS],
        kept_strides: [u32; MAX_DIMS],
        reduced_shape: [u32; MAX_DIMS],
        reduced_strides: [u32; MAX_DIMS],
        offsets: [u32; MAX_BINDINGS],
    }
}

/// The parameters of reducing `x` over `axes` (the output row-major over the kept dims), the
/// kept and the reduced dimensions each merged where `x`'s strides allow.
fn reduction(gpu: &dyn Gpu, op: &Op, x: &TensorRef<'_>, axes: &[usize]) -> Result<ReduceParams> {
    let (mut ks, mut kt, mut rs, mut rt) = (vec![], vec![], vec![], vec![]);
    for (d, (&s, &st)) in x.layout.shape.iter().zip(&x.layout.strides).enumerate() {
        if axes.contains(&d) {
            rs.push(s);
            rt.push(st);
        } else {
            ks.push(s);
            kt.push(st);
        }
    }
    let mut params = ReduceParams {
        rows: ks.iter().product::<usize>() as u32,
        row_len: rs.iter().product::<usize>() as u32,
        ..ReduceParams::default()
    };
    let (ks, kt) = merge_dims(&ks, &[&kt]);
    let (rs, rt) = merge_dims(&rs, &[&rt]);
    if ks.len().max(rs.len()) > MAX_DIMS {
        return Err(Error::unsupported(
            gpu.backend(),
            format!(
                "{} of a tensor of shape {:?} whose dimensions do not merge into {MAX_DIMS}",
                op.name(),
                x.layout.shape
            ),
        ));
    }
    params.kept_rank = ks.len() as u32;
    params.reduced_rank = rs.len() as u32;
    for (d, (&s, &st)) in ks.iter().zip(&kt[0]).enumerate() {
        params.kept_shape[d] = s as u32;
        params.kept_strides[d] = st as u32;
    }
    for (d, (&s, &st)) in rs.iter().zip(&rt[0]).enumerate() {
        params.reduced_shape[d] = s as u32;
        params.reduced_strides[d] = st as u32;
    }
    Ok(params)
}

pub(crate) fn launch(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    let x = &inputs[0];
    let k = |variant: &str| key(op, inputs, outputs, variant);
    match op {
        Op::Reduce { op: kind, axes, .. } => {
            let params = reduction(gpu, op, x, axes)?;
            let (nout, nred) = (params.rows as usize, params.row_len as usize);
            let (init, combine) = match kind {
                ReduceOp::Sum | ReduceOp::Mean => ("0.0", "a + b"),
                ReduceOp::Max => ("-inf()", "max_nan(a, b)"),
                ReduceOp::Min => ("inf()", "min_nan(a, b)"),
            };
            let finish = match kind {
                ReduceOp::Mean => "select(v / f32(nred), nan(), nred == 0u)",
                _ => "v",
            };
            let subst = [
                ("INIT", init.to_string()),
                ("COMBINE", combine.to_string()),
                ("FINISH", finish.to_string()),
            ];
            if let Some(chunks) = column_chunks(gpu, &params) {
                return reduce_columns(gpu, op, &subst, inputs, outputs, params, chunks);
            }
            let (section, groups) = if nred < THREAD_REDUCE_MAX {
                ("reduce_thread", groups_for(nout))
            } else {
                ("reduce_group", nout as u64)
            };
            run(
                gpu,
                &k(section),
                SRC,
                section,
                || Ok(subst.to_vec()),
                inputs,
                outputs,
                groups,
                with_offsets(params),
            )
        }
        Op::ArgMax { axis, .. } => argmax(gpu, *axis, x, &outputs[0], 0),
        Op::Softmax | Op::LogSoftmax => {
            let n = *x.layout.shape.last().unwrap_or(&1);
            let rows = x.layout.numel() / n.max(1);
            let out = if matches!(op, Op::Softmax) {
                "exp(x - m) / s"
            } else {
                "x - m - ls"
            };
            let groups = if n == 0 { 0 } else { rows as u64 };
            run(
                gpu,
                &k("softmax"),
                SRC,
                "softmax",
                || Ok(vec![("SOFTMAX_OUT", out.into())]),
                inputs,
                outputs,
                groups,
                |o| ReduceParams {
                    rows: rows as u32,
                    row_len: n as u32,
                    offsets: offsets(o),
                    ..ReduceParams::default()
                },
            )
        }
        Op::SoftmaxBackward | Op::LogSoftmaxBackward => {
            let n = *x.layout.shape.last().unwrap_or(&1);
            let rows = x.layout.numel() / n.max(1);
            let (dot, grad) = if matches!(op, Op::SoftmaxBackward) {
                ("dy * y", "y * (dy - s)")
            } else {
                ("dy", "dy - exp(y) * s")
            };
            let subst = [("DOT_TERM", dot.to_string()), ("GRAD", grad.to_string())];
            let groups = if n == 0 { 0 } else { rows as u64 };
            run(
                gpu,
                &k("softmax_backward"),
                SRC,
                "softmax_backward",
                || Ok(subst.to_vec()),
                inputs,
                outputs,
                groups,
                |o| ReduceParams {
                    rows: rows as u32,
                    row_len: n as u32,
                    offsets: offsets(o),
                    ..ReduceParams::default()
                },
            )
        }
        _ => Err(unsupported(gpu, op)),
    }
}

/// Argmax along `axis` of `x`, whose first element along it has index `first` in the op's
/// whole input (0 but for parts of a reduced extent that runs over windows).
pub(crate) fn argmax(
    gpu: &dyn Gpu,
    axis: usize,
    x: &TensorRef<'_>,
    out: &TensorRef<'_>,
    first: usize,
) -> Result<()> {
    let op = Op::ArgMax {
        axis,
        keepdim: false,
    };
    let params = ReduceParams {
        first: first as u32,
        ..reduction(gpu, &op, x, &[axis])?
    };
    let (ins, outs) = ([*x], [*out]);
    let (rows, row_len) = (params.rows as usize, params.row_len as usize);
    if rows > ARGMAX_CHUNKED_ROWS || row_len < 2 * ARGMAX_CHUNK || params.reduced_rank != 1 {
        return run(
            gpu,
            &key(&op, &ins, &outs, "argmax"),
            SRC,
            "argmax",
            no_subst,
            &ins,
            &outs,
            rows as u64,
            with_offsets(params),
        );
    }
    let chunks = row_len.div_ceil(ARGMAX_CHUNK);
    let mut params = params;
    params.chunks = chunks as u32;
    params.chunk_len = ARGMAX_CHUNK as u32;
    let pairs = gpu.scratch(8 * rows * chunks)?;
    let layout = Layout::contiguous(&[2 * rows * chunks]);
    let outs = [
        *out,
        TensorRef {
            buffer: &pairs,
            layout: &layout,
            dtype: DType::U32,
        },
    ];
    for (section, groups) in [("argmax_chunks", rows * chunks), ("argmax_finish", rows)] {
        run(
            gpu,
            &key(&op, &ins, &outs, section),
            SRC,
            section,
            no_subst,
            &ins,
            &outs,
            groups as u64,
            with_offsets(params),
        )?;
    }
    Ok(())
}
