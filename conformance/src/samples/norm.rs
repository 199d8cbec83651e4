//! Layer norm and RMS norm samples: rows longer than a workgroup, more rows than one grid
//! dimension holds, single columns, empty batches, rows of whole 16-byte groups in many
//! chunks (the backward's warp-per-row kernel), and many rows of an odd length (a subgroup a
//! row, 16-bit rows starting mid-word).

use tessera::Op;

use super::{input, stats, uniform, Gen, Sample, View};

const EPS: f64 = 1e-5;

const SHAPES: [&[usize]; 11] = [
    &[7, 33],
    &[260, 33],
    &[300, 72],
    &[40, 1024],
    &[3, 1500],
    &[2, 2100],
    &[70_000, 4],
    &[2, 3, 17],
    &[5],
    &[1, 1],
    &[0, 8],
];

fn rows(shape: &[usize]) -> usize {
    shape[..shape.len() - 1].iter().product()
}

pub(super) fn forward(op: &Op) -> Vec<Sample> {
    let case = |shape: &[usize], view: View| {
        let n = shape[shape.len() - 1];
        let mut inputs = vec![
            input(shape, uniform(-2.0, 3.0)).view(view),
            input(&[n], uniform(0.5, 1.5)),
        ];
        if matches!(op, Op::LayerNorm) {
            inputs.push(input(&[n], uniform(-0.5, 0.5)));
        }
        Sample::new(op.clone(), format!("{shape:?}"), inputs)
            .scalars(&[EPS])
            .reduce(n)
            .grad_reduce(n.max(rows(shape)))
    };
    let mut out: Vec<Sample> = SHAPES.iter().map(|s| case(s, View::Contiguous)).collect();
    out.push(case(&[6, 300], View::Offset(13)));
    out.push(case(&[3, 5], View::Contiguous).gradcheck());
    out
}

pub(super) fn backward(op: &Op) -> Vec<Sample> {
    SHAPES
        .iter()
        .map(|&shape| {
            let n = shape[shape.len() - 1];
            let r = rows(shape);
            let x = input(shape, uniform(-2.0, 3.0));
            let w = input(&[n], uniform(0.5, 1.5));
            let dy = input(shape, uniform(-1.0, 1.0));
            let (inputs, lens) = if matches!(op, Op::LayerNormBackward) {
                let stat = |output| {
                    stats(
                        &shape[..shape.len() - 1],
                        Gen::Forward {
                            op: Op::LayerNorm,
                            args: vec![0, 1, 1],
                            scalars: vec![EPS],
                            output,
                        },
                    )
                };
                (vec![x, w, stat(1), stat(2), dy], vec![n, r, r])
            } else {
                let rstd = stats(
                    &shape[..shape.len() - 1],
                    Gen::Forward {
                        op: Op::RmsNorm,
                        args: vec![0, 1],
                        scalars: vec![EPS],
                        output: 1,
                    },
                );
                (vec![x, w, rstd, dy], vec![n, r])
            };
            Sample::new(op.clone(), format!("{shape:?}"), inputs).reduce_each(&lens)
        })
        .collect()
}
