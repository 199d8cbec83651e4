//! Movement: concatenation, embedding, gather, index copies, and the deterministic
//! accumulations (embedding backward, scatter-add).
//!
//! Concat, embedding and gather move raw element bytes, so they work for every dtype. The
//! accumulations run in source order on one thread, which makes them deterministic.

use std::sync::Arc;

use tessera_core::{contiguous_strides, numel, DType, Layout, Op, Result, TensorRef};

use crate::buffer::{
    bytes_mut, cpu_buffer, read, read_index, read_raw, with_bytes, write, write_raw,
};
use crate::float::{computes_in_f64, Float};
use crate::wrong_family;

/// Marks a source element whose index is out of range.
const SKIP: usize = usize::MAX;

pub(crate) fn launch(op: &Op, inputs: &[TensorRef<'_>], outputs: &[TensorRef<'_>]) -> Result<()> {
    let out = &outputs[0];
    match op {
        Op::Concat { axis } => concat(*axis, inputs, out),
        Op::Embedding => embedding(&inputs[0], &inputs[1], out),
        Op::EmbeddingBackward => {
            let ids = read_index(&inputs[0])?;
            let (vocab, d) = (out.layout.shape[0], out.layout.shape[1]);
            let mut targets = Vec::with_capacity(ids.len() * d);
            for &id in &ids {
                let row = usize::try_from(id).ok().filter(|&r| r < vocab);
                targets.extend((0..d).map(|j| row.map_or(SKIP, |r| r * d + j)));
            }
            accumulate(&inputs[1], out, &targets)
        }
        Op::Gather { axis } => gather(*axis, &inputs[0], &inputs[1], out),
        Op::IndexCopy { axis } => index_copy(*axis, inputs, out),
        Op::ScatterAdd { axis } => {
            let index = read_index(&inputs[0])?;
            let shape = &out.layout.shape;
            let mut strides = contiguous_strides(shape);
            let step = strides[*axis];
            strides[*axis] = 0;
            let base = Layout {
                shape: inputs[0].layout.shape.clone(),
                strides,
                offset: 0,
            };
            let targets: Vec<usize> = base
                .indices()
                .zip(&index)
                .map(|(b, &i)| match usize::try_from(i) {
                    Ok(i) if i < shape[*axis] => b + i * step,
                    _ => SKIP,
                })
                .collect();
            accumulate(&inputs[1], out, &targets)
        }
        _ => Err(wrong_family(op)),
    }
}

/// Copies `src`'s rows into `out` at the indexed positions along `axis`, after `dst` where
/// `out` is not `dst` itself: only those rows are written, so a cache updated in place costs
/// what the new rows cost.
fn index_copy(axis: usize, inputs: &[TensorRef<'_>], out: &TensorRef<'_>) -> Result<()> {
    let dst = &inputs[0];
    let in_place = std::ptr::addr_eq(Arc::as_ptr(dst.buffer), Arc::as_ptr(out.buffer))
        && dst.layout == out.layout;
    if !in_place {
        write_raw(out, &read_raw(dst)?)?;
    }
    let index = read_index(&inputs[1])?;
    let src = read_raw(&inputs[2])?;
    let shape = &out.layout.shape;
    let size = out.dtype.size();
    let (outer, along) = (numel(&shape[..axis]), shape[axis]);
    let row = numel(&shape[axis + 1..]) * size;
    let base = out.layout.offset * size;
    cpu_buffer(out.buffer)?.write(|words| {
        let bytes = bytes_mut(words);
        for o in 0..outer {
            for (t, &i) in index.iter().enumerate() {
                let Some(i) = usize::try_from(i).ok().filter(|&i| i < along) else {
                    continue;
                };
                let to = base + (o * along + i) * row;
                let from = (o * index.len() + t) * row;
                bytes[to..to + row].copy_from_slice(&src[from..from + row]);
            }
        }
        Ok(())
    })
}

fn concat(axis: usize, inputs: &[TensorRef<'_>], out: &TensorRef<'_>) -> Result<()> {
    let shape = &out.layout.shape;
    let (outer, inner) = (numel(&shape[..axis]), numel(&shape[axis + 1..]));
    let size = out.dtype.size();
    let parts = inputs.iter().map(read_raw).collect::<Result<Vec<_>>>()?;
    let chunks: Vec<usize> = inputs
        .iter()
        .map(|t| t.layout.shape[axis] * inner * size)
        .collect();
    let mut bytes = Vec::with_capacity(out.layout.numel() * size);
    for o in 0..outer {
        for (part, &chunk) in parts.iter().zip(&chunks) {
            bytes.extend_from_slice(&part[o * chunk..(o + 1) * chunk]);
        }
    }
    write_raw(out, &bytes)
}

/// Row `ids[i]` of `weight` for each id, or a zero row for ids outside `0..V`.
fn embedding(weight: &TensorRef<'_>, ids: &TensorRef<'_>, out: &TensorRef<'_>) -> Result<()> {
    let ids = read_index(ids)?;
    let (vocab, d) = (weight.layout.shape[0], weight.layout.shape[1]);
    let size = weight.dtype.size();
    let row = d * size;
    let base = weight.layout.offset * size;
    let bytes = with_bytes(weight, |w| {
        let mut bytes = vec![0u8; ids.len() * row];
        for (dst, &id) in bytes.chunks_exact_mut(row.max(1)).zip(&ids) {
            if let Some(r) = usize::try_from(id).ok().filter(|&r| r < vocab) {
                dst.copy_from_slice(&w[base + r * row..base + (r + 1) * row]);
            }
        }
        Ok(bytes)
    })?;
    write_raw(out, &bytes)
}

/// `out[i][j] = x[i][index[i][j]]` along `axis`; 0 for out-of-range indices.
fn gather(
    axis: usize,
    x: &TensorRef<'_>,
    index: &TensorRef<'_>,
    out: &TensorRef<'_>,
) -> Result<()> {
    let idx = read_index(index)?;
    let size = x.dtype.size();
    let mut strides = contiguous_strides(&x.layout.shape);
    let step = strides[axis];
    strides[axis] = 0;
    let base = Layout {
        shape: index.layout.shape.clone(),
        strides,
        offset: x.layout.offset,
    };
    let len = x.layout.shape[axis];
    let bytes = with_bytes(x, |w| {
        let mut bytes = vec![0u8; idx.len() * size];
        for ((dst, b), &i) in bytes.chunks_exact_mut(size).zip(base.indices()).zip(&idx) {
            if let Some(i) = usize::try_from(i).ok().filter(|&i| i < len) {
                let src = (b + i * step) * size;
                dst.copy_from_slice(&w[src..src + size]);
            }
        }
        Ok(bytes)
    })?;
    write_raw(out, &bytes)
}

/// Zeros, then `out[targets[i]] += src[i]` for every source element in order, skipping
/// [`SKIP`]. Floats accumulate in the compute type; integers wrap, as 32-bit addition does.
fn accumulate(src: &TensorRef<'_>, out: &TensorRef<'_>, targets: &[usize]) -> Result<()> {
    fn floats<F: Float>(src: &TensorRef<'_>, out: &TensorRef<'_>, targets: &[usize]) -> Result<()> {
        let values = read::<F>(src)?;
        let mut acc = vec![F::zero(); out.layout.numel()];
        for (&t, &v) in targets.iter().zip(&values) {
            if let Some(a) = acc.get_mut(t) {
                *a += v;
            }
        }
        write(out, &acc)
    }
    match src.dtype {
        DType::I32 | DType::U32 => {
            let values = read_index(src)?;
            let mut acc = vec![0u32; out.layout.numel()];
            for (&t, &v) in targets.iter().zip(&values) {
                if let Some(a) = acc.get_mut(t) {
                    *a = a.wrapping_add(v as u32);
                }
            }
            write_raw(out, bytemuck::cast_slice(&acc))
        }
        d if computes_in_f64(d) => floats::<f64>(src, out, targets),
        _ => floats::<f32>(src, out, targets),
    }
}
