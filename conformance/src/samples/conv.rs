//! Conv2d samples: strides, padding, dilation, 1x1 kernels, kernels wider than the input.

use tessera::{Conv2dParams, Op};

use super::{input, uniform, Sample};

/// One convolution: input `[N, C, H, W]`, weight `[O, C, KH, KW]`, parameters.
struct Problem {
    x: [usize; 4],
    w: [usize; 4],
    params: Conv2dParams,
}

fn params(stride: [usize; 2], padding: [usize; 2], dilation: [usize; 2]) -> Conv2dParams {
    Conv2dParams {
        stride,
        padding,
        dilation,
    }
}

impl Problem {
    fn y(&self) -> [usize; 4] {
        let [oh, ow] = self
            .params
            .output_size([self.x[2], self.x[3]], [self.w[2], self.w[3]])
            .unwrap_or_else(|| {
                panic!(
                    "sample bug: empty conv output for {:?} {:?}",
                    self.x, self.w
                )
            });
        [self.x[0], self.w[0], oh, ow]
    }

    fn describe(&self) -> String {
        let p = &self.params;
        format!(
            "x {:?} w {:?} stride {:?} padding {:?} dilation {:?}",
            self.x, self.w, p.stride, p.padding, p.dilation
        )
    }

    /// Lengths of the sums behind y (C KH KW), dx (O KH KW) and dw (N OH OW).
    fn lens(&self) -> [usize; 3] {
        let y = self.y();
        [
            self.w[1] * self.w[2] * self.w[3],
            self.w[0] * self.w[2] * self.w[3],
            y[0] * y[2] * y[3],
        ]
    }
}

fn problems() -> Vec<(Problem, bool)> {
    let d = Conv2dParams::default();
    vec![
        (
            Problem {
                x: [2, 3, 9, 11],
                w: [4, 3, 3, 3],
                params: d,
            },
            false,
        ),
        (
            Problem {
                x: [2, 3, 9, 11],
                w: [4, 3, 3, 2],
                params: params([2, 1], [1, 2], [1, 1]),
            },
            false,
        ),
        (
            Problem {
                x: [1, 2, 12, 10],
                w: [3, 2, 3, 3],
                params: params([1, 2], [2, 2], [2, 2]),
            },
            false,
        ),
        (
            Problem {
                x: [2, 5, 7, 7],
                w: [3, 5, 1, 1],
                params: d,
            },
            false,
        ),
        (
            Problem {
                x: [1, 1, 3, 3],
                w: [2, 1, 5, 5],
                params: params([1, 1], [2, 2], [1, 1]),
            },
            false,
        ),
        (
            Problem {
                x: [2, 3, 33, 35],
                w: [8, 3, 3, 3],
                params: params([1, 1], [1, 1], [1, 1]),
            },
            false,
        ),
        (
            Problem {
                x: [0, 3, 5, 5],
                w: [2, 3, 3, 3],
                params: d,
            },
            false,
        ),
        (
            Problem {
                x: [1, 2, 4, 5],
                w: [2, 2, 2, 3],
                params: d,
            },
            true,
        ),
        (
            Problem {
                x: [2, 1, 5, 4],
                w: [2, 1, 3, 2],
                params: params([2, 1], [1, 1], [1, 2]),
            },
            true,
        ),
    ]
}

/// The convolution of `pr`, with a bias or without.
fn forward_of(pr: &Problem, bias: bool) -> Sample {
    let mut inputs = vec![
        input(&pr.x, uniform(-1.0, 1.0)),
        input(&pr.w, uniform(-1.0, 1.0)),
    ];
    if bias {
        inputs.push(input(&[pr.w[0]], uniform(-1.0, 1.0)));
    }
    let [ly, ldx, ldw] = pr.lens();
    Sample::new(
        Op::Conv2d {
            params: pr.params,
            bias,
        },
        format!("{} bias {bias}", pr.describe()),
        inputs,
    )
    .reduce(ly)
    .grad_reduce(ldx.max(ldw))
}

fn backward_data_of(pr: &Problem) -> Sample {
    let inputs = vec![
        input(&pr.y(), uniform(-1.0, 1.0)),
        input(&pr.w, uniform(-1.0, 1.0)),
    ];
    Sample::new(
        Op::Conv2dBackwardData { params: pr.params },
        pr.describe(),
        inputs,
    )
    .out_shape(&pr.x)
    .reduce(pr.lens()[1])
}

fn backward_weight_of(pr: &Problem) -> Sample {
    let inputs = vec![
        input(&pr.x, uniform(-1.0, 1.0)),
        input(&pr.y(), uniform(-1.0, 1.0)),
    ];
    Sample::new(
        Op::Conv2dBackwardWeight { params: pr.params },
        pr.describe(),
        inputs,
    )
    .out_shape(&pr.w)
    .reduce(pr.lens()[2].max(1))
}

pub(super) fn forward() -> Vec<Sample> {
    let mut out = Vec::new();
    for (pr, small) in problems() {
        for bias in [false, true] {
            let s = forward_of(&pr, bias);
            out.push(if small { s.gradcheck() } else { s });
        }
    }
    out
}

pub(super) fn backward_data() -> Vec<Sample> {
    problems()
        .iter()
        .map(|(pr, _)| backward_data_of(pr))
        .collect()
}

pub(super) fn backward_weight() -> Vec<Sample> {
    problems()
        .iter()
        .map(|(pr, _)| backward_weight_of(pr))
        .collect()
}

/// The sample of convolution `op` over `pr`, with a bias for the forward pass.
fn sample_of(op: &Op, pr: &Problem) -> Option<Sample> {
    match op {
        Op::Conv2d { .. } => Some(forward_of(pr, true)),
        Op::Conv2dBackwardData { .. } => Some(backward_data_of(pr)),
        Op::Conv2dBackwardWeight { .. } => Some(backward_weight_of(pr)),
        _ => None,
    }
}

/// One image whose im2col columns pass a binding of `rows * cols` f32 elements (four
/// channels, 3x3 kernel, padding 1): its columns run in parts.
pub(super) fn one_large_image(op: &Op, rows: usize, cols: usize) -> Vec<Sample> {
    let pr = Problem {
        x: [1, 4, rows / 4, cols / 8],
        w: [2, 4, 3, 3],
        params: params([1, 1], [1, 1], [1, 1]),
    };
    sample_of(op, &pr).into_iter().collect()
}

/// `rows / 8` small images whose im2col columns together pass a binding of `rows * cols`
/// f32 elements: the images run in parts of several.
pub(super) fn many_small_images(op: &Op, rows: usize, cols: usize) -> Vec<Sample> {
    let pr = Problem {
        x: [rows / 8, 2, 4, cols / 8],
        w: [2, 2, 3, 3],
        params: params([1, 1], [1, 1], [1, 1]),
    };
    sample_of(op, &pr).into_iter().collect()
}
