//! Layer norm and RMS norm, forward and backward: a workgroup per row for the row statistics
//! and `dx` (rows of up to 1,024 held in registers in the forward), then the weight gradients
//! over the rows (no atomics): in chunks of rows over 64 columns at a time, added up by a
//! second kernel, where there are many rows; a workgroup per column otherwise.

use tessera_core::{DType, Layout, Op, Result, TensorRef};

use crate::gpu::{Gpu, WG};
use crate::params::{offsets, param_block, MAX_BINDINGS};
use crate::reduce::{COLUMN_CHUNK, MAX_COLUMN_CHUNKS};
use crate::source::{groups_for, key, no_subst, run, unsupported};

const SRC: &str = include_str!("../kernels/norm.wgsl");

param_block! {
    /// The norms' parameters: `rows` rows of `row_len`.
    NormParams {
        rows: u32,
        row_len: u32,
        eps: f32,
        chunks: u32,
        chunk_len: u32,
        offsets: [u32; MAX_BINDINGS],
    }
}

/// Rows from which a norm goes a subgroup per row (where the device has subgroups): fewer
/// leave most of a large GPU idle either way (decoding's one row keeps the workgroup).
const MANY_ROWS: usize = 256;
/// Rows a workgroup of the subgroup kernels takes with 32-lane subgroups (the grid's size;
/// other widths loop over the rows).
const ROWS_PER_GROUP: usize = WG as usize / 32;

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
        ..NormParams::default()
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
    // Rows a workgroup holds in registers, four elements a thread, are read once. Many
    // such rows go a subgroup each where the device has subgroups: a workgroup per row
    // spends its time waiting on its barriers.
    let short = n <= 4 * WG as usize;
    let by_subgroups = short && gpu.caps().subgroups && rows >= MANY_ROWS;
    // The kernels over rows that go a workgroup or a subgroup per row.
    let by_rows = |section: &str| {
        let (variant, groups) = match by_subgroups {
            true => (
                format!("{section}/subgroup_rows"),
                rows.div_ceil(ROWS_PER_GROUP),
            ),
            false => (section.to_string(), rows),
        };
        run(
            gpu,
            &k(&variant),
            SRC,
            section,
            || Ok(rows_code(by_subgroups)),
            inputs,
            outputs,
            groups as u64,
            params,
        )
    };
    match op {
        Op::LayerNorm if short && !by_subgroups => go("layer_norm_short", rows),
        Op::RmsNorm if short && !by_subgroups => go("rms_norm_short", rows),
        Op::LayerNorm => by_rows("layer_norm"),
        Op::RmsNorm => by_rows("rms_norm"),
        Op::LayerNormBackward => {
            by_rows("layer_norm_dx")?;
            match dw_chunks(gpu, rows, n) {
                Some(chunks) => dw_in_chunks(gpu, op, inputs, outputs, rows, n, chunks),
                None => go("layer_norm_dw", n),
            }
        }
        Op::RmsNormBackward => {
            by_rows("rms_norm_dx")?;
            match dw_chunks(gpu, rows, n) {
                Some(chunks) => dw_in_chunks(gpu, op, inputs, outputs, rows, n, chunks),
                None => go("rms_norm_dw", n),
            }
        }
        _ => Err(unsupported(gpu, op)),
    }
}

/// How the kernels over rows (`norm.wgsl`'s head) take them: a subgroup per row (its sums by
/// `subgroupAdd`) or a workgroup per row.
fn rows_code(by_subgroups: bool) -> Vec<(&'static str, String)> {
    let (begin, sum) = match by_subgroups {
        true => (
            "let lanes = WG / sg_count;
    let lane = sg_lane;
    for (var first = group_index(wid, nwg) * sg_count; first < rows; first += group_count(nwg) * sg_count) {
        let row = min(first + sg_index, rows - 1u);
        let live = first + sg_index < rows;",
            "subgroupAdd(v)",
        ),
        false => (
            "let lanes = WG;
    let lane = lid;
    for (var row = group_index(wid, nwg); row < rows; row += group_count(nwg)) {
        let live = true;",
            "wg_sum(v, lid)",
        ),
    };
    vec![("ROWS_BEGIN", begin.into()), ("ROW_SUM", sum.into())]
}

/// The chunks of rows `norm_dw_chunks` splits a norm's weight gradients into, where it
/// applies: two chunks or more, at least 64 columns, and the sums fitting a binding.
fn dw_chunks(gpu: &dyn Gpu, rows: usize, n: usize) -> Option<usize> {
    let chunks = rows.div_ceil(COLUMN_CHUNK).min(MAX_COLUMN_CHUNKS);
    (chunks >= 2 && n >= 64 && (8 * chunks * n) as u64 <= gpu.max_binding()).then_some(chunks)
}

/// A norm's weight (and bias) gradients over `rows` rows of `n` in two steps, through f32
/// sums over `chunks` chunks of rows in a scratch buffer: `norm_dw_chunks` binds what the
/// terms read and the sums, `norm_dw_finish` the sums and the op's outputs.
fn dw_in_chunks(
    gpu: &dyn Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    rows: usize,
    n: usize,
    chunks: usize,
) -> Result<()> {
    let sums = gpu.scratch(8 * chunks * n)?;
    let layout = Layout::contiguous(&[2 * chunks * n]);
    let sums = TensorRef {
        buffer: &sums,
        layout: &layout,
        dtype: DType::F32,
    };
    // Layer norm's inputs are x, weight, mean, rstd and dy, its outputs dx, dweight and
    // dbias; RMS norm's x, weight, rstd and dy, then dx and dweight. The terms read x, the
    // row statistics and dy: bindings 1 to 4 (3), the sums after them.
    let layer = matches!(op, Op::LayerNormBackward);
    let (read, terms) = if layer {
        (
            vec![inputs[0], inputs[2], inputs[3], inputs[4]],
            "let dy = ld4(o(4u) + r * n + cc);\n\
             sw += dy * (ld1(o(1u) + r * n + cc) - ld2(o(2u) + r)) * ld3(o(3u) + r);\n\
             sb += dy;\n",
        )
    } else {
        (
            vec![inputs[0], inputs[2], inputs[3]],
            "sw += ld3(o(3u) + r * n + cc) * ld1(o(1u) + r * n + cc) * ld2(o(2u) + r);\n",
        )
    };
    let s = read.len() + 1;
    let mut stash = format!("st{s}(o({s}u) + chunk * n + c, w);\n");
    let mut sum = "w += ld1(o(1u) + k * n + c);\n".to_string();
    // The finishing kernel binds the sums, then the op's outputs (dx unused): the norms'
    // shared functions read bindings 1 to 3.
    let mut finish = "st3(o(3u) + c, w);\n".to_string();
    if layer {
        stash += &format!("st{s}(o({s}u) + (chunks + chunk) * n + c, b);\n");
        sum += "b += ld1(o(1u) + (chunks + k) * n + c);\n";
        finish += "st4(o(4u) + c, b);\n";
    }
    let subst = vec![
        ("TERMS", terms.to_string()),
        ("STASH", stash),
        ("SUM", sum),
        ("FINISH", finish),
    ];
    let params = |o: &[usize]| NormParams {
        rows: rows as u32,
        row_len: n as u32,
        chunks: chunks as u32,
        chunk_len: rows.div_ceil(chunks) as u32,
        offsets: offsets(o),
        ..NormParams::default()
    };
    let steps: [(&str, &[TensorRef<'_>], &[TensorRef<'_>], u64); 2] = [
        (
            "norm_dw_chunks",
            &read,
            &[sums],
            (n.div_ceil(64) * chunks) as u64,
        ),
        ("norm_dw_finish", &[sums], outputs, groups_for(n)),
    ];
    for (section, ins, outs, groups) in steps {
        run(
            gpu,
            &key(op, ins, outs, section),
            SRC,
            section,
            || Ok(subst.clone()),
            ins,
            outs,
            groups,
            params,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{rows_code, NormParams, SRC};
    use crate::gpu::Build;
    use crate::params::ParamBlock;
    use crate::source::source;
    use tessera_core::DType;

    /// The kernels over rows validate a workgroup per row (with and without subgroups) and a
    /// subgroup per row, for 16-bit rows and f32 statistics.
    #[test]
    fn the_row_kernels_are_valid_wgsl() {
        let (x, stat) = ((DType::BF16, false), (DType::F32, false));
        let (y, stat_out) = ((DType::BF16, true), (DType::F32, true));
        let kernels = [
            ("layer_norm", vec![x, x, x, y, stat_out, stat_out]),
            ("rms_norm", vec![x, x, y, stat_out]),
            ("layer_norm_dx", vec![x, x, stat, stat, x, y, y, y]),
            ("rms_norm_dx", vec![x, x, stat, x, y, y]),
        ];
        for (section, bindings) in kernels {
            for (subgroups, by_subgroups) in [(false, false), (true, false), (true, true)] {
                let build = Build {
                    immediate_words: None,
                    subgroups,
                };
                let subst = rows_code(by_subgroups);
                let src = source(SRC, section, &bindings, &subst, build, &NormParams::wgsl());
                crate::source::assert_valid(&src, &format!("{section} {by_subgroups}"));
            }
        }
    }
}
