//! Fused ops run as the catalog ops they fuse, for backends and shapes without a fused kernel:
//! the same definition, one more launch and a scratch tensor.

use std::sync::Arc;

use crate::ops::stats_dtype;
use crate::{Buffer, Error, Layout, Op, Result, TensorRef};

/// A launch of one catalog op on a backend's own kernels.
pub type LaunchOp<'a> = dyn Fn(&Op, &[TensorRef<'_>], &[TensorRef<'_>], &[f64]) -> Result<()> + 'a;

/// Runs `NormMatmul` as its norm, whose output goes to scratch of `x`'s dtype (rounded as the
/// norm op stores it, which the fused op allows), then its matmul reading that scratch.
/// `scratch` allocates device memory that may be reused once the work queued on it has run.
pub fn norm_then_matmul(
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    scalars: &[f64],
    scratch: &dyn Fn(usize) -> Result<Arc<dyn Buffer>>,
    launch: &LaunchOp<'_>,
) -> Result<()> {
    let Op::NormMatmul {
        norm,
        bias,
        activation,
        residual,
    } = *op
    else {
        return Err(Error::invalid(&op.name(), "not a norm_matmul"));
    };
    let x = &inputs[0];
    let &[m, k] = &x.layout.shape[..] else {
        return Err(Error::shape(
            &op.name(),
            format!("x must be [M, K]; got {:?}", x.layout.shape),
        ));
    };
    let y_layout = Layout::contiguous(&[m, k]);
    let stats_layout = Layout::contiguous(&[m]);
    let stats = stats_dtype(x.dtype);
    let padded = |bytes: usize| bytes.div_ceil(4).max(1) * 4;
    let y_buffer = scratch(padded(m * k * x.dtype.size()))?;
    let stat_buffers = (0..norm.statistics())
        .map(|_| scratch(padded(m * stats.size())))
        .collect::<Result<Vec<_>>>()?;
    let y = TensorRef {
        buffer: &y_buffer,
        layout: &y_layout,
        dtype: x.dtype,
    };
    let mut norm_outputs = vec![y];
    norm_outputs.extend(stat_buffers.iter().map(|buffer| TensorRef {
        buffer,
        layout: &stats_layout,
        dtype: stats,
    }));
    let params = 2 + norm.params();
    let mut norm_inputs = vec![*x];
    norm_inputs.extend_from_slice(&inputs[2..params]);
    launch(&norm.op(), &norm_inputs, &norm_outputs, &scalars[..1])?;
    let mut product_inputs = vec![y, inputs[1]];
    product_inputs.extend_from_slice(&inputs[params..]);
    let product = Op::Matmul {
        bias,
        activation,
        residual,
    };
    launch(&product, &product_inputs, outputs, &[])
}

/// Runs `AppendAttention` as its cache write (`IndexCopy` of `kv_new` into output 1, the
/// cache, at the positions) and then `CachedAttention` over that cache's keys and values.
pub fn index_copy_then_attention(
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    scalars: &[f64],
    launch: &LaunchOp<'_>,
) -> Result<()> {
    let (&[q, kv, positions, new], &[out, cache]) = (inputs, outputs) else {
        return Err(Error::invalid(
            &op.name(),
            "needs q, kv, positions and kv_new, and out and kv",
        ));
    };
    launch(
        &Op::IndexCopy { axis: 3 },
        &[kv, positions, new],
        &[cache],
        &[],
    )?;
    let (k, v) = (cache.layout.select_first(0), cache.layout.select_first(1));
    let attend = [q, cache.with_layout(&k), cache.with_layout(&v), positions];
    launch(&Op::CachedAttention, &attend, &[out], scalars)
}
