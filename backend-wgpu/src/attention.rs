//! Rotary embeddings and flash-style attention: forward with an online softmax per query
//! row, backward as `delta = rowsum(dout * out)`, then `dq` per query row and `dk`/`dv` per
//! key row (summing grouped query heads in order), so nothing races and nothing is T x T.

use tessera_core::{DType, Layout, Op, Result, TensorRef};

use crate::device::Core;
use crate::shader::{groups_for, key, run, unsupported};

const SRC: &str = include_str!("kernels/attention.wgsl");

pub(crate) fn launch(
    core: &Core,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    let k =
        |ins: &[TensorRef<'_>], outs: &[TensorRef<'_>], variant: &str| key(op, ins, outs, variant);
    match op {
        Op::Rotary => {
            let x = &inputs[0].layout.shape;
            let r = x.len();
            let n = inputs[0].layout.numel();
            run(
                core,
                &k(inputs, outputs, "rotary"),
                SRC,
                "rotary",
                &[],
                inputs,
                outputs,
                groups_for(n),
                |o, p| {
                    p.u(n).u(x[r - 2]).u(x[r - 1]).all(o);
                },
            )
        }
        Op::Attention { causal } | Op::AttentionBackward { causal } => {
            let (q, kk, v) = (
                &inputs[0].layout.shape,
                &inputs[1].layout.shape,
                &inputs[2].layout.shape,
            );
            let dims = [
                q[0],
                q[1],
                kk[1],
                q[2],
                kk[2],
                q[3],
                v[3],
                usize::from(*causal),
            ];
            let rows = q[0] * q[1] * q[2];
            let params = |o: &[usize], p: &mut crate::shader::Params| {
                p.all(&dims).f(s[0]).all(o);
            };
            if matches!(op, Op::Attention { .. }) {
                return run(
                    core,
                    &k(inputs, outputs, "forward"),
                    SRC,
                    "forward",
                    &[],
                    inputs,
                    outputs,
                    rows as u64,
                    params,
                );
            }
            let scratch = core.scratch(rows * 4)?;
            let layout = Layout::contiguous(&[rows]);
            let delta = TensorRef {
                buffer: &scratch,
                layout: &layout,
                dtype: DType::F32,
            };
            let mut outs = outputs.to_vec();
            outs.push(delta);
            let krows = kk[0] * kk[1] * kk[2];
            run(
                core,
                &k(inputs, &outs, "delta"),
                SRC,
                "delta",
                &[],
                inputs,
                &outs,
                groups_for(rows),
                params,
            )?;
            run(
                core,
                &k(inputs, &outs, "dq"),
                SRC,
                "dq",
                &[],
                inputs,
                &outs,
                rows as u64,
                params,
            )?;
            run(
                core,
                &k(inputs, &outs, "dkv"),
                SRC,
                "dkv",
                &[],
                inputs,
                &outs,
                krows as u64,
                params,
            )
        }
        _ => Err(unsupported(op)),
    }
}
