//! Movement samples: concat, embedding, gather, scatter-add, index copy. Index inputs include ids outside
//! the valid range, whose results the catalog defines (zero rows, zeros, skipped).

use tessera::{DType, Op};

use super::{fixed, input, uniform, Gen, Input, Sample, View, ANY_DTYPE};

fn ids(shape: &[usize], dtype: DType, lo: i64, hi: i64) -> Input {
    fixed(shape, dtype, Gen::Ints { lo, hi })
}

pub(super) fn concat() -> Vec<Sample> {
    let case = |axis: usize, shapes: &[&[usize]], view: View| {
        let inputs = shapes
            .iter()
            .map(|s| input(s, uniform(-2.0, 2.0)).view(view.clone()))
            .collect();
        Sample::new(
            Op::Concat { axis },
            format!("axis {axis} {shapes:?}"),
            inputs,
        )
        .dtypes(&ANY_DTYPE)
    };
    vec![
        case(0, &[&[3, 5], &[4, 5], &[1, 5]], View::Contiguous),
        case(1, &[&[3, 5], &[3, 0], &[3, 7]], View::Offset(2)),
        case(2, &[&[2, 3, 4], &[2, 3, 1030]], View::Contiguous),
        case(0, &[&[5]], View::Contiguous),
        case(0, &[&[0, 4], &[0, 4]], View::Contiguous),
        case(1, &[&[2, 3], &[2, 2]], View::Contiguous).gradcheck(),
    ]
}

pub(super) fn embedding() -> Vec<Sample> {
    let case = |v: usize, d: usize, id_shape: &[usize], index: Input| {
        let n: usize = id_shape.iter().product();
        Sample::new(
            Op::Embedding,
            format!("[{v}, {d}] ids {id_shape:?} {}", index.kind_name()),
            vec![input(&[v, d], uniform(-1.0, 1.0)), index],
        )
        .grad_reduce(n.max(1))
    };
    vec![
        case(50, 17, &[3, 7], ids(&[3, 7], DType::I32, -2, 52)),
        case(50, 17, &[3, 7], ids(&[3, 7], DType::U32, 0, 53)),
        case(1000, 1030, &[9], ids(&[9], DType::I32, 0, 1000)),
        case(10, 4, &[], ids(&[], DType::I32, 0, 10)),
        case(10, 4, &[0], ids(&[0], DType::I32, 0, 10)),
        case(5, 3, &[4], ids(&[4], DType::I32, 0, 5)).gradcheck(),
    ]
}

pub(super) fn embedding_backward() -> Vec<Sample> {
    let case = |v: usize, d: usize, id_shape: &[usize], index: Input| {
        let n: usize = id_shape.iter().product();
        let mut dy_shape = id_shape.to_vec();
        dy_shape.push(d);
        Sample::new(
            Op::EmbeddingBackward,
            format!("V {v} dy {dy_shape:?} {}", index.kind_name()),
            vec![index, input(&dy_shape, uniform(-1.0, 1.0))],
        )
        .out_shape(&[v, d])
        .reduce(n.max(1))
    };
    vec![
        case(10, 17, &[40], ids(&[40], DType::I32, -1, 11)),
        case(10, 17, &[40], ids(&[40], DType::U32, 0, 12)),
        case(7, 1030, &[300], ids(&[300], DType::I32, 0, 7)),
        case(9, 5, &[2, 3], ids(&[2, 3], DType::I32, 0, 9)),
        case(4, 5, &[0], ids(&[0], DType::I32, 0, 4)),
    ]
}

pub(super) fn gather() -> Vec<Sample> {
    let case = |axis: usize, x: &[usize], index: Input| {
        let along = index.shape[axis];
        Sample::new(
            Op::Gather { axis },
            format!(
                "axis {axis} x {x:?} index {:?} {}",
                index.shape,
                index.kind_name()
            ),
            vec![input(x, uniform(-2.0, 2.0)), index],
        )
        .grad_reduce(along.max(1))
    };
    vec![
        case(1, &[5, 7], ids(&[5, 3], DType::I32, -1, 8)),
        case(0, &[5, 7], ids(&[9, 4], DType::I32, 0, 6)),
        case(0, &[5, 7], ids(&[9, 4], DType::U32, 0, 6)),
        case(2, &[2, 3, 1030], ids(&[2, 3, 20], DType::I32, 0, 1030)),
        case(1, &[4, 6], ids(&[0, 3], DType::I32, 0, 6)),
        case(1, &[3, 4], ids(&[3, 5], DType::I32, 0, 4)).gradcheck(),
    ]
}

pub(super) fn scatter_add() -> Vec<Sample> {
    let case = |axis: usize, out: &[usize], index: Input| {
        let shape = index.shape.clone();
        let along = shape[axis];
        Sample::new(
            Op::ScatterAdd { axis },
            format!(
                "axis {axis} index {shape:?} out {out:?} {}",
                index.kind_name()
            ),
            vec![index, input(&shape, uniform(-1.0, 1.0))],
        )
        .out_shape(out)
        .reduce(along.max(1))
    };
    vec![
        case(1, &[4, 10], ids(&[4, 6], DType::I32, -1, 11)),
        case(0, &[5, 3], ids(&[8, 3], DType::I32, 0, 5)),
        case(0, &[5, 3], ids(&[8, 3], DType::U32, 0, 6)),
        case(1, &[4, 5], ids(&[2, 3], DType::I32, 0, 5)),
        case(1, &[3, 7], ids(&[3, 300], DType::I32, 0, 7)),
        case(1, &[2, 3], ids(&[0, 3], DType::I32, 0, 3)),
    ]
}

/// Index copies in place (a KV cache written at positions) and into a fresh output, with
/// distinct indices; out-of-range ones are skipped.
pub(super) fn index_copy() -> Vec<Sample> {
    let case = |axis: usize, dst: &[usize], index: &[i64], dtype: DType| {
        let mut src = dst.to_vec();
        src[axis] = index.len();
        let positions = Gen::Values(index.iter().map(|&i| i as f64).collect());
        [false, true].map(|in_place| {
            let s = Sample::new(
                Op::IndexCopy { axis },
                format!("axis {axis} dst {dst:?} index {index:?} {dtype} in place {in_place}"),
                vec![
                    input(dst, uniform(-2.0, 2.0)),
                    fixed(&[index.len()], dtype, positions.clone()),
                    input(&src, uniform(-2.0, 2.0)),
                ],
            )
            .dtypes(&ANY_DTYPE);
            if in_place {
                s.in_place()
            } else {
                s
            }
        })
    };
    let all: Vec<i64> = (0..33).collect();
    [
        case(0, &[7, 5], &[4, 0, 6], DType::I32),
        case(3, &[2, 1, 3, 16, 8], &[9], DType::I32),
        case(3, &[2, 2, 2, 40, 16], &all, DType::U32),
        case(1, &[3, 10, 4], &[2, 11, -1, 7], DType::I32),
        case(2, &[2, 3, 5], &[4, 1], DType::U32),
        case(0, &[4, 3], &[], DType::I32),
    ]
    .into_iter()
    .flatten()
    .collect()
}
