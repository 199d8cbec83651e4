//! Creation and random ops: the output dtype is the tested dtype.

use tessera::rng::split_u64;
use tessera::{DType, Op};

use super::Sample;

pub(super) fn samples(op: &Op) -> Vec<Sample> {
    let shapes: [&[usize]; 6] = [&[], &[0], &[17], &[4, 6], &[33, 257], &[70_001]];
    match op {
        Op::Fill { .. } => shapes
            .iter()
            .map(|s| {
                Sample::new(op.clone(), format!("{s:?}"), vec![])
                    .scalars(&[-2.75])
                    .out_shape(s)
                    .retype()
                    .dtypes(&[
                        DType::F32,
                        DType::F16,
                        DType::BF16,
                        DType::F64,
                        DType::I32,
                        DType::U32,
                        DType::Bool,
                    ])
            })
            .collect(),
        Op::Arange { .. } => [0usize, 1, 17, 257, 70_001]
            .iter()
            .map(|&n| {
                let step = if n > 1000 { 1.0 / 1024.0 } else { 0.25 };
                Sample::new(op.clone(), format!("[{n}]"), vec![])
                    .scalars(&[-3.5, step])
                    .out_shape(&[n])
                    .retype()
                    .dtypes(&[DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32])
            })
            .collect(),
        Op::RandUniform { .. } | Op::RandNormal { .. } => {
            let keys = [
                (0u64, 0u64),
                (0x1234_5678_9abc_def0, 7),
                (42, 0x0000_0003_0000_0001),
            ];
            let params = if matches!(op, Op::RandUniform { .. }) {
                [-2.0, 3.0]
            } else {
                [0.5, 2.0]
            };
            shapes
                .iter()
                .zip(keys.iter().cycle())
                .map(|(s, &(key, counter))| {
                    let [k0, k1] = split_u64(key);
                    let [c0, c1] = split_u64(counter);
                    Sample::new(
                        op.clone(),
                        format!("{s:?} key {key:#x} counter {counter:#x}"),
                        vec![],
                    )
                    .scalars(&[k0, k1, c0, c1, params[0], params[1]])
                    .out_shape(s)
                    .retype()
                })
                .collect()
        }
        _ => unreachable!("not a creation op: {op:?}"),
    }
}
