//! Reductions over any axes (a workgroup per output with a tree reduction, or a thread per
//! output when the reduced extent is short), argmax, and softmax over rows.

use tessera_core::{Op, ReduceOp, Result, TensorRef};

use crate::gpu::Gpu;
use crate::source::{groups_for, key, no_subst, run, unsupported};

const SRC: &str = include_str!("../kernels/reduce.wgsl");

/// Reduced extents shorter than this use one thread per output.
const THREAD_REDUCE_MAX: usize = 64;

/// Kept and reduced dims of `x` as (shape, strides) pairs.
fn split_axes(
    t: &TensorRef<'_>,
    axes: &[usize],
) -> (Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>) {
    let (mut ks, mut kt, mut rs, mut rt) = (vec![], vec![], vec![], vec![]);
    for (d, (&s, &st)) in t.layout.shape.iter().zip(&t.layout.strides).enumerate() {
        if axes.contains(&d) {
            rs.push(s);
            rt.push(st);
        } else {
            ks.push(s);
            kt.push(st);
        }
    }
    (ks, kt, rs, rt)
}

pub(crate) fn launch(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    let x = &inputs[0];
    let k = |variant: &str| key(op, inputs, outputs, variant);
    match op {
        Op::Reduce { op: kind, axes, .. } => {
            let (ks, kt, rs, rt) = split_axes(x, axes);
            let nout: usize = ks.iter().product();
            let nred: usize = rs.iter().product();
            let (init, combine) = match kind {
                ReduceOp::Sum | ReduceOp::Mean => ("0.0", "a + b"),
                ReduceOp::Max => ("-inf()", "max_nan(a, b)"),
                ReduceOp::Min => ("inf()", "min_nan(a, b)"),
            };
            let finish = match kind {
                ReduceOp::Mean => "select(v / f32(nred), nan(), nred == 0u)",
                _ => "v",
            };
            let subst = [
                ("INIT", init.to_string()),
                ("COMBINE", combine.to_string()),
                ("FINISH", finish.to_string()),
            ];
            let (section, groups) = if nred < THREAD_REDUCE_MAX {
                ("reduce_thread", groups_for(nout))
            } else {
                ("reduce_group", nout as u64)
            };
            run(
                gpu,
                &k(section),
                SRC,
                section,
                || Ok(subst.to_vec()),
                inputs,
                outputs,
                groups,
                |o, p| {
                    p.u(nout).u(nred).u(ks.len()).u(rs.len()).u(o[0]).u(o[1]);
                    p.all(&ks).all(&kt).all(&rs).all(&rt);
                },
            )
        }
        Op::ArgMax { axis, .. } => argmax(gpu, *axis, x, &outputs[0], 0),
        Op::Softmax | Op::LogSoftmax => {
            let n = *x.layout.shape.last().unwrap_or(&1);
            let rows = x.layout.numel() / n.max(1);
            let out = if matches!(op, Op::Softmax) {
                "exp(x - m) / s"
            } else {
                "x - m - ls"
            };
            let groups = if n == 0 { 0 } else { rows as u64 };
            run(
                gpu,
                &k("softmax"),
                SRC,
                "softmax",
                || Ok(vec![("SOFTMAX_OUT", out.into())]),
                inputs,
                outputs,
                groups,
                |o, p| {
                    p.u(rows).u(n).u(o[0]).u(0).u(o[1]);
                },
            )
        }
        Op::SoftmaxBackward | Op::LogSoftmaxBackward => {
            let n = *x.layout.shape.last().unwrap_or(&1);
            let rows = x.layout.numel() / n.max(1);
            let (dot, grad) = if matches!(op, Op::SoftmaxBackward) {
                ("dy * y", "y * (dy - s)")
            } else {
                ("dy", "dy - exp(y) * s")
            };
            let subst = [("DOT_TERM", dot.to_string()), ("GRAD", grad.to_string())];
            let groups = if n == 0 { 0 } else { rows as u64 };
            run(
                gpu,
                &k("softmax_backward"),
                SRC,
                "softmax_backward",
                || Ok(subst.to_vec()),
                inputs,
                outputs,
                groups,
                |o, p| {
                    p.u(rows).u(n).u(o[0]).u(o[1]).u(o[2]);
                },
            )
        }
        _ => Err(unsupported(gpu, op)),
    }
}

/// Argmax along `axis` of `x`, whose first element along it has index `first` in the op's
/// whole input (0 but for parts of a reduced extent that runs over windows).
pub(crate) fn argmax(
    gpu: &dyn Gpu,
    axis: usize,
    x: &TensorRef<'_>,
    out: &TensorRef<'_>,
    first: usize,
) -> Result<()> {
    let (ks, kt, rs, rt) = split_axes(x, &[axis]);
    let nout: usize = ks.iter().product();
    let nred: usize = rs.iter().product();
    let (ins, outs) = ([*x], [*out]);
    let op = Op::ArgMax {
        axis,
        keepdim: false,
    };
    run(
        gpu,
        &key(&op, &ins, &outs, "argmax"),
        SRC,
        "argmax",
        no_subst,
        &ins,
        &outs,
        nout as u64,
        |o, p| {
            p.u(nout).u(nred).u(ks.len()).u(rs.len()).u(o[0]).u(o[1]);
            p.all(&ks).all(&kt).all(&rs).all(&rt).u(first);
        },
    )
}
