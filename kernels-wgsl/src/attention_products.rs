//! Attention's backward as products. Where the device multiplies the operands' dtype on
//! cooperative matrices (f16, bf16), or for f32 on a GPU, the gradients are five batched
//! products of the matmul kernels (tensor-core or tiled) around one row pass
//! (`kernels/scores.wgsl`), instead of the fused kernels of `attention.rs`, which compute every
//! product one thread per row:
//!
//! 1. `S = q k^T` and `dP = dout v^T`, in f32;
//! 2. per score row, `P = exp(scale S - lse)` where the key is visible, `delta = sum_j P dP`
//!    and `dS = scale P (dP - delta)`; for 16-bit operands each as the sum of two values of
//!    their dtype (`hi`, rounded, and `lo`, what rounding left out: 16 significant bits in
//!    bf16, 22 in f16), since the tensor cores take only that dtype;
//! 3. `dv = P^T dout`, `dq = dS k` and `dk = dS^T q`; for 16-bit operands each the `lo`
//!    product added to the `hi` product (f32) in the matmul's epilogue.
//!
//! Where the backend has a tensor-core attention kernel for the tensors (`Caps::
//! tensor_attention`), steps 1 and 2 are one kernel of it
//! ([`crate::AttentionPass::ScoresGradient`]), which keeps `S` and `dP` in registers and
//! stores only the parts of `P` and `dS`.
//!
//! Rounding `P` and `dS` once to 16 bits, as flash attention does, is not enough: a gradient
//! that is a small sum of larger terms then misses the catalog's tolerance by several times
//! (measured on the H100). Grouped query heads share a key head: its `dk` and `dv` are one
//! product over the rows of all its query heads, so they sum in a fixed order, as every
//! product here does. The T x T intermediates take 16 bytes a score (S and dP in f32, P and
//! dS in f32 or as 16-bit parts; 8 where the backend's kernel forms P and dS): attention whose
//! intermediates would not fit one binding each, or would take more than an eighth of the
//! device's memory, runs the fused kernels, as do CPU drivers (lavapipe), where the fused
//! kernels are faster.
//!
//! Causal attention's products name what its mask hides ([`Band`]): the backend's
//! tensor-core kernel then skips score tiles no query sees and the parts of k outside each
//! tile's band (zeros in `P` and `dS`), and other kernels run them whole, with the same result.

use tessera_core::{DType, Layout, Op, Result, TensorRef};

use crate::gpu::{Band, BandKind, Gpu, Source, TensorAttention};
use crate::matmul::{self, PLAIN};
use crate::params::{offsets, param_block, ParamBlock, MAX_BINDINGS};
use crate::source::{key, run, run_native};

/// A product with a residual added in its epilogue.
const WITH_RESIDUAL: Op = Op::Matmul {
    bias: false,
    activation: None,
    residual: true,
};

const SRC: &str = include_str!("../kernels/scores.wgsl");

param_block! {
    /// The row pass's parameters: `batch` x `heads` query heads of `q_len` rows over `k_len`
    /// keys, whether the attention is `causal` (key j visible to query i when
    /// j + q_len <= i + k_len), and the scores' `scale`.
    ScoresParams {
        batch: u32,
        heads: u32,
        q_len: u32,
        k_len: u32,
        causal: u32,
        scale: f32,
        offsets: [u32; MAX_BINDINGS],
    }
}

/// Runs attention's backward (`inputs`: q, k, v, out, lse, dout; `outputs`: dq, dk, dv) of
/// `(scale, causal, the backend's tensor-core kernel for its scores' gradients, if any)` as
/// products, that kernel reading the attention parameters `params` gives for its bindings'
/// offsets; `Ok(false)`, having run nothing, where the device or the tensors do not allow it.
pub(crate) fn backward<P: ParamBlock>(
    gpu: &dyn Gpu,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    (scale, causal, scores_kernel): (f64, bool, Option<TensorAttention>),
    params: impl FnOnce(&[usize]) -> P,
) -> Result<bool> {
    let (q, k, v, lse, dout) = (&inputs[0], &inputs[1], &inputs[2], &inputs[4], &inputs[5]);
    let dtype = q.dtype;
    let products = match dtype {
        DType::F16 => gpu.coop_f16(),
        DType::BF16 => gpu.coop_bf16(),
        DType::F32 => !gpu.is_cpu(),
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
    // The intermediates take at most an eighth of the device's memory, which fused kernels
    // would not need at all.
    let room = gpu
        .caps()
        .limits
        .memory_bytes
        .is_none_or(|m| 16 * scores <= m / 8);
    if !products
        || !contiguous
        || !same_dtype
        || scores == 0
        || hkv == 0
        || d == 0
        || dv == 0
        || !room
        || 4 * scores as u64 > gpu.max_binding()
        || !gpu.fits(inputs)
        || !gpu.fits(outputs)
    {
        return Ok(false);
    }
    let g = hq / hkv;
    // f32 gradients take P and dS whole; 16-bit ones in two parts each.
    let split = dtype != DType::F32;
    let part_bytes = dtype.size() * scores;
    let parts = (0..if split { 4 } else { 2 })
        .map(|_| gpu.scratch(part_bytes))
        .collect::<Result<Vec<_>>>()?;
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
    // Causal attention's products leave out, on the tensor-core kernel, the tiles and the
    // parts of k its mask makes zero or unread ([`Band`]); the key-side products only where
    // each key head has one query head (with more, their rows are folded together along k).
    let band = |kind: BandKind| {
        let applies = causal && (kind != BandKind::KeyRows || g == 1);
        applies.then_some(Band {
            kind,
            offset: (tk - tq) as u32,
        })
    };
    let product =
        |op: &Op, inputs: &[TensorRef<'_>], out: TensorRef<'_>, kind: BandKind| match band(kind) {
            Some(band) => matmul::launch_banded(gpu, op, inputs, &[out], band),
            None => matmul::launch(gpu, op, inputs, &[out]),
        };
    // out = a b for `a` whole, else a_lo b + (a_hi b), the latter in f32.
    let grad_product =
        |a: &[TensorRef<'_>], b: TensorRef<'_>, out: TensorRef<'_>, kind: BandKind| {
            let [a_hi, a_lo] = a[..] else {
                return product(&PLAIN, &[a[0], b], out, kind);
            };
            let high = gpu.scratch(4 * out.layout.numel())?;
            let high_layout = at(&out.layout.shape, 0);
            let high = TensorRef {
                buffer: &high,
                layout: &high_layout,
                dtype: DType::F32,
            };
            product(&PLAIN, &[a_hi, b], high, kind)?;
            product(&WITH_RESIDUAL, &[a_lo, b, high], out, kind)
        };
    let score_layout = grouped(tq, tk, 0);
    let scores_t = transposed(&folded(tq, tk, 0));
    let part_refs: Vec<TensorRef<'_>> = parts
        .iter()
        .map(|buffer| TensorRef {
            buffer,
            layout: &score_layout,
            dtype,
        })
        .collect();
    let (p, ds) = part_refs.split_at(part_refs.len() / 2);
    let rows = b * hq * tq;
    let lse_rows = at(&[rows], lse.layout.offset);
    let lse_rows = view(lse, &lse_rows);
    let shared_op = Op::AttentionBackward { causal: false };
    if let Some(kernel) = scores_kernel {
        let ins = [*q, *k, *v, lse_rows, *dout];
        let groups = tq.div_ceil(TensorAttention::ROWS as usize);
        let grid = [groups as u32, (b * hq) as u32, 1];
        let variant = format!("tensor_scores/{}", kernel.head);
        run_native(
            gpu,
            &key(&shared_op, &ins, &part_refs, &variant),
            Source::TensorAttention(kernel),
            &ins,
            &part_refs,
            grid,
            kernel.covers(tq, tk),
            params,
        )?;
    } else {
        let f32_scores = [gpu.scratch(4 * scores)?, gpu.scratch(4 * scores)?];
        let [s, dp] = [0, 1].map(|i| TensorRef {
            buffer: &f32_scores[i],
            layout: &score_layout,
            dtype: DType::F32,
        });
        let q_grouped = grouped(tq, d, q.layout.offset);
        let dout_grouped = grouped(tq, dv, dout.layout.offset);
        let (k_t, v_t) = (per_query_head(k, true), per_query_head(v, true));
        let scores = BandKind::Scores;
        product(&PLAIN, &[view(q, &q_grouped), view(k, &k_t)], s, scores)?;
        product(
            &PLAIN,
            &[view(dout, &dout_grouped), view(v, &v_t)],
            dp,
            scores,
        )?;
        let u = |v: usize| v as u32;
        let ins = [s, dp, lse_rows];
        let variant = format!("scores_grad/{}", if tk % 2 == 0 { "even" } else { "odd" });
        run(
            gpu,
            &key(&shared_op, &ins, &part_refs, &variant),
            SRC,
            "scores_grad",
            || Ok(row_pass_code(dtype, tk)),
            &ins,
            &part_refs,
            rows as u64,
            |o| ScoresParams {
                batch: u(b),
                heads: u(hq),
                q_len: u(tq),
                k_len: u(tk),
                causal: u32::from(causal),
                scale: scale as f32,
                offsets: offsets(o),
            },
        )?;
    }
    let dout_folded = folded(tq, dv, dout.layout.offset);
    let q_folded = folded(tq, d, q.layout.offset);
    let k_rows = per_query_head(k, false);
    let dq_grouped = grouped(tq, d, outputs[0].layout.offset);
    let dout_folded = view(dout, &dout_folded);
    let p_t: Vec<_> = p.iter().map(|part| view(part, &scores_t)).collect();
    let ds_t: Vec<_> = ds.iter().map(|part| view(part, &scores_t)).collect();
    grad_product(&p_t, dout_folded, outputs[2], BandKind::KeyRows)?;
    let (k_rows, dq) = (view(k, &k_rows), view(&outputs[0], &dq_grouped));
    grad_product(ds, k_rows, dq, BandKind::QueryRows)?;
    grad_product(&ds_t, view(q, &q_folded), outputs[1], BandKind::KeyRows)?;
    Ok(true)
}

/// The row pass's code for gradients of `dtype` over rows of `keys`: how it rounds f32 `v` to
/// the dtype (the bindings' helpers for a 16-bit one are there), the parts it keeps (both for
/// 16-bit dtypes, the first, all of it, for f32), and how a thread stores a pair of keys: bf16
/// rows of an even length as whole words (one store each instead of two atomics per element,
/// the scratch bindings starting at element 0), else key by key.
fn row_pass_code(dtype: DType, keys: usize) -> Vec<(&'static str, String)> {
    let (rounded, keep) = match dtype {
        DType::BF16 => ("bitcast<f32>(bf16_bits(v) << 16u)", SPLIT_PARTS),
        DType::F16 => ("f32(to_f16(v))", SPLIT_PARTS),
        _ => ("v", WHOLE),
    };
    let pair = if dtype == DType::BF16 && keys.is_multiple_of(2) {
        BF16_WORDS
    } else {
        "put_parts(row, j, x, delta);\nput_parts(row, j + 1u, y, delta);\n"
    };
    vec![
        ("ROUNDED", rounded.into()),
        ("KEEP_PARTS", keep.into()),
        ("PUT_PAIR", pair.into()),
    ]
}

/// Stores of both parts of P (bindings 4, 5) and of dS (6, 7).
const SPLIT_PARTS: &str = "st4(o(4u) + e, p.x);\nst5(o(5u) + e, p.y);\n\
                           st6(o(6u) + e, ds.x);\nst7(o(7u) + e, ds.y);\n";
/// Stores of P (binding 4) and dS (5) whole.
const WHOLE: &str = "st4(o(4u) + e, p.x);\nst5(o(5u) + e, ds.x);\n";
/// A pair of bf16 keys' parts as whole words: key `j` in the low half, `j + 1` in the high.
const BF16_WORDS: &str = "if (j + 1u >= params.k_len) { put_parts(row, j, x, delta); return; }
let w = (row * params.k_len + j) / 2u;
let p0 = parts(x.x);
let p1 = parts(y.x);
let d0 = parts(params.scale * x.x * (x.y - delta));
let d1 = parts(params.scale * y.x * (y.y - delta));
stw4(o(4u) / 2u + w, bf16_bits(p0.x) | (bf16_bits(p1.x) << 16u));
stw5(o(5u) / 2u + w, bf16_bits(p0.y) | (bf16_bits(p1.y) << 16u));
stw6(o(6u) / 2u + w, bf16_bits(d0.x) | (bf16_bits(d1.x) << 16u));
stw7(o(7u) / 2u + w, bf16_bits(d0.y) | (bf16_bits(d1.y) << 16u));
";

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

#[cfg(test)]
mod tests {
    use std::any::Any;
    use std::sync::{Arc, Mutex};

    use tessera_core::{Buffer, Limits};

    use super::*;
    use crate::gpu::{AttentionPass, Build, Caps, Dispatch};
    use crate::params::ParamBlock;
    use crate::source::source;

    /// Bytes a device would hold, never touched.
    #[derive(Debug)]
    struct Bytes(usize);

    impl Buffer for Bytes {
        fn len(&self) -> usize {
            self.0
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    /// A GPU that records what each dispatch would run, and runs nothing.
    struct Recorder {
        caps: Caps,
        runs: Mutex<Vec<(String, Source, bool)>>,
    }

    impl Gpu for Recorder {
        fn caps(&self) -> &Caps {
            &self.caps
        }
        fn backend(&self) -> &str {
            "recorder"
        }
        fn scratch(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
            Ok(Arc::new(Bytes(bytes)))
        }
        fn capacity(&self, buffer: &Arc<dyn Buffer>) -> Result<u64> {
            Ok(buffer.len() as u64)
        }
        fn dispatch(
            &self,
            dispatch: &Dispatch<'_>,
            source: &mut dyn FnMut() -> Result<Source>,
        ) -> Result<()> {
            let run = (dispatch.key.to_string(), source()?, dispatch.specialize);
            self.runs.lock().unwrap().push(run);
            Ok(())
        }
    }

    /// A GPU with bf16 tensor cores, and the backend's own attention kernels where
    /// `tensor_attention`.
    fn recorder(tensor_attention: bool) -> Recorder {
        Recorder {
            caps: Caps {
                limits: Limits {
                    max_buffer_bytes: 1 << 34,
                    max_binding_bytes: 1 << 32,
                    binding_align: 256,
                    max_workgroup_size: 1024,
                    max_workgroups_per_dim: 65535,
                    memory_bytes: None,
                },
                workgroup_memory: 48 << 10,
                coop_f16: true,
                coop_bf16: true,
                cpu: false,
                tensor_matmul: true,
                tensor_attention,
                immediate_words: 64,
                subgroups: true,
            },
            runs: Mutex::new(Vec::new()),
        }
    }

    /// What the backward of a causal bf16 attention of `[1, 2, 128, 64]` q, k and v
    /// dispatches on `gpu`.
    fn backward_runs(gpu: &Recorder) -> Vec<(String, Source, bool)> {
        let shape = [1, 2, 128, 64];
        let rows = Layout::contiguous(&shape);
        let lse = Layout::contiguous(&shape[..3]);
        // q, k, v, out, lse, dout, then dq, dk, dv; only the log-sum-exp is f32.
        let of = |i: usize| match i {
            4 => (&lse, DType::F32),
            _ => (&rows, DType::BF16),
        };
        let buffers: Vec<Arc<dyn Buffer>> = (0..9)
            .map(|i| {
                let (layout, dtype) = of(i);
                Arc::new(Bytes(layout.numel() * dtype.size())) as Arc<dyn Buffer>
            })
            .collect();
        let tensor = |i: usize| TensorRef {
            buffer: &buffers[i],
            layout: of(i).0,
            dtype: of(i).1,
        };
        let inputs: Vec<_> = (0..6).map(tensor).collect();
        let outputs: Vec<_> = (6..9).map(tensor).collect();
        let op = Op::AttentionBackward { causal: true };
        crate::attention::launch(gpu, &op, &inputs, &outputs, &[0.125]).unwrap();
        gpu.runs.lock().unwrap().drain(..).collect()
    }

    /// Where the backend has its own attention kernels, the scores' probabilities and
    /// gradients come from its kernel (compiled for the sizes, which fill whole blocks) and
    /// no row pass runs; elsewhere the row pass forms them between the products.
    #[test]
    fn the_scores_gradient_kernel_replaces_the_products_and_row_pass_where_the_backend_has_it() {
        let runs = backward_runs(&recorder(true));
        let scores = |run: &&(String, Source, bool)| {
            matches!(
                run.1,
                Source::TensorAttention(TensorAttention {
                    pass: AttentionPass::ScoresGradient,
                    ..
                })
            )
        };
        let kernel: Vec<_> = runs.iter().filter(scores).collect();
        assert_eq!(
            kernel.len(),
            1,
            "{:?}",
            runs.iter().map(|r| &r.0).collect::<Vec<_>>()
        );
        assert!(kernel[0].2, "compiled for the sizes");
        assert!(!runs.iter().any(|r| r.0.contains("scores_grad")));
        // dv, dq and dk, each as the product of two parts.
        let products = runs
            .iter()
            .filter(|r| matches!(r.1, Source::TensorMatmul(_)));
        assert_eq!(products.count(), 6);

        let runs = backward_runs(&recorder(false));
        assert!(!runs.iter().any(|r| scores(&r)));
        // The row pass, after S and dP as products too.
        assert_eq!(
            runs.iter().filter(|r| r.0.contains("scores_grad")).count(),
            1
        );
        let products = runs
            .iter()
            .filter(|r| matches!(r.1, Source::TensorMatmul(_)));
        assert_eq!(products.count(), 8);
    }

    /// The row pass runs only on devices with tensor cores (not lavapipe), so its WGSL is at
    /// least checked everywhere, for each dtype it writes, with and without subgroups.
    #[test]
    fn the_row_pass_is_valid_wgsl() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for subgroups in [false, true] {
                let mut bindings = vec![(DType::F32, false); 3];
                let parts = if dtype == DType::F32 { 2 } else { 4 };
                bindings.extend(vec![(dtype, true); parts]);
                for keys in [63, 64] {
                    let subst = row_pass_code(dtype, keys);
                    let build = Build {
                        immediate_words: Some(64),
                        subgroups,
                    };
                    let params = ScoresParams::wgsl();
                    let src = source(SRC, "scores_grad", &bindings, &subst, build, &params);
                    let words = dtype == DType::BF16 && keys == 64;
                    assert_eq!(src.contains("stw4(o(4u)"), words);
                    crate::source::assert_valid(&src, &format!("scores_grad {dtype:?} {keys}"));
                }
            }
        }
    }
}
