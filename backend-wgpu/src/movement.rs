//! Movement: concat (a strided copy per input into its slice of the output), embedding and
//! gather (a thread per output element), and deterministic embedding backward and
//! scatter-add (each output element sums its sources in order; no atomics). Embedding
//! backward first links each position to the next one with the same id, so the sums cost
//! O(P * D) after an O(P^2) pass over the ids alone.

use tessera_core::{contiguous_strides, DType, Layout, Op, Result, TensorRef};

use crate::device::Core;
use crate::shader::{groups_for, key, run, unsupported};
use crate::{elementwise, random};

const SRC: &str = include_str!("kernels/movement.wgsl");

pub(crate) fn launch(
    core: &Core,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    let out = &outputs[0];
    let n = out.layout.numel();
    let k = |variant: &str| key(op, inputs, outputs, variant);
    match op {
        Op::Concat { axis } => {
            let mut start = 0;
            for t in inputs {
                let len = t.layout.shape[*axis];
                let layout = out.layout.narrow(*axis, start, len);
                let slice = TensorRef {
                    buffer: out.buffer,
                    layout: &layout,
                    dtype: out.dtype,
                };
                elementwise::launch(
                    core,
                    &Op::Copy,
                    std::slice::from_ref(t),
                    std::slice::from_ref(&slice),
                    &[],
                )?;
                start += len;
            }
            Ok(())
        }
        Op::Embedding => {
            let (v, d) = (inputs[0].layout.shape[0], inputs[0].layout.shape[1]);
            run(
                core,
                &k("embedding"),
                SRC,
                "embedding",
                &[],
                inputs,
                outputs,
                groups_for(n),
                |o, p| {
                    p.u(n).u(d.max(1)).u(v).u(0).all(o);
                },
            )
        }
        Op::EmbeddingBackward => {
            let (v, d) = (out.layout.shape[0], out.layout.shape[1]);
            random::launch(core, &Op::Fill { dtype: out.dtype }, outputs, &[0.0])?;
            let ids = &inputs[0];
            let positions = ids.layout.numel();
            let scratch = core.scratch(positions * 8)?;
            let layout = Layout::contiguous(&[2 * positions]);
            let links = TensorRef {
                buffer: &scratch,
                layout: &layout,
                dtype: DType::U32,
            };
            let links = std::slice::from_ref(&links);
            run(
                core,
                &key(op, std::slice::from_ref(ids), links, "embedding_links"),
                SRC,
                "embedding_links",
                &[],
                std::slice::from_ref(ids),
                links,
                groups_for(positions),
                |o, p| {
                    p.u(positions).u(0).u(0).u(0).all(o);
                },
            )?;
            let with_links: Vec<TensorRef<'_>> = outputs.iter().chain(links).cloned().collect();
            let m = inputs[1].layout.numel();
            run(
                core,
                &key(op, inputs, &with_links, "embedding_backward"),
                SRC,
                "embedding_backward",
                &[],
                inputs,
                &with_links,
                groups_for(m),
                |o, p| {
                    p.u(m).u(d.max(1)).u(v).u(0).all(o);
                },
            )
        }
        Op::Gather { axis } => {
            let (x, idx) = (&inputs[0], &inputs[1]);
            run(
                core,
                &k("gather"),
                SRC,
                "gather",
                &[],
                inputs,
                outputs,
                groups_for(n),
                |o, p| {
                    p.u(n)
                        .u(idx.layout.rank())
                        .u(*axis)
                        .u(x.layout.shape[*axis])
                        .all(o);
                    p.all(&idx.layout.shape)
                        .all(&contiguous_strides(&x.layout.shape));
                },
            )
        }
        Op::ScatterAdd { axis } => {
            let idx = &inputs[0];
            run(
                core,
                &k("scatter_add"),
                SRC,
                "scatter_add",
                &[],
                inputs,
                outputs,
                groups_for(n),
                |o, p| {
                    p.u(n).u(idx.layout.rank()).u(*axis).u(0).all(o);
                    p.all(&out.layout.shape)
                        .all(&idx.layout.shape)
                        .all(&contiguous_strides(&idx.layout.shape));
                },
            )
        }
        _ => Err(unsupported(op)),
    }
}
