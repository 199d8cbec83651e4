//! Layer norm and RMS norm, forward and backward (`kernels/norm.hip`): a block per row for
//! the statistics, `y` and `dx`; the weight and bias gradients as partial sums over fixed
//! chunks of rows (a thread per column, rows in order), then the chunks added in a fixed
//! order, so they are deterministic and use the whole device however many rows there are. Forward
//! rows of up to [`MAX_REGS`] elements per thread live in registers (`norm_forward_regs`):
//! one trip to memory per row, which is what a decoding step's one-row norms wait on. The
//! backward of rows of up to 2,048 16-bit (1,024 f32) elements on 16-byte boundaries runs as
//! one kernel with a warp per row (`norm_backward_rows`: x and dy read once for dx and the
//! weight gradients both, no block barrier per row), then the chunks' sums added in order.

use tessera_core::{DType, Op, Result, TensorRef};

use super::{cxx_type, unsupported};
use crate::gpu::{grid_for, rows_grid, Gpu, Source};
use crate::memory::buffer_address;
use crate::params::hip_params;

const SRC: &str = include_str!("../../kernels/norm.hip");

/// Threads of the column kernels.
const THREADS: u32 = 256;
/// Rows one block of the weight gradients sums at least (`norm_dw_partial`, and
/// `norm_backward_rows`, whose eight warps take four rows each); at most this many chunks.
const CHUNK_ROWS: usize = 64;
const ROW_KERNEL_CHUNK_ROWS: usize = 32;
const MAX_CHUNKS: usize = 1024;

hip_params! {
    /// The norms' parameters: the operands (absent ones 0), `rows` rows of `n`, `eps`, and
    /// the weight gradients' `chunks` of `chunk_rows` rows with their `partial` sums.
    NormParams {
        x: u64,
        w: u64,
        b: u64,
        y: u64,
        mean: u64,
        rstd: u64,
        dy: u64,
        dx: u64,
        dw: u64,
        db: u64,
        partial: u64,
        rows: u64,
        n: u64,
        chunks: u64,
        chunk_rows: u64,
        eps: f32,
    }
}

/// Whether this family's kernels run `op` on inputs of `dtypes`: every op on f32, f16 and
/// bf16.
pub(crate) fn supports(_op: &Op, _dtypes: &[DType]) -> bool {
    true
}

/// Elements per thread up to which a forward row is held in registers.
const MAX_REGS: usize = 8;

/// Kernel `entry` for data of `dtype`, layer norm or RMS norm.
fn norm_source(entry: &'static str, dtype: DType, layer: bool) -> Source {
    Source::new::<NormParams>(SRC, entry)
        .define("T", cxx_type(dtype))
        .define("LAYER", if layer { "1" } else { "0" })
}

/// Most 16-byte groups per lane of a row `norm_backward_rows` holds (with 32 lanes: rows of up
/// to 2,048 16-bit or 1,024 f32 elements).
const MAX_GROUPS_PER_LANE: usize = 8;

/// `norm_backward_rows` for 16-byte groups of `dtype`, `groups` of them per lane.
fn rows_backward_source(dtype: DType, layer: bool, groups: usize) -> Source {
    norm_source("norm_backward_rows", dtype, layer)
        .define("V", (16 / dtype.size()).to_string())
        .define("KV", groups.to_string())
}

/// `norm_forward_regs` with `regs` elements per thread.
fn regs_source(dtype: DType, layer: bool, regs: usize) -> Source {
    norm_source("norm_forward_regs", dtype, layer).define("REGS", regs.to_string())
}

/// The kernels `launch` compiles for `op` on inputs of `dtypes`.
#[cfg(test)]
pub(crate) fn samples(op: &Op, dtypes: &[DType]) -> Vec<Source> {
    let layer = matches!(op, Op::LayerNorm | Op::LayerNormBackward);
    let entries: &[&'static str] = match op {
        Op::LayerNorm | Op::RmsNorm => &["norm_forward"],
        _ => &["norm_dx", "norm_dw_partial", "norm_dw_finish"],
    };
    let regs = if matches!(op, Op::LayerNorm | Op::RmsNorm) {
        [1, MAX_REGS].map(|r| regs_source(dtypes[0], layer, r))
    } else {
        [1, MAX_GROUPS_PER_LANE].map(|g| rows_backward_source(dtypes[0], layer, g))
    };
    entries
        .iter()
        .map(|e| norm_source(e, dtypes[0], layer))
        .chain(regs)
        .collect()
}

/// Threads per row for rows of `n`: about four elements each, 64 to 256.
fn row_threads(n: usize) -> u32 {
    n.div_ceil(4).next_power_of_two().clamp(64, 256) as u32
}

pub(crate) fn launch(
    gpu: &Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    scalars: &[f64],
) -> Result<()> {
    let x = &inputs[0];
    let n = *x.layout.shape.last().unwrap_or(&1);
    let rows = x.layout.numel() / n.max(1);
    let dtype = x.dtype;
    let layer = matches!(op, Op::LayerNorm | Op::LayerNormBackward);
    let mut params = NormParams {
        x: gpu.ptr(x)?,
        w: gpu.ptr(&inputs[1])?,
        rows: rows as u64,
        n: n as u64,
        eps: scalars.first().copied().unwrap_or(0.0) as f32,
        ..NormParams::default()
    };
    let run = |entry: &'static str, grid, params: &NormParams| {
        let key = format!("{entry}:{}:{dtype}", op.name());
        gpu.run(&key, || Ok(norm_source(entry, dtype, layer)), grid, params)
    };
    let threads = row_threads(n);
    let row_grid = rows_grid(rows, threads, 0);
    match op {
        Op::LayerNorm | Op::RmsNorm => {
            if rows == 0 {
                return Ok(());
            }
            params.y = gpu.ptr(&outputs[0])?;
            if layer {
                params.b = gpu.ptr(&inputs[2])?;
                params.mean = gpu.ptr(&outputs[1])?;
                params.rstd = gpu.ptr(&outputs[2])?;
            } else {
                params.rstd = gpu.ptr(&outputs[1])?;
            }
            let regs = n.div_ceil(threads as usize);
            if regs > MAX_REGS {
                return run("norm_forward", row_grid, &params);
            }
            let key = format!("norm_forward_regs:{}:{dtype}:{regs}", op.name());
            let source = || Ok(regs_source(dtype, layer, regs));
            gpu.run(&key, source, row_grid, &params)
        }
        Op::LayerNormBackward | Op::RmsNormBackward => {
            let (rstd, dy) = if layer { (3, 4) } else { (2, 3) };
            params.rstd = gpu.ptr(&inputs[rstd])?;
            params.dy = gpu.ptr(&inputs[dy])?;
            if layer {
                params.mean = gpu.ptr(&inputs[2])?;
                params.db = gpu.ptr(&outputs[2])?;
            }
            params.dx = gpu.ptr(&outputs[0])?;
            params.dw = gpu.ptr(&outputs[1])?;
            if rows == 0 {
                let bytes = n * dtype.size();
                for out in &outputs[1..] {
                    gpu.driver.zero(gpu.ptr(out)?, bytes)?;
                }
                return Ok(());
            }
            let group = 16 / dtype.size();
            let per_lane = (n / group).div_ceil(32);
            // Each warp's gradient sums in shared memory (eight warps where they are 32 wide).
            let sums = if layer { 2 } else { 1 };
            let shared = 8 * sums * n * 4;
            let mut aligned = n.is_multiple_of(group)
                && per_lane <= MAX_GROUPS_PER_LANE
                && shared <= gpu.max_shared_bytes();
            for t in [x, &inputs[1], &inputs[dy], &outputs[0]] {
                aligned &= gpu.ptr(t)? % 16 == 0;
            }
            let least = if aligned {
                ROW_KERNEL_CHUNK_ROWS
            } else {
                CHUNK_ROWS
            };
            let chunk_rows = least.max(rows.div_ceil(MAX_CHUNKS));
            let chunks = rows.div_ceil(chunk_rows);
            params.chunks = chunks as u64;
            params.chunk_rows = chunk_rows as u64;
            let scratch = if chunks > 1 {
                let buffer = gpu.alloc(2 * chunks * n * 4)?;
                params.partial = buffer_address(gpu.backend(), &buffer)?;
                Some(buffer)
            } else {
                None
            };
            if aligned {
                let key = format!("norm_backward_rows:{}:{dtype}:{per_lane}", op.name());
                let source = || Ok(rows_backward_source(dtype, layer, per_lane));
                let grid = rows_grid(chunks, THREADS, shared as u32);
                gpu.run(&key, source, grid, &params)?;
            } else {
                run("norm_dx", row_grid, &params)?;
                let blocks = n.div_ceil(THREADS as usize) * chunks;
                let partial_grid = grid_for(blocks * THREADS as usize, THREADS);
                run("norm_dw_partial", partial_grid, &params)?;
            }
            if scratch.is_some() {
                run(
                    "norm_dw_finish",
                    rows_grid(n.div_ceil(32), THREADS, 0),
                    &params,
                )?;
            }
            Ok(())
        }
        _ => Err(unsupported(gpu, op)),
    }
}
