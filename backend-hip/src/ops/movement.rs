//! Concat, embedding and its backward, gather, index copies and deterministic scatter-add
//! (`kernels/movement.hip`). Every operand is row-major.
//!
//! Concat and embedding copy words as wide as the operands' alignment allows (up to 16
//! bytes), gather copies elements' bits, so all three serve every dtype. Scatter-add gives each
//! output element a thread that sums its sources in order. Embedding backward sorts the
//! positions by id stably (integer counts, a scan and a tiled ranking in one block), then
//! each element of `dweight` sums its id's rows of `dy` in increasing position order: no
//! float atomics, so the same input gives the same bits.

use tessera_core::{contiguous_strides, DType, Error, Op, Result, TensorRef};

use super::{cxx_type, index_type, unsupported};
use crate::gpu::{grid_for, Gpu, Source};
use crate::memory::buffer_address;
use crate::params::hip_params;

const SRC: &str = include_str!("../../kernels/movement.hip");

/// Dimensions gather and scatter-add index.
const MAX_DIMS: usize = 8;
/// Threads per block; the ordering kernel of embedding backward runs one block of these.
const THREADS: u32 = 256;

hip_params! {
    /// The movement kernels' parameters: the operands (`src` is the copied or summed data,
    /// `index` the ids or indices, `dst` the output, `aux*` embedding backward's scratch:
    /// counts, cursors, order), `elements` output items (words for the copies), `row` words
    /// per row (concat's input, embedding's row, D), concat's `out_row` and `dst_offset`,
    /// `rows` the valid range of an id or index (V, or x's extent along `axis`),
    /// `positions` the number of ids (embedding backward's, an index copy's), and the shapes
    /// and strides of gather and scatter-add.
    MoveParams {
        src: u64,
        index: u64,
        dst: u64,
        aux0: u64,
        aux1: u64,
        aux2: u64,
        elements: u64,
        row: u64,
        out_row: u64,
        dst_offset: u64,
        rows: u64,
        positions: u64,
        rank: u32,
        axis: u32,
        index_shape: [u64; MAX_DIMS],
        out_shape: [u64; MAX_DIMS],
        x_strides: [u64; MAX_DIMS],
        index_strides: [u64; MAX_DIMS],
    }
}

/// Whether this family's kernels run `op` on inputs of `dtypes`: every op on every dtype the
/// catalog allows.
pub(crate) fn supports(_op: &Op, _dtypes: &[DType]) -> bool {
    true
}

/// The unsigned type of `bytes` bytes, the word the copies move.
fn word(bytes: usize) -> &'static str {
    match bytes {
        1 => "u8",
        2 => "u16",
        4 => "u32",
        8 => "u64",
        _ => "w128",
    }
}

/// What the sums of `dtype` accumulate in: f32 for floats, wrapping u32 for integers.
fn accumulator(dtype: DType) -> &'static str {
    if dtype.is_float() {
        "float"
    } else {
        "u32"
    }
}

/// The largest word (1 to 16 bytes) that divides every size and address in `values`.
fn word_bytes(values: &[u64]) -> usize {
    let mut w = 16;
    while w > 1 && values.iter().any(|v| v % w != 0) {
        w /= 2;
    }
    w as usize
}

/// The copy kernel `entry` (concat, embedding, gather) moving words of `bytes` bytes, with
/// ids of `ids` (none for concat).
fn copy_source(entry: &'static str, bytes: usize, ids: Option<DType>, index: &str) -> Source {
    let source = Source::new::<MoveParams>(SRC, entry)
        .define("IDX", index)
        .define("W", word(bytes));
    match ids {
        Some(ids) => source.define("I", cxx_type(ids)),
        None => source,
    }
}

/// A summing kernel (`scatter_add`, `embedding_sum`) of `data`, or the embedding backward
/// steps that only read ids (`data` none), with ids of `ids`.
fn sum_source(entry: &'static str, ids: DType, data: Option<DType>, index: &str) -> Source {
    let source = Source::new::<MoveParams>(SRC, entry).define("IDX", index);
    let source = if entry == "embedding_sum" {
        source
    } else {
        source.define("I", cxx_type(ids))
    };
    match data {
        Some(d) => source
            .define("T", cxx_type(d))
            .define("ACC", accumulator(d)),
        None => source,
    }
}

/// The kernels `launch` compiles for `op` on inputs of `dtypes`.
#[cfg(test)]
pub(crate) fn samples(op: &Op, dtypes: &[DType]) -> Vec<Source> {
    let size = |d: DType| d.size();
    match op {
        Op::Concat { .. } => [16, 4, size(dtypes[0])]
            .into_iter()
            .map(|b| copy_source("concat", b, None, "u32"))
            .chain([copy_source("concat", 1, None, "u64")])
            .collect(),
        Op::Embedding => vec![
            copy_source("embedding", 16, Some(dtypes[1]), "u32"),
            copy_source("embedding", size(dtypes[0]), Some(dtypes[1]), "u64"),
        ],
        Op::Gather { .. } => ["u32", "u64"]
            .into_iter()
            .map(|index| copy_source("gather", size(dtypes[0]), Some(dtypes[1]), index))
            .collect(),
        Op::IndexCopy { .. } => [(16, "u32"), (size(dtypes[0]), "u64")]
            .into_iter()
            .map(|(bytes, index)| copy_source("index_copy", bytes, Some(dtypes[1]), index))
            .collect(),
        Op::ScatterAdd { .. } => ["u32", "u64"]
            .into_iter()
            .map(|index| sum_source("scatter_add", dtypes[0], Some(dtypes[1]), index))
            .collect(),
        Op::EmbeddingBackward => vec![
            sum_source("embedding_count", dtypes[0], None, "u32"),
            sum_source("embedding_order", dtypes[0], None, "u32"),
            sum_source("embedding_sum", dtypes[0], Some(dtypes[1]), "u32"),
            sum_source("embedding_sum", dtypes[0], Some(dtypes[1]), "u64"),
        ],
        _ => Vec::new(),
    }
}

/// A shape or strides as a parameter field, or `Unsupported` for `op` past [`MAX_DIMS`].
fn dims(gpu: &Gpu, op: &Op, values: &[usize]) -> Result<[u64; MAX_DIMS]> {
    if values.len() > MAX_DIMS {
        return Err(Error::unsupported(
            gpu.backend(),
            format!(
                "{} over {} dimensions (the kernel indexes {MAX_DIMS})",
                op.name(),
                values.len()
            ),
        ));
    }
    let mut field = [0; MAX_DIMS];
    for (f, &v) in field.iter_mut().zip(values) {
        *f = v as u64;
    }
    Ok(field)
}

pub(crate) fn launch(
    gpu: &Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    _scalars: &[f64],
) -> Result<()> {
    let out = &outputs[0];
    if out.layout.numel() == 0 {
        return Ok(());
    }
    match op {
        Op::Concat { axis } => concat(gpu, *axis, inputs, out),
        Op::Embedding => embedding(gpu, &inputs[0], &inputs[1], out),
        Op::EmbeddingBackward => embedding_backward(gpu, &inputs[0], &inputs[1], out),
        Op::Gather { axis } => gather(gpu, op, *axis, &inputs[0], &inputs[1], out),
        Op::ScatterAdd { axis } => scatter_add(gpu, op, *axis, &inputs[0], &inputs[1], out),
        Op::IndexCopy { axis } => index_copy(gpu, *axis, inputs, out),
        _ => Err(unsupported(gpu, op)),
    }
}

/// Each input copied into its slice of the output: `outer` rows of the input's
/// `len * inner` elements, placed at `start * inner` in rows of `total * inner`.
fn concat(gpu: &Gpu, axis: usize, inputs: &[TensorRef<'_>], out: &TensorRef<'_>) -> Result<()> {
    let shape = &out.layout.shape;
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let size = out.dtype.size();
    let out_row = (shape[axis] * inner * size) as u64;
    let dst = gpu.ptr(out)?;
    let mut start = 0;
    for t in inputs {
        let len = t.layout.shape[axis];
        let offset = (start * inner * size) as u64;
        start += len;
        if t.layout.numel() == 0 {
            continue;
        }
        let src = gpu.ptr(t)?;
        let chunk = (len * inner * size) as u64;
        let bytes = word_bytes(&[chunk, out_row, offset, src, dst]);
        let w = bytes as u64;
        let index = index_type(&[t, out]);
        let params = MoveParams {
            src,
            dst,
            elements: outer as u64 * chunk / w,
            row: chunk / w,
            out_row: out_row / w,
            dst_offset: offset / w,
            ..MoveParams::default()
        };
        let key = format!("concat:{bytes}:{index}");
        let source = || Ok(copy_source("concat", bytes, None, index));
        let n = params.elements as usize;
        gpu.run(&key, source, grid_for(n, THREADS), &params)?;
    }
    Ok(())
}

/// `dst` with `src`'s rows at the indexed positions along `axis`: `dst` copied into the output
/// first unless the output is `dst` itself (in place, a KV cache), then only those rows.
fn index_copy(gpu: &Gpu, axis: usize, inputs: &[TensorRef<'_>], out: &TensorRef<'_>) -> Result<()> {
    let (dst, index, src) = (&inputs[0], &inputs[1], &inputs[2]);
    let to = gpu.ptr(out)?;
    if gpu.ptr(dst)? != to {
        concat(gpu, 0, std::slice::from_ref(dst), out)?;
    }
    let shape = &out.layout.shape;
    let row_bytes = (shape[axis + 1..].iter().product::<usize>() * out.dtype.size()) as u64;
    if src.layout.numel() == 0 {
        return Ok(());
    }
    let from = gpu.ptr(src)?;
    let bytes = word_bytes(&[row_bytes, from, to]);
    let w = bytes as u64;
    let count = index.layout.numel() as u64;
    let elements = src.layout.numel() as u64 * out.dtype.size() as u64 / w;
    let ids = index_type(&[src, out]);
    let params = MoveParams {
        src: from,
        index: gpu.ptr(index)?,
        dst: to,
        elements,
        row: row_bytes / w,
        rows: shape[axis] as u64,
        positions: count,
        ..MoveParams::default()
    };
    let key = format!("index_copy:{bytes}:{}:{ids}", index.dtype);
    let source = || Ok(copy_source("index_copy", bytes, Some(index.dtype), ids));
    gpu.run(&key, source, grid_for(elements as usize, THREADS), &params)
}

/// Row `ids[i]` of the table per position, zeros for ids outside it.
fn embedding(
    gpu: &Gpu,
    table: &TensorRef<'_>,
    ids: &TensorRef<'_>,
    out: &TensorRef<'_>,
) -> Result<()> {
    let (vocab, d) = (table.layout.shape[0], table.layout.shape[1]);
    let (src, dst) = (gpu.ptr(table)?, gpu.ptr(out)?);
    let row_bytes = (d * table.dtype.size()) as u64;
    let bytes = word_bytes(&[row_bytes, src, dst]);
    let w = bytes as u64;
    let index = index_type(&[table, ids, out]);
    let params = MoveParams {
        src,
        index: gpu.ptr(ids)?,
        dst,
        elements: ids.layout.numel() as u64 * row_bytes / w,
        row: row_bytes / w,
        rows: vocab as u64,
        ..MoveParams::default()
    };
    let key = format!("embedding:{bytes}:{}:{index}", ids.dtype);
    let source = || Ok(copy_source("embedding", bytes, Some(ids.dtype), index));
    let n = params.elements as usize;
    gpu.run(&key, source, grid_for(n, THREADS), &params)
}

/// `out[e] = x[..., index[e], ...]` along `axis`, zero for indices outside x.
fn gather(
    gpu: &Gpu,
    op: &Op,
    axis: usize,
    x: &TensorRef<'_>,
    idx: &TensorRef<'_>,
    out: &TensorRef<'_>,
) -> Result<()> {
    let index = index_type(&[x, idx, out]);
    let size = x.dtype.size();
    let params = MoveParams {
        src: gpu.ptr(x)?,
        index: gpu.ptr(idx)?,
        dst: gpu.ptr(out)?,
        elements: out.layout.numel() as u64,
        rows: x.layout.shape[axis] as u64,
        rank: idx.layout.rank() as u32,
        axis: axis as u32,
        index_shape: dims(gpu, op, &idx.layout.shape)?,
        x_strides: dims(gpu, op, &contiguous_strides(&x.layout.shape))?,
        ..MoveParams::default()
    };
    let key = format!("gather:{size}:{}:{index}", idx.dtype);
    let source = || Ok(copy_source("gather", size, Some(idx.dtype), index));
    let n = out.layout.numel();
    gpu.run(&key, source, grid_for(n, THREADS), &params)
}

/// Zeros, then each output element sums its sources along `axis` in source order.
fn scatter_add(
    gpu: &Gpu,
    op: &Op,
    axis: usize,
    idx: &TensorRef<'_>,
    src: &TensorRef<'_>,
    out: &TensorRef<'_>,
) -> Result<()> {
    let index = index_type(&[idx, src, out]);
    let params = MoveParams {
        src: gpu.ptr(src)?,
        index: gpu.ptr(idx)?,
        dst: gpu.ptr(out)?,
        elements: out.layout.numel() as u64,
        rank: out.layout.rank() as u32,
        axis: axis as u32,
        index_shape: dims(gpu, op, &idx.layout.shape)?,
        out_shape: dims(gpu, op, &out.layout.shape)?,
        index_strides: dims(gpu, op, &contiguous_strides(&idx.layout.shape))?,
        ..MoveParams::default()
    };
    let key = format!("scatter_add:{}:{}:{index}", idx.dtype, src.dtype);
    let source = || Ok(sum_source("scatter_add", idx.dtype, Some(src.dtype), index));
    let n = out.layout.numel();
    gpu.run(&key, source, grid_for(n, THREADS), &params)
}

/// `dweight [V, D]`: the positions sorted by id (stably), then each element sums its id's
/// rows of `dy` in increasing position order.
fn embedding_backward(
    gpu: &Gpu,
    ids: &TensorRef<'_>,
    dy: &TensorRef<'_>,
    out: &TensorRef<'_>,
) -> Result<()> {
    let (vocab, d) = (out.layout.shape[0], out.layout.shape[1]);
    let positions = ids.layout.numel();
    let dst = gpu.ptr(out)?;
    if positions == 0 {
        return gpu.driver.zero(dst, out.layout.numel() * out.dtype.size());
    }
    if positions >= u32::MAX as usize || vocab >= u32::MAX as usize {
        return Err(Error::unsupported(
            gpu.backend(),
            format!(
                "embedding_backward over {positions} positions and {vocab} ids (at most 2^32 each)"
            ),
        ));
    }
    let counts = gpu.alloc(vocab * 4)?;
    let cursor = gpu.alloc(vocab * 4)?;
    let order = gpu.alloc(positions * 4)?;
    let backend = gpu.backend();
    let aux0 = buffer_address(backend, &counts)?;
    gpu.driver.zero(aux0, vocab * 4)?;
    let index = index_type(&[ids, dy, out]);
    let params = MoveParams {
        src: gpu.ptr(dy)?,
        index: gpu.ptr(ids)?,
        dst,
        aux0,
        aux1: buffer_address(backend, &cursor)?,
        aux2: buffer_address(backend, &order)?,
        elements: out.layout.numel() as u64,
        row: d as u64,
        rows: vocab as u64,
        positions: positions as u64,
        ..MoveParams::default()
    };
    let (i, t) = (ids.dtype, dy.dtype);
    let count = || Ok(sum_source("embedding_count", i, None, "u32"));
    let grid = grid_for(positions, THREADS);
    gpu.run(&format!("embedding_count:{i}"), count, grid, &params)?;
    let order_source = || Ok(sum_source("embedding_order", i, None, "u32"));
    let one_block = grid_for(1, THREADS);
    gpu.run(
        &format!("embedding_order:{i}"),
        order_source,
        one_block,
        &params,
    )?;
    let sum = || Ok(sum_source("embedding_sum", i, Some(t), index));
    let key = format!("embedding_sum:{t}:{index}");
    gpu.run(&key, sum, grid_for(out.layout.numel(), THREADS), &params)
}
