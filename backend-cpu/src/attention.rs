//! Rotary embeddings and attention, forward and backward, and attention over a KV cache at
//! positions read from the device (`CachedAttention`, the forward with other visible keys).
//!
//! Attention runs one query row at a time: each task holds one row of scores (`Tk` values),
//! never a whole score matrix. The backward pass runs one task per (batch, key/value head),
//! which owns that head's `dk`, `dv` and the `dq` of its query heads, and loops over the query
//! heads and rows in order, so shared key/value gradients are summed deterministically.

use rayon::prelude::*;
use tessera_core::{Op, Result, TensorRef};

use crate::buffer::{read, read_index, write};
use crate::float::{computes_in_f64, Float};
use crate::wrong_family;

pub(crate) fn launch(
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    if computes_in_f64(inputs[0].dtype) {
        run::<f64>(op, inputs, outputs, s)
    } else {
        run::<f32>(op, inputs, outputs, s)
    }
}

/// Sizes of one attention launch.
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
    causal: bool,
}

impl Dims {
    fn new(inputs: &[TensorRef<'_>], causal: bool) -> Dims {
        let (q, k, v) = (
            &inputs[0].layout.shape,
            &inputs[1].layout.shape,
            &inputs[2].layout.shape,
        );
        Dims {
            b: q[0],
            hq: q[1],
            hkv: k[1],
            tq: q[2],
            tk: k[2],
            d: q[3],
            dv: v[3],
            causal,
        }
    }

    /// Query heads per key/value head.
    fn group(&self) -> usize {
        self.hq / self.hkv.max(1)
    }

    /// Keys visible to query row `i`: `0..visible(i)`.
    fn visible(&self, i: usize) -> usize {
        if self.causal {
            (i + self.tk - self.tq + 1).min(self.tk)
        } else {
            self.tk
        }
    }
}

fn dot<F: Float>(a: &[F], b: &[F]) -> F {
    a.iter().zip(b).fold(F::zero(), |acc, (&x, &y)| acc + x * y)
}

fn run<F: Float>(
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    match op {
        Op::Rotary => rotary::<F>(inputs, outputs),
        Op::Attention { causal } => {
            let dims = Dims::new(inputs, *causal);
            forward::<F>(dims, F::of_f64(s[0]), |i| dims.visible(i), inputs, outputs)
        }
        Op::CachedAttention => {
            let dims = Dims::new(inputs, true);
            let positions = read_index(&inputs[3])?;
            // Keys up to the query's position, within the cache.
            let visible =
                |i: usize| usize::try_from(positions[i]).map_or(0, |p| (p + 1).min(dims.tk));
            forward::<F>(dims, F::of_f64(s[0]), visible, inputs, outputs)
        }
        Op::AttentionBackward { causal } => {
            backward::<F>(Dims::new(inputs, *causal), F::of_f64(s[0]), inputs, outputs)
        }
        _ => Err(wrong_family(op)),
    }
}

fn rotary<F: Float>(inputs: &[TensorRef<'_>], outputs: &[TensorRef<'_>]) -> Result<()> {
    let shape = &inputs[0].layout.shape;
    let (t, d) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let half = d / 2;
    let x = read::<F>(&inputs[0])?;
    let (cos, sin) = (read::<F>(&inputs[1])?, read::<F>(&inputs[2])?);
    if x.is_empty() {
        return write(&outputs[0], &x);
    }
    let mut y = vec![F::zero(); x.len()];
    y.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .enumerate()
        .with_min_len(crate::float::rows_per_task(d))
        .for_each(|(row, (y, x))| {
            let pos = row % t;
            let (c, s) = (
                &cos[pos * half..(pos + 1) * half],
                &sin[pos * half..(pos + 1) * half],
            );
            for i in 0..half {
                y[i] = x[i] * c[i] - x[i + half] * s[i];
                y[i + half] = x[i + half] * c[i] + x[i] * s[i];
            }
        });
    write(&outputs[0], &y)
}

/// Attention forward; query row `i` sees keys `0..visible(i)`. The log-sum-exp is written
/// where the op has that output (not `CachedAttention`).
fn forward<F: Float>(
    dims: Dims,
    scale: F,
    visible: impl Fn(usize) -> usize + Sync,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    let Dims {
        b,
        hq,
        tq,
        tk,
        d,
        dv,
        ..
    } = dims;
    let group = dims.group();
    let (q, k, v) = (
        read::<F>(&inputs[0])?,
        read::<F>(&inputs[1])?,
        read::<F>(&inputs[2])?,
    );
    let rows = b * hq * tq;
    // One output row and its log-sum-exp per query row; `scores` is the task's scratch row.
    let results: Vec<(Vec<F>, F)> = (0..rows)
        .into_par_iter()
        .map_init(
            || vec![F::zero(); tk],
            |scores, row| {
                let (bh, i) = (row / tq.max(1), row % tq.max(1));
                let kv = (bh / hq) * dims.hkv + (bh % hq) / group;
                let qi = &q[row * d..(row + 1) * d];
                let keys = &k[kv * tk * d..(kv + 1) * tk * d];
                let values = &v[kv * tk * dv..(kv + 1) * tk * dv];
                let n = visible(i);
                let mut out = vec![F::zero(); dv];
                if n == 0 {
                    return (out, F::neg_infinity());
                }
                let mut max = F::neg_infinity();
                for (j, sc) in scores[..n].iter_mut().enumerate() {
                    *sc = scale * dot(qi, &keys[j * d..(j + 1) * d]);
                    if *sc > max || sc.is_nan() {
                        max = *sc;
                    }
                }
                let mut sum = F::zero();
                for (j, &sc) in scores[..n].iter().enumerate() {
                    let p = (sc - max).exp();
                    sum += p;
                    for (o, &vv) in out.iter_mut().zip(&values[j * dv..(j + 1) * dv]) {
                        *o += p * vv;
                    }
                }
                for o in out.iter_mut() {
                    *o /= sum;
                }
                (out, max + sum.ln())
            },
        )
        .collect();
    let mut out = Vec::with_capacity(rows * dv);
    let mut lse = Vec::with_capacity(rows);
    for (row, l) in results {
        out.extend_from_slice(&row);
        lse.push(l);
    }
    write(&outputs[0], &out)?;
    match outputs.get(1) {
        Some(lse_out) => write(lse_out, &lse),
        None => Ok(()),
    }
}

fn backward<F: Float>(
    dims: Dims,
    scale: F,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    let Dims {
        b,
        hq,
        hkv,
        tq,
        tk,
        d,
        dv,
        ..
    } = dims;
    let group = dims.group();
    let (q, k, v) = (
        read::<F>(&inputs[0])?,
        read::<F>(&inputs[1])?,
        read::<F>(&inputs[2])?,
    );
    // `out` (input 3) is not read: `delta` below is formed from `p` and `dp` instead.
    let (lse, dout) = (read::<F>(&inputs[4])?, read::<F>(&inputs[5])?);
    // Per (batch, kv head): dq of its `group` query heads, then its dk and dv.
    let blocks: Vec<(Vec<F>, Vec<F>, Vec<F>)> = (0..b * hkv)
        .into_par_iter()
        .map(|task| {
            let (bi, kv) = (task / hkv, task % hkv);
            let keys = &k[task * tk * d..(task + 1) * tk * d];
            let values = &v[task * tk * dv..(task + 1) * tk * dv];
            let mut dq = vec![F::zero(); group * tq * d];
            let mut dk = vec![F::zero(); tk * d];
            let mut dvv = vec![F::zero(); tk * dv];
            let (mut p, mut dp) = (vec![F::zero(); tk], vec![F::zero(); tk]);
            for g in 0..group {
                let h = kv * group + g;
                for i in 0..tq {
                    let row = (bi * hq + h) * tq + i;
                    let n = dims.visible(i);
                    let qi = &q[row * d..(row + 1) * d];
                    let doi = &dout[row * dv..(row + 1) * dv];
                    // delta = sum_j p_j dp_j, which equals `dout . out` but does not inherit
                    // the rounding of an f16/bf16 `out`.
                    let mut delta = F::zero();
                    for j in 0..n {
                        p[j] = (scale * dot(qi, &keys[j * d..(j + 1) * d]) - lse[row]).exp();
                        dp[j] = dot(doi, &values[j * dv..(j + 1) * dv]);
                        delta += p[j] * dp[j];
                    }
                    let dqi = &mut dq[(g * tq + i) * d..(g * tq + i + 1) * d];
                    for j in 0..n {
                        let ds = p[j] * (dp[j] - delta);
                        for (dq, &kk) in dqi.iter_mut().zip(&keys[j * d..(j + 1) * d]) {
                            *dq += scale * ds * kk;
                        }
                        for (dk, &qq) in dk[j * d..(j + 1) * d].iter_mut().zip(qi) {
                            *dk += scale * ds * qq;
                        }
                        for (dv, &g) in dvv[j * dv..(j + 1) * dv].iter_mut().zip(doi) {
                            *dv += p[j] * g;
                        }
                    }
                }
            }
            (dq, dk, dvv)
        })
        .collect();
    let (mut dq, mut dk, mut dvs) = (Vec::new(), Vec::new(), Vec::new());
    for (q, k, v) in blocks {
        dq.extend_from_slice(&q);
        dk.extend_from_slice(&k);
        dvs.extend_from_slice(&v);
    }
    write(&outputs[0], &dq)?;
    write(&outputs[1], &dk)?;
    write(&outputs[2], &dvs)
}
