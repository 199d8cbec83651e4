//! Rotary embedding and attention over parts of whole heads.

use crate::{Op, Result, TensorRef};

use super::part::{on_halves, too_large, PartLauncher};

/// Rotary embedding (`x [..., T, D]`, tables `[T, D/2]`, row-major) in halves of `x`'s
/// outermost dimension longer than one, recursively, until each part fits; where that is
/// the sequence, the tables' rows split with it.
pub(super) fn rotary_windows(
    dev: &dyn PartLauncher,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    if dev.fits(inputs) && dev.fits(outputs) {
        return dev.launch_whole(op, inputs, outputs, s);
    }
    let x = inputs[0].layout;
    let r = x.rank();
    let Some(dim) = (0..r - 1).find(|&d| x.shape[d] > 1) else {
        return Err(too_large(dev, op, inputs, outputs));
    };
    let size = x.shape[dim];
    on_halves(
        dev,
        op,
        inputs,
        outputs,
        s,
        size,
        rotary_windows,
        |start, len| {
            let li = inputs
                .iter()
                .enumerate()
                .map(|(k, t)| match (k, dim == r - 2) {
                    (0, _) => t.layout.narrow(dim, start, len),
                    (_, true) => t.layout.narrow(0, start, len),
                    (_, false) => t.layout.clone(),
                })
                .collect();
            (li, vec![outputs[0].layout.narrow(dim, start, len)])
        },
    )
}

/// Attention or its backward in halves of the batch, then of the key/value heads (each with
/// its query heads), recursively, until each part fits: every part is whole heads, computed
/// as in one launch. A single head wider than a binding is `Unsupported`.
pub(super) fn attention_windows(
    dev: &dyn PartLauncher,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    if dev.fits(inputs) && dev.fits(outputs) {
        return dev.launch_whole(op, inputs, outputs, s);
    }
    let (q, kv) = (&inputs[0].layout.shape, &inputs[1].layout.shape);
    let group = q[1] / kv[1].max(1);
    let (dim, size, per_query) = match (q[0], kv[1]) {
        (b, _) if b > 1 => (0, b, 1),
        (_, h) if h > 1 => (1, h, group),
        _ => return Err(too_large(dev, op, inputs, outputs)),
    };
    // Keys and values (and their gradients) are the tensors with the key/value heads.
    let backward = matches!(op, Op::AttentionBackward { .. });
    let of_keys = |output: bool, k: usize| matches!(k, 1 | 2) && (backward || !output);
    // A cached attention's positions belong to every part.
    let positions = |output: bool, k: usize| !output && k == 3 && *op == Op::CachedAttention;
    let narrow = |list: &[TensorRef<'_>], output: bool, start: usize, len: usize| {
        list.iter()
            .enumerate()
            .map(|(k, t)| match (positions(output, k), of_keys(output, k)) {
                (true, _) => t.layout.clone(),
                (false, true) => t.layout.narrow(dim, start, len),
                (false, false) => t.layout.narrow(dim, start * per_query, len * per_query),
            })
            .collect()
    };
    on_halves(
        dev,
        op,
        inputs,
        outputs,
        s,
        size,
        attention_windows,
        |start, len| {
            (
                narrow(inputs, false, start, len),
                narrow(outputs, true, start, len),
            )
        },
    )
}
