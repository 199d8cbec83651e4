//! 2-D convolution by im2col and gemm, one image at a time.
//!
//! For an image, `cols [C*KH*KW, OH*OW]` holds in row `(c, ki, kj)` and column `(oh, ow)` the
//! input pixel that kernel tap meets at that output position (0 in the padding). Then
//! `y = w @ cols`, `dcols = w^T @ dy` (scattered back by col2im) and `dw += dy @ cols^T`.

use tessera_core::{Conv2dParams, Op, Result, TensorRef};

use crate::buffer::{read, write};
use crate::float::{computes_in_f64, Float};
use crate::matmul::{gemm_into, Mat};
use crate::wrong_family;

pub(crate) fn launch(op: &Op, inputs: &[TensorRef<'_>], outputs: &[TensorRef<'_>]) -> Result<()> {
    if computes_in_f64(inputs[0].dtype) {
        run::<f64>(op, inputs, outputs)
    } else {
        run::<f32>(op, inputs, outputs)
    }
}

/// Sizes of one convolution.
struct Geometry {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    p: Conv2dParams,
}

impl Geometry {
    fn new(x: &[usize], w: &[usize], y: &[usize], p: Conv2dParams) -> Geometry {
        Geometry {
            n: x[0],
            c: x[1],
            h: x[2],
            w: x[3],
            o: w[0],
            kh: w[2],
            kw: w[3],
            oh: y[2],
            ow: y[3],
            p,
        }
    }

    /// Rows of `cols`: one per channel and kernel tap.
    fn taps(&self) -> usize {
        self.c * self.kh * self.kw
    }

    /// Columns of `cols`: one per output pixel.
    fn pixels(&self) -> usize {
        self.oh * self.ow
    }

    /// The input coordinate kernel tap `k` meets at output coordinate `o` along `axis`, if it
    /// is inside the input (not padding).
    fn source(&self, axis: usize, o: usize, k: usize) -> Option<usize> {
        let size = if axis == 0 { self.h } else { self.w };
        (o * self.p.stride[axis] + k * self.p.dilation[axis])
            .checked_sub(self.p.padding[axis])
            .filter(|&i| i < size)
    }

    /// Calls `f(col_index, input_index)` for every in-bounds entry of one image's `cols`, in
    /// order. Input indices are within the image `[C, H, W]`.
    fn for_each_tap(&self, mut f: impl FnMut(usize, usize)) {
        let pixels = self.pixels();
        for c in 0..self.c {
            for ki in 0..self.kh {
                for kj in 0..self.kw {
                    let row = (c * self.kh + ki) * self.kw + kj;
                    for oy in 0..self.oh {
                        let Some(iy) = self.source(0, oy, ki) else {
                            continue;
                        };
                        for ox in 0..self.ow {
                            if let Some(ix) = self.source(1, ox, kj) {
                                f(
                                    row * pixels + oy * self.ow + ox,
                                    (c * self.h + iy) * self.w + ix,
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    fn im2col<F: Float>(&self, image: &[F], cols: &mut [F]) {
        cols.fill(F::zero());
        self.for_each_tap(|col, src| cols[col] = image[src]);
    }

    /// Adds each entry of `cols` into the input pixel it came from, in a fixed order.
    fn col2im<F: Float>(&self, cols: &[F], image: &mut [F]) {
        self.for_each_tap(|col, dst| image[dst] += cols[col]);
    }
}

fn run<F: Float>(op: &Op, inputs: &[TensorRef<'_>], outputs: &[TensorRef<'_>]) -> Result<()> {
    let shape = |t: &TensorRef<'_>| t.layout.shape.clone();
    let (x_shape, w_shape, y_shape, params) = match op {
        Op::Conv2d { params, .. } => (
            shape(&inputs[0]),
            shape(&inputs[1]),
            shape(&outputs[0]),
            params,
        ),
        Op::Conv2dBackwardData { params } => (
            shape(&outputs[0]),
            shape(&inputs[1]),
            shape(&inputs[0]),
            params,
        ),
        Op::Conv2dBackwardWeight { params } => (
            shape(&inputs[0]),
            shape(&outputs[0]),
            shape(&inputs[1]),
            params,
        ),
        _ => return Err(wrong_family(op)),
    };
    let g = Geometry::new(&x_shape, &w_shape, &y_shape, *params);
    let (taps, pixels) = (g.taps(), g.pixels());
    let image = g.c * g.h * g.w;
    let out_image = g.o * pixels;
    let mut cols = vec![F::zero(); taps * pixels];
    match op {
        Op::Conv2d { bias, .. } => {
            let (x, w) = (read::<F>(&inputs[0])?, read::<F>(&inputs[1])?);
            let bias = if *bias {
                read::<F>(&inputs[2])?
            } else {
                vec![F::zero(); g.o]
            };
            let mut y = vec![F::zero(); g.n * out_image];
            for i in 0..g.n {
                g.im2col(&x[i * image..(i + 1) * image], &mut cols);
                let yi = &mut y[i * out_image..(i + 1) * out_image];
                gemm_into(
                    g.o,
                    pixels,
                    taps,
                    Mat::rows(&w, taps),
                    Mat::rows(&cols, pixels),
                    yi,
                    false,
                )?;
                for (o, row) in yi.chunks_mut(pixels.max(1)).enumerate() {
                    for v in row {
                        *v += bias[o];
                    }
                }
            }
            write(&outputs[0], &y)
        }
        Op::Conv2dBackwardData { .. } => {
            let (dy, w) = (read::<F>(&inputs[0])?, read::<F>(&inputs[1])?);
            let mut dx = vec![F::zero(); g.n * image];
            for i in 0..g.n {
                let dyi = &dy[i * out_image..(i + 1) * out_image];
                gemm_into(
                    taps,
                    pixels,
                    g.o,
                    Mat::transposed(&w, taps),
                    Mat::rows(dyi, pixels),
                    &mut cols,
                    false,
                )?;
                g.col2im(&cols, &mut dx[i * image..(i + 1) * image]);
            }
            write(&outputs[0], &dx)
        }
        Op::Conv2dBackwardWeight { .. } => {
            let (x, dy) = (read::<F>(&inputs[0])?, read::<F>(&inputs[1])?);
            let mut dw = vec![F::zero(); g.o * taps];
            for i in 0..g.n {
                g.im2col(&x[i * image..(i + 1) * image], &mut cols);
                let dyi = &dy[i * out_image..(i + 1) * out_image];
                gemm_into(
                    g.o,
                    taps,
                    pixels,
                    Mat::rows(dyi, pixels),
                    Mat::transposed(&cols, pixels),
                    &mut dw,
                    true,
                )?;
            }
            write(&outputs[0], &dw)
        }
        _ => Err(wrong_family(op)),
    }
}
