//! Attention's backward on tensor cores. Where the device multiplies the operands' dtype on
//! cooperative matrices, the gradients are five batched products of the matmul kernels around
//! one row pass (`kernels/scores.wgsl`), instead of the fused kernels of `attention.rs`, which
//! compute every product on the vector units:
//!
//! 1. `S = q k^T` and `dP = dout v^T`, in f32;
//! 2. per score row, `P = exp(scale S - lse)` where the key is visible, `delta = sum_j P dP`
//!    and `dS = scale P (dP - delta)`, each as the sum of two values of the operands' dtype
//!    (`hi`, rounded, and `lo`, what rounding left out: 16 significant bits in bf16, 22 in
//!    f16), since the tensor cores take only that dtype;
//! 3. `dv = P^T dout`, `dq = dS k` and `dk = dS^T q`, each the `lo` product added to the `hi`
//!    product (f32) in the matmul's epilogue.
//!
//! Rounding `P` and `dS` once to 16 bits, as flash attention does, is not enough: a gradient
//! that is a small sum of larger terms then misses the catalog's tolerance by several times
//! (measured on the H100). Grouped query heads share a key head: its `dk` and `dv` are one
//! product over the rows of all its query heads, so they sum in a fixed order, as every
//! product here does. The T x T intermediates take 16 bytes a score (S and dP in f32, the
//! parts of P and dS in 16 bits): attention whose intermediates would not fit one binding each
//! runs the fused kernels.

use tessera_core::{DType, Layout, Op, Result, TensorRef};

use crate::attention::AttentionParams;
use crate::gpu::Gpu;
use crate::matmul::{self, PLAIN};

/// A product with a residual added in its epilogue.
const WITH_RESIDUAL: Op = Op::Matmul {
    bias: false,
    activation: None,
    residual: true,
};
use crate::params::offsets;
use crate::source::{key, no_subst, run};

const SRC: &str = include_str!("../kernels/scores.wgsl");

/// Runs attention's backward (`inputs`: q, k, v, out, lse, dout; `outputs`: dq, dk, dv) as
/// products on tensor cores; `Ok(false)`, having run nothing, where the device or the tensors
/// do not allow it.
pub(crate) fn backward(
    gpu: &dyn Gpu,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    scale: f64,
    causal: bool,
) -> Result<bool> {
    let (q, k, v, lse, dout) = (&inputs[0], &inputs[1], &inputs[2], &inputs[4], &inputs[5]);
    let dtype = q.dtype;
    let tensor_cores = match dtype {
        DType::F16 => gpu.coop_f16(),
        DType::BF16 => gpu.coop_bf16(),
        _ => false,
    };
    let [b, hq, tq, d] = q.layout.shape[..] else {
        return Ok(false);
    };
    let (hkv, tk, dv) = (k.layout.shape[1], k.layout.shape[2], v.layout.shape[3]);
    let scores = b * hq * tq * tk;
    let contiguous = [q, dout, lse, &outputs[0], &outputs[1], &outputs[2]]
        .iter()
        .all(|t| t.layout.is_contiguous());
    let same_dtype = inputs[..4]
        .iter()
        .chain(&inputs[5..])
        .all(|t| t.dtype == dtype)
        && outputs.iter().all(|t| t.dtype == dtype);
    if !tensor_cores
        || !contiguous
        || !same_dtype
        || scores == 0
        || d == 0
        || dv == 0
        || 4 * scores as u64 > gpu.max_binding()
        || !gpu.fits(inputs)
        || !gpu.fits(outputs)
    {
        return Ok(false);
    }
    let g = hq / hkv;
    let f32_scores = [gpu.scratch(4 * scores)?, gpu.scratch(4 * scores)?];
    let half = dtype.size() * scores;
    let half_scores = [
        gpu.scratch(half)?,
        gpu.scratch(half)?,
        gpu.scratch(half)?,
        gpu.scratch(half)?,
    ];
    // Contiguous query-side tensors starting at `offset` as [B, Hkv, G, rows, cols], or with
    // each key head's query rows as one, [B, Hkv, G * rows, cols]; key-side ones broadcast
    // over G.
    let at = |shape: &[usize], offset: usize| Layout {
        offset,
        ..Layout::contiguous(shape)
    };
    let grouped = |rows: usize, cols: usize, offset| at(&[b, hkv, g, rows, cols], offset);
    let folded = |rows: usize, cols: usize, offset| at(&[b, hkv, g * rows, cols], offset);
    let per_query_head = |t: &TensorRef<'_>, transpose: bool| {
        let (l, s) = (&t.layout.shape, &t.layout.strides);
        let (rows, cols) = if transpose { (3, 2) } else { (2, 3) };
        Layout {
            shape: vec![b, hkv, g, l[rows], l[cols]],
            strides: vec![s[0], s[1], 0, s[rows], s[cols]],
            offset: t.layout.offset,
        }
    };
    let product = |a: TensorRef<'_>, b: TensorRef<'_>, out: TensorRef<'_>| {
        matmul::launch(gpu, &PLAIN, &[a, b], &[out])
    };
    // out = a_lo b + (a_hi b), the latter in f32.
    let split_product =
        |a_hi: TensorRef<'_>, a_lo: TensorRef<'_>, b: TensorRef<'_>, out: TensorRef<'_>| {
            let high = gpu.scratch(4 * out.layout.numel())?;
            let high_layout = at(&out.layout.shape, 0);
            let high = TensorRef {
                buffer: &high,
                layout: &high_layout,
                dtype: DType::F32,
            };
            product(a_hi, b, high)?;
            matmul::launch(gpu, &WITH_RESIDUAL, &[a_lo, b, high], &[out])
        };
    let score_layout = grouped(tq, tk, 0);
    let scores_t = transposed(&folded(tq, tk, 0));
    let [s, dp] = [0, 1].map(|i| TensorRef {
        buffer: &f32_scores[i],
        layout: &score_layout,
        dtype: DType::F32,
    });
    let [p_hi, p_lo, ds_hi, ds_lo] = [0, 1, 2, 3].map(|i| TensorRef {
        buffer: &half_scores[i],
        layout: &score_layout,
        dtype,
    });
    let q_grouped = grouped(tq, d, q.layout.offset);
    let dout_grouped = grouped(tq, dv, dout.layout.offset);
    let (k_t, v_t) = (per_query_head(k, true), per_query_head(v, true));
    product(view(q, &q_grouped), view(k, &k_t), s)?;
    product(view(dout, &dout_grouped), view(v, &v_t), dp)?;
    let rows = b * hq * tq;
    let u = |v: usize| v as u32;
    let lse_rows = at(&[rows], lse.layout.offset);
    let (ins, outs) = ([s, dp, view(lse, &lse_rows)], [p_hi, p_lo, ds_hi, ds_lo]);
    let shared_op = Op::AttentionBackward { causal: false };
    run(
        gpu,
        &key(&shared_op, &ins, &outs, "scores_grad"),
        SRC,
        "scores_grad",
        no_subst,
        &ins,
        &outs,
        rows as u64,
        |o| AttentionParams {
            batch: u(b),
            heads: u(hq),
            kv_heads: u(hkv),
            q_len: u(tq),
            k_len: u(tk),
            k_dim: u(d),
            v_dim: u(dv),
            causal: u32::from(causal),
            scale: scale as f32,
            offsets: offsets(o),
            ..AttentionParams::default()
        },
    )?;
    let dout_folded = folded(tq, dv, dout.layout.offset);
    let q_folded = folded(tq, d, q.layout.offset);
    let k_rows = per_query_head(k, false);
    let dq_grouped = grouped(tq, d, outputs[0].layout.offset);
    let dout_folded = view(dout, &dout_folded);
    let [p_hi_t, p_lo_t, ds_hi_t, ds_lo_t] =
        [&p_hi, &p_lo, &ds_hi, &ds_lo].map(|part| view(part, &scores_t));
    split_product(p_hi_t, p_lo_t, dout_folded, outputs[2])?;
    let (k_rows, dq) = (view(k, &k_rows), view(&outputs[0], &dq_grouped));
    split_product(ds_hi, ds_lo, k_rows, dq)?;
    split_product(ds_hi_t, ds_lo_t, view(q, &q_folded), outputs[1])?;
    Ok(true)
}

/// `t`'s data seen through `layout`.
fn view<'a>(t: &TensorRef<'a>, layout: &'a Layout) -> TensorRef<'a> {
    TensorRef {
        buffer: t.buffer,
        layout,
        dtype: t.dtype,
    }
}

/// `l` with its last two dimensions swapped.
fn transposed(l: &Layout) -> Layout {
    let r = l.shape.len();
    let mut t = l.clone();
    t.shape.swap(r - 1, r - 2);
    t.strides.swap(r - 1, r - 2);
    t
}
