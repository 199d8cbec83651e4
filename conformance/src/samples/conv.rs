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

pub(super) fn forward() -> Vec<Sample> {
    let mut out = Vec::new();
    for (pr, small) in problems() {
        for bias in [false, true] {
            let mut inputs = vec![
                input(&pr.x, uniform(-1.0, 1.0)),
                input(&pr.w, uniform(-1.0, 1.0)),
            ];
            if bias {
                inputs.push(input(&[pr.w[0]], uniform(-1.0, 1.0)));
            }
            let [ly, ldx, ldw] = pr.lens();
            let s = Sample::new(
                Op::Conv2d {
                    params: pr.params,
                    bias,
                },
                format!("{} bias {bias}", pr.describe()),
                inputs,
            )
            .reduce(ly)
            .grad_reduce(ldx.max(ldw));
            out.push(if small { s.gradcheck() } else { s });
        }
    }
    out
}

pub(super) fn backward_data() -> Vec<Sample> {
    problems()
        .into_iter()
        .map(|(pr, _)| {
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
        })
        .collect()
}

pub(super) fn backward_weight() -> Vec<Sample> {
    problems()
        .into_iter()
        .map(|(pr, _)| {
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
        })
        .collect()
}
