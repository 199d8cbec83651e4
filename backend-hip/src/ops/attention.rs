//! Rotary embeddings and flash-style attention (`kernels/attention.hip`). The forward pass
//! runs a thread per query row with an online softmax over keys streamed through shared
//! memory; the backward pass runs `dq` per query row (which also leaves `delta_i` for the
//! others), then `dk` and `dv` per key row, each summing grouped query heads and rows in
//! order: no T x T memory, no atomics, the same bits every run. On NVIDIA, 16-bit data with
//! head dims that are multiples of 16 up to 128 run the same passes on tensor cores
//! (`forward_mma`; `dq_mma` then `dkv_mma`, which recompute the scores rather than add
//! partial dQ with atomics, so they too give the same bits every run). Attention over a KV
//! cache at device positions (decoding) runs a block per query row whose warps share the
//! keys (`cached`). f32 with head dims of 64 or 128 runs the same three passes tiled on NVIDIA's
//! CUDA cores (`forward_tiled`, `dq_tiled`, `dkv_tiled`: each thread a 4 x 4 share of a 64 x 64
//! tile of scores, about twice the row kernels' speed); exact f32 arithmetic, no TF32.

use tessera_core::exec::unfused::index_copy_then_attention;
use tessera_core::{DType, Error, Op, Result, TensorRef};

use super::{cxx_type, index_type, unsupported};
use crate::gpu::{grid_for, rows_grid, Gpu, Source};
use crate::memory::buffer_address;
use crate::params::hip_params;

const SRC: &str = include_str!("../../kernels/attention.hip");

/// Query (or key) rows per block, a thread each.
const ROWS: u32 = 64;
/// Most rows per streamed tile.
const MAX_TILE: usize = 32;
/// Floats of shared memory a block may use (48 KiB, the limit without opt-in).
const SHARED_FLOATS: usize = 12 * 1024;
/// The largest head dim: the rows a thread holds are per-thread arrays of this size.
const MAX_HEAD: usize = 512;

hip_params! {
    /// Rotary's parameters: `pairs` rotated pairs in rows of `2 * half`, `positions` rows per
    /// sequence (the tables' rows).
    RotaryParams {
        x: u64,
        cos: u64,
        sin: u64,
        y: u64,
        pairs: u64,
        half: u64,
        positions: u64,
    }
}

hip_params! {
    /// Attention's parameters, forward and backward: the operands (those a kernel does not
    /// use are 0), k's and v's batch and head strides in elements, and the sizes.
    AttnParams {
        q: u64,
        k: u64,
        v: u64,
        out: u64,
        lse: u64,
        dout: u64,
        dq: u64,
        dk: u64,
        dv: u64,
        /// Scratch: delta_i per query row, from the dq kernel.
        delta: u64,
        /// Cached attention's query positions.
        positions: u64,
        k_batch_stride: u64,
        k_head_stride: u64,
        v_batch_stride: u64,
        v_head_stride: u64,
        batch: u32,
        heads: u32,
        kv_heads: u32,
        q_len: u32,
        k_len: u32,
        causal: u32,
        scale: f32,
    }
}

/// Whether this family's kernels run `op` on inputs of `dtypes`: f32, f16 and bf16 data.
pub(crate) fn supports(_op: &Op, dtypes: &[DType]) -> bool {
    matches!(dtypes.first(), Some(DType::F32 | DType::F16 | DType::BF16))
}

/// Rows per streamed tile for head dims `kd`, `vd`: as many as fit the shared memory of the
/// largest kernel (dk: both tiles and two statistics per row), at most [`MAX_TILE`].
fn tile(kd: usize, vd: usize) -> usize {
    (SHARED_FLOATS / (kd.max(1) + vd.max(1) + 2)).min(MAX_TILE)
}

/// The attention kernel `entry` (`forward`, `dq`, `dk` or `dv`) for data of `dtype` and head
/// dims `kd`, `vd`.
fn attn_source(entry: &str, dtype: DType, kd: usize, vd: usize) -> Source {
    let (name, flag) = match entry {
        "forward" => ("forward", "FORWARD"),
        "dq" => ("dq", "DQ"),
        "dk" => ("dkv", "DK"),
        _ => ("dkv", "DV"),
    };
    Source::new::<AttnParams>(SRC, name)
        .define(flag, "1")
        .define("T", cxx_type(dtype))
        .define("KD", kd.to_string())
        .define("VD", vd.to_string())
        .define("TILE", tile(kd, vd).to_string())
        .define("ROWS", ROWS.to_string())
        .define("DELTA_SUM", if dtype == DType::F32 { "0" } else { "1" })
}

/// Threads per block of the cached-attention kernel, whose warps each stream a share of the
/// keys: decoding has a block per head, so many warps per block keep the chain of dependent
/// loads each warp walks short. Value heads past 256 take half as many (the warps' partial
/// rows share 48 KiB of shared memory).
fn cached_threads(vd: usize) -> u32 {
    if vd > 256 {
        512
    } else {
        1024
    }
}

/// Keys each warp of the cached-attention kernel takes per step, their keys' and values'
/// loads in flight together: 8 (the 32 warps of a block then cover 256 positions in one
/// step), fewer for wide heads, whose values would not fit in registers.
fn cached_keys(vd: usize) -> usize {
    match vd {
        0..=128 => 8,
        129..=256 => 4,
        _ => 2,
    }
}

/// The cached-attention kernel for data of `dtype`, positions of `positions` and head dims
/// `kd`, `vd`.
fn cached_source(dtype: DType, positions: DType, kd: usize, vd: usize) -> Source {
    Source::new::<AttnParams>(SRC, "cached")
        .define("CACHED", "1")
        .define("T", cxx_type(dtype))
        .define("I", cxx_type(positions))
        .define("KD", kd.to_string())
        .define("VD", vd.to_string())
        .define("THREADS", cached_threads(vd).to_string())
        .define("KEYS", cached_keys(vd).to_string())
        // The file's shared helpers name the row kernels' sizes.
        .define("ROWS", ROWS.to_string())
        .define("TILE", "1")
}

/// A tensor-core kernel (NVIDIA only: `forward_mma`, `dq_mma` or `dkv_mma`) for 16-bit data
/// of `dtype` and head dim `d`.
fn mma_source(entry: &'static str, dtype: DType, d: usize) -> Source {
    Source::new::<AttnParams>(SRC, entry)
        .define("MMA", "1")
        .define(&entry.to_uppercase(), "1")
        .define("T", cxx_type(dtype))
        .define("KD", d.to_string())
        .define("VD", d.to_string())
        .define("D", d.to_string())
        .define("MMA_BF16", if dtype == DType::BF16 { "1" } else { "0" })
        // The file's shared helpers name the row kernels' sizes.
        .define("ROWS", "128")
        .define("TILE", "64")
}

/// Shared memory of tensor-core kernel `entry`: tiles of 64 rows of `d + 8` 16-bit values,
/// those streamed in two stages. The forward: the query tile and two stages of key and
/// value tiles; `dq_mma`: the query and output-gradient tiles and two stages of key and value
/// tiles; `dkv_mma`: the key and value tiles and two stages of a query tile, an
/// output-gradient tile and 64 lse and delta values.
fn mma_shared_bytes(entry: &str, d: usize) -> u32 {
    let tile = 64 * (d + 8) * 2;
    match entry {
        "forward_mma" => (5 * tile) as u32,
        "dq_mma" => (6 * tile) as u32,
        _ => (2 * tile + 2 * (2 * tile + 2 * 64 * 4)) as u32,
    }
}

/// Whether the tensor-core kernels run this launch: NVIDIA, 16-bit data, equal query and
/// value head dims that are a multiple of 16 up to 128, and every operand in `tensors` on a
/// 16-byte boundary with k's and v's heads and batches too (the kernels move 8 values at a
/// time). The forward also wants at least 16 query rows: decoding's single rows stay on the
/// row kernel.
fn mma_fits(gpu: &Gpu, op: &Op, tensors: &[&TensorRef<'_>]) -> Result<bool> {
    let (q, v) = (tensors[0], tensors[2]);
    let (d, vd, tq) = (q.layout.shape[3], v.layout.shape[3], q.layout.shape[2]);
    let shape_fits = gpu.backend() == "cuda"
        && matches!(q.dtype, DType::F16 | DType::BF16)
        && d == vd
        && d % 16 == 0
        && (16..=128).contains(&d)
        && mma_shared_bytes("dq_mma", d) as usize <= gpu.max_shared_bytes()
        && (tq >= 16 || matches!(op, Op::AttentionBackward { .. }));
    Ok(shape_fits && in_16_byte_groups(gpu, tensors)?)
}

/// Whether the kernels that move 16 bytes at a time may read `tensors` (q, k, v, then the
/// rest): every operand on a 16-byte boundary, and k's and v's heads and batches too.
fn in_16_byte_groups(gpu: &Gpu, tensors: &[&TensorRef<'_>]) -> Result<bool> {
    let group = 16 / tensors[0].dtype.size();
    let strides = tensors[1..3].iter().all(|t| {
        t.layout.strides[..2]
            .iter()
            .all(|s| s.is_multiple_of(group))
    });
    let mut aligned = strides;
    for t in tensors {
        aligned &= gpu.ptr(t)? % 16 == 0;
    }
    Ok(aligned)
}

/// A tiled f32 kernel (NVIDIA only: `forward_tiled`, `dq_tiled` or `dkv_tiled`) for head dim
/// `d`.
fn tiled_source(entry: &'static str, d: usize) -> Source {
    Source::new::<AttnParams>(SRC, entry)
        .define("TILED", "1")
        .define(&entry.to_uppercase(), "1")
        .define("T", cxx_type(DType::F32))
        .define("KD", d.to_string())
        .define("VD", d.to_string())
        .define("D", d.to_string())
        // The file's shared helpers name the row kernels' sizes.
        .define("ROWS", "256")
        .define("TILE", "64")
}

/// Shared memory of tiled kernel `entry` for head dim `d`: tiles of 64 rows held as columns
/// (`d` rows of 68 floats), as rows (64 rows of `d + 4`), and a 64 x 64 tile of probabilities
/// (or their gradients) as columns. The forward: the query and key columns, the value rows
/// and the probabilities; `dq_tiled`: query, output-gradient, key and value columns, key rows
/// and the score gradients; `dkv_tiled`: key, value, query and output-gradient columns, query
/// and output-gradient rows, the probabilities, and 64 lse and delta values.
fn tiled_shared_bytes(entry: &str, d: usize) -> usize {
    let (cols, rows, scores) = (d * 68, 64 * (d + 4), 64 * 68);
    let floats = match entry {
        "forward_tiled" => 2 * cols + rows + scores,
        "dq_tiled" => 4 * cols + rows + scores,
        _ => 4 * cols + 2 * rows + scores + 2 * 64,
    };
    floats * 4
}

/// Whether the tiled f32 kernels run this launch: NVIDIA, f32 data, equal query and value head
/// dims of 64 or 128, the kernels' shared memory within the device's, and every operand in
/// `tensors` on a 16-byte boundary with k's and v's heads and batches too (the kernels move 4
/// floats at a time). The forward also wants at least 16 query rows.
fn tiled_fits(gpu: &Gpu, op: &Op, tensors: &[&TensorRef<'_>]) -> Result<bool> {
    let (q, v) = (tensors[0], tensors[2]);
    let (d, vd, tq) = (q.layout.shape[3], v.layout.shape[3], q.layout.shape[2]);
    let shape_fits = gpu.backend() == "cuda"
        && q.dtype == DType::F32
        && d == vd
        && (d == 64 || d == 128)
        && tiled_shared_bytes("dkv_tiled", d) <= gpu.max_shared_bytes()
        && (tq >= 16 || matches!(op, Op::AttentionBackward { .. }));
    Ok(shape_fits && in_16_byte_groups(gpu, tensors)?)
}

fn rotary_source(dtype: DType, index: &str) -> Source {
    Source::new::<RotaryParams>(SRC, "rotary")
        .define("ROTARY", "1")
        .define("T", cxx_type(dtype))
        .define("IDX", index)
}

/// The kernels `launch` compiles for `op` on inputs of `dtypes`: a few head dims.
#[cfg(test)]
pub(crate) fn samples(op: &Op, dtypes: &[DType]) -> Vec<Source> {
    let dtype = dtypes[0];
    let heads = [(64, 64), (80, 80), (128, 96), (256, 256), (8, 0)];
    match op {
        Op::Rotary => vec![rotary_source(dtype, "u32"), rotary_source(dtype, "u64")],
        Op::Attention { .. } => {
            let mut sources: Vec<Source> = heads
                .iter()
                .map(|&(kd, vd)| attn_source("forward", dtype, kd, vd))
                .collect();
            if dtype == DType::F32 {
                sources.extend([64, 128].map(|d| tiled_source("forward_tiled", d)));
            } else {
                sources.extend([64, 128].map(|d| mma_source("forward_mma", dtype, d)));
            }
            sources
        }
        // Value heads past 256 take blocks of another size.
        Op::CachedAttention => heads
            .iter()
            .chain(&[(512, 512)])
            .map(|&(kd, vd)| cached_source(dtype, dtypes[3], kd, vd))
            .collect(),
        Op::AttentionBackward { .. } => {
            let mut sources: Vec<Source> = heads
                .iter()
                .flat_map(|&(kd, vd)| {
                    ["dq", "dk", "dv"].map(|entry| attn_source(entry, dtype, kd, vd))
                })
                .collect();
            for d in [64, 128] {
                if dtype == DType::F32 {
                    sources.extend(["dq_tiled", "dkv_tiled"].map(|e| tiled_source(e, d)));
                } else {
                    sources.extend(["dq_mma", "dkv_mma"].map(|e| mma_source(e, dtype, d)));
                }
            }
            sources
        }
        _ => Vec::new(),
    }
}

pub(crate) fn launch(
    gpu: &Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    match op {
        Op::Rotary => rotary(gpu, inputs, &outputs[0]),
        Op::Attention { causal } | Op::AttentionBackward { causal } => {
            attention(gpu, op, *causal, inputs, outputs, s[0])
        }
        Op::CachedAttention => attention(gpu, op, true, inputs, outputs, s[0]),
        // The cache write, then the cached attention: a replayed graph launches both for
        // about what one costs.
        Op::AppendAttention => {
            let launch = |op: &Op, i: &[TensorRef<'_>], o: &[TensorRef<'_>], s: &[f64]| {
                super::launch_family(gpu, op, i, o, s)
            };
            index_copy_then_attention(op, inputs, outputs, s, &launch)
        }
        _ => Err(unsupported(gpu, op)),
    }
}

fn rotary(gpu: &Gpu, inputs: &[TensorRef<'_>], y: &TensorRef<'_>) -> Result<()> {
    let shape = &inputs[0].layout.shape;
    let r = shape.len();
    let n = inputs[0].layout.numel();
    if n == 0 {
        return Ok(());
    }
    let dtype = inputs[0].dtype;
    let index = index_type(&[&inputs[0]]);
    let params = RotaryParams {
        x: gpu.ptr(&inputs[0])?,
        cos: gpu.ptr(&inputs[1])?,
        sin: gpu.ptr(&inputs[2])?,
        y: gpu.ptr(y)?,
        pairs: (n / 2) as u64,
        half: (shape[r - 1] / 2) as u64,
        positions: shape[r - 2] as u64,
    };
    let key = format!("rotary:{dtype}:{index}");
    let source = || Ok(rotary_source(dtype, index));
    gpu.run(&key, source, grid_for(n / 2, 256), &params)
}

fn attention(
    gpu: &Gpu,
    op: &Op,
    causal: bool,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    scale: f64,
) -> Result<()> {
    let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
    let (qs, ks, vs) = (&q.layout.shape, &k.layout.shape, &v.layout.shape);
    let (b, hq, tq, kd) = (qs[0], qs[1], qs[2], qs[3]);
    let (hkv, tk, vd) = (ks[1], ks[2], vs[3]);
    let dtype = q.dtype;
    if kd > MAX_HEAD || vd > MAX_HEAD {
        return Err(Error::unsupported(
            gpu.backend(),
            format!(
                "{} with head dims {kd} and {vd} (the kernels hold rows of up to {MAX_HEAD})",
                op.name()
            ),
        ));
    }
    let fits = |x: usize| x < u32::MAX as usize;
    if ![b, hq, hkv, tq, tk].into_iter().all(fits) || !fits(b * hq) || !fits(b * hq * tq) {
        return Err(Error::unsupported(
            gpu.backend(),
            format!("{} past 2^32 rows or heads", op.name()),
        ));
    }
    let mut params = AttnParams {
        q: gpu.ptr(q)?,
        k: gpu.ptr(k)?,
        v: gpu.ptr(v)?,
        k_batch_stride: k.layout.strides[0] as u64,
        k_head_stride: k.layout.strides[1] as u64,
        v_batch_stride: v.layout.strides[0] as u64,
        v_head_stride: v.layout.strides[1] as u64,
        batch: b as u32,
        heads: hq as u32,
        kv_heads: hkv as u32,
        q_len: tq as u32,
        k_len: tk as u32,
        causal: u32::from(causal),
        scale: scale as f32,
        ..AttnParams::default()
    };
    let rows = b * hq * tq;
    let query_blocks = b * hq * tq.div_ceil(ROWS as usize);
    let key_blocks = b * hkv * tk.div_ceil(ROWS as usize);
    let tile = tile(kd, vd);
    let run = |entry: &str, blocks: usize, params: &AttnParams| {
        let key = format!("attn_{entry}:{dtype}:{kd}:{vd}:{tile}");
        let source = || Ok(attn_source(entry, dtype, kd, vd));
        gpu.run(&key, source, rows_grid(blocks, ROWS, 0), params)
    };
    let run_mma = |entry: &'static str, blocks: usize, params: &AttnParams| {
        let key = format!("attn_{entry}:{dtype}:{kd}");
        let source = || Ok(mma_source(entry, dtype, kd));
        let grid = rows_grid(blocks, 128, mma_shared_bytes(entry, kd));
        gpu.run(&key, source, grid, params)
    };
    let run_tiled = |entry: &'static str, blocks: usize, params: &AttnParams| {
        let key = format!("attn_{entry}:{kd}");
        let source = || Ok(tiled_source(entry, kd));
        let grid = rows_grid(blocks, 256, tiled_shared_bytes(entry, kd) as u32);
        gpu.run(&key, source, grid, params)
    };
    if matches!(op, Op::CachedAttention) {
        if rows == 0 {
            return Ok(());
        }
        params.out = gpu.ptr(&outputs[0])?;
        params.positions = gpu.ptr(&inputs[3])?;
        let positions = inputs[3].dtype;
        let key = format!("attn_cached:{dtype}:{positions}:{kd}:{vd}");
        let source = || Ok(cached_source(dtype, positions, kd, vd));
        let grid = rows_grid(rows, cached_threads(vd), 0);
        return gpu.run(&key, source, grid, &params);
    }
    if matches!(op, Op::Attention { .. }) {
        if rows == 0 {
            return Ok(());
        }
        params.out = gpu.ptr(&outputs[0])?;
        params.lse = gpu.ptr(&outputs[1])?;
        if mma_fits(gpu, op, &[q, k, v, &outputs[0]])? {
            return run_mma("forward_mma", b * hq * tq.div_ceil(64), &params);
        }
        if tiled_fits(gpu, op, &[q, k, v, &outputs[0]])? {
            return run_tiled("forward_tiled", b * hq * tq.div_ceil(64), &params);
        }
        return run("forward", query_blocks, &params);
    }
    params.out = gpu.ptr(&inputs[3])?;
    params.lse = gpu.ptr(&inputs[4])?;
    params.dout = gpu.ptr(&inputs[5])?;
    params.dq = gpu.ptr(&outputs[0])?;
    params.dk = gpu.ptr(&outputs[1])?;
    params.dv = gpu.ptr(&outputs[2])?;
    let scratch = gpu.alloc(rows.max(1) * 4)?;
    params.delta = buffer_address(gpu.backend(), &scratch)?;
    if mma_fits(gpu, op, &[q, k, v, &inputs[5]])? {
        if rows > 0 {
            run_mma("dq_mma", b * hq * tq.div_ceil(64), &params)?;
        }
        if tk > 0 {
            run_mma("dkv_mma", b * hkv * tk.div_ceil(64), &params)?;
        }
        return Ok(());
    }
    let operands = [
        q,
        k,
        v,
        &inputs[3],
        &inputs[5],
        &outputs[0],
        &outputs[1],
        &outputs[2],
    ];
    if tiled_fits(gpu, op, &operands)? {
        if rows > 0 {
            run_tiled("dq_tiled", b * hq * tq.div_ceil(64), &params)?;
        }
        if tk > 0 {
            run_tiled("dkv_tiled", b * hkv * tk.div_ceil(64), &params)?;
        }
        return Ok(());
    }
    if rows > 0 {
        run("dq", query_blocks, &params)?;
    }
    if key_blocks > 0 {
        if kd > 0 {
            run("dk", key_blocks, &params)?;
        }
        if vd > 0 {
            run("dv", key_blocks, &params)?;
        }
    }
    Ok(())
}
