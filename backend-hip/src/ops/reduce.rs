//! Reductions over any axes (sum, mean, max, min), argmax, softmax and log-softmax with their
//! backwards (`kernels/reduce.hip`). Reductions and argmax read their input in place through
//! its strides: a thread per output for short extents, 32 outputs per block for extents along
//! outer axes (neighbouring outputs adjacent in memory), otherwise a block per output, split
//! into chunks combined by a second launch when a few outputs reduce long extents. Softmax
//! runs a block per row. Every order of combination is fixed, so results are deterministic.

use tessera_core::{merge_dims, DType, Error, Op, ReduceOp, Result, TensorRef};

use super::{cxx_type, index_type, unsupported};
use crate::driver::Grid;
use crate::gpu::{grid_for, rows_grid, Gpu, Source};
use crate::params::hip_params;

const SRC: &str = include_str!("../../kernels/reduce.hip");

/// Dimensions of the kept and of the reduced part of an input, each after merging.
const MAX_DIMS: usize = 8;
/// Reduced extents shorter than this use one thread per output.
const THREAD_MAX: usize = 64;
/// Threads of the block-per-output kernels.
const BLOCK: u32 = 256;
/// Reduced elements per block below which a row is not split into chunks.
const CHUNK_MIN: usize = 8192;
/// Rows of an argmax below which each row splits into chunks (or, too short for two, takes a
/// block of 1,024 threads).
const FEW_ROWS: usize = 128;
/// Elements per chunk of a split argmax: one round of ARGMAX_LOADS loads for each of a
/// block's threads.
const ARGMAX_CHUNK: usize = 16 * BLOCK as usize;
/// Blocks a split reduction aims for, enough to fill a large GPU.
const SPLIT_BLOCKS: usize = 512;
/// Reduced elements per chunk below which a column reduction is not split.
const CHUNK_COLS: usize = 256;
/// The same for `reduce_cols_vec`, whose blocks cover 32 groups of 16 bytes of outputs each
/// (fewer blocks per chunk, so shorter chunks to fill the GPU).
const VEC_CHUNK_COLS: usize = 64;

hip_params! {
    /// Every reduce kernel's parameters. `ptrs`: input, second input (softmax backward's
    /// `dy`), output. Reductions and argmax: `rows` outputs each over `row_len` elements, the
    /// kept and reduced dimensions (merged), `count` the full reduced count (a mean's
    /// divisor), and `chunks` blocks of `chunk` elements per output. Softmax: `rows` rows of
    /// `row_len`.
    ReduceParams {
        ptrs: [u64; 3],
        rows: u64,
        row_len: u64,
        count: u64,
        chunk: u64,
        chunks: u64,
        kept_rank: u32,
        reduced_rank: u32,
        kept_shape: [u64; MAX_DIMS],
        kept_strides: [u64; MAX_DIMS],
        reduced_shape: [u64; MAX_DIMS],
        reduced_strides: [u64; MAX_DIMS],
    }
}

/// Whether this family's kernels run `op`: all of it, on float inputs.
pub(crate) fn supports(_op: &Op, _dtypes: &[DType]) -> bool {
    true
}

fn kind_code(kind: ReduceOp) -> u32 {
    match kind {
        ReduceOp::Sum => 0,
        ReduceOp::Mean => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
    }
}

/// A reduction kernel `entry` of `kind` from `input` to `output` with index type `index`;
/// `partial` when it writes per-chunk partials.
fn reduce_source(
    entry: &'static str,
    kind: ReduceOp,
    partial: bool,
    input: DType,
    output: DType,
    index: &str,
) -> Source {
    Source::new::<ReduceParams>(SRC, entry)
        .define("IDX", index)
        .define("TI", cxx_type(input))
        .define("TO", cxx_type(output))
        .define("KIND", kind_code(kind).to_string())
        .define("PARTIAL", u32::from(partial).to_string())
}

/// `reduce_cols_vec` over an input of `input`, 16-byte groups of outputs.
fn cols_vec_source(kind: ReduceOp, partial: bool, input: DType, output: DType) -> Source {
    reduce_source("reduce_cols_vec", kind, partial, input, output, "u64")
        .define("VEC_COLS", (16 / input.size()).to_string())
}

/// An argmax kernel (`argmax_thread`, `argmax_block` or `argmax_finish`) on `input`;
/// `partial` for an argmax_block that leaves its chunks' pairs to argmax_finish.
fn argmax_source(entry: &'static str, input: DType, index: &str, partial: bool) -> Source {
    Source::new::<ReduceParams>(SRC, entry)
        .define("IDX", index)
        .define("TI", cxx_type(input))
        .define("TO", cxx_type(input))
        .define("PARTIAL", u32::from(partial).to_string())
}

/// A softmax kernel (`softmax` or `softmax_backward`) on `dtype`, `log` for log-softmax.
fn softmax_source(entry: &'static str, log: bool, dtype: DType) -> Source {
    let t = cxx_type(dtype);
    Source::new::<ReduceParams>(SRC, entry)
        .define("IDX", "u64")
        .define("TI", t)
        .define("TO", t)
        .define("LOG", u32::from(log).to_string())
}

/// The kernels `launch` compiles for `op` on inputs of `dtypes`: each entry point with both
/// index types, and the partial passes of a split reduction.
#[cfg(test)]
pub(crate) fn samples(op: &Op, dtypes: &[DType]) -> Vec<Source> {
    let Some(&t) = dtypes.first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    match op {
        Op::Reduce { op: kind, .. } => {
            for index in ["u32", "u64"] {
                for entry in ["reduce_thread", "reduce_cols", "reduce_block"] {
                    out.push(reduce_source(entry, *kind, false, t, t, index));
                }
                out.push(cols_vec_source(*kind, index == "u64", t, t));
                out.push(reduce_source(
                    "reduce_block",
                    *kind,
                    true,
                    t,
                    DType::F32,
                    index,
                ));
                out.push(reduce_source(
                    "reduce_block",
                    *kind,
                    false,
                    DType::F32,
                    t,
                    index,
                ));
            }
        }
        Op::ArgMax { .. } => {
            for index in ["u32", "u64"] {
                out.push(argmax_source("argmax_thread", t, index, false));
                out.push(argmax_source("argmax_block", t, index, false));
                out.push(argmax_source("argmax_block", t, index, true));
                out.push(argmax_source("argmax_finish", t, index, false));
            }
        }
        Op::Softmax => out.push(softmax_source("softmax", false, t)),
        Op::LogSoftmax => out.push(softmax_source("softmax", true, t)),
        Op::SoftmaxBackward => out.push(softmax_source("softmax_backward", false, t)),
        Op::LogSoftmaxBackward => out.push(softmax_source("softmax_backward", true, t)),
        _ => {}
    }
    out
}

/// The parameters of reducing `x` over `axes` (the output row-major over the kept dims),
/// the kept and the reduced dimensions each merged where `x`'s strides allow.
fn reduction(gpu: &Gpu, op: &Op, x: &TensorRef<'_>, axes: &[usize]) -> Result<ReduceParams> {
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
    let rows = ks.iter().product::<usize>() as u64;
    let row_len = rs.iter().product::<usize>() as u64;
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
    let mut params = ReduceParams {
        ptrs: [gpu.ptr(x)?, 0, 0],
        rows,
        row_len,
        count: row_len,
        chunk: row_len.max(1),
        chunks: 1,
        kept_rank: ks.len() as u32,
        reduced_rank: rs.len() as u32,
        ..ReduceParams::default()
    };
    for (d, (&s, &st)) in ks.iter().zip(&kt[0]).enumerate() {
        params.kept_shape[d] = s as u64;
        params.kept_strides[d] = st as u64;
    }
    for (d, (&s, &st)) in rs.iter().zip(&rt[0]).enumerate() {
        params.reduced_shape[d] = s as u64;
        params.reduced_strides[d] = st as u64;
    }
    Ok(params)
}

/// Whether neighbouring outputs lie next to each other in the input while the reduced
/// elements do not: a reduction over outer axes.
fn along_outer_axes(p: &ReduceParams) -> bool {
    let kept = p.kept_rank as usize;
    let reduced = p.reduced_rank as usize;
    kept > 0 && p.kept_strides[kept - 1] == 1 && reduced > 0 && p.reduced_strides[reduced - 1] != 1
}

fn reduce(
    gpu: &Gpu,
    kind: ReduceOp,
    x: &TensorRef<'_>,
    out: &TensorRef<'_>,
    axes: &[usize],
    op: &Op,
) -> Result<()> {
    let mut params = reduction(gpu, op, x, axes)?;
    let (rows, len) = (params.rows as usize, params.row_len as usize);
    if rows == 0 {
        return Ok(());
    }
    params.ptrs[2] = gpu.ptr(out)?;
    let index = index_type(&[x, out]);
    let (ti, to) = (x.dtype, out.dtype);
    let key = |entry: &str, partial: bool, ti: DType, to: DType| {
        format!("{entry}:{}:{partial}:{ti}->{to}:{index}", kind.name())
    };
    let run = |entry: &'static str,
               partial: bool,
               ti: DType,
               to: DType,
               grid: Grid,
               params: &ReduceParams| {
        let source = || Ok(reduce_source(entry, kind, partial, ti, to, index));
        gpu.run(&key(entry, partial, ti, to), source, grid, params)
    };
    if len < THREAD_MAX {
        return run("reduce_thread", false, ti, to, grid_for(rows, 256), &params);
    }
    if along_outer_axes(&params) && rows >= 2 {
        let groups = rows.div_ceil(32);
        let lanes: u32 = if groups >= 256 {
            8
        } else if groups >= 64 {
            16
        } else {
            32
        };
        // A contiguous input whose rows are whole 16-byte groups of outputs (a bias gradient)
        // runs reduce_cols_vec, a 16-byte load per thread and reduced row.
        let width = 16 / ti.size();
        let vector = params.kept_rank == 1
            && params.reduced_rank == 1
            && params.reduced_strides[0] == params.rows
            && rows.is_multiple_of(width)
            && params.ptrs[0] % 16 == 0;
        let tiles = (rows / width).div_ceil(32);
        // Few groups of columns (a bias gradient: 768 columns over 8192 rows is 24 blocks)
        // would leave most of a large GPU idle: the reduced extent splits into chunks.
        let chunks = if vector {
            (SPLIT_BLOCKS / tiles).min(len / VEC_CHUNK_COLS)
        } else {
            (SPLIT_BLOCKS / groups).min(len / CHUNK_COLS)
        };
        if chunks < 2 {
            return run(
                "reduce_cols",
                false,
                ti,
                to,
                rows_grid(groups, 32 * lanes, 0),
                &params,
            );
        }
        let chunk = len.div_ceil(chunks);
        let chunks = len.div_ceil(chunk);
        let scratch = gpu.alloc(rows * chunks * 4)?;
        let partials = crate::memory::buffer_address(gpu.backend(), &scratch)?;
        let first = ReduceParams {
            ptrs: [params.ptrs[0], 0, partials],
            chunk: chunk as u64,
            chunks: chunks as u64,
            ..params
        };
        if vector {
            let key = format!("reduce_cols_vec:{}:{ti}", kind.name());
            let source = || Ok(cols_vec_source(kind, true, ti, DType::F32));
            gpu.run(&key, source, rows_grid(tiles * chunks, 256, 0), &first)?;
        } else {
            let grid = rows_grid(groups * chunks, 32 * lanes, 0);
            run("reduce_cols", true, ti, DType::F32, grid, &first)?;
        }
        // The partials lie [chunks, rows]: a reduction over their outer axis.
        let second = partials_params(partials, params.ptrs[2], rows, chunks, len, (1, rows));
        let grid = rows_grid(groups, 32 * lanes, 0);
        return run("reduce_cols", false, DType::F32, to, grid, &second);
    }
    let chunks = (len / CHUNK_MIN).min(SPLIT_BLOCKS / rows);
    if chunks < 2 {
        return run(
            "reduce_block",
            false,
            ti,
            to,
            rows_grid(rows, BLOCK, 0),
            &params,
        );
    }
    // Pass 1: `chunks` f32 partials per output into scratch; pass 2 combines each output's.
    let chunk = len.div_ceil(chunks);
    let chunks = len.div_ceil(chunk);
    let scratch = gpu.alloc(rows * chunks * 4)?;
    let partials = crate::memory::buffer_address(gpu.backend(), &scratch)?;
    let first = ReduceParams {
        ptrs: [params.ptrs[0], 0, partials],
        chunk: chunk as u64,
        chunks: chunks as u64,
        ..params
    };
    run(
        "reduce_block",
        true,
        ti,
        DType::F32,
        rows_grid(rows * chunks, BLOCK, 0),
        &first,
    )?;
    // The partials lie [rows, chunks].
    let second = partials_params(partials, params.ptrs[2], rows, chunks, len, (chunks, 1));
    run(
        "reduce_block",
        false,
        DType::F32,
        to,
        rows_grid(rows, BLOCK, 0),
        &second,
    )
}

/// The parameters of a second pass that combines `chunks` f32 partials of each of `rows`
/// outputs (at `partials`, with `(kept, reduced)` element strides) into `out`, for
/// reductions of `len` elements.
fn partials_params(
    partials: u64,
    out: u64,
    rows: usize,
    chunks: usize,
    len: usize,
    (kept, reduced): (usize, usize),
) -> ReduceParams {
    let mut params = ReduceParams {
        ptrs: [partials, 0, out],
        rows: rows as u64,
        row_len: chunks as u64,
        count: len as u64,
        chunk: chunks as u64,
        chunks: 1,
        kept_rank: 1,
        reduced_rank: 1,
        ..ReduceParams::default()
    };
    params.kept_shape[0] = rows as u64;
    params.kept_strides[0] = kept as u64;
    params.reduced_shape[0] = chunks as u64;
    params.reduced_strides[0] = reduced as u64;
    params
}

fn argmax(gpu: &Gpu, op: &Op, x: &TensorRef<'_>, out: &TensorRef<'_>, axis: usize) -> Result<()> {
    let mut params = reduction(gpu, op, x, &[axis])?;
    let (rows, len) = (params.rows as usize, params.row_len as usize);
    if rows == 0 || len == 0 {
        return Ok(());
    }
    params.ptrs[2] = gpu.ptr(out)?;
    let index = index_type(&[x, out]);
    let run = |entry: &'static str, partial: bool, grid, params: &ReduceParams| {
        let key = format!("{entry}:{}:{index}:{partial}", x.dtype);
        let source = || Ok(argmax_source(entry, x.dtype, index, partial));
        gpu.run(&key, source, grid, params)
    };
    if len < THREAD_MAX {
        return run("argmax_thread", false, grid_for(rows, 256), &params);
    }
    // A few long rows (greedy decoding's logits) split into chunks of ARGMAX_CHUNK elements,
    // a block each, whose best pairs a second launch combines: one block per row would walk
    // the row alone (28 us for GPT-2's 50,257 logits on an H100).
    let chunks = if rows < FEW_ROWS {
        len.div_ceil(ARGMAX_CHUNK).min(SPLIT_BLOCKS / rows)
    } else {
        1
    };
    if chunks < 2 {
        let threads = if rows < FEW_ROWS { 1024 } else { BLOCK };
        return run("argmax_block", false, rows_grid(rows, threads, 0), &params);
    }
    let chunk = len.div_ceil(chunks);
    let chunks = len.div_ceil(chunk);
    let pairs = rows * chunks;
    let index_bytes = if index == "u32" { 4 } else { 8 };
    // Scratch stays alive until both launches are queued (reuse is ordered after them).
    let value_scratch = gpu.alloc(pairs * 4)?;
    let index_scratch = gpu.alloc(pairs * index_bytes)?;
    let values = crate::memory::buffer_address(gpu.backend(), &value_scratch)?;
    let indices = crate::memory::buffer_address(gpu.backend(), &index_scratch)?;
    let first = ReduceParams {
        ptrs: [params.ptrs[0], indices, values],
        chunk: chunk as u64,
        chunks: chunks as u64,
        ..params
    };
    run("argmax_block", true, rows_grid(pairs, BLOCK, 0), &first)?;
    let second = ReduceParams {
        ptrs: [values, indices, params.ptrs[2]],
        chunks: chunks as u64,
        ..params
    };
    run("argmax_finish", false, rows_grid(rows, 64, 0), &second)
}

/// Threads per row of softmax: enough for the row, a multiple of 64 (every warp size).
fn softmax_threads(n: usize) -> u32 {
    match n {
        0..=64 => 64,
        65..=128 => 128,
        129..=8191 => 256,
        _ => 1024,
    }
}

fn softmax(
    gpu: &Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    out: &TensorRef<'_>,
    backward: bool,
    log: bool,
) -> Result<()> {
    let x = &inputs[0];
    let n = x.layout.shape.last().copied().unwrap_or(1);
    let total = x.layout.numel();
    if n == 0 || total == 0 {
        return Ok(());
    }
    let rows = total / n;
    let second = if backward { gpu.ptr(&inputs[1])? } else { 0 };
    let params = ReduceParams {
        ptrs: [gpu.ptr(x)?, second, gpu.ptr(out)?],
        rows: rows as u64,
        row_len: n as u64,
        ..ReduceParams::default()
    };
    let entry = if backward {
        "softmax_backward"
    } else {
        "softmax"
    };
    let key = format!("{}:{}", op.name(), x.dtype);
    let source = || Ok(softmax_source(entry, log, x.dtype));
    let grid = rows_grid(rows, softmax_threads(n), 0);
    gpu.run(&key, source, grid, &params)
}

pub(crate) fn launch(
    gpu: &Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    _scalars: &[f64],
) -> Result<()> {
    let (x, out) = (&inputs[0], &outputs[0]);
    match op {
        Op::Reduce { op: kind, axes, .. } => reduce(gpu, *kind, x, out, axes, op),
        Op::ArgMax { axis, .. } => argmax(gpu, op, x, out, *axis),
        Op::Softmax => softmax(gpu, op, inputs, out, false, false),
        Op::LogSoftmax => softmax(gpu, op, inputs, out, false, true),
        Op::SoftmaxBackward => softmax(gpu, op, inputs, out, true, false),
        Op::LogSoftmaxBackward => softmax(gpu, op, inputs, out, true, true),
        _ => Err(unsupported(gpu, op)),
    }
}
