//! Fused neural-network functions: norms, rotary embeddings, attention, cross-entropy,
//! convolution, dropout and the global squared norm.

use std::sync::Arc;

use super::Tensor;
use crate::rng::RngState;
use crate::{is_grad_enabled, CompareOp, Conv2dParams, Device, Error, Layout, Op, Result};

impl Tensor {
    /// Layer norm over the last axis: `(x - mean) / sqrt(var + eps) * weight + bias`.
    pub fn layer_norm(&self, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
        Ok(Tensor::apply(&Op::LayerNorm, &[self, weight, bias], &[eps], None)?.remove(0))
    }

    /// RMS norm over the last axis: `x / sqrt(mean(x^2) + eps) * weight`.
    pub fn rms_norm(&self, weight: &Tensor, eps: f64) -> Result<Tensor> {
        Ok(Tensor::apply(&Op::RmsNorm, &[self, weight], &[eps], None)?.remove(0))
    }

    /// Rotates `[..., T, D]` by the `[T, D/2]` tables (rotate-half layout).
    pub fn rotary(&self, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        Ok(Tensor::apply(&Op::Rotary, &[self, cos, sin], &[], None)?.remove(0))
    }

    /// Fused attention of `q [B, Hq, Tq, D]` over `k`, `v [B, Hkv, Tk, D]`; with `causal`,
    /// query `i` sees keys up to position `i + Tk - Tq`.
    pub fn attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: f64,
    ) -> Result<Tensor> {
        Ok(Tensor::apply(&Op::Attention { causal }, &[q, k, v], &[scale], None)?.remove(0))
    }

    /// Causal attention of `q [B, Hq, Tq, D]` over a KV cache `k`, `v [B, Hkv, S, D]` whose
    /// query `i` sits at position `positions[i]` (a device tensor `[Tq]`, i32 or u32) and sees
    /// the keys up to it: decoding whose position lives on the device, so that a recorded step
    /// replays at every position. Inference only: it has no gradient.
    pub fn cached_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        positions: &Tensor,
        scale: f64,
    ) -> Result<Tensor> {
        if is_grad_enabled() && [q, k, v].iter().any(|t| t.tracks_grad()) {
            return Err(Error::invalid(
                "cached_attention",
                "has no gradient: run it under no_grad (decoding)",
            ));
        }
        Ok(Tensor::apply(&Op::CachedAttention, &[q, k, v, positions], &[scale], None)?.remove(0))
    }

    /// Writes `kv_new [2, B, Hkv, Tq, D]` (keys, then values) into the KV cache `kv [2, B, Hkv,
    /// S, D]` at `positions` in place (positions past `S` are skipped), then attends as
    /// [`Tensor::cached_attention`] over the cache's keys and values: a decoding step's cache
    /// write and attention, one launch where the backend fuses them. Inference only.
    pub fn append_attention(
        q: &Tensor,
        kv: &Tensor,
        positions: &Tensor,
        kv_new: &Tensor,
        scale: f64,
    ) -> Result<Tensor> {
        let tracked = [q, kv_new].iter().any(|t| t.tracks_grad());
        if kv.tracks_grad() || (is_grad_enabled() && tracked) {
            return Err(Error::invalid(
                "append_attention",
                "has no gradient and writes its cache in place: run it under no_grad \
                 (decoding) on a cache that records no gradient",
            ));
        }
        let (q, positions, kv_new) = (
            q.contiguous()?,
            positions.contiguous()?,
            kv_new.contiguous()?,
        );
        let bytes = q.numel() * q.dtype().size();
        let device = q.device().clone();
        let out = Tensor::from_parts(
            device.alloc(bytes)?,
            Layout::contiguous(q.shape()),
            q.dtype(),
            device,
        );
        Tensor::apply_in_place(
            &Op::AppendAttention,
            &[&q, kv, &positions, &kv_new],
            &[&out, kv],
            &[scale],
        )?;
        Ok(out)
    }

    /// Per-row cross-entropy of `[N, V]` logits against `[N]` targets (f32; f64 for f64);
    /// targets outside `0..V` give 0.
    pub fn cross_entropy_rows(&self, targets: &Tensor) -> Result<Tensor> {
        Ok(Tensor::apply(&Op::CrossEntropy, &[self, targets], &[], None)?.remove(0))
    }

    /// Mean cross-entropy over the rows whose target is in `0..V` (PyTorch's
    /// `ignore_index` behaviour), computed without a host round trip. A rank-0 tensor.
    pub fn cross_entropy(&self, targets: &Tensor) -> Result<Tensor> {
        self.cross_entropy_of(targets, self.shape().last().copied().unwrap_or(0))
    }

    /// [`Tensor::cross_entropy`] over the first `classes` columns, where the others' logits
    /// are too low to take any probability (a padded vocabulary's): rows whose target is
    /// not in `0..classes` are ignored.
    pub(crate) fn cross_entropy_of(&self, targets: &Tensor, classes: usize) -> Result<Tensor> {
        if self.rank() != 2 {
            return Err(Error::shape(
                "cross_entropy",
                format!(
                    "logits must be [N, V]; got {:?} {}",
                    self.shape(),
                    self.dtype()
                ),
            ));
        }
        let rows = self.cross_entropy_rows(targets)?;
        let stats = rows.dtype();
        let device = self.device();
        // Compared in the targets' own integer dtype: exact, and available on every backend.
        let low = Tensor::scalar(0.0, targets.dtype(), device)?;
        let high = Tensor::scalar(classes as f64, targets.dtype(), device)?;
        let valid = targets
            .compare_to(&low, CompareOp::Ge)?
            .to_dtype(stats)?
            .mul(&targets.compare_to(&high, CompareOp::Lt)?.to_dtype(stats)?)?;
        let count = valid
            .sum_all()?
            .maximum(&Tensor::scalar(1.0, stats, device)?)?;
        // A target among padded columns is a row the op did not ignore.
        let rows = if classes < self.shape()[1] {
            rows.mul(&valid)?
        } else {
            rows
        };
        rows.sum_all()?.div(&count)
    }

    fn compare_to(&self, other: &Tensor, op: CompareOp) -> Result<Tensor> {
        let other = other.expand(self.shape())?;
        Ok(Tensor::apply(&Op::Compare(op), &[self, &other], &[], None)?.remove(0))
    }

    /// 2-D convolution of `[N, C, H, W]` by `[O, C, KH, KW]` (cross-correlation, groups 1).
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        params: Conv2dParams,
    ) -> Result<Tensor> {
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        Ok(Tensor::apply(
            &Op::Conv2d {
                params,
                bias: bias.is_some(),
            },
            &inputs,
            &[],
            None,
        )?
        .remove(0))
    }

    /// Inverted dropout: zeroes each element with probability `p` and scales the rest by
    /// `1 / (1 - p)`. The mask comes from the keyed generator, so it is the same on every
    /// backend.
    pub fn dropout(&self, p: f64, rng: &mut RngState) -> Result<Tensor> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid(
                "dropout",
                format!("probability must be in [0, 1); got {p}"),
            ));
        }
        if p == 0.0 {
            return Ok(self.clone());
        }
        let u = Tensor::rand_uniform(self.shape(), 0.0, 1.0, self.dtype(), rng, self.device())?;
        let threshold = Tensor::scalar(p, self.dtype(), self.device())?;
        let keep = u
            .compare_to(&threshold, CompareOp::Ge)?
            .to_dtype(self.dtype())?;
        self.mul(&keep.mul_scalar(1.0 / (1.0 - p))?)
    }

    /// The sum of squares of every element of every tensor, as a `[1]` tensor on their
    /// device (f32; f64 for f64). Never recorded.
    pub fn squared_norm(tensors: &[&Tensor]) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::invalid("squared_norm", "needs at least one tensor"))?;
        let device: Arc<dyn Device> = first.device().clone();
        let _guard = super::no_grad();
        Ok(Tensor::apply_on(&device, &Op::SquaredNorm, tensors, &[], None)?.remove(0))
    }
}
