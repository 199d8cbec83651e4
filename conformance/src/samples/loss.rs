//! Cross-entropy samples: vocabularies beyond 65,536, many rows, ignored targets, rows of
//! whole 16-byte vectors.

use tessera::{DType, Op};

use super::{fixed, input, stats, uniform, Gen, Input, Sample, View};

/// Targets in `lo..hi`; values outside `0..V` are ignored rows.
pub(super) fn targets(n: usize, dtype: DType, lo: i64, hi: i64) -> Input {
    fixed(&[n], dtype, Gen::Ints { lo, hi })
}

fn cases() -> Vec<(usize, usize, Input)> {
    vec![
        (7, 33, targets(7, DType::I32, -1, 33)),
        (7, 33, targets(7, DType::U32, 0, 36)),
        // Rows of whole 16-byte vectors (read and written a vector at a time on GPUs).
        (9, 264, targets(9, DType::I32, -1, 270)),
        (
            4,
            33,
            fixed(&[4], DType::I32, Gen::Values(vec![-100.0, 3.0, 32.0, 0.0])),
        ),
        (3, 70_000, targets(3, DType::I32, 0, 70_000)),
        (4, 2100, targets(4, DType::I32, 0, 2100)),
        (70_000, 3, targets(70_000, DType::I32, 0, 3)),
        (2, 1, targets(2, DType::I32, 0, 1)),
        (0, 5, targets(0, DType::I32, 0, 5)),
    ]
}

/// The forward sample of `[n, v]` logits and targets `t`.
pub(super) fn forward_case(n: usize, v: usize, t: Input) -> Sample {
    let desc = format!("[{n}, {v}] {} targets", t.kind_name());
    Sample::new(
        Op::CrossEntropy,
        desc,
        vec![input(&[n, v], uniform(-3.0, 3.0)), t],
    )
    .reduce(v)
}

/// The backward sample of `[n, v]` logits, targets `t`, their log-sum-exp and a gradient.
pub(super) fn backward_case(n: usize, v: usize, t: Input) -> Sample {
    let desc = format!("[{n}, {v}] {} targets", t.kind_name());
    let lse = stats(
        &[n],
        Gen::Forward {
            op: Op::CrossEntropy,
            args: vec![0, 1],
            scalars: vec![],
            output: 1,
        },
    );
    let inputs = vec![
        input(&[n, v], uniform(-3.0, 3.0)),
        t,
        lse,
        stats(&[n], uniform(-1.0, 1.0)),
    ];
    Sample::new(Op::CrossEntropyBackward, desc, inputs).reduce(v)
}

pub(super) fn forward() -> Vec<Sample> {
    let case = forward_case;
    let mut out: Vec<Sample> = cases().into_iter().map(|(n, v, t)| case(n, v, t)).collect();
    out.push(case(3, 5, targets(3, DType::I32, 0, 5)).gradcheck());
    out
}

pub(super) fn backward() -> Vec<Sample> {
    let mut out: Vec<Sample> = cases()
        .into_iter()
        .map(|(n, v, t)| backward_case(n, v, t))
        .collect();
    // A gradient written from an odd element: a 16-bit output then starts mid-word.
    out.push(backward_case(7, 33, targets(7, DType::I32, 0, 33)).out_view(View::Offset(1)));
    // ... and from a whole vector past the output's start.
    out.push(backward_case(9, 264, targets(9, DType::I32, 0, 264)).out_view(View::Offset(8)));
    out
}
