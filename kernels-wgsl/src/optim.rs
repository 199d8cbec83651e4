//! Optimizer updates in place, and the global squared norm by per-chunk partial sums summed
//! by one workgroup (fixed order, no atomics).

use tessera_core::{DType, Layout, Op, Result, TensorRef};

use crate::gpu::{Gpu, Planner};
use crate::source::{groups_for, key, no_subst, run, unsupported};
use tessera_core::exec::split;

const SRC: &str = include_str!("../kernels/optim.wgsl");

/// Elements each workgroup of the squared norm sums.
const CHUNK: usize = 4096;

pub(crate) fn launch(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    let k = |variant: &str| key(op, inputs, outputs, variant);
    match op {
        Op::AdamUpdate {
            decoupled_weight_decay,
        } => {
            let n = inputs[0].layout.numel();
            let decay = if *decoupled_weight_decay {
                "w *= pf(7u);"
            } else {
                "g += pf(5u) * w;"
            };
            let (lr, b1, b2, eps, wd, bc1, bc2) = (s[0], s[1], s[2], s[3], s[4], s[5], s[6]);
            run(
                gpu,
                &k("adam"),
                SRC,
                "adam",
                || Ok(vec![("DECAY", decay.into())]),
                inputs,
                outputs,
                groups_for(n),
                |o, p| {
                    p.u(n)
                        .f(lr / bc1)
                        .f(b1)
                        .f(b2)
                        .f(eps)
                        .f(wd)
                        .f(bc2.sqrt())
                        .f(1.0 - lr * wd)
                        .all(o);
                },
            )
        }
        Op::SgdUpdate { momentum, nesterov } => {
            let n = inputs[0].layout.numel();
            let (scale, pout, mom) = if *momentum {
                let next = if *nesterov {
                    "d = d + pf(2u) * b;"
                } else {
                    "d = b;"
                };
                (
                    4,
                    5,
                    format!(
                        "let b = pf(2u) * ld3(o(3u) + i) + pf(3u) * d; st6(o(6u) + i, b); {next}"
                    ),
                )
            } else {
                (3, 4, String::new())
            };
            let subst = [
                ("SCALE", scale.to_string()),
                ("POUT", pout.to_string()),
                ("MOMENTUM", mom),
            ];
            run(
                gpu,
                &k("sgd"),
                SRC,
                "sgd",
                || Ok(subst.to_vec()),
                inputs,
                outputs,
                groups_for(n),
                |o, p| {
                    p.u(n)
                        .f(s[0])
                        .f(s[1])
                        .f(s[2])
                        .f(s[3])
                        .f(0.0)
                        .f(0.0)
                        .f(0.0)
                        .all(o);
                },
            )
        }
        Op::SquaredNorm => {
            let chunks: Vec<usize> = inputs
                .iter()
                .map(|t| t.layout.numel().div_ceil(CHUNK))
                .collect();
            let total: usize = chunks.iter().sum();
            let scratch = gpu.scratch(total * 4)?;
            let layout = Layout::contiguous(&[total]);
            let partial = TensorRef {
                buffer: &scratch,
                layout: &layout,
                dtype: DType::F32,
            };
            // Tensors past one binding are summed over ranges of whole chunks, which give the
            // same partial sums.
            let mut first = 0;
            for t in inputs {
                let n = t.layout.numel();
                let part = (split::flat_part(&Planner(gpu), std::slice::from_ref(t)) / CHUNK)
                    .max(1)
                    * CHUNK;
                let whole = t.layout.flat();
                for start in (0..n).step_by(part) {
                    let len = part.min(n - start);
                    let range = whole.narrow(0, start, len);
                    let ins = TensorRef::with_layouts(
                        std::slice::from_ref(t),
                        std::slice::from_ref(&range),
                    );
                    let outs = std::slice::from_ref(&partial);
                    let c = len.div_ceil(CHUNK);
                    run(
                        gpu,
                        &key(op, &ins, outs, "squares"),
                        SRC,
                        "squares",
                        no_subst,
                        &ins,
                        outs,
                        c as u64,
                        |o, p| {
                            p.u(len)
                                .u(CHUNK)
                                .u(first)
                                .f(0.0)
                                .f(0.0)
                                .f(0.0)
                                .f(0.0)
                                .f(0.0)
                                .all(o);
                        },
                    )?;
                    first += c;
                }
            }
            let ins = std::slice::from_ref(&partial);
            run(
                gpu,
                &key(op, ins, outputs, "sum_partials"),
                SRC,
                "sum_partials",
                no_subst,
                ins,
                outputs,
                1,
                |o, p| {
                    p.u(total)
                        .f(0.0)
                        .f(0.0)
                        .f(0.0)
                        .f(0.0)
                        .f(0.0)
                        .f(0.0)
                        .f(0.0)
                        .all(o);
                },
            )?;
            Ok(())
        }
        _ => Err(unsupported(gpu, op)),
    }
}
