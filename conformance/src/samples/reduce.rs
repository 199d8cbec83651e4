//! Reductions, argmax and softmax samples.

use tessera::{Op, ReduceOp};

use super::{input, special, uniform, Gen, Sample, View};

pub(super) fn reduce(kind: ReduceOp) -> Vec<Sample> {
    let extremal = matches!(kind, ReduceOp::Max | ReduceOp::Min);
    let r = |axes: &[usize], keepdim: bool| Op::Reduce {
        op: kind,
        axes: axes.to_vec(),
        keepdim,
    };
    let case = |shape: &[usize], axes: &[usize], keepdim: bool, view: View, gen: Gen| {
        let len: usize = axes.iter().map(|&a| shape[a]).product();
        Sample::new(
            r(axes, keepdim),
            format!("{shape:?} axes {axes:?} keepdim {keepdim}"),
            vec![input(shape, gen).view(view)],
        )
        .reduce(len)
    };
    let u = || uniform(-2.0, 2.0);
    let mut out = vec![
        case(&[17, 33], &[1], false, View::Contiguous, u()),
        case(&[17, 33], &[0], true, View::Contiguous, u()),
        case(&[17, 33], &[0, 1], false, View::Contiguous, u()),
        case(&[17, 33], &[], false, View::Contiguous, u()),
        case(&[], &[], true, View::Contiguous, u()),
        case(&[3, 2100], &[1], false, View::Contiguous, u()),
        case(&[1500, 3], &[0], false, View::Contiguous, u()),
        // Rows of whole 16-byte groups: a column reduction by vector loads.
        case(&[1000, 72], &[0], false, View::Contiguous, u()),
        // Column reductions over more than one workgroup's outputs, of rows merged from two
        // axes.
        case(&[3, 200, 520], &[0, 1], false, View::Contiguous, u()),
        // Rows in more chunks (20) than a column reduction's finishing step has threads an
        // output (16), over outputs that are not a whole number of its workgroups.
        case(&[5000, 70], &[0], false, View::Contiguous, u()),
        case(&[70_000, 3], &[1], false, View::Contiguous, u()),
        case(
            &[4, 5, 6],
            &[0, 2],
            true,
            View::Permuted(vec![2, 0, 1]),
            u(),
        ),
        case(&[4, 5, 6], &[1], false, View::Contiguous, u()),
        case(&[8, 33], &[0], false, View::Broadcast(vec![33]), u()),
        case(&[5, 1030], &[1], true, View::Padded(3), u()),
        case(&[0, 5], &[1], false, View::Contiguous, u()),
        case(&[9, 29], &[1], false, View::Contiguous, special()).no_backward(),
        case(&[9, 29], &[0], false, View::Contiguous, special()).no_backward(),
        case(
            &[3, 4],
            &[1],
            false,
            View::Contiguous,
            Gen::Distinct { scale: 0.05 },
        )
        .gradcheck(),
        case(
            &[2, 3, 4],
            &[0, 2],
            false,
            View::Contiguous,
            Gen::Distinct { scale: 0.05 },
        )
        .gradcheck(),
    ];
    if !extremal {
        out.push(case(&[3, 0], &[1], false, View::Contiguous, u()));
    }
    out
}

pub(super) fn argmax() -> Vec<Sample> {
    let a = |axis: usize, keepdim: bool| Op::ArgMax { axis, keepdim };
    let case = |shape: &[usize], axis: usize, keepdim: bool, view: View, gen: Gen| {
        Sample::new(
            a(axis, keepdim),
            format!("{shape:?} axis {axis} keepdim {keepdim}"),
            vec![input(shape, gen).view(view)],
        )
    };
    let u = || uniform(-2.0, 2.0);
    vec![
        case(&[17, 33], 1, false, View::Contiguous, u()),
        case(&[17, 33], 0, true, View::Contiguous, u()),
        case(&[3, 2100], 1, false, View::Contiguous, u()),
        case(&[1500, 3], 0, false, View::Contiguous, u()),
        case(&[70_000, 3], 1, false, View::Contiguous, u()),
        case(&[4, 5, 6], 1, false, View::Permuted(vec![2, 0, 1]), u()),
        case(
            &[6, 257],
            1,
            false,
            View::Padded(2),
            Gen::Ints { lo: 0, hi: 3 },
        ),
        case(&[1, 1], 0, false, View::Contiguous, u()),
        case(&[0, 5], 1, true, View::Contiguous, u()),
        case(&[9, 29], 1, false, View::Contiguous, special()),
        case(&[9, 29], 0, false, View::Contiguous, special()),
        // A few long rows (greedy decoding's logits; backends may split them into chunks):
        // GPT-2's vocabulary, ties across the whole row through a strided view, and
        // special values.
        case(&[2, 50_257], 1, true, View::Contiguous, u()),
        case(
            &[3, 20_000],
            1,
            false,
            View::Padded(3),
            Gen::Ints { lo: 0, hi: 3 },
        ),
        case(&[2, 9_000], 1, false, View::Contiguous, special()),
    ]
}

/// Rows of shapes for the last-axis ops: longer than a workgroup, more rows than a grid
/// dimension holds, rank 1 and 3, a single element, and empty.
const ROWS: [&[usize]; 9] = [
    &[7, 33],
    &[3, 1500],
    &[2, 2100],
    &[70_000, 4],
    &[2, 3, 17],
    &[5],
    &[1, 1],
    &[0, 8],
    &[4, 0],
];

pub(super) fn softmax(op: &Op) -> Vec<Sample> {
    let mut out: Vec<Sample> = ROWS
        .iter()
        .map(|&s| {
            let sample = Sample::new(
                op.clone(),
                format!("{s:?}"),
                vec![input(s, uniform(-4.0, 4.0))],
            )
            .reduce(s[s.len() - 1]);
            if s.iter().product::<usize>() > 100_000 {
                sample.no_half_chain()
            } else {
                sample
            }
        })
        .collect();
    let masked = Gen::Values(vec![
        0.3,
        f64::NEG_INFINITY,
        1.2,
        -0.7,
        f64::NEG_INFINITY,
        2.0,
        0.1,
    ]);
    out.push(
        Sample::new(
            op.clone(),
            "[5, 33] masked -inf",
            vec![input(&[5, 33], masked)],
        )
        .reduce(33),
    );
    out.push(
        Sample::new(
            op.clone(),
            "[9, 29] NaN/inf",
            vec![input(&[9, 29], special())],
        )
        .reduce(29)
        .no_backward(),
    );
    out.push(
        Sample::new(
            op.clone(),
            "[6, 300] offset",
            vec![input(&[6, 300], uniform(-20.0, 20.0)).view(View::Offset(11))],
        )
        .reduce(300),
    );
    out.push(
        Sample::new(
            op.clone(),
            "[3, 5] gradcheck",
            vec![input(&[3, 5], uniform(-2.0, 2.0))],
        )
        .reduce(5)
        .gradcheck(),
    );
    out
}

pub(super) fn softmax_backward(op: &Op) -> Vec<Sample> {
    let forward = if matches!(op, Op::SoftmaxBackward) {
        Op::Softmax
    } else {
        Op::LogSoftmax
    };
    ROWS.iter()
        .map(|&s| {
            let y = input(
                s,
                Gen::Forward {
                    op: forward.clone(),
                    args: vec![1],
                    scalars: vec![],
                    output: 0,
                },
            );
            Sample::new(
                op.clone(),
                format!("{s:?}"),
                vec![y, input(s, uniform(-1.0, 1.0))],
            )
            .reduce(s[s.len() - 1])
        })
        .collect()
}
