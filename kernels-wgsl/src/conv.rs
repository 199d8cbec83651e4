//! conv2d by im2col and the tiled matmul: the columns go to a scratch buffer from the pool,
//! the products run as batched matmuls over strided views, the bias through the residual
//! epilogue as a broadcast view, the data gradient through col2im (a gather, so no atomics)
//! and the weight gradient as one matmul per image accumulated in order through the residual
//! epilogue. The columns are f32 whatever the dtype, so 16-bit convolutions round once, at the
//! output.
//!
//! Tensors and columns larger than one binding: the images run in parts whose input, output
//! and columns fit, and where one image's columns do not, its columns are built in parts too:
//! ranges of output positions for the forward pass, ranges of input channels for the
//! gradients. Every output element is then computed from the same products as in one launch.
//! Still `Unsupported`: a weight, or one image of the input or output, or the columns of one
//! output position (forward) or one input channel (gradients), wider than a binding.

use tessera_core::{Conv2dParams, DType, Layout, Op, Result, TensorRef};

use crate::gpu::{Gpu, Planner};
use crate::matmul::{self, PLAIN};
use crate::params::{offsets, param_block, MAX_BINDINGS};
use crate::source::{groups_for, key, no_subst, run, unsupported};
use tessera_core::exec::split;

const SRC: &str = include_str!("../kernels/conv.wgsl");

param_block! {
    /// im2col's and col2im's parameters: `images` of `channels` x `height` x `width`, the
    /// kernel, output size, stride, padding and dilation, and the part of the columns:
    /// `part_channels` from `first_channel`, `part_positions` from `first_position`.
    Im2colParams {
        images: u32,
        channels: u32,
        height: u32,
        width: u32,
        kernel_h: u32,
        kernel_w: u32,
        out_h: u32,
        out_w: u32,
        stride: [u32; 2],
        padding: [u32; 2],
        dilation: [u32; 2],
        first_channel: u32,
        part_channels: u32,
        first_position: u32,
        part_positions: u32,
        offsets: [u32; MAX_BINDINGS],
    }
}

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

const ACCUMULATE: Op = Op::Matmul {
    bias: false,
    activation: None,
    residual: true,
};

/// How a convolution is split: images per part, input channels per part of the columns,
/// output positions per part of the columns (all of them where everything fits).
struct Parts {
    images: usize,
    channels: usize,
    positions: usize,
}

/// The largest parts that fit one binding each, or `None` where one image (or one position's
/// or channel's columns) does not.
fn parts(gpu: &dyn Gpu, op: &Op, dims: [usize; 7], sizes: [usize; 2]) -> Option<Parts> {
    let [n, c, h, w, o, kk, l] = dims;
    let [x_size, y_size] = sizes;
    let room = gpu.max_binding().saturating_sub(gpu.align()) as usize;
    let (x_image, y_image, cols_image) = (c * h * w * x_size, o * l * y_size, c * kk * l * 4);
    if x_image > room || y_image > room {
        return None;
    }
    if cols_image <= room {
        let per = |bytes: usize| room / bytes.max(1);
        let images = per(x_image).min(per(y_image)).min(per(cols_image));
        return Some(Parts {
            images: images.clamp(1, n.max(1)),
            channels: c.max(1),
            positions: l.max(1),
        });
    }
    let (channels, positions) = match op {
        Op::Conv2d { .. } => (c, room / (c * kk * 4)),
        _ => (room / (kk * l * 4), l),
    };
    (channels > 0 && positions > 0).then_some(Parts {
        images: 1,
        channels,
        positions,
    })
}

pub(crate) fn launch(
    gpu: &dyn Gpu,
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
        _ => return Err(unsupported(gpu, op)),
    };
    let [n, c, h, w] = [x_shape[0], x_shape[1], x_shape[2], x_shape[3]];
    let [o, _, kh, kw] = [w_shape[0], w_shape[1], w_shape[2], w_shape[3]];
    let [oh, ow] = params
        .output_size([h, w], [kh, kw])
        .ok_or_else(|| unsupported(gpu, op))?;
    let (kk, l) = (kh * kw, oh * ow);
    let ckk = c * kk;
    // The image-sized operands (x or dx, y or dy) and the whole ones (weight, bias).
    let (x_t, y_t, whole): (&TensorRef<'_>, &TensorRef<'_>, Vec<TensorRef<'_>>) = match op {
        Op::Conv2d { .. } => (&inputs[0], &outputs[0], inputs[1..].to_vec()),
        Op::Conv2dBackwardData { .. } => (&outputs[0], &inputs[0], vec![inputs[1]]),
        _ => (&inputs[0], &inputs[1], vec![outputs[0]]),
    };
    let dims = [n, c, h, w, o, kk, l];
    let sizes = [x_t.dtype.size(), y_t.dtype.size()];
    let plan = match parts(gpu, op, dims, sizes) {
        Some(plan) if gpu.fits(&whole) => plan,
        _ => return Err(split::too_large(&Planner(gpu), op, inputs, outputs)),
    };
    let pair = |v: [usize; 2]| v.map(|x| x as u32);
    let geometry = Im2colParams {
        channels: c as u32,
        height: h as u32,
        width: w as u32,
        kernel_h: kh as u32,
        kernel_w: kw as u32,
        out_h: oh as u32,
        out_w: ow as u32,
        stride: pair(params.stride),
        padding: pair(params.padding),
        dilation: pair(params.dilation),
        ..Im2colParams::default()
    };
    let scratch = gpu.scratch(plan.images * plan.channels * kk * plan.positions * 4)?;
    // Columns `[images, channels * KH * KW, positions]` of a part, in f32.
    let columns = |images: usize, channels: usize, positions: usize| {
        Layout::contiguous(&[images, channels * kk, positions])
    };
    // The geometry with the part's images, first channel, channels, first position and
    // positions.
    let part_params = |images: usize, part: [usize; 4]| {
        move |offs: &[usize]| Im2colParams {
            images: images as u32,
            first_channel: part[0] as u32,
            part_channels: part[1] as u32,
            first_position: part[2] as u32,
            part_positions: part[3] as u32,
            offsets: offsets(offs),
            ..geometry
        }
    };
    let im2col = |x: &TensorRef<'_>, cols: &TensorRef<'_>, images: usize, part: [usize; 4]| {
        let (ins, outs) = (std::slice::from_ref(x), std::slice::from_ref(cols));
        run(
            gpu,
            &key(op, ins, outs, "im2col"),
            SRC,
            "im2col",
            no_subst,
            ins,
            outs,
            groups_for(cols.layout.numel()),
            part_params(images, part),
        )
    };
    let image_parts = (0..n)
        .step_by(plan.images)
        .map(|i0| (i0, plan.images.min(n - i0)));
    let ranges = |total: usize, per: usize| {
        (0..total)
            .step_by(per)
            .map(move |s| (s, per.min(total - s)))
    };
    match op {
        Op::Conv2d { bias, .. } => {
            let (x, wt, y) = (&inputs[0], &inputs[1], &outputs[0]);
            for (i0, m) in image_parts {
                let x_part = x.layout.narrow(0, i0, m);
                for (l0, ln) in ranges(l, plan.positions) {
                    let cols_l = columns(m, c, ln);
                    let cols = TensorRef::f32(&scratch, &cols_l);
                    im2col(&t(x, &x_part), &cols, m, [0, c, l0, ln])?;
                    let a_l = strided(&[m, o, ckk], &[0, ckk, 1], wt.layout.offset);
                    let y_l = strided(
                        &[m, o, ln],
                        &[o * l, l, 1],
                        y.layout.offset + i0 * o * l + l0,
                    );
                    let y_part = [t(y, &y_l)];
                    if !*bias {
                        matmul::launch_windows(gpu, &PLAIN, &[t(wt, &a_l), cols], &y_part)?;
                        continue;
                    }
                    // The bias (one per output channel, a row of the product) enters through
                    // the residual epilogue as a view broadcast over images and positions.
                    let b = &inputs[2];
                    let b_l = strided(&[m, o, ln], &[0, b.layout.strides[0], 0], b.layout.offset);
                    matmul::launch_windows(
                        gpu,
                        &ACCUMULATE,
                        &[t(wt, &a_l), cols, t(b, &b_l)],
                        &y_part,
                    )?;
                }
            }
            Ok(())
        }
        Op::Conv2dBackwardData { .. } => {
            let (dy, wt, dx) = (&inputs[0], &inputs[1], &outputs[0]);
            for (i0, m) in image_parts {
                let dx_part = dx.layout.narrow(0, i0, m);
                let dx_part = [t(dx, &dx_part)];
                let dy_l = strided(&[m, o, l], &[o * l, l, 1], dy.layout.offset + i0 * o * l);
                for (c0, cn) in ranges(c, plan.channels) {
                    let cols_l = columns(m, cn, l);
                    let cols = [TensorRef::f32(&scratch, &cols_l)];
                    let a_l = strided(&[m, cn * kk, o], &[0, 1, ckk], wt.layout.offset + c0 * kk);
                    matmul::launch_windows(gpu, &PLAIN, &[t(wt, &a_l), t(dy, &dy_l)], &cols)?;
                    run(
                        gpu,
                        &key(op, &cols, &dx_part, "col2im"),
                        SRC,
                        "col2im",
                        no_subst,
                        &cols,
                        &dx_part,
                        groups_for(m * cn * h * w),
                        part_params(m, [c0, cn, 0, l]),
                    )?;
                }
            }
            Ok(())
        }
        Op::Conv2dBackwardWeight { .. } => {
            let (x, dy, out) = (&inputs[0], &inputs[1], &outputs[0]);
            let out_l = strided(&[o, ckk], &[ckk, 1], out.layout.offset);
            if n == 0 {
                return crate::random::launch(
                    gpu,
                    &Op::Fill { dtype: out.dtype },
                    &[t(out, &out_l)],
                    &[0.0],
                    0,
                );
            }
            // The sum over images runs in f32; a 16-bit gradient is rounded once at the end.
            let sum_scratch;
            let sum_layout = Layout::contiguous(&[o, ckk]);
            let dw = if out.dtype == DType::F32 {
                *out
            } else {
                sum_scratch = gpu.scratch(o * ckk * 4)?;
                TensorRef {
                    buffer: &sum_scratch,
                    layout: &sum_layout,
                    dtype: DType::F32,
                }
            };
            for (i0, m) in image_parts {
                let x_part = x.layout.narrow(0, i0, m);
                for (c0, cn) in ranges(c, plan.channels) {
                    let cols_l = columns(m, cn, l);
                    im2col(
                        &t(x, &x_part),
                        &TensorRef::f32(&scratch, &cols_l),
                        m,
                        [c0, cn, 0, l],
                    )?;
                    let dw_l = strided(&[o, cn * kk], &[ckk, 1], dw.layout.offset + c0 * kk);
                    let dw_part = t(&dw, &dw_l);
                    for img in 0..m {
                        let dy_l = strided(&[o, l], &[l, 1], dy.layout.offset + (i0 + img) * o * l);
                        let c_l = strided(&[l, cn * kk], &[1, l], img * cn * kk * l);
                        let ins = [t(dy, &dy_l), TensorRef::f32(&scratch, &c_l), dw_part];
                        let (acc, ins) = match i0 + img {
                            0 => (&PLAIN, &ins[..2]),
                            _ => (&ACCUMULATE, &ins[..]),
                        };
                        matmul::launch_windows(gpu, acc, ins, &[dw_part])?;
                    }
                }
            }
            if out.dtype == DType::F32 {
                return Ok(());
            }
            let dw_l = strided(&[o, ckk], &[ckk, 1], dw.layout.offset);
            split::launch(
                &Planner(gpu),
                &Op::Cast { to: out.dtype },
                &[t(&dw, &dw_l)],
                &[t(out, &out_l)],
                &[],
            )
        }
        _ => Err(unsupported(gpu, op)),
    }
}
