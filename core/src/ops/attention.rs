//! Rotary embeddings and fused attention.
//!
//! - `Rotary`: `(x [..., T, D], cos [T, D/2], sin [T, D/2])`, D even, one float dtype, to `y`
//!   of `x`'s shape, rotating the two halves of each row (the "rotate half" layout of GPT-NeoX
//!   and Hugging Face Llama): for `i < D/2`,
//!   `y[i] = x[i] cos[t,i] - x[i + D/2] sin[t,i]` and
//!   `y[i + D/2] = x[i + D/2] cos[t,i] + x[i] sin[t,i]`. Its transpose is the same op with
//!   `-sin`, which is how the gradient is taken. Decoding at an offset passes the rows of
//!   `cos`/`sin` for those positions.
//! - `Attention { causal }`: `(q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv])`, scalar
//!   `scale`, `Hq` a multiple of `Hkv` (query head `h` uses key/value head `h / (Hq / Hkv)`),
//!   to `(out [B, Hq, Tq, Dv], lse [B, Hq, Tq])` with
//!   `out = softmax(scale q k^T + mask) v` and `lse` the log-sum-exp of each masked score row
//!   (f32, f64 for f64). With `causal`, query `i` sits at position `i + Tk - Tq` (a KV cache
//!   holds the earlier keys) and sees keys `j <= i + Tk - Tq`; this needs `Tk >= Tq`. Any
//!   `Tq`, `Tk` and head dim; a row with no visible key gives zeros and `lse = -inf`.
//! - `AttentionBackward { causal }`: `(q, k, v, out, lse, dout)`, scalar `scale`, to
//!   `(dq, dk, dv)`; the gradients of key/value heads shared by several query heads are summed
//!   in a fixed order.
//! - `CachedAttention`: `(q [B, Hq, Tq, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv], positions [Tq]
//!   i32/u32)`, scalar `scale`, to `out [B, Hq, Tq, Dv]`: causal attention over a KV cache of
//!   capacity `S` whose filled length is known only on the device (a replayed decoding step,
//!   as `flash_attn_with_kvcache` with cache lengths). Query `i` sits at position
//!   `positions[i]` and sees keys `j <= positions[i]`, `j < S`; the keys past it are never
//!   read, so cache rows not yet written may hold anything. Scores and softmax as `Attention`.
//!   Forward only: no log-sum-exp, no gradient.
//! - `AppendAttention`: `(q [B, Hq, Tq, D], kv [2, B, Hkv, S, D], positions [Tq] i32/u32, kv_new
//!   [2, B, Hkv, Tq, D])`, scalar `scale`, to `(out [B, Hq, Tq, D], kv)`: writes the new keys
//!   and values `kv_new` into the cache `kv` (keys, then values) at `positions` in place, as
//!   `IndexCopy { axis: 3 }` (positions past `S` are not written), then attends as
//!   `CachedAttention` over `kv`'s keys and values: a decoding step's cache write and attention,
//!   one launch where a backend fuses them. Output 1 is input 1, updated.

use super::{
    require_float, require_index, require_same_dtype, specs_str, stats_dtype, Op, TensorSpec,
};
use crate::{Error, Result};

pub(super) fn infer(op: &Op, name: &str, inputs: &[TensorSpec]) -> Result<Vec<TensorSpec>> {
    let err = |what: &str| Error::shape(name, format!("{what}; got {}", specs_str(inputs)));
    match op {
        Op::Rotary => {
            require_float(name, inputs, &[0, 1, 2])?;
            require_same_dtype(name, inputs, &[0, 1, 2])?;
            let x = &inputs[0].shape;
            let r = x.len();
            if r < 2 || !x[r - 1].is_multiple_of(2) {
                return Err(err("x must be [..., T, D] with D even"));
            }
            let half = [x[r - 2], x[r - 1] / 2];
            if inputs[1].shape != half || inputs[2].shape != half {
                return Err(err("cos and sin must be [T, D/2]"));
            }
            Ok(vec![inputs[0].clone()])
        }
        Op::Attention { causal } | Op::AttentionBackward { causal } => {
            let data: Vec<usize> = if matches!(op, Op::Attention { .. }) {
                vec![0, 1, 2]
            } else {
                vec![0, 1, 2, 3, 5]
            };
            require_float(name, inputs, &data)?;
            require_same_dtype(name, inputs, &data)?;
            let (q, k, v) = (&inputs[0].shape, &inputs[1].shape, &inputs[2].shape);
            if q.len() != 4 || k.len() != 4 || v.len() != 4 {
                return Err(err("q, k, v must be [B, H, T, D]"));
            }
            let (b, hq, tq, d) = (q[0], q[1], q[2], q[3]);
            let (hkv, tk, dv) = (k[1], k[2], v[3]);
            if k[0] != b || v[0] != b || k[3] != d || v[1] != hkv || v[2] != tk {
                return Err(err("k must be [B, Hkv, Tk, D] and v [B, Hkv, Tk, Dv]"));
            }
            if hkv == 0 || hq % hkv != 0 {
                return Err(err("query heads must be a multiple of key/value heads"));
            }
            if *causal && tk < tq {
                return Err(err(
                    "causal attention needs at least as many keys as queries",
                ));
            }
            let out = TensorSpec::new(&[b, hq, tq, dv], inputs[0].dtype);
            let lse = TensorSpec::new(&[b, hq, tq], stats_dtype(inputs[0].dtype));
            if matches!(op, Op::Attention { .. }) {
                return Ok(vec![out, lse]);
            }
            if inputs[3].shape != out.shape || inputs[5].shape != out.shape {
                return Err(err("out and dout must be [B, Hq, Tq, Dv]"));
            }
            if inputs[4] != lse {
                return Err(err(&format!("lse must be {:?} {}", lse.shape, lse.dtype)));
            }
            Ok(vec![
                inputs[0].clone(),
                inputs[1].clone(),
                inputs[2].clone(),
            ])
        }
        Op::CachedAttention => {
            require_float(name, inputs, &[0, 1, 2])?;
            require_same_dtype(name, inputs, &[0, 1, 2])?;
            require_index(name, inputs, 3)?;
            let (q, k, v) = (&inputs[0].shape, &inputs[1].shape, &inputs[2].shape);
            let fits = q.len() == 4
                && k.len() == 4
                && v.len() == 4
                && k[0] == q[0]
                && v[0] == q[0]
                && k[3] == q[3]
                && v[1] == k[1]
                && v[2] == k[2]
                && k[1] > 0
                && q[1] % k[1] == 0
                && inputs[3].shape == [q[2]];
            if !fits {
                return Err(err(
                    "need q [B, Hq, Tq, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv] with Hq a \
                     multiple of Hkv, and positions [Tq]",
                ));
            }
            Ok(vec![TensorSpec::new(
                &[q[0], q[1], q[2], v[3]],
                inputs[0].dtype,
            )])
        }
        Op::AppendAttention => {
            require_float(name, inputs, &[0, 1, 3])?;
            require_same_dtype(name, inputs, &[0, 1, 3])?;
            require_index(name, inputs, 2)?;
            let (q, kv, new) = (&inputs[0].shape, &inputs[1].shape, &inputs[3].shape);
            let fits = q.len() == 4
                && kv.len() == 5
                && kv[0] == 2
                && kv[1] == q[0]
                && kv[4] == q[3]
                && kv[2] > 0
                && q[1] % kv[2] == 0
                && *new == [2, q[0], kv[2], q[2], q[3]]
                && inputs[2].shape == [q[2]];
            if !fits {
                return Err(err(
                    "need q [B, Hq, Tq, D], kv [2, B, Hkv, S, D] with Hq a multiple of Hkv, \
                     positions [Tq] and kv_new [2, B, Hkv, Tq, D]",
                ));
            }
            Ok(vec![inputs[0].clone(), inputs[1].clone()])
        }
        _ => unreachable!("not an attention op: {op:?}"),
    }
}
