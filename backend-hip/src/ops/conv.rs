//! 2-D convolution and its backward passes (`kernels/conv.hip`), as direct kernels: a thread
//! per output element of the forward pass and the data gradient, a block per element of the
//! weight gradient (whose sums run over the whole batch), each summing in a fixed order in
//! f32.

use tessera_core::{Conv2dParams, DType, Op, Result, TensorRef};

use super::{cxx_type, index_type, unsupported};
use crate::gpu::{grid_for, rows_grid, Gpu, Source};
use crate::params::hip_params;

const SRC: &str = include_str!("../../kernels/conv.hip");

hip_params! {
    /// A convolution's operands and geometry: x [n, c, height, width], w [o, c, kh, kw],
    /// y [n, o, oh, ow] (dy in the backward passes, which write dx through `x` or dw through
    /// `w`), and the number of output `elements`.
    ConvParams {
        x: u64,
        w: u64,
        bias: u64,
        y: u64,
        elements: u64,
        n: u32,
        c: u32,
        height: u32,
        width: u32,
        o: u32,
        kh: u32,
        kw: u32,
        oh: u32,
        ow: u32,
        stride: [u32; 2],
        pad: [u32; 2],
        dil: [u32; 2],
    }
}

/// Whether this family's kernels run `op` on inputs of `dtypes`: f32, f16 and bf16 data.
pub(crate) fn supports(_op: &Op, dtypes: &[DType]) -> bool {
    matches!(dtypes.first(), Some(DType::F32 | DType::F16 | DType::BF16))
}

/// The kernel for `op` on data of `dtype`, indexed with `index`.
fn conv_source(op: &Op, dtype: DType, index: &str) -> Option<Source> {
    let (entry, flag) = match op {
        Op::Conv2d { .. } => ("conv2d", "FORWARD"),
        Op::Conv2dBackwardData { .. } => ("conv2d_dx", "BACKWARD_DATA"),
        Op::Conv2dBackwardWeight { .. } => ("conv2d_dw", "BACKWARD_WEIGHT"),
        _ => return None,
    };
    let bias = matches!(op, Op::Conv2d { bias: true, .. });
    Some(
        Source::new::<ConvParams>(SRC, entry)
            .define(flag, "1")
            .define("T", cxx_type(dtype))
            .define("IDX", index)
            .define("BIAS", if bias { "1" } else { "0" }),
    )
}

/// The kernels `launch` compiles for `op` on inputs of `dtypes`: both index types.
#[cfg(test)]
pub(crate) fn samples(op: &Op, dtypes: &[DType]) -> Vec<Source> {
    ["u32", "u64"]
        .into_iter()
        .filter_map(|index| conv_source(op, dtypes[0], index))
        .collect()
}

/// Threads summing one weight-gradient element over `terms` products: fewer for short sums.
fn dw_threads(terms: usize) -> u32 {
    match terms {
        0..=2048 => 64,
        2049..=8192 => 128,
        _ => 256,
    }
}

pub(crate) fn launch(
    gpu: &Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    _scalars: &[f64],
) -> Result<()> {
    // x, w and y (or their gradients) in the op's inputs and outputs.
    let (x, w, y, conv): (
        &TensorRef<'_>,
        &TensorRef<'_>,
        &TensorRef<'_>,
        &Conv2dParams,
    ) = match op {
        Op::Conv2d { params, .. } => (&inputs[0], &inputs[1], &outputs[0], params),
        Op::Conv2dBackwardData { params } => (&outputs[0], &inputs[1], &inputs[0], params),
        Op::Conv2dBackwardWeight { params } => (&inputs[0], &outputs[0], &inputs[1], params),
        _ => return Err(unsupported(gpu, op)),
    };
    let out = &outputs[0];
    let elements = out.layout.numel();
    if elements == 0 {
        return Ok(());
    }
    let (xs, ws, ys) = (&x.layout.shape, &w.layout.shape, &y.layout.shape);
    let dims = [
        xs[0], xs[1], xs[2], xs[3], ws[0], ws[2], ws[3], ys[2], ys[3],
    ];
    let limit = i32::MAX as usize;
    let geometry = conv
        .stride
        .iter()
        .chain(&conv.padding)
        .chain(&conv.dilation);
    if dims.iter().chain(geometry).any(|&d| d > limit) {
        return Err(unsupported(gpu, op));
    }
    let u = |v: usize| v as u32;
    let pair = |v: [usize; 2]| v.map(u);
    let bias = match op {
        Op::Conv2d { bias: true, .. } => gpu.ptr(&inputs[2])?,
        _ => 0,
    };
    let params = ConvParams {
        x: gpu.ptr(x)?,
        w: gpu.ptr(w)?,
        bias,
        y: gpu.ptr(y)?,
        elements: elements as u64,
        n: u(xs[0]),
        c: u(xs[1]),
        height: u(xs[2]),
        width: u(xs[3]),
        o: u(ws[0]),
        kh: u(ws[2]),
        kw: u(ws[3]),
        oh: u(ys[2]),
        ow: u(ys[3]),
        stride: pair(conv.stride),
        pad: pair(conv.padding),
        dil: pair(conv.dilation),
    };
    let dtype = x.dtype;
    let index = index_type(&[x, w, y]);
    let grid = match op {
        Op::Conv2dBackwardWeight { .. } => {
            rows_grid(elements, dw_threads(xs[0] * ys[2] * ys[3]), 0)
        }
        _ => grid_for(elements, 256),
    };
    let bias_key = matches!(op, Op::Conv2d { bias: true, .. });
    let key = format!("{}:{dtype}:{index}:{bias_key}", op.name());
    let source = || conv_source(op, dtype, index).ok_or_else(|| unsupported(gpu, op));
    gpu.run(&key, source, grid, &params)
}
