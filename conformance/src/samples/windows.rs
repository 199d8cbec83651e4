//! Samples whose largest operands (or a convolution's im2col columns) are `[rows, cols]` f32
//! tensors: past one storage binding (128 MiB on lavapipe) at [`ROWS`] x [`COLS`], so
//! backends that bind buffers in windows run them over several. Each covers a way an op is
//! split: broadcast operands, sub-word outputs (bf16), random values that keep their
//! element's index, ids in different windows of an embedding table, matmuls split along rows,
//! columns and K, row-wise ops (softmax, layer norm with its statistics, cross-entropy and
//! its backward) over ranges of rows, reductions split along kept dimensions and into
//! partial results along reduced ones, attention and rotary embedding over parts of whole
//! heads, gather and scatter-add split on and off their axis, an index copy split along its
//! rows, and convolutions over parts of their columns. Splits
//! that the family samples already take under a small binding cap (the optimizer's flat
//! ranges, embedding over ranges of positions) have no sample here: each of these costs a
//! minute of CPU reference time.

use tessera::rng::split_u64;
use tessera::{DType, Op, ReduceOp, UnaryOp};

use super::{conv, fixed, input, loss, stats, uniform, Gen, Input, Sample, View};

/// Rows and columns of the largest operands: 134,480,000 bytes in f32, just past 128 MiB.
pub const ROWS: usize = 8200;
pub const COLS: usize = 4100;

/// The samples of `op`'s catalog entry whose largest operands are `[rows, cols]` (f32 only,
/// no backward: their point is size).
pub fn samples(op: &Op, rows: usize, cols: usize) -> Vec<Sample> {
    let big = [rows, cols];
    let ids = |values: Vec<f64>| fixed(&[values.len()], DType::I32, Gen::Values(values));
    // Ids in the first and last rows, on both sides of the middle, repeated, and out of range.
    let spread = || {
        let r = rows as f64;
        vec![
            -1.0,
            0.0,
            r - 1.0,
            (r / 2.0).floor(),
            r,
            3.0,
            r - 1.0,
            (r / 2.0).floor() + 1.0,
        ]
    };
    // One id per table row, drawn from a sixteenth of the rows (ids repeat), some out of range.
    let many_ids = || {
        fixed(
            &[rows],
            DType::I32,
            Gen::Ints {
                lo: -1,
                hi: (rows / 16) as i64 + 1,
            },
        )
    };
    let matmul = |bias: bool, activation: Option<UnaryOp>, residual: bool| Op::Matmul {
        bias,
        activation,
        residual,
    };
    let samples = match op {
        Op::Binary(tessera::BinaryOp::Add) => vec![Sample::new(
            op.clone(),
            format!("{big:?} + row"),
            vec![
                input(&big, uniform(-2.0, 2.0)),
                input(&big, uniform(-2.0, 2.0)).view(View::Broadcast(vec![cols])),
            ],
        )],
        Op::Cast { .. } => vec![Sample::new(
            Op::Cast { to: DType::BF16 },
            format!("to bf16 {big:?}"),
            vec![input(&big, uniform(-3.0, 3.0))],
        )],
        Op::Fill { .. } => vec![Sample::new(op.clone(), format!("{big:?}"), vec![])
            .scalars(&[1.25])
            .out_shape(&big)
            .retype()],
        Op::RandNormal { .. } => {
            let [k0, k1] = split_u64(0x5eed);
            let [c0, c1] = split_u64(9);
            vec![Sample::new(op.clone(), format!("{big:?}"), vec![])
                .scalars(&[k0, k1, c0, c1, 0.5, 2.0])
                .out_shape(&big)
                .retype()]
        }
        // Column sums and minima split the reduced rows into partial results; a mean over
        // everything splits both ways; row maxima split the kept rows.
        Op::Reduce { op: kind, .. } => {
            let (axes, keepdim): (&[usize], bool) = match kind {
                ReduceOp::Sum => (&[0], false),
                ReduceOp::Min => (&[0], true),
                ReduceOp::Mean => (&[0, 1], false),
                ReduceOp::Max => (&[1], true),
            };
            let len: usize = axes.iter().map(|&a| big[a]).product();
            vec![Sample::new(
                Op::Reduce {
                    op: *kind,
                    axes: axes.to_vec(),
                    keepdim,
                },
                format!("{big:?} axes {axes:?} keepdim {keepdim}"),
                vec![input(&big, uniform(-2.0, 2.0))],
            )
            .reduce(len)]
        }
        // Along the kept rows, and along the reduced rows: integers below the row count, so
        // that the maximum of a column lies in either half and often ties across them (the
        // first index must win).
        Op::ArgMax { .. } => vec![
            Sample::new(
                Op::ArgMax {
                    axis: 1,
                    keepdim: false,
                },
                format!("{big:?} axis 1"),
                vec![input(&big, uniform(-2.0, 2.0))],
            ),
            Sample::new(
                Op::ArgMax {
                    axis: 0,
                    keepdim: true,
                },
                format!("{big:?} axis 0 keepdim, ties"),
                vec![input(
                    &big,
                    Gen::Ints {
                        lo: 0,
                        hi: rows as i64,
                    },
                )],
            ),
        ],
        Op::Attention { .. } | Op::Rotary => vec![attention_case(op, rows, cols)],
        Op::Softmax => vec![Sample::new(
            op.clone(),
            format!("{big:?}"),
            vec![input(&big, uniform(-4.0, 4.0))],
        )
        .reduce(cols)],
        Op::LayerNorm => vec![Sample::new(
            op.clone(),
            format!("{big:?}"),
            vec![
                input(&big, uniform(-2.0, 3.0)),
                input(&[cols], uniform(0.5, 1.5)),
                input(&[cols], uniform(-0.5, 0.5)),
            ],
        )
        .scalars(&[1e-5])
        .reduce(cols)],
        Op::CrossEntropy => vec![loss::forward_case(
            rows,
            cols,
            loss::targets(rows, DType::I32, -1, cols as i64),
        )],
        Op::CrossEntropyBackward => vec![loss::backward_case(
            rows,
            cols,
            loss::targets(rows, DType::I32, -1, cols as i64),
        )],
        Op::SquaredNorm => vec![Sample::new(
            op.clone(),
            format!("{big:?} and [5]"),
            vec![
                input(&big, uniform(-1.0, 1.0)),
                input(&[5], uniform(-1.0, 1.0)),
            ],
        )
        .reduce(rows * cols + 5)],
        Op::Embedding => vec![Sample::new(
            op.clone(),
            format!("table {big:?}"),
            vec![input(&big, uniform(-1.0, 1.0)), ids(spread())],
        )],
        Op::EmbeddingBackward => vec![
            Sample::new(
                op.clone(),
                format!("V {rows} dy [8, {cols}]"),
                vec![ids(spread()), input(&[8, cols], uniform(-1.0, 1.0))],
            )
            .out_shape(&big)
            .reduce(8),
            Sample::new(
                op.clone(),
                format!("V {rows} dy [{rows}, {cols}]"),
                vec![many_ids(), input(&big, uniform(-1.0, 1.0))],
            )
            .out_shape(&big)
            .reduce(rows),
        ],
        Op::Matmul { .. } => vec![
            // Decoding's LM head: `b` a transposed table, split along columns.
            Sample::new(
                matmul(false, None, false),
                format!("[1, 3, {cols}] x table^T"),
                vec![
                    input(&[1, 3, cols], uniform(-1.0, 1.0)),
                    input(&[1, cols, rows], uniform(-1.0, 1.0)).view(View::Permuted(vec![0, 2, 1])),
                ],
            )
            .reduce(cols),
            // The input gradient through it: split along K, with every epilogue.
            Sample::new(
                matmul(true, Some(UnaryOp::Gelu), true),
                format!("[3, {rows}] x table bias gelu residual"),
                vec![
                    input(&[3, rows], uniform(-1.0, 1.0)),
                    input(&big, uniform(-1.0, 1.0)),
                    input(&[cols], uniform(-1.0, 1.0)),
                    input(&[3, cols], uniform(-1.0, 1.0)),
                ],
            )
            .reduce(rows),
            // The weight gradient: a large output, split along rows.
            Sample::new(
                matmul(false, None, false),
                format!("[{rows}, 8] x [8, {cols}]"),
                vec![
                    input(&[rows, 8], uniform(-1.0, 1.0)),
                    input(&[8, cols], uniform(-1.0, 1.0)),
                ],
            )
            .reduce(8),
        ],
        // Off the axis all operands split; along it `x` splits into windows of rows (ids in
        // both, and out of range), or the index and output split with `x` whole.
        Op::Gather { .. } => {
            let index = |shape: &[usize], hi: usize| {
                let gen = Gen::Ints {
                    lo: -1,
                    hi: hi as i64 + 1,
                };
                fixed(shape, DType::I32, gen)
            };
            let gather = |axis: usize, x: &[usize], idx: Input| {
                let name = format!("axis {axis} x {x:?} index {:?}", idx.shape);
                Sample::new(
                    Op::Gather { axis },
                    name,
                    vec![input(x, uniform(-2.0, 2.0)), idx],
                )
            };
            vec![
                gather(1, &big, index(&[rows, cols / 2], cols)),
                gather(0, &big, index(&[16, cols], rows)),
                gather(1, &[1, cols], index(&[1, rows * cols], cols)),
            ]
        }
        // Sources split along the axis, each part adding onto the output; targets split into
        // ranges, past the rows the sources reach (zeros).
        Op::ScatterAdd { .. } => {
            let n = rows * cols;
            let targets = vec![
                -1.0,
                0.0,
                (n / 2) as f64,
                (n / 2 - 1) as f64,
                (n - 1) as f64,
                n as f64,
            ];
            let reached = [1, targets.len()];
            vec![
                Sample::new(
                    Op::ScatterAdd { axis: 0 },
                    format!("axis 0 index {big:?} out [8, {cols}]"),
                    vec![
                        fixed(&big, DType::I32, Gen::Ints { lo: -1, hi: 9 }),
                        input(&big, uniform(-1.0, 1.0)),
                    ],
                )
                .out_shape(&[8, cols])
                .reduce(rows),
                Sample::new(
                    Op::ScatterAdd { axis: 1 },
                    format!("axis 1 index {reached:?} out [2, {n}]"),
                    vec![
                        fixed(&reached, DType::I32, Gen::Values(targets)),
                        input(&reached, uniform(-1.0, 1.0)),
                    ],
                )
                .out_shape(&[2, n])
                .reduce(2),
            ]
        }
        // A cache-like destination split along its rows, written at a few columns.
        Op::IndexCopy { .. } => {
            let index = vec![0.0, (cols / 2) as f64, (cols - 1) as f64, cols as f64];
            vec![Sample::new(
                Op::IndexCopy { axis: 1 },
                format!("axis 1 dst {big:?} index {index:?} in place"),
                vec![
                    input(&big, uniform(-1.0, 1.0)),
                    ids(index),
                    input(&[rows, 4], uniform(-1.0, 1.0)),
                ],
            )
            .in_place()]
        }
        Op::Conv2d { .. } | Op::Conv2dBackwardData { .. } | Op::Conv2dBackwardWeight { .. } => {
            conv::one_large_image(op, rows, cols)
        }
        _ => Vec::new(),
    };
    samples.into_iter().map(Sample::large).collect()
}

/// Samples of the same kind that run only scaled down, in the small-binding test of the wgpu
/// backend: at full size their CPU reference (attention backward) or lavapipe's kernels
/// (convolutions over 1,025 images; lavapipe's tiled matmul costs about half a millisecond
/// per output tile and K step) would add minutes to the `ops` test. Attention backward and
/// cached attention split as attention does; convolutions over many small images split into parts of several images.
pub fn scaled_samples(op: &Op, rows: usize, cols: usize) -> Vec<Sample> {
    let samples = match op {
        Op::AttentionBackward { .. } | Op::CachedAttention => {
            vec![attention_case(op, rows, cols)]
        }
        Op::Conv2d { .. } | Op::Conv2dBackwardData { .. } | Op::Conv2dBackwardWeight { .. } => {
            conv::many_small_images(op, rows, cols)
        }
        _ => Vec::new(),
    };
    samples.into_iter().map(Sample::large).collect()
}

/// Attention over short heads whose queries, `[1, 2 h, 16, 64]`, pass a binding of `rows *
/// cols` f32 elements: split along the key/value heads, each with its two query heads.
/// Attention backward and rotary embedding of such queries split along the heads too.
fn attention_case(op: &Op, rows: usize, cols: usize) -> Sample {
    let (t, d) = (16, 64);
    let hkv = (rows * cols).div_ceil(2 * t * d);
    let q = [1, 2 * hkv, t, d];
    let kv = [1, hkv, t, d];
    let name = format!("q {q:?} k, v {kv:?}");
    let qkv = || {
        vec![
            input(&q, uniform(-1.0, 1.0)),
            input(&kv, uniform(-1.0, 1.0)),
            input(&kv, uniform(-1.0, 1.0)),
        ]
    };
    let scale = 1.0 / (d as f64).sqrt();
    let forward = |output| Gen::Forward {
        op: Op::Attention { causal: true },
        args: vec![0, 1, 2],
        scalars: vec![scale],
        output,
    };
    let attention = |op: Op, inputs| {
        Sample::new(op, name.clone(), inputs)
            .scalars(&[scale])
            .reduce(t.max(d))
    };
    match op {
        Op::Attention { .. } => attention(Op::Attention { causal: true }, qkv()),
        Op::CachedAttention => {
            let mut inputs = qkv();
            let positions = (0..t).map(|i| (i + 3) as f64).collect();
            inputs.push(fixed(&[t], DType::I32, Gen::Values(positions)));
            attention(Op::CachedAttention, inputs)
        }
        Op::AttentionBackward { .. } => {
            let mut inputs = qkv();
            inputs.push(input(&q, forward(0)));
            inputs.push(stats(&q[..3], forward(1)));
            inputs.push(input(&q, uniform(-1.0, 1.0)));
            attention(Op::AttentionBackward { causal: true }, inputs)
        }
        _ => {
            let table = || input(&[t, d / 2], uniform(-1.0, 1.0));
            let x = input(&q, uniform(-2.0, 2.0));
            Sample::new(Op::Rotary, format!("{q:?}"), vec![x, table(), table()]).reduce(2)
        }
    }
}
