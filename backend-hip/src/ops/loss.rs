//! Fused cross-entropy forward and backward over any vocabulary (`kernels/loss.hip`): a
//! block per row for the max-subtracted log-sum-exp, a thread per element for the gradient.

use tessera_core::{DType, Op, Result, TensorRef};

use super::{cxx_type, unsupported};
use crate::driver::Grid;
use crate::gpu::{rows_grid, Gpu, Source};
use crate::params::hip_params;

const SRC: &str = include_str!("../../kernels/loss.hip");

/// Threads of the gradient kernel.
const THREADS: u32 = 256;

hip_params! {
    /// Cross-entropy's parameters: the operands (absent ones 0), `rows` rows of `vocab`
    /// logits, `elements` of them in all.
    LossParams {
        logits: u64,
        targets: u64,
        loss: u64,
        lse: u64,
        dloss: u64,
        dlogits: u64,
        rows: u64,
        vocab: u64,
        elements: u64,
    }
}

/// Whether this family's kernels run `op` on inputs of `dtypes`: both ops on f32, f16 and
/// bf16 logits with i32 or u32 targets.
pub(crate) fn supports(_op: &Op, _dtypes: &[DType]) -> bool {
    true
}

/// Kernel `entry` for logits of `logits` and targets of `targets`.
fn loss_source(entry: &'static str, logits: DType, targets: DType) -> Source {
    Source::new::<LossParams>(SRC, entry)
        .define("T", cxx_type(logits))
        .define("I", cxx_type(targets))
}

/// The kernels `launch` compiles for `op` on inputs of `dtypes`.
#[cfg(test)]
pub(crate) fn samples(op: &Op, dtypes: &[DType]) -> Vec<Source> {
    let entry = match op {
        Op::CrossEntropy => "cross_entropy",
        _ => "cross_entropy_backward",
    };
    vec![loss_source(entry, dtypes[0], dtypes[1])]
}

pub(crate) fn launch(
    gpu: &Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    _scalars: &[f64],
) -> Result<()> {
    let (logits, targets) = (&inputs[0], &inputs[1]);
    let (rows, vocab) = (logits.layout.shape[0], logits.layout.shape[1]);
    if rows == 0 {
        return Ok(());
    }
    let mut params = LossParams {
        logits: gpu.ptr(logits)?,
        targets: gpu.ptr(targets)?,
        rows: rows as u64,
        vocab: vocab as u64,
        elements: (rows * vocab) as u64,
        ..LossParams::default()
    };
    let (t, i) = (logits.dtype, targets.dtype);
    match op {
        Op::CrossEntropy => {
            params.loss = gpu.ptr(&outputs[0])?;
            params.lse = gpu.ptr(&outputs[1])?;
            let threads = vocab.div_ceil(4).next_power_of_two().clamp(64, 256) as u32;
            let source = || Ok(loss_source("cross_entropy", t, i));
            let key = format!("cross_entropy:{t}:{i}");
            gpu.run(&key, source, rows_grid(rows, threads, 0), &params)
        }
        Op::CrossEntropyBackward => {
            params.lse = gpu.ptr(&inputs[2])?;
            params.dloss = gpu.ptr(&inputs[3])?;
            params.dlogits = gpu.ptr(&outputs[0])?;
            let source = || Ok(loss_source("cross_entropy_backward", t, i));
            let key = format!("cross_entropy_backward:{t}:{i}");
            // Rows along y, chunks of 8 x THREADS elements along x (the kernel's unrolling).
            let grid = Grid {
                blocks: [
                    vocab.div_ceil(8 * THREADS as usize).clamp(1, 65_535) as u32,
                    rows.clamp(1, 65_535) as u32,
                    1,
                ],
                threads: THREADS,
                shared_bytes: 0,
            };
            gpu.run(&key, source, grid, &params)
        }
        _ => Err(unsupported(gpu, op)),
    }
}
