//! Elementwise samples: casts, copies, unary and binary math, comparisons, select, SwiGLU.

use tessera::{BinaryOp, CompareOp, DType, Op, UnaryOp};

use super::{fixed, input, special, uniform, Gen, Input, Sample, View, ANY_DTYPE};

/// Keeps `|x| >= step / 2` away from zero and each value off the kinks of relu and abs.
fn away_from_zero(step: f64) -> Gen {
    Gen::Lattice {
        step,
        phase: 0.5,
        range: 12,
    }
}

/// The input domain where `u` is smooth and well conditioned.
fn domain(u: UnaryOp) -> Gen {
    match u {
        UnaryOp::Abs | UnaryOp::Relu => away_from_zero(0.2),
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::PowScalar => uniform(0.1, 4.0),
        UnaryOp::Recip => away_from_zero(0.25),
        UnaryOp::Neg
        | UnaryOp::Exp
        | UnaryOp::Square
        | UnaryOp::Tanh
        | UnaryOp::Sigmoid
        | UnaryOp::Gelu
        | UnaryOp::Silu
        | UnaryOp::Sin
        | UnaryOp::Cos
        | UnaryOp::Affine => uniform(-3.0, 3.0),
    }
}

fn scalar_sets(u: UnaryOp) -> Vec<Vec<f64>> {
    match u {
        UnaryOp::Affine => vec![vec![1.5, -0.25], vec![-0.5, 2.0]],
        UnaryOp::PowScalar => vec![vec![2.5], vec![-1.5], vec![3.0], vec![0.0]],
        _ => vec![vec![]],
    }
}

/// Shapes of the samples with NaN and infinities: rows of 29 elements go one at a time, rows
/// of 16 may go 16 bytes at a time.
const NONFINITE_SHAPES: [([usize; 2], &str); 2] =
    [([9, 29], "[9, 29] NaN/inf"), ([6, 16], "[6, 16] NaN/inf")];

/// Shapes and views every one-input elementwise op runs on: tile-unfriendly sizes, rank 0,
/// empty, and strided, padded and broadcast views, and rows of 16 elements spaced apart (a
/// backend may move them 16 bytes at a time).
fn layouts() -> Vec<(Vec<usize>, View)> {
    vec![
        (vec![17, 33], View::Contiguous),
        (vec![], View::Contiguous),
        (vec![0, 5], View::Contiguous),
        (vec![33, 17], View::Permuted(vec![1, 0])),
        (vec![5, 7, 9], View::Padded(3)),
        (vec![4, 3, 257], View::Broadcast(vec![1, 1, 257])),
        (vec![3, 4, 5], View::Permuted(vec![2, 0, 1])),
        (vec![1, 1030], View::Offset(7)),
        (vec![2, 5, 16], View::Capacity(3)),
    ]
}

pub(super) fn unary(u: UnaryOp) -> Vec<Sample> {
    let op = Op::Unary(u);
    let mut out = Vec::new();
    for scalars in scalar_sets(u) {
        for (shape, view) in layouts() {
            let x = input(&shape, domain(u)).view(view);
            out.push(
                Sample::new(op.clone(), format!("{shape:?} {scalars:?}"), vec![x])
                    .scalars(&scalars),
            );
        }
        out.push(
            Sample::new(
                op.clone(),
                format!("[3, 4] gradcheck {scalars:?}"),
                vec![input(&[3, 4], domain(u))],
            )
            .scalars(&scalars)
            .gradcheck(),
        );
        for (shape, name) in NONFINITE_SHAPES {
            let x = input(&shape, Gen::Special(Box::new(uniform(-3.0, 3.0))));
            let sample = Sample::new(op.clone(), format!("{name} {scalars:?}"), vec![x]);
            out.push(sample.scalars(&scalars).no_backward());
        }
    }
    out
}

pub(super) fn unary_backward(u: UnaryOp) -> Vec<Sample> {
    let op = Op::UnaryBackward(u);
    let mut out = Vec::new();
    for scalars in scalar_sets(u) {
        for (shape, view) in layouts() {
            let x = input(&shape, domain(u)).view(view.clone());
            let dy_view = if matches!(view, View::Broadcast(_)) {
                View::Contiguous
            } else {
                View::Broadcast(vec![1; shape.len()])
            };
            let dy = input(&shape, uniform(-1.0, 1.0)).view(if shape.contains(&0) {
                View::Contiguous
            } else {
                dy_view
            });
            out.push(
                Sample::new(op.clone(), format!("{shape:?} {scalars:?}"), vec![x, dy])
                    .scalars(&scalars),
            );
        }
        for (shape, name) in NONFINITE_SHAPES {
            let x = input(&shape, Gen::Special(Box::new(uniform(-3.0, 3.0))));
            let sample = Sample::new(
                op.clone(),
                format!("{name} {scalars:?}"),
                vec![x, input(&shape, special())],
            );
            out.push(sample.scalars(&scalars));
        }
    }
    out
}

/// Domains of `(a, b)` for a binary op: off ties for maximum/minimum, off zero for division,
/// positive bases for pow.
fn binary_domain(b: BinaryOp) -> (Gen, Gen) {
    match b {
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul => (uniform(-2.0, 2.0), uniform(-2.0, 2.0)),
        BinaryOp::Div => (uniform(-2.0, 2.0), away_from_zero(0.25)),
        BinaryOp::Maximum | BinaryOp::Minimum => (
            Gen::Lattice {
                step: 0.2,
                phase: 0.25,
                range: 10,
            },
            Gen::Lattice {
                step: 0.2,
                phase: 0.75,
                range: 10,
            },
        ),
        BinaryOp::Pow => (uniform(0.3, 2.5), uniform(-2.0, 2.0)),
    }
}

pub(super) fn binary(bop: BinaryOp) -> Vec<Sample> {
    let op = Op::Binary(bop);
    let (ga, gb) = binary_domain(bop);
    let pair = |shape: &[usize], va: View, vb: View| {
        vec![
            input(shape, ga.clone()).view(va),
            input(shape, gb.clone()).view(vb),
        ]
    };
    let mut out = vec![
        Sample::new(
            op.clone(),
            "[17, 33]",
            pair(&[17, 33], View::Contiguous, View::Contiguous),
        ),
        Sample::new(
            op.clone(),
            "[17, 33] b row",
            pair(&[17, 33], View::Contiguous, View::Broadcast(vec![33])),
        ),
        Sample::new(
            op.clone(),
            "[17, 33] a column",
            pair(&[17, 33], View::Broadcast(vec![17, 1]), View::Offset(3)),
        ),
        Sample::new(
            op.clone(),
            "[33, 17] transposed",
            pair(&[33, 17], View::Permuted(vec![1, 0]), View::Contiguous),
        ),
        Sample::new(
            op.clone(),
            "[2, 5, 9] padded",
            pair(&[2, 5, 9], View::Padded(2), View::Permuted(vec![1, 2, 0])),
        ),
        Sample::new(
            op.clone(),
            "[2, 5, 16] rows spaced apart",
            pair(&[2, 5, 16], View::Capacity(3), View::Contiguous),
        ),
        Sample::new(
            op.clone(),
            "[0, 4]",
            pair(&[0, 4], View::Contiguous, View::Contiguous),
        ),
        Sample::new(
            op.clone(),
            "[]",
            pair(&[], View::Contiguous, View::Contiguous),
        ),
        Sample::new(
            op.clone(),
            "[1, 1, 1030]",
            pair(&[1, 1, 1030], View::Contiguous, View::Broadcast(vec![1])),
        ),
        Sample::new(
            op.clone(),
            "[3, 4] gradcheck",
            pair(&[3, 4], View::Contiguous, View::Contiguous),
        )
        .gradcheck(),
        Sample::new(
            op.clone(),
            "[9, 29] NaN/inf",
            vec![input(&[9, 29], special()), input(&[9, 29], special())],
        )
        .no_backward(),
        Sample::new(
            op.clone(),
            "[6, 16] NaN/inf",
            vec![input(&[6, 16], special()), input(&[6, 16], special())],
        )
        .no_backward(),
    ];
    if matches!(bop, BinaryOp::Maximum | BinaryOp::Minimum) {
        let ties = Gen::Ints { lo: -2, hi: 3 };
        out.push(Sample::new(
            op.clone(),
            "[7, 11] ties",
            vec![input(&[7, 11], ties.clone()), input(&[7, 11], ties)],
        ));
    }
    if bop == BinaryOp::Add {
        let n = 4100;
        let big = vec![
            input(&[n, n], uniform(-1.0, 1.0)),
            input(&[n, n], uniform(-1.0, 1.0)).view(View::Broadcast(vec![n])),
        ];
        out.push(Sample::new(op, format!("[{n}, {n}] over 2^24 elements"), big).large());
    }
    out
}

pub(super) fn compare(c: CompareOp) -> Vec<Sample> {
    let op = Op::Compare(c);
    let ties = || Gen::Ints { lo: 0, hi: 4 };
    let all = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I32,
        DType::U32,
    ];
    let pair = |shape: &[usize], va: View, vb: View| {
        vec![input(shape, ties()).view(va), input(shape, ties()).view(vb)]
    };
    vec![
        Sample::new(
            op.clone(),
            "[17, 33]",
            pair(&[17, 33], View::Contiguous, View::Contiguous),
        )
        .dtypes(&all),
        Sample::new(
            op.clone(),
            "[17, 33] b row",
            pair(
                &[17, 33],
                View::Permuted(vec![1, 0]),
                View::Broadcast(vec![33]),
            ),
        )
        .dtypes(&all),
        Sample::new(
            op.clone(),
            "[0, 3]",
            pair(&[0, 3], View::Contiguous, View::Contiguous),
        )
        .dtypes(&all),
        Sample::new(
            op.clone(),
            "[]",
            pair(&[], View::Contiguous, View::Contiguous),
        )
        .dtypes(&all),
        Sample::new(
            op.clone(),
            "[3, 1030]",
            pair(&[3, 1030], View::Padded(5), View::Offset(1)),
        )
        .dtypes(&all),
        Sample::new(
            op.clone(),
            "[9, 29] NaN/inf",
            vec![input(&[9, 29], special()), input(&[9, 29], special())],
        ),
    ]
}

pub(super) fn select() -> Vec<Sample> {
    let op = Op::Where;
    let cond = |shape: &[usize]| fixed(shape, DType::Bool, Gen::Bool);
    let ab = |shape: &[usize]| {
        (
            input(shape, uniform(-3.0, 3.0)),
            input(shape, uniform(-3.0, 3.0)),
        )
    };
    let mut out = Vec::new();
    let (a, b) = ab(&[17, 33]);
    out.push(Sample::new(op.clone(), "[17, 33]", vec![cond(&[17, 33]), a, b]).dtypes(&ANY_DTYPE));
    let (a, b) = ab(&[17, 33]);
    out.push(
        Sample::new(
            op.clone(),
            "[17, 33] broadcast",
            vec![
                cond(&[17, 33]).view(View::Broadcast(vec![17, 1])),
                a.view(View::Permuted(vec![1, 0])),
                b.view(View::Broadcast(vec![33])),
            ],
        )
        .dtypes(&ANY_DTYPE),
    );
    let (a, b) = ab(&[0, 2]);
    out.push(Sample::new(op.clone(), "[0, 2]", vec![cond(&[0, 2]), a, b]).dtypes(&ANY_DTYPE));
    let (a, b) = ab(&[3, 4]);
    out.push(Sample::new(op.clone(), "[3, 4] gradcheck", vec![cond(&[3, 4]), a, b]).gradcheck());
    out.push(
        Sample::new(
            op,
            "[9, 29] NaN/inf",
            vec![
                cond(&[9, 29]),
                input(&[9, 29], special()),
                input(&[9, 29], special()),
            ],
        )
        .no_backward(),
    );
    out
}

fn swiglu_inputs(shape: &[usize], with_dy: bool) -> Vec<Input> {
    let mut v = vec![
        input(shape, uniform(-3.0, 3.0)),
        input(shape, uniform(-2.0, 2.0)),
    ];
    if with_dy {
        v.push(input(shape, uniform(-1.0, 1.0)));
    }
    v
}

pub(super) fn swiglu() -> Vec<Sample> {
    let op = Op::SwiGlu;
    vec![
        Sample::new(op.clone(), "[17, 33]", swiglu_inputs(&[17, 33], false)),
        Sample::new(op.clone(), "[3, 1030]", swiglu_inputs(&[3, 1030], false)),
        Sample::new(op.clone(), "[0, 8]", swiglu_inputs(&[0, 8], false)),
        Sample::new(
            op.clone(),
            "[2, 3] gradcheck",
            swiglu_inputs(&[2, 3], false),
        )
        .gradcheck(),
        Sample::new(
            op.clone(),
            "[9, 29] offset",
            swiglu_inputs(&[9, 29], false)
                .into_iter()
                .map(|i| i.view(View::Offset(5)))
                .collect(),
        ),
        Sample::new(
            op,
            "[9, 29] NaN/inf",
            vec![input(&[9, 29], special()), input(&[9, 29], special())],
        )
        .no_backward(),
    ]
}

pub(super) fn swiglu_backward() -> Vec<Sample> {
    let op = Op::SwiGluBackward;
    vec![
        Sample::new(op.clone(), "[17, 33]", swiglu_inputs(&[17, 33], true)),
        Sample::new(op.clone(), "[3, 1030]", swiglu_inputs(&[3, 1030], true)),
        Sample::new(op.clone(), "[0, 8]", swiglu_inputs(&[0, 8], true)),
        Sample::new(
            op,
            "[9, 29] offset",
            swiglu_inputs(&[9, 29], true)
                .into_iter()
                .map(|i| i.view(View::Offset(3)))
                .collect(),
        ),
    ]
}

pub(super) fn cast() -> Vec<Sample> {
    let mut out = Vec::new();
    let extremes = Gen::Values(vec![
        70_000.0, -70_000.0, 65_519.0, 65_520.0, 1e-8, -1e-8, 3e9, -3e9, 0.5, -0.5, 1.5, 2.5, -2.5,
        1e38, -0.0, 0.0,
    ]);
    for to in DType::ALL {
        let op = Op::Cast { to };
        out.push(Sample::new(
            op.clone(),
            format!("to {to} [17, 33]"),
            vec![input(&[17, 33], uniform(-1000.0, 1000.0))],
        ));
        out.push(Sample::new(
            op.clone(),
            format!("to {to} [33, 17]"),
            vec![input(&[33, 17], uniform(-3.0, 3.0)).view(View::Permuted(vec![1, 0]))],
        ));
        out.push(Sample::new(
            op.clone(),
            format!("to {to} [0, 3]"),
            vec![input(&[0, 3], uniform(-3.0, 3.0))],
        ));
        out.push(
            Sample::new(
                op.clone(),
                format!("to {to} extremes"),
                vec![input(&[16], extremes.clone())],
            )
            .no_backward(),
        );
        for shape in [[9, 29], [6, 16]] {
            out.push(
                Sample::new(
                    op.clone(),
                    format!("to {to} {shape:?} NaN/inf"),
                    vec![input(
                        &shape,
                        Gen::Special(Box::new(uniform(-100.0, 100.0))),
                    )],
                )
                .no_backward(),
            );
        }
        // Finite differences see a rounding cast as a step function: only f64 is smooth.
        if to == DType::F64 {
            out.push(
                Sample::new(
                    op,
                    format!("to {to} [3, 4] gradcheck"),
                    vec![input(&[3, 4], uniform(-3.0, 3.0))],
                )
                .gradcheck(),
            );
        }
    }
    let from = [
        (
            DType::I32,
            Gen::Ints {
                lo: -1000,
                hi: 1000,
            },
        ),
        (DType::U32, Gen::Ints { lo: 0, hi: 3000 }),
        (DType::Bool, Gen::Bool),
    ];
    for (dtype, gen) in from {
        let x = fixed(&[17, 33], dtype, gen.clone());
        out.push(
            Sample::new(
                Op::Cast { to: DType::F32 },
                format!("from {dtype} [17, 33]"),
                vec![x],
            )
            .retype(),
        );
        let x = fixed(&[33, 17], dtype, gen).view(View::Permuted(vec![1, 0]));
        out.push(
            Sample::new(
                Op::Cast { to: DType::F32 },
                format!("from {dtype} [33, 17]"),
                vec![x],
            )
            .retype(),
        );
    }
    out
}

pub(super) fn copy() -> Vec<Sample> {
    let op = Op::Copy;
    let x = |shape: &[usize], view: View| vec![input(shape, uniform(-3.0, 3.0)).view(view)];
    vec![
        Sample::new(op.clone(), "[17, 33]", x(&[17, 33], View::Contiguous))
            .dtypes(&ANY_DTYPE)
            .gradcheck(),
        Sample::new(
            op.clone(),
            "[33, 17]",
            x(&[33, 17], View::Permuted(vec![1, 0])),
        )
        .dtypes(&ANY_DTYPE),
        Sample::new(
            op.clone(),
            "[3, 5, 7]",
            x(&[3, 5, 7], View::Permuted(vec![2, 0, 1])),
        )
        .dtypes(&ANY_DTYPE),
        Sample::new(op.clone(), "[5, 1030]", x(&[5, 1030], View::Padded(3))).dtypes(&ANY_DTYPE),
        Sample::new(
            op.clone(),
            "[4, 6, 257]",
            x(&[4, 6, 257], View::Broadcast(vec![6, 1])),
        )
        .dtypes(&ANY_DTYPE),
        Sample::new(op.clone(), "[0, 7]", x(&[0, 7], View::Contiguous)).dtypes(&ANY_DTYPE),
        Sample::new(op.clone(), "[]", x(&[], View::Offset(2))).dtypes(&ANY_DTYPE),
        Sample::new(op.clone(), "[9, 13]", x(&[9, 13], View::Contiguous))
            .dtypes(&ANY_DTYPE)
            .out_view(View::Permuted(vec![1, 0])),
        Sample::new(op.clone(), "[9, 13]", x(&[9, 13], View::Offset(1)))
            .dtypes(&ANY_DTYPE)
            .out_view(View::Padded(4)),
        Sample::new(
            op.clone(),
            "[2, 3, 4, 16] heads",
            x(&[2, 3, 4, 16], View::Permuted(vec![0, 2, 1, 3])),
        )
        .dtypes(&ANY_DTYPE),
        Sample::new(
            op.clone(),
            "[2, 4, 3, 16]",
            x(&[2, 4, 3, 16], View::Offset(8)),
        )
        .dtypes(&ANY_DTYPE)
        .out_view(View::Permuted(vec![0, 2, 1, 3])),
        Sample::new(
            op.clone(),
            "[9, 29] NaN/inf",
            vec![input(&[9, 29], special())],
        )
        .no_backward(),
        Sample::new(op, "[6, 16] NaN/inf", vec![input(&[6, 16], special())]).no_backward(),
    ]
}
