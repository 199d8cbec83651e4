//! Movement: concat (a strided copy per input into its slice of the output), embedding and
//! gather (a thread per output element), index copy (a thread per source element, writing
//! only the indexed rows), and deterministic embedding backward and scatter-add (each output
//! element sums its sources in order; no atomics). Embedding backward first links each
//! position to the next one with the same id, so the sums cost O(P * D) after an O(P^2) pass
//! over the ids alone.

use std::sync::Arc;

use tessera_core::{numel, DType, Error, Layout, Op, Result, TensorRef};

use crate::gpu::{Gpu, Planner};
use crate::params::{offsets, param_block, MAX_BINDINGS};
use crate::source::{groups_for, key, no_subst, run, unsupported};
use crate::{elementwise, random};
use tessera_core::exec::split;

const SRC: &str = include_str!("../kernels/movement.wgsl");

/// Dimensions gather and scatter-add index (their operands are read through strides as they
/// are, axis included, so nothing merges).
const MAX_DIMS: usize = 8;

param_block! {
    /// The movement kernels' parameters. Embedding (and its backward): `elements` outputs in
    /// rows of `row_len`, the table's rows `first .. first + window_rows` of `total_rows`
    /// bound. Gather: x's rows `first .. first + window_rows` along `axis` of `total_rows`;
    /// scatter-add: the target of the output's first element along `axis` is `first`, and
    /// `accumulate` adds onto the output. Index copy: `elements` source elements in rows of
    /// `row_len`, `window_rows` indices, `total_rows` rows along the output's axis.
    MovementParams {
        elements: u32,
        row_len: u32,
        rank: u32,
        axis: u32,
        first: u32,
        window_rows: u32,
        total_rows: u32,
        accumulate: u32,
        index_shape: [u32; MAX_DIMS],
        out_shape: [u32; MAX_DIMS],
        x_strides: [u32; MAX_DIMS],
        index_strides: [u32; MAX_DIMS],
        out_strides: [u32; MAX_DIMS],
        offsets: [u32; MAX_BINDINGS],
    }
}

/// A shape or strides as a parameter field, or `Unsupported` for `op` past [`MAX_DIMS`].
fn dims(gpu: &dyn Gpu, op: &Op, values: &[usize]) -> Result<[u32; MAX_DIMS]> {
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
    for (w, &v) in field.iter_mut().zip(values) {
        *w = v as u32;
    }
    Ok(field)
}

/// Ranges `(first, count)` of `rows` rows of `row_bytes` bytes each (an embedding table, the
/// gradients of positions; row-major) that each fit one binding: all rows where they fit.
fn row_windows(gpu: &dyn Gpu, rows: usize, row_bytes: usize) -> Vec<(usize, usize)> {
    let room = gpu.max_binding().saturating_sub(gpu.align());
    let row_bytes = row_bytes.max(1) as u64;
    let per = if rows as u64 * row_bytes <= room {
        rows.max(1)
    } else {
        (room / row_bytes).max(1) as usize
    };
    (0..rows.max(1))
        .step_by(per)
        .map(|first| (first, per.min(rows - first)))
        .collect()
}

pub(crate) fn launch(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    let out = &outputs[0];
    let k = |variant: &str| key(op, inputs, outputs, variant);
    match op {
        Op::Concat { axis } => {
            let mut start = 0;
            for t in inputs {
                let len = t.layout.shape[*axis];
                let layout = out.layout.narrow(*axis, start, len);
                let slice = TensorRef {
                    buffer: out.buffer,
                    layout: &layout,
                    dtype: out.dtype,
                };
                split::launch(
                    &Planner(gpu),
                    &Op::Copy,
                    std::slice::from_ref(t),
                    std::slice::from_ref(&slice),
                    &[],
                )?;
                start += len;
            }
            Ok(())
        }
        Op::Embedding => {
            let (table, ids) = (&inputs[0], &inputs[1]);
            let (v, d) = (table.layout.shape[0], table.layout.shape[1]);
            let positions = ids.layout.numel();
            let ids_flat = ids.layout.flat();
            let out_rows = Layout {
                shape: vec![positions, d],
                strides: vec![d, 1],
                offset: out.layout.offset,
            };
            let position_windows = row_windows(gpu, positions, d * out.dtype.size());
            for (first, rows) in row_windows(gpu, v, d * table.dtype.size()) {
                let window = table.layout.narrow(0, first, rows);
                for &(p0, count) in &position_windows {
                    let (ids_part, out_part) =
                        (ids_flat.narrow(0, p0, count), out_rows.narrow(0, p0, count));
                    let ins = [table.with_layout(&window), ids.with_layout(&ids_part)];
                    let outs = [out.with_layout(&out_part)];
                    let m = count * d;
                    run(
                        gpu,
                        &k("embedding"),
                        SRC,
                        "embedding",
                        no_subst,
                        &ins,
                        &outs,
                        groups_for(m),
                        |o| MovementParams {
                            elements: m as u32,
                            row_len: d.max(1) as u32,
                            first: first as u32,
                            window_rows: rows as u32,
                            total_rows: v as u32,
                            offsets: offsets(o),
                            ..MovementParams::default()
                        },
                    )?;
                }
            }
            Ok(())
        }
        Op::EmbeddingBackward => {
            let (ids, d) = (&inputs[0], out.layout.shape[1]);
            let positions = ids.layout.numel();
            let ids_flat = ids.layout.flat();
            let dy_rows = Layout {
                shape: vec![positions, d],
                strides: vec![d, 1],
                offset: inputs[1].layout.offset,
            };
            let dy = inputs[1].with_layout(&dy_rows);
            let position_windows = row_windows(gpu, positions, d * dy.dtype.size());
            // 16-bit gradients summed over several ranges of positions add up in f32 scratch,
            // rounded once at the end.
            let staged = position_windows.len() > 1 && out.dtype != DType::F32;
            let sum_dtype = if staged { DType::F32 } else { out.dtype };
            let v = out.layout.shape[0];
            for (first, rows) in row_windows(gpu, v, d * sum_dtype.size()) {
                let window = out.layout.narrow(0, first, rows);
                let part = out.with_layout(&window);
                let scratch = if staged {
                    Some(gpu.scratch(rows * d * 4)?)
                } else {
                    None
                };
                let dense = Layout::contiguous(&[rows, d]);
                let sums = match &scratch {
                    Some(buffer) => TensorRef {
                        buffer,
                        layout: &dense,
                        dtype: DType::F32,
                    },
                    None => part,
                };
                random::launch(
                    gpu,
                    &Op::Fill { dtype: sums.dtype },
                    std::slice::from_ref(&sums),
                    &[0.0],
                    0,
                )?;
                for &(p0, count) in &position_windows {
                    let (ids_part, dy_part) =
                        (ids_flat.narrow(0, p0, count), dy_rows.narrow(0, p0, count));
                    let ins = [ids.with_layout(&ids_part), dy.with_layout(&dy_part)];
                    let scratch = gpu.scratch(count * 8)?;
                    let layout = Layout::contiguous(&[2 * count]);
                    let links = TensorRef {
                        buffer: &scratch,
                        layout: &layout,
                        dtype: DType::U32,
                    };
                    let links = std::slice::from_ref(&links);
                    run(
                        gpu,
                        &key(op, &ins[..1], links, "embedding_links"),
                        SRC,
                        "embedding_links",
                        no_subst,
                        &ins[..1],
                        links,
                        groups_for(count),
                        |o| MovementParams {
                            elements: count as u32,
                            offsets: offsets(o),
                            ..MovementParams::default()
                        },
                    )?;
                    let with_links = [sums, links[0]];
                    let m = count * d;
                    run(
                        gpu,
                        &key(op, &ins, &with_links, "embedding_backward"),
                        SRC,
                        "embedding_backward",
                        no_subst,
                        &ins,
                        &with_links,
                        groups_for(m),
                        |o| MovementParams {
                            elements: m as u32,
                            row_len: d.max(1) as u32,
                            first: first as u32,
                            window_rows: rows as u32,
                            offsets: offsets(o),
                            ..MovementParams::default()
                        },
                    )?;
                }
                if staged {
                    elementwise::launch(
                        gpu,
                        &Op::Cast { to: out.dtype },
                        std::slice::from_ref(&sums),
                        std::slice::from_ref(&part),
                        &[],
                    )?;
                }
            }
            Ok(())
        }
        Op::Gather { axis } => {
            let (x, idx) = (&inputs[0], &inputs[1]);
            let rows = x.layout.shape[*axis];
            gather_part(gpu, *axis, x, idx, out, 0, rows)
        }
        Op::ScatterAdd { axis } => {
            scatter_add_part(gpu, *axis, &inputs[0], &inputs[1], out, 0, false)
        }
        Op::IndexCopy { axis } => index_copy(gpu, op, *axis, inputs, out),
        _ => Err(unsupported(gpu, op)),
    }
}

/// Index copy of row-major operands: `dst` is copied to `out` first unless `out` is `dst`
/// itself, then only the indexed rows are written, so that an update in place (a KV cache
/// written at a decoding step's position) costs what its new rows cost. Elements move as
/// their bits, so every dtype copies exactly.
fn index_copy(
    gpu: &dyn Gpu,
    op: &Op,
    axis: usize,
    inputs: &[TensorRef<'_>],
    out: &TensorRef<'_>,
) -> Result<()> {
    let (dst, index, src) = (&inputs[0], &inputs[1], &inputs[2]);
    let in_place = std::ptr::addr_eq(Arc::as_ptr(dst.buffer), Arc::as_ptr(out.buffer))
        && dst.layout == out.layout;
    if !in_place {
        elementwise::launch(
            gpu,
            &Op::Copy,
            std::slice::from_ref(dst),
            std::slice::from_ref(out),
            &[],
        )?;
    }
    let shape = &out.layout.shape;
    let (rows, row_len) = (shape[axis], numel(&shape[axis + 1..]));
    let n = src.layout.numel();
    if n == 0 {
        return Ok(());
    }
    // dst is not bound: the kernel writes the output's rows alone.
    let (ins, outs) = ([*index, *src], [*out]);
    run(
        gpu,
        &key(op, &ins, &outs, "index_copy"),
        SRC,
        "index_copy",
        no_subst,
        &ins,
        &outs,
        groups_for(n),
        |o| MovementParams {
            elements: n as u32,
            row_len: row_len as u32,
            window_rows: index.layout.numel() as u32,
            total_rows: rows as u32,
            offsets: offsets(o),
            ..MovementParams::default()
        },
    )
}

/// Gather with `x` a window of rows `first..first + x.shape[axis]` along the axis of the
/// `rows` that the op's whole `x` has (`first` 0 and all rows in one launch): indices in the
/// window read it, the window from row 0 writes zeros for indices outside `0..rows`, and other
/// outputs are left to their window's launch. Operands are read and written through strides.
pub(crate) fn gather_part(
    gpu: &dyn Gpu,
    axis: usize,
    x: &TensorRef<'_>,
    idx: &TensorRef<'_>,
    out: &TensorRef<'_>,
    first: usize,
    rows: usize,
) -> Result<()> {
    let op = Op::Gather { axis };
    let (ins, outs) = ([*x, *idx], [*out]);
    let n = out.layout.numel();
    let params = MovementParams {
        elements: n as u32,
        rank: idx.layout.rank() as u32,
        axis: axis as u32,
        first: first as u32,
        window_rows: x.layout.shape[axis] as u32,
        total_rows: rows as u32,
        index_shape: dims(gpu, &op, &idx.layout.shape)?,
        x_strides: dims(gpu, &op, &x.layout.strides)?,
        index_strides: dims(gpu, &op, &idx.layout.strides)?,
        out_strides: dims(gpu, &op, &out.layout.strides)?,
        ..MovementParams::default()
    };
    run(
        gpu,
        &key(&op, &ins, &outs, "gather"),
        SRC,
        "gather",
        no_subst,
        &ins,
        &outs,
        groups_for(n),
        |o| {
            let mut params = params;
            params.offsets = offsets(o);
            params
        },
    )
}

/// Scatter-add into `out`, whose first element along the axis is target `first`, from `idx`
/// and `src` (one shape and strides): written (`accumulate` false: the whole op in one
/// launch), or added onto `out`'s values (parts of an op over windows, after zeroing).
pub(crate) fn scatter_add_part(
    gpu: &dyn Gpu,
    axis: usize,
    idx: &TensorRef<'_>,
    src: &TensorRef<'_>,
    out: &TensorRef<'_>,
    first: usize,
    accumulate: bool,
) -> Result<()> {
    let op = Op::ScatterAdd { axis };
    let (ins, outs) = ([*idx, *src], [*out]);
    let n = out.layout.numel();
    let params = MovementParams {
        elements: n as u32,
        rank: idx.layout.rank() as u32,
        axis: axis as u32,
        first: first as u32,
        accumulate: u32::from(accumulate),
        out_shape: dims(gpu, &op, &out.layout.shape)?,
        index_shape: dims(gpu, &op, &idx.layout.shape)?,
        index_strides: dims(gpu, &op, &idx.layout.strides)?,
        out_strides: dims(gpu, &op, &out.layout.strides)?,
        ..MovementParams::default()
    };
    run(
        gpu,
        &key(&op, &ins, &outs, "scatter_add"),
        SRC,
        "scatter_add",
        no_subst,
        &ins,
        &outs,
        groups_for(n),
        |o| {
            let mut params = params;
            params.offsets = offsets(o);
            params
        },
    )
}
