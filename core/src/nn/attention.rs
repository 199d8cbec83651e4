//! Causal self-attention with grouped-query heads, rotary embeddings and a KV cache.

use std::sync::{Arc, Mutex, PoisonError};

use super::{join, Linear, Module, PreNormed};
use crate::{DType, Device, Result, Tensor};

/// Rotary position tables `[positions, head_dim / 2]`, computed as Hugging Face Llama
/// computes them (inverse frequencies and angles in f32), then converted to the model dtype.
///
/// The tables cover the positions used so far, grown (at least doubled) when a sequence
/// reaches past them, up to `max_positions`: a config's `max_position_embeddings` says how
/// far a model may go, and building tables that far ahead would cost gigabytes for large
/// values before any token is seen. A row depends only on its position, so growing changes
/// no value.
pub struct Rotary {
    head_dim: usize,
    max_positions: usize,
    theta: f64,
    dtype: DType,
    device: Arc<dyn Device>,
    /// cos and sin over the positions covered so far.
    tables: Mutex<Option<(Tensor, Tensor)>>,
}

/// Positions the tables cover at least once built, so that decoding grows them seldom.
const MIN_ROWS: usize = 256;

impl Rotary {
    pub fn new(
        head_dim: usize,
        max_positions: usize,
        theta: f64,
        dtype: DType,
        device: &Arc<dyn Device>,
    ) -> Result<Self> {
        Ok(Rotary {
            head_dim,
            max_positions,
            theta,
            dtype,
            device: device.clone(),
            tables: Mutex::new(None),
        })
    }

    /// cos and sin over at least the first `needed` positions (at most `max_positions`).
    fn tables(&self, needed: usize) -> Result<(Tensor, Tensor)> {
        let mut tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        let covered = tables.as_ref().map_or(0, |(cos, _)| cos.shape()[0]);
        if let Some((cos, sin)) = tables.as_ref().filter(|_| covered >= needed) {
            return Ok((cos.clone(), sin.clone()));
        }
        let rows = needed
            .max(2 * covered)
            .max(MIN_ROWS)
            .min(self.max_positions);
        let half = self.head_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / (self.theta as f32).powf((2 * i) as f32 / self.head_dim as f32))
            .collect();
        let mut cos = Vec::with_capacity(rows * half);
        let mut sin = Vec::with_capacity(rows * half);
        for pos in 0..rows {
            for &f in &inv_freq {
                let angle = pos as f32 * f;
                cos.push(f64::from(angle.cos()));
                sin.push(f64::from(angle.sin()));
            }
        }
        let built = (
            Tensor::from_f64(&cos, &[rows, half], self.dtype, &self.device)?,
            Tensor::from_f64(&sin, &[rows, half], self.dtype, &self.device)?,
        );
        *tables = Some(built.clone());
        Ok(built)
    }

    /// Rotates `x [B, H, T, D]` whose first row is at position `start`.
    pub fn apply(&self, x: &Tensor, start: usize) -> Result<Tensor> {
        let &[_, _, t, _] = x.shape() else {
            return Err(crate::Error::shape(
                "rotary",
                format!("x must be [B, H, T, D]; got {:?}", x.shape()),
            ));
        };
        let end = start
            .checked_add(t)
            .filter(|&end| end <= self.max_positions);
        let Some(end) = end else {
            return Err(crate::Error::Index {
                op: "rotary".into(),
                index: start.saturating_add(t) as isize,
                size: self.max_positions,
                shape: x.shape().to_vec(),
            });
        };
        let (cos, sin) = self.tables(end)?;
        x.rotary(&cos.narrow(0, start, t)?, &sin.narrow(0, start, t)?)
    }

    /// Rotates `x [B, H, T, D]` whose rows sit at `positions [T]` (a device tensor), with
    /// tables covering the first `covered` positions (the cache's capacity): the rows are
    /// looked up on the device.
    pub fn apply_at(&self, x: &Tensor, positions: &Tensor, covered: usize) -> Result<Tensor> {
        let (cos, sin) = self.tables(covered.min(self.max_positions))?;
        x.rotary(&cos.embedding(positions)?, &sin.embedding(positions)?)
    }
}

/// Where a forward pass's tokens sit in their sequences.
#[derive(Clone, Copy, Debug)]
pub enum Positions<'a> {
    /// Known on the host: `start..start + T` (training, prompts, sampled decoding).
    From(usize),
    /// In a device tensor `[T]` (i32), with a KV cache of fixed capacity: a decoding step
    /// whose launches are the same at every position, so that it is recorded once and
    /// replayed ([`crate::ReplayedStep`]).
    Device(&'a Tensor),
}

/// Cached keys and values of every layer, for incremental decoding.
#[derive(Default)]
pub struct KvCache {
    pub layers: Vec<Option<LayerCache>>,
    /// A fixed capacity in positions (`None`: grown as needed).
    capacity: Option<usize>,
}

impl KvCache {
    pub fn new(layers: usize) -> Self {
        KvCache {
            layers: (0..layers).map(|_| None).collect(),
            capacity: None,
        }
    }

    /// A cache of `capacity` positions, allocated at once and never grown or moved: what
    /// forward passes at device positions ([`Positions::Device`]) write into, so that every
    /// step's launches see the same buffers. Its [`KvCache::len`] counts the positions
    /// written at host positions only (the device ones are known on the device).
    pub fn with_capacity(layers: usize, capacity: usize) -> Self {
        KvCache {
            capacity: Some(capacity),
            ..KvCache::new(layers)
        }
    }

    /// The fixed capacity, if any.
    pub fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// Empties the cache unless it has one slot per layer of a model of `layers`.
    pub(crate) fn fit_layers(&mut self, layers: usize) {
        if self.layers.len() != layers {
            self.layers = (0..layers).map(|_| None).collect();
        }
    }

    /// Positions already cached.
    pub fn len(&self) -> usize {
        self.layers
            .first()
            .and_then(|l| l.as_ref())
            .map_or(0, |c| c.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One layer's keys and values: one buffer `[2, B, Hkv, capacity, D]` (keys, then values)
/// whose first `len` positions are filled. New positions are written in place and attention
/// reads views of the filled part (it reads keys and values with heads further apart than
/// their rows), so a decoding step writes one row per head instead of copying the whole
/// cache; a full buffer grows to twice its capacity, copied once. Keys and values share the
/// buffer so that a fused projection's keys and values go in with one copy.
pub struct LayerCache {
    kv: Tensor,
    /// Views of `kv`'s keys and values, `[B, Hkv, capacity, D]` each, taken while `kv` is
    /// whole (a selection of a partly filled view would be copied to make it row-major).
    k: Tensor,
    v: Tensor,
    len: usize,
}

/// The smallest capacity a cache starts with, in positions.
const MIN_CAPACITY: usize = 64;

impl LayerCache {
    /// Appends `k` and `v` (`[B, Hkv, T, D]`) to the cache in `slot`, creating or growing it
    /// as needed (up to `fixed` positions where given), and returns views of every cached
    /// position.
    fn append(
        slot: &mut Option<LayerCache>,
        fixed: Option<usize>,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let t = k.shape()[2];
        let cache = Self::reserve(slot, fixed, k.shape(), k.dtype(), k.device(), t)?;
        cache.k.narrow(2, cache.len, t)?.copy_from(k)?;
        cache.v.narrow(2, cache.len, t)?.copy_from(v)?;
        cache.filled(t)
    }

    /// As [`LayerCache::append`] for keys and values stacked as `kv [2, B, Hkv, T, D]` (a
    /// view of a fused projection's output): one copy.
    fn append_stacked(
        slot: &mut Option<LayerCache>,
        fixed: Option<usize>,
        kv: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let t = kv.shape()[3];
        let cache = Self::reserve(slot, fixed, &kv.shape()[1..], kv.dtype(), kv.device(), t)?;
        cache.kv.narrow(3, cache.len, t)?.copy_from(kv)?;
        cache.filled(t)
    }

    /// Writes keys and values stacked as `kv [2, B, Hkv, T, D]` at `positions [T]` (device)
    /// into the cache of `capacity` positions in `slot`, and attends with `q` over the whole
    /// cache ([`Tensor::append_attention`]: the write and the attention in one launch).
    fn attend_at(
        slot: &mut Option<LayerCache>,
        capacity: usize,
        q: &Tensor,
        kv: &Tensor,
        positions: &Tensor,
        scale: f64,
    ) -> Result<Tensor> {
        let cache = Self::reserve(
            slot,
            Some(capacity),
            &kv.shape()[1..],
            kv.dtype(),
            kv.device(),
            0,
        )?;
        Tensor::append_attention(q, &cache.kv, positions, kv, scale)
    }

    /// The cache in `slot` with room for `t` more positions of keys of shape `[B, Hkv, T,
    /// D]`, created or grown as needed; a cache of `fixed` capacity is created at that size
    /// and never grows.
    fn reserve<'a>(
        slot: &'a mut Option<LayerCache>,
        fixed: Option<usize>,
        shape: &[usize],
        dtype: DType,
        device: &Arc<dyn Device>,
        t: usize,
    ) -> Result<&'a mut LayerCache> {
        let len = slot.as_ref().map_or(0, |c| c.len);
        let capacity = slot.as_ref().map_or(0, |c| c.kv.shape()[3]);
        if let Some(fixed) = fixed.filter(|&f| len + t > f) {
            return Err(crate::Error::invalid(
                "kv_cache",
                format!("{} positions do not fit a cache of {fixed}", len + t),
            ));
        }
        if slot.is_none() || len + t > capacity {
            let capacity = fixed.unwrap_or((len + t).max(2 * capacity).max(MIN_CAPACITY));
            let mut whole = vec![2];
            whole.extend_from_slice(shape);
            whole[3] = capacity;
            let kv = Tensor::zeros(&whole, dtype, device)?;
            if let Some(old) = slot.take() {
                kv.narrow(3, 0, len)?
                    .copy_from(&old.kv.narrow(3, 0, len)?)?;
            }
            let (k, v) = (kv.select(0, 0)?, kv.select(0, 1)?);
            *slot = Some(LayerCache { kv, k, v, len });
        }
        slot.as_mut()
            .ok_or_else(|| crate::Error::invalid("kv_cache", "no cache after growing it"))
    }

    /// Counts `t` appended positions and returns views of the keys and values of all.
    fn filled(&mut self, t: usize) -> Result<(Tensor, Tensor)> {
        self.len += t;
        Ok((
            self.k.narrow(2, 0, self.len)?,
            self.v.narrow(2, 0, self.len)?,
        ))
    }
}

/// How queries, keys and values are projected.
pub enum QkvProjection {
    /// One matrix producing `[q | k | v]` (GPT-2's `c_attn`).
    Fused(Linear),
    /// Separate projections (Llama's `q_proj`, `k_proj`, `v_proj`).
    Split { q: Linear, k: Linear, v: Linear },
}

pub struct CausalSelfAttention {
    pub qkv: QkvProjection,
    pub out: Linear,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub rotary: Option<Arc<Rotary>>,
    /// Hugging Face names of the fused projection and the output projection.
    pub names: [&'static str; 2],
}

impl CausalSelfAttention {
    /// `norm(x)` for `x [B, T, C]` at `positions` to `[B, T, C]`, plus `residual` if given
    /// (added in the output projection's matmul). With a cache (of `capacity` positions where
    /// fixed), the new keys and values are appended (written at the device positions) and
    /// attention covers every cached position up to each query's.
    pub fn forward(
        &self,
        x: PreNormed<'_>,
        positions: Positions<'_>,
        cache: Option<(&mut Option<LayerCache>, Option<usize>)>,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        let &[b, t, _] = x.x.shape() else {
            return Err(crate::Error::shape(
                "attention",
                format!("x must be [B, T, C]; got {:?} {}", x.x.shape(), x.x.dtype()),
            ));
        };
        let (hq, hkv, d) = (self.n_head, self.n_kv_head, self.head_dim);
        let heads = |t_: Tensor, h: usize| -> Result<Tensor> {
            t_.reshape(&[b, t, h, d])?.transpose(1, 2)?.contiguous()
        };
        let scale = 1.0 / (d as f64).sqrt();
        if let Positions::Device(at) = positions {
            let Some((slot, Some(capacity))) = cache else {
                return Err(crate::Error::invalid(
                    "attention",
                    "device positions need a KV cache of fixed capacity",
                ));
            };
            let (q, kv) = match (&self.qkv, &self.rotary) {
                // GPT-2: keys and values go into the cache from the projection's output.
                (QkvProjection::Fused(lin), None) if hq == hkv => {
                    let y = x
                        .linear(&lin.weight, lin.bias.as_ref(), None, None)?
                        .reshape(&[b, t, 3, hq, d])?;
                    let q = y.select(2, 0)?.transpose(1, 2)?.contiguous()?;
                    (q, y.narrow(2, 1, 2)?.permute(&[2, 0, 3, 1, 4])?)
                }
                _ => {
                    let (q, k, v) = self.project(x)?;
                    let (mut q, mut k, v) = (heads(q, hq)?, heads(k, hkv)?, heads(v, hkv)?);
                    if let Some(rot) = &self.rotary {
                        q = rot.apply_at(&q, at, capacity)?;
                        k = rot.apply_at(&k, at, capacity)?;
                    }
                    (q, Tensor::cat(&[&k.unsqueeze(0)?, &v.unsqueeze(0)?], 0)?)
                }
            };
            let y = LayerCache::attend_at(slot, capacity, &q, &kv, at, scale)?;
            let y = y.transpose(1, 2)?.reshape(&[b, t, hq * d])?;
            return self.out.forward_plus(&y, residual);
        }
        let Positions::From(start) = positions else {
            unreachable!("device positions returned above")
        };
        let (q, k, v) = match (&self.qkv, cache) {
            // A fused projection's keys and values without rotary embedding (GPT-2) go into
            // the cache straight from the projection's output, with one copy.
            (QkvProjection::Fused(lin), Some((slot, fixed)))
                if self.rotary.is_none() && hq == hkv =>
            {
                let y = x
                    .linear(&lin.weight, lin.bias.as_ref(), None, None)?
                    .reshape(&[b, t, 3, hq, d])?;
                let q = y.select(2, 0)?.transpose(1, 2)?.contiguous()?;
                let kv = y.narrow(2, 1, 2)?.permute(&[2, 0, 3, 1, 4])?;
                let (k, v) = LayerCache::append_stacked(slot, fixed, &kv)?;
                (q, k, v)
            }
            (_, cache) => {
                let (q, k, v) = self.project(x)?;
                let (mut q, mut k, mut v) = (heads(q, hq)?, heads(k, hkv)?, heads(v, hkv)?);
                if let Some(rot) = &self.rotary {
                    q = rot.apply(&q, start)?;
                    k = rot.apply(&k, start)?;
                }
                if let Some((slot, fixed)) = cache {
                    (k, v) = LayerCache::append(slot, fixed, &k, &v)?;
                }
                (q, k, v)
            }
        };
        let y = Tensor::attention(&q, &k, &v, true, scale)?;
        let y = y.transpose(1, 2)?.reshape(&[b, t, hq * d])?;
        self.out.forward_plus(&y, residual)
    }

    /// Queries, keys and values of `norm(x)` for `x [B, T, C]`, each `[B, T, heads * D]`:
    /// one product with the norm folded in, or the norm once and three products.
    fn project(&self, x: PreNormed<'_>) -> Result<(Tensor, Tensor, Tensor)> {
        let (hq, hkv, d) = (self.n_head, self.n_kv_head, self.head_dim);
        Ok(match &self.qkv {
            QkvProjection::Fused(lin) => {
                let y = x.linear(&lin.weight, lin.bias.as_ref(), None, None)?;
                (
                    y.narrow(2, 0, hq * d)?,
                    y.narrow(2, hq * d, hkv * d)?,
                    y.narrow(2, (hq + hkv) * d, hkv * d)?,
                )
            }
            QkvProjection::Split { q, k, v } => {
                let x = x.normalized()?;
                (q.forward(&x)?, k.forward(&x)?, v.forward(&x)?)
            }
        })
    }
}

impl Module for CausalSelfAttention {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        match &self.qkv {
            QkvProjection::Fused(l) => l.visit(&join(prefix, self.names[0]), f),
            QkvProjection::Split { q, k, v } => {
                q.visit(&join(prefix, "q_proj"), f);
                k.visit(&join(prefix, "k_proj"), f);
                v.visit(&join(prefix, "v_proj"), f);
            }
        }
        self.out.visit(&join(prefix, self.names[1]), f);
    }
    fn visit_mut(
        &mut self,
        prefix: &str,
        f: &mut dyn FnMut(&str, &mut Tensor) -> Result<()>,
    ) -> Result<()> {
        match &mut self.qkv {
            QkvProjection::Fused(l) => l.visit_mut(&join(prefix, self.names[0]), f)?,
            QkvProjection::Split { q, k, v } => {
                q.visit_mut(&join(prefix, "q_proj"), f)?;
                k.visit_mut(&join(prefix, "k_proj"), f)?;
                v.visit_mut(&join(prefix, "v_proj"), f)?;
            }
        }
        self.out.visit_mut(&join(prefix, self.names[1]), f)
    }
}
