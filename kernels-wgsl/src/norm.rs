//! Layer norm and RMS norm, forward and backward: a workgroup per row for the row statistics
//! and `dx` (rows of up to 1,024 held in registers in the forward), then a workgroup per
//! column for the weight gradients (no atomics).

use tessera_core::{Op, Result, TensorRef};

use crate::gpu::{Gpu, WG};
use crate::params::{offsets, param_block, MAX_BINDINGS};
use crate::source::{key, no_subst, run, unsupported};

const SRC: &str = include_str!("../kernels/norm.wgsl");

param_block! {
    /// The norms' parameters: `rows` rows of `row_len`.
    NormParams {
        rows: u32,
        row_len: u32,
        eps: f32,
        offsets: [u32; MAX_BINDINGS],
    }
}

pub(crate) fn launch(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    let x = &inputs[0];
    let n = *x.layout.shape.last().unwrap_or(&1);
    let rows = x.layout.numel() / n.max(1);
    let eps = s.first().copied().unwrap_or(0.0);
    let params = |o: &[usize]| NormParams {
        rows: rows as u32,
        row_len: n as u32,
        eps: eps as f32,
        offsets: offsets(o),
    };
    let k = |variant: &str| key(op, inputs, outputs, variant);
    let go = |section: &str, groups: usize| {
        run(
            gpu,
            &k(section),
            SRC,
            section,
            no_subst,
            inputs,
            outputs,
            groups as u64,
            params,
        )
    };
    // Rows a workgroup holds in registers, four elements a thread, are read once.
    let short = n <= 4 * WG as usize;
    match op {
        Op::LayerNorm if short => go("layer_norm_short", rows),
        Op::RmsNorm if short => go("rms_norm_short", rows),
        Op::LayerNorm => go("layer_norm", rows),
        Op::RmsNorm => go("rms_norm", rows),
        Op::LayerNormBackward => {
            go("layer_norm_dx", rows)?;
            go("layer_norm_dw", n)
        }
        Op::RmsNormBackward => {
            go("rms_norm_dx", rows)?;
            go("rms_norm_dw", n)
        }
        _ => Err(unsupported(gpu, op)),
    }
}
