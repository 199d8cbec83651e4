//! Optimizer updates in place, and the global squared norm by per-chunk partial sums summed
//! by one workgroup (fixed order, no atomics).

use tessera_core::ops::{per_param_operands, updated_params};
use tessera_core::{DType, Layout, Op, Result, TensorRef};

use crate::gpu::{Gpu, Planner};
use crate::params::{offsets, param_block, MAX_BINDINGS};
use crate::source::{groups_for, key, no_subst, run, unsupported};
use tessera_core::exec::split;

const SRC: &str = include_str!("../kernels/optim.wgsl");

param_block! {
    /// Adam's parameters; what changes from step to step is read from the step's values.
    AdamParams {
        elements: u32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
        offsets: [u32; MAX_BINDINGS],
    }
}

param_block! {
    /// SGD's parameters; `grad_coef` scales the gradient into the momentum buffer.
    SgdParams {
        elements: u32,
        lr: f32,
        momentum: f32,
        grad_coef: f32,
        weight_decay: f32,
        offsets: [u32; MAX_BINDINGS],
    }
}

param_block! {
    /// The squared norm's first pass: sums of squares of `chunk` elements each, written from
    /// partial `first`.
    SquaresParams {
        elements: u32,
        chunk: u32,
        first: u32,
        offsets: [u32; MAX_BINDINGS],
    }
}

param_block! {
    /// The sum of `count` partial sums.
    SumParams {
        count: u32,
        offsets: [u32; MAX_BINDINGS],
    }
}

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
        // A group's update, a launch per parameter (one launch binds at most eight buffers).
        Op::AdamUpdate { .. } if updated_params(op, inputs.len()) > 1 => {
            for (ins, outs) in per_param_operands(op, inputs, outputs) {
                launch(gpu, op, &ins, &outs, s)?;
            }
            Ok(())
        }
        Op::AdamUpdate {
            decoupled_weight_decay,
        } => {
            let n = inputs[0].layout.numel();
            let decay = if *decoupled_weight_decay {
                "w *= decay_factor;"
            } else {
                "g += params.weight_decay * w;"
            };
            let (b1, b2, eps, wd) = (s[0], s[1], s[2], s[3]);
            run(
                gpu,
                &k("adam"),
                SRC,
                "adam",
                || Ok(vec![("DECAY", decay.into())]),
                inputs,
                outputs,
                groups_for(n),
                |o| AdamParams {
                    elements: n as u32,
                    beta1: b1 as f32,
                    beta2: b2 as f32,
                    eps: eps as f32,
                    weight_decay: wd as f32,
                    offsets: offsets(o),
                },
            )
        }
        Op::SgdUpdate { momentum, nesterov } => {
            let n = inputs[0].layout.numel();
            let (scale, pout, mom) = if *momentum {
                let next = if *nesterov {
                    "d = d + params.momentum * b;"
                } else {
                    "d = b;"
                };
                (
                    4,
                    5,
                    format!(
                        "let b = params.momentum * ld3(o(3u) + i) + params.grad_coef * d; st6(o(6u) + i, b); {next}"
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
                |o| SgdParams {
                    elements: n as u32,
                    lr: s[0] as f32,
                    momentum: s[1] as f32,
                    grad_coef: s[2] as f32,
                    weight_decay: s[3] as f32,
                    offsets: offsets(o),
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
                        |o| SquaresParams {
                            elements: len as u32,
                            chunk: CHUNK as u32,
                            first: first as u32,
                            offsets: offsets(o),
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
                |o| SumParams {
                    count: total as u32,
                    offsets: offsets(o),
                },
            )?;
            Ok(())
        }
        _ => Err(unsupported(gpu, op)),
    }
}
