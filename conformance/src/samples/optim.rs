//! Optimizer update and squared-norm samples. Updates run both into separate outputs and in
//! place (outputs are the input buffers), as training runs them.

use tessera::ops::adam_factors;
use tessera::{DType, Op};

use super::{fixed, input, stats, uniform, Gen, Input, Sample, View};

const SHAPES: [&[usize]; 5] = [&[17], &[33, 9], &[0], &[1030], &[70_000]];

fn grad_scale() -> Input {
    fixed(&[1], DType::F32, Gen::Values(vec![0.5]))
}

pub(super) fn adam(decoupled_weight_decay: bool) -> Vec<Sample> {
    let op = Op::AdamUpdate {
        decoupled_weight_decay,
    };
    let (lr, beta1, beta2, eps, weight_decay, step) = (1e-2, 0.9f64, 0.999f64, 1e-8, 0.1, 3);
    let scalars = [beta1, beta2, eps, weight_decay];
    let [step_size, decay, bc2_sqrt] = adam_factors(
        lr,
        weight_decay,
        1.0 - beta1.powi(step),
        1.0 - beta2.powi(step),
    );
    let step_values = || stats(&[4], Gen::Values(vec![0.5, step_size, decay, bc2_sqrt]));
    let mut out = Vec::new();
    for shape in SHAPES {
        for in_place in [false, true] {
            let inputs = vec![
                input(shape, uniform(-1.0, 1.0)).view(if in_place {
                    View::Offset(5)
                } else {
                    View::Contiguous
                }),
                input(shape, uniform(-1.0, 1.0)),
                input(shape, uniform(-0.1, 0.1)),
                input(shape, uniform(1e-4, 1e-2)),
                step_values(),
            ];
            let s = Sample::new(op.clone(), format!("{shape:?} in place {in_place}"), inputs)
                .scalars(&scalars);
            out.push(if in_place { s.in_place() } else { s });
        }
    }
    // A group's parameters in one launch: inputs by role (params, grads, m, v), then the
    // step's values.
    let group: [&[usize]; 4] = [&[17], &[0], &[33, 9], &[70_000]];
    for in_place in [false, true] {
        let role = |gen: fn() -> Gen| group.iter().map(move |shape| input(shape, gen()));
        let inputs: Vec<Input> = role(|| uniform(-1.0, 1.0))
            .map(|i| {
                i.view(if in_place {
                    View::Offset(5)
                } else {
                    View::Contiguous
                })
            })
            .chain(role(|| uniform(-1.0, 1.0)))
            .chain(role(|| uniform(-0.1, 0.1)))
            .chain(role(|| uniform(1e-4, 1e-2)))
            .chain([step_values()])
            .collect();
        let s = Sample::new(
            op.clone(),
            format!("a group of {:?} in place {in_place}", group),
            inputs,
        )
        .scalars(&scalars);
        out.push(if in_place { s.in_place() } else { s });
    }
    out
}

pub(super) fn sgd() -> Vec<Sample> {
    let variants = [
        (false, false, 1.0),
        (true, false, 1.0),
        (true, false, 0.9),
        (true, true, 1.0),
        (true, true, 0.9),
    ];
    let mut out = Vec::new();
    for (momentum, nesterov, grad_coef) in variants {
        let op = Op::SgdUpdate { momentum, nesterov };
        for shape in SHAPES {
            for in_place in [false, true] {
                let mut inputs = vec![
                    input(shape, uniform(-1.0, 1.0)),
                    input(shape, uniform(-1.0, 1.0)),
                ];
                if momentum {
                    inputs.push(input(shape, uniform(-0.5, 0.5)).view(if in_place {
                        View::Offset(3)
                    } else {
                        View::Contiguous
                    }));
                }
                inputs.push(grad_scale());
                let desc = format!("momentum {momentum} nesterov {nesterov} grad_coef {grad_coef} {shape:?} in place {in_place}");
                let s = Sample::new(op.clone(), desc, inputs).scalars(&[0.1, 0.9, grad_coef, 0.01]);
                out.push(if in_place { s.in_place() } else { s });
            }
        }
    }
    out
}

pub(super) fn squared_norm() -> Vec<Sample> {
    let case = |shapes: &[&[usize]]| {
        let total: usize = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
        let inputs = shapes
            .iter()
            .map(|s| input(s, uniform(-1.0, 1.0)))
            .collect();
        Sample::new(Op::SquaredNorm, format!("{shapes:?}"), inputs).reduce(total)
    };
    vec![
        case(&[&[1030]]),
        case(&[&[3, 5], &[17], &[0], &[2, 2, 2]]),
        case(&[&[70_000, 4]]),
        case(&[&[0]]),
        case(&[&[]]),
    ]
}
