//! Fused cross-entropy, forward (a workgroup per row) and backward (a thread per logit).

use tessera_core::{Op, Result, TensorRef};

use crate::gpu::Gpu;
use crate::params::{offsets, param_block, MAX_BINDINGS};
use crate::source::{groups_for, key, no_subst, run, unsupported};

const SRC: &str = include_str!("../kernels/loss.wgsl");

param_block! {
    /// Cross-entropy's parameters: `rows` rows of `vocab` logits.
    LossParams {
        rows: u32,
        vocab: u32,
        offsets: [u32; MAX_BINDINGS],
    }
}

pub(crate) fn launch(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    let (rows, vocab) = (inputs[0].layout.shape[0], inputs[0].layout.shape[1]);
    let (section, groups) = match op {
        Op::CrossEntropy => ("cross_entropy", rows as u64),
        // A thread per pair of elements, and one for the elements left alone.
        Op::CrossEntropyBackward => ("cross_entropy_backward", groups_for(rows * vocab / 2 + 1)),
        _ => return Err(unsupported(gpu, op)),
    };
    run(
        gpu,
        &key(op, inputs, outputs, section),
        SRC,
        section,
        no_subst,
        inputs,
        outputs,
        groups,
        |o| LossParams {
            rows: rows as u32,
            vocab: vocab as u32,
            offsets: offsets(o),
        },
    )
}
