//! conv2d by im2col and the tiled matmul: the columns go to a scratch buffer from the pool,
//! the products run as batched matmuls over strided views, the bias through the residual
//! epilogue as a broadcast view, the
//! data gradient through col2im (a gather, so no atomics) and the weight gradient as one
//! matmul per image accumulated in order through the residual epilogue.
//! The columns are f32 whatever the dtype, so 16-bit convolutions round once, at the output.

use tessera_core::{Conv2dParams, DType, Layout, Op, Result, TensorRef};

use crate::device::Core;
use crate::matmul;
use crate::shader::{groups_for, key, no_subst, run, unsupported};

const SRC: &str = include_str!("kernels/conv.wgsl");

pub(crate) const SUPPORTED: bool = true;

fn t<'a>(like: &TensorRef<'a>, layout: &'a Layout) -> TensorRef<'a> {
    TensorRef {
        buffer: like.buffer,
        layout,
        dtype: like.dtype,
    }
}

fn strided(shape: &[usize], strides: &[usize], offset: usize) -> Layout {
    Layout {
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        offset,
    }
}

const PLAIN: Op = Op::Matmul {
    bias: false,
    activation: None,
    residual: false,
};

pub(crate) fn launch(
    core: &Core,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    let (x_shape, w_shape, params): (&[usize], &[usize], &Conv2dParams) = match op {
        Op::Conv2d { params, .. } => (&inputs[0].layout.shape, &inputs[1].layout.shape, params),
        Op::Conv2dBackwardData { params } => {
            (&outputs[0].layout.shape, &inputs[1].layout.shape, params)
        }
        Op::Conv2dBackwardWeight { params } => {
            (&inputs[0].layout.shape, &outputs[0].layout.shape, params)
        }
        _ => return Err(unsupported(op)),
    };
    let [n, c, h, w] = [x_shape[0], x_shape[1], x_shape[2], x_shape[3]];
    let [o, _, kh, kw] = [w_shape[0], w_shape[1], w_shape[2], w_shape[3]];
    let [oh, ow] = params
        .output_size([h, w], [kh, kw])
        .ok_or_else(|| unsupported(op))?;
    let (ckk, l) = (c * kh * kw, oh * ow);
    let geometry = [
        n,
        c,
        h,
        w,
        kh,
        kw,
        oh,
        ow,
        params.stride[0],
        params.stride[1],
        params.padding[0],
        params.padding[1],
        params.dilation[0],
        params.dilation[1],
    ];
    let scratch = core.scratch(n * ckk * l * 4)?;
    let cols_layout = Layout::contiguous(&[n, ckk, l]);
    let cols = TensorRef {
        buffer: &scratch,
        layout: &cols_layout,
        dtype: DType::F32,
    };
    let conv_params = |offs: &[usize], p: &mut crate::shader::Params| {
        p.all(&geometry).all(offs);
    };
    let im2col = |x: &TensorRef<'_>| {
        let ins = std::slice::from_ref(x);
        let outs = std::slice::from_ref(&cols);
        run(
            core,
            &key(op, ins, outs, "im2col"),
            SRC,
            "im2col",
            no_subst,
            ins,
            outs,
            groups_for(n * ckk * l),
            conv_params,
        )
    };
    match op {
        Op::Conv2d { bias, .. } => {
            let (wt, y) = (&inputs[1], &outputs[0]);
            im2col(&inputs[0])?;
            let a_l = strided(&[n, o, ckk], &[0, ckk, 1], wt.layout.offset);
            let y_l = strided(&[n, o, l], &[o * l, l, 1], y.layout.offset);
            if !*bias {
                return matmul::launch(core, &PLAIN, &[t(wt, &a_l), cols], &[t(y, &y_l)]);
            }
            // The bias (one per output channel, a row of the product) enters through the
            // residual epilogue as a view broadcast over images and positions.
            let b = &inputs[2];
            let b_l = strided(&[n, o, l], &[0, b.layout.strides[0], 0], b.layout.offset);
            let with_bias = Op::Matmul {
                bias: false,
                activation: None,
                residual: true,
            };
            matmul::launch(
                core,
                &with_bias,
                &[t(wt, &a_l), cols, t(b, &b_l)],
                &[t(y, &y_l)],
            )
        }
        Op::Conv2dBackwardData { .. } => {
            let (dy, wt) = (&inputs[0], &inputs[1]);
            let a_l = strided(&[n, ckk, o], &[0, 1, ckk], wt.layout.offset);
            let dy_l = strided(&[n, o, l], &[o * l, l, 1], dy.layout.offset);
            matmul::launch(
                core,
                &PLAIN,
                &[t(wt, &a_l), t(dy, &dy_l)],
                std::slice::from_ref(&cols),
            )?;
            let ins = std::slice::from_ref(&cols);
            run(
                core,
                &key(op, ins, outputs, "col2im"),
                SRC,
                "col2im",
                no_subst,
                ins,
                outputs,
                groups_for(n * c * h * w),
                conv_params,
            )
        }
        Op::Conv2dBackwardWeight { .. } => {
            let (x, dy, out) = (&inputs[0], &inputs[1], &outputs[0]);
            im2col(x)?;
            // The sum over images runs in f32; a 16-bit gradient is rounded once at the end.
            let sum_scratch;
            let sum_layout = Layout::contiguous(&[o, ckk]);
            let dw = if out.dtype == DType::F32 {
                *out
            } else {
                sum_scratch = core.scratch(o * ckk * 4)?;
                TensorRef {
                    buffer: &sum_scratch,
                    layout: &sum_layout,
                    dtype: DType::F32,
                }
            };
            let dw = &dw;
            let dw_l = strided(&[o, ckk], &[ckk, 1], dw.layout.offset);
            if n == 0 {
                let out_l = strided(&[o, ckk], &[ckk, 1], out.layout.offset);
                return crate::random::launch(
                    core,
                    &Op::Fill { dtype: out.dtype },
                    &[t(out, &out_l)],
                    &[0.0],
                    0,
                );
            }
            for img in 0..n {
                let dy_l = strided(&[o, l], &[l, 1], dy.layout.offset + img * o * l);
                let c_l = strided(&[l, ckk], &[1, l], img * ckk * l);
                let ct = TensorRef {
                    buffer: &scratch,
                    layout: &c_l,
                    dtype: DType::F32,
                };
                if img == 0 {
                    matmul::launch(core, &PLAIN, &[t(dy, &dy_l), ct], &[t(dw, &dw_l)])?;
                } else {
                    let acc = Op::Matmul {
                        bias: false,
                        activation: None,
                        residual: true,
                    };
                    matmul::launch(
                        core,
                        &acc,
                        &[t(dy, &dy_l), ct, t(dw, &dw_l)],
                        &[t(dw, &dw_l)],
                    )?;
                }
            }
            if out.dtype == DType::F32 {
                return Ok(());
            }
            let out_l = strided(&[o, ckk], &[ckk, 1], out.layout.offset);
            crate::elementwise::launch(
                core,
                &Op::Cast { to: out.dtype },
                &[t(dw, &dw_l)],
                &[t(out, &out_l)],
                &[],
            )
        }
        _ => Err(unsupported(op)),
    }
}
