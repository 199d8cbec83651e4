//! The decoder-only transformer shared by both families.

use std::sync::Arc;

use super::{Family, TransformerConfig};
use crate::nn::{
    join, CausalSelfAttention, Embedding, FeedForward, KvCache, LayerCache, LayerNorm, Linear, Mlp,
    Module, Norm, Positions, PreNormed, QkvProjection, RmsNorm, Rotary, SwiGluMlp,
};
use crate::{DType, Device, Error, Result, Tensor};

/// How a parameter starts when a model is built from scratch.
#[derive(Clone, Copy, Debug)]
pub(crate) enum InitKind {
    Normal(f64),
    Zeros,
    Ones,
}

/// Supplies each parameter by name and shape while a model is built: random initialization or
/// a checkpoint.
pub(crate) type ParamSource<'a> = dyn FnMut(&str, &[usize], InitKind) -> Result<Tensor> + 'a;

/// The LM head's vocabulary is padded to a multiple of this (GPT-2's 50,257 to 50,432) for
/// large products: zero rows appended to the head's weight, and the logits narrowed back to
/// the vocabulary. The three products of a training step then fill whole tiles of the GPUs'
/// tensor-core matmul (its tile is 128 x 256 x 32), and the logits' rows start on 16 bytes,
/// where 50,257 columns left every tile clamping its loads and reading unaligned rows (on the
/// H200 the three went from 13.4 to 8.5 ms of GPT-2's bf16 step). As in nanoGPT and llm.c,
/// but invisible: the extra rows are zero and their logits the dtype's lowest value (a bias
/// the products add), narrowed away from what [`Transformer::forward`] returns and given no
/// probability by the loss, so the loss, the gradients and the parameters are the
/// vocabulary's alone (the loss of GPT-2's step is the same bits).
const VOCAB_MULTIPLE: usize = 256;
/// Rows from which the logits' product is padded: fewer (decoding, short prompts) run
/// kernels that do not tile, and would copy the head's weight for nothing.
const PADDED_ROWS: usize = 256;

/// The vocabulary the LM head's product runs over for `rows` rows: padded to a multiple of
/// [`VOCAB_MULTIPLE`] where that adds at most 1/64 to the product ([`PADDED_ROWS`] rows on).
fn padded_vocab(rows: usize, vocab: usize) -> usize {
    if rows >= PADDED_ROWS && vocab >= 64 * VOCAB_MULTIPLE {
        vocab.next_multiple_of(VOCAB_MULTIPLE)
    } else {
        vocab
    }
}

/// The lowest finite value of `dtype`: the logit of a padded column, whose exponential
/// underflows to zero against any real logit without the infinities' `inf - inf`.
fn lowest_finite(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => half::f16::MIN.to_f64(),
        DType::BF16 => half::bf16::MIN.to_f64(),
        _ => f64::from(f32::MIN),
    }
}

/// Pre-norm residual block: `x + attn(norm1(x))`, then `x + mlp(norm2(x))`, each residual
/// added in the epilogue of the branch's last matmul.
pub struct Block {
    pub norm1: Norm,
    pub attn: CausalSelfAttention,
    pub norm2: Norm,
    pub mlp: FeedForward,
    names: [&'static str; 4],
}

impl Block {
    pub fn forward(
        &self,
        x: &Tensor,
        positions: Positions<'_>,
        cache: Option<(&mut Option<LayerCache>, Option<usize>)>,
    ) -> Result<Tensor> {
        let normed = PreNormed {
            x,
            norm: &self.norm1,
        };
        let x = self.attn.forward(normed, positions, cache, Some(x))?;
        let normed = PreNormed {
            x: &x,
            norm: &self.norm2,
        };
        self.mlp.forward(normed, Some(&x))
    }
}

impl Module for Block {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        self.norm1.visit(&join(prefix, self.names[0]), f);
        self.attn.visit(&join(prefix, self.names[1]), f);
        self.norm2.visit(&join(prefix, self.names[2]), f);
        self.mlp.visit(&join(prefix, self.names[3]), f);
    }
    fn visit_mut(
        &mut self,
        prefix: &str,
        f: &mut dyn FnMut(&str, &mut Tensor) -> Result<()>,
    ) -> Result<()> {
        self.norm1.visit_mut(&join(prefix, self.names[0]), f)?;
        self.attn.visit_mut(&join(prefix, self.names[1]), f)?;
        self.norm2.visit_mut(&join(prefix, self.names[2]), f)?;
        self.mlp.visit_mut(&join(prefix, self.names[3]), f)
    }
}

/// A GPT-2 or Llama language model.
pub struct Transformer {
    pub config: TransformerConfig,
    pub embed: Embedding,
    /// Learned positions (GPT-2 only).
    pub positions: Option<Embedding>,
    pub blocks: Vec<Block>,
    pub norm: Norm,
    /// `None` when the output projection is the token embedding (tied).
    pub lm_head: Option<Linear>,
    rotary: Option<Arc<Rotary>>,
    device: Arc<dyn Device>,
    dtype: DType,
}

impl Transformer {
    /// A randomly initialized model (GPT-2's scheme: normal(0, 0.02) weights, residual
    /// projections scaled by `1 / sqrt(2 n_layer)`, zero biases, unit norm weights).
    pub fn new(
        config: &TransformerConfig,
        device: &Arc<dyn Device>,
        dtype: DType,
        rng: &mut crate::rng::RngState,
    ) -> Result<Self> {
        let mut source = |_: &str, shape: &[usize], kind: InitKind| -> Result<Tensor> {
            let t = match kind {
                InitKind::Normal(std) => Tensor::randn(shape, 0.0, std, dtype, rng, device)?,
                InitKind::Zeros => Tensor::zeros(shape, dtype, device)?,
                InitKind::Ones => Tensor::ones(shape, dtype, device)?,
            };
            Ok(t.requires_grad())
        };
        Transformer::build(config, device, dtype, &mut source)
    }

    /// Builds the model, asking `source` for every parameter by its Hugging Face name.
    pub(crate) fn build(
        config: &TransformerConfig,
        device: &Arc<dyn Device>,
        dtype: DType,
        source: &mut ParamSource<'_>,
    ) -> Result<Self> {
        config.validate("config")?;
        let weight_bytes = config
            .parameter_count()
            .and_then(|n| n.checked_mul(dtype.size()));
        device
            .info()
            .check_fits("model", "the model's weights", weight_bytes)?;
        let c = config;
        let gpt2 = c.family == Family::Gpt2;
        let top = if gpt2 { "transformer" } else { "model" };
        let mut p = Builder { source, config: c };
        let rotary = if gpt2 {
            None
        } else {
            Some(Arc::new(Rotary::new(
                c.head_dim,
                c.max_positions,
                c.rope_theta,
                dtype,
                device,
            )?))
        };
        let (d, hd) = (c.d_model, c.head_dim);
        let (std, resid_std) = (0.02, 0.02 / (2.0 * c.n_layer as f64).sqrt());
        let embed = Embedding {
            weight: p.param(
                &join(
                    top,
                    if gpt2 {
                        "wte.weight"
                    } else {
                        "embed_tokens.weight"
                    },
                ),
                &[c.vocab_size, d],
                InitKind::Normal(std),
            )?,
        };
        let positions = if gpt2 {
            Some(Embedding {
                weight: p.param(
                    &join(top, "wpe.weight"),
                    &[c.max_positions, d],
                    InitKind::Normal(std / 2.0),
                )?,
            })
        } else {
            None
        };
        // Layers are built (or read) one at a time: a layer count from a file is never trusted
        // with an allocation of its own, the first missing layer ends the load.
        let mut blocks = Vec::new();
        for i in 0..c.n_layer {
            let prefix = join(top, &format!("{}.{i}", if gpt2 { "h" } else { "layers" }));
            let names: [&'static str; 4] = if gpt2 {
                ["ln_1", "attn", "ln_2", "mlp"]
            } else {
                [
                    "input_layernorm",
                    "self_attn",
                    "post_attention_layernorm",
                    "mlp",
                ]
            };
            let (attn_p, mlp_p) = (join(&prefix, names[1]), join(&prefix, names[3]));
            let norm1 = p.norm(&join(&prefix, names[0]))?;
            let qkv = if gpt2 {
                QkvProjection::Fused(p.linear(&join(&attn_p, "c_attn"), d, 3 * d, true, std)?)
            } else {
                QkvProjection::Split {
                    q: p.linear(
                        &join(&attn_p, "q_proj"),
                        d,
                        c.n_head * hd,
                        c.attention_bias,
                        std,
                    )?,
                    k: p.linear(
                        &join(&attn_p, "k_proj"),
                        d,
                        c.n_kv_head * hd,
                        c.attention_bias,
                        std,
                    )?,
                    v: p.linear(
                        &join(&attn_p, "v_proj"),
                        d,
                        c.n_kv_head * hd,
                        c.attention_bias,
                        std,
                    )?,
                }
            };
            let out_name = if gpt2 { "c_proj" } else { "o_proj" };
            let out = p.linear(
                &join(&attn_p, out_name),
                c.n_head * hd,
                d,
                gpt2 || c.attention_bias,
                resid_std,
            )?;
            let attn = CausalSelfAttention {
                qkv,
                out,
                n_head: c.n_head,
                n_kv_head: c.n_kv_head,
                head_dim: hd,
                rotary: rotary.clone(),
                names: ["c_attn", out_name],
            };
            let norm2 = p.norm(&join(&prefix, names[2]))?;
            let mlp = if gpt2 {
                FeedForward::Gelu(Mlp {
                    fc: p.linear(&join(&mlp_p, "c_fc"), d, c.d_ff, true, std)?,
                    proj: p.linear(&join(&mlp_p, "c_proj"), c.d_ff, d, true, resid_std)?,
                    names: ["c_fc", "c_proj"],
                })
            } else {
                FeedForward::SwiGlu(SwiGluMlp {
                    gate: p.linear(&join(&mlp_p, "gate_proj"), d, c.d_ff, c.mlp_bias, std)?,
                    up: p.linear(&join(&mlp_p, "up_proj"), d, c.d_ff, c.mlp_bias, std)?,
                    down: p.linear(&join(&mlp_p, "down_proj"), c.d_ff, d, c.mlp_bias, resid_std)?,
                })
            };
            blocks.push(Block {
                norm1,
                attn,
                norm2,
                mlp,
                names,
            });
        }
        let norm = p.norm(&join(top, if gpt2 { "ln_f" } else { "norm" }))?;
        let lm_head = if c.tie_embeddings {
            None
        } else {
            Some(p.linear("lm_head", d, c.vocab_size, false, std)?)
        };
        Ok(Transformer {
            config: c.clone(),
            embed,
            positions,
            blocks,
            norm,
            lm_head,
            rotary,
            device: device.clone(),
            dtype,
        })
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Moves the model (parameters and rotary tables) to `device` and `dtype`.
    pub fn to_device(&mut self, device: &Arc<dyn Device>, dtype: DType) -> Result<()> {
        crate::nn::to_device(self, device, dtype)?;
        if self.rotary.is_some() {
            let c = &self.config;
            let rot = Arc::new(Rotary::new(
                c.head_dim,
                c.max_positions,
                c.rope_theta,
                dtype,
                device,
            )?);
            for b in &mut self.blocks {
                b.attn.rotary = Some(rot.clone());
            }
            self.rotary = Some(rot);
        }
        self.device = device.clone();
        self.dtype = dtype;
        Ok(())
    }

    /// [`Transformer::forward`]'s logits before they are narrowed to the vocabulary: padded
    /// ones keep their extra columns ([`VOCAB_MULTIPLE`]).
    fn padded_forward(&self, ids: &Tensor, cache: Option<&mut KvCache>) -> Result<Tensor> {
        self.check_ids(ids)?;
        let t = ids.shape()[1];
        let start = cache.as_ref().map_or(0, |c| c.len());
        if start + t > self.config.max_positions || t == 0 {
            return Err(Error::shape(
                "transformer",
                format!(
                    "{t} tokens after {start} cached ones: need 1..={} positions in total",
                    self.config.max_positions
                ),
            ));
        }
        let pos_ids = match &self.positions {
            Some(_) => Some(Tensor::arange(
                t,
                start as f64,
                1.0,
                DType::I32,
                &self.device,
            )?),
            None => None,
        };
        self.run(ids, Positions::From(start), pos_ids.as_ref(), cache)
    }

    /// Logits `[B, T, V]` for token ids `[B, T]` (i32 or u32). With a cache, the ids continue
    /// the cached positions and the cache grows by `T`.
    pub fn forward(&self, ids: &Tensor, cache: Option<&mut KvCache>) -> Result<Tensor> {
        let logits = self.padded_forward(ids, cache)?;
        self.vocabulary(logits)
    }

    /// Logits `[B, T, V]` for token ids `[B, T]` at `positions [T]` (an i32 device tensor),
    /// written into and read from `cache`, of fixed capacity ([`KvCache::with_capacity`]):
    /// the same launches at every position, so a decoding step built on it is recorded once
    /// and replayed. Positions past the capacity are not written and see only the cache.
    pub fn forward_at(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        self.check_ids(ids)?;
        let t = ids.shape()[1];
        if positions.shape() != [t] || positions.dtype() != DType::I32 || t == 0 {
            return Err(Error::shape(
                "transformer",
                format!(
                    "positions must be [T] i32 for ids {:?}; got {:?} {}",
                    ids.shape(),
                    positions.shape(),
                    positions.dtype()
                ),
            ));
        }
        if cache.capacity().is_none() {
            return Err(Error::invalid(
                "transformer",
                "device positions need a KV cache of fixed capacity (KvCache::with_capacity)",
            ));
        }
        let logits = self.run(
            ids,
            Positions::Device(positions),
            Some(positions),
            Some(cache),
        )?;
        self.vocabulary(logits)
    }

    fn check_ids(&self, ids: &Tensor) -> Result<()> {
        if ids.rank() != 2 || !ids.dtype().is_index() {
            return Err(Error::shape(
                "transformer",
                format!(
                    "token ids must be [B, T] i32 or u32; got {:?} {}",
                    ids.shape(),
                    ids.dtype()
                ),
            ));
        }
        Ok(())
    }

    /// The forward pass at `positions`; `pos_ids` are the learned positions' ids (GPT-2).
    fn run(
        &self,
        ids: &Tensor,
        positions: Positions<'_>,
        pos_ids: Option<&Tensor>,
        mut cache: Option<&mut KvCache>,
    ) -> Result<Tensor> {
        let mut x = self.embed.forward(ids)?;
        if let (Some(table), Some(pos_ids)) = (&self.positions, pos_ids) {
            x = x.add(&table.forward(pos_ids)?)?;
        }
        if let Some(c) = cache.as_mut() {
            c.fit_layers(self.blocks.len());
        }
        for (i, block) in self.blocks.iter().enumerate() {
            let slot = cache.as_mut().map(|c| {
                let fixed = c.capacity();
                (&mut c.layers[i], fixed)
            });
            x = block.forward(&x, positions, slot)?;
        }
        let head = self
            .lm_head
            .as_ref()
            .map_or(&self.embed.weight, |l| &l.weight);
        let normed = PreNormed {
            x: &x,
            norm: &self.norm,
        };
        let vocab = head.shape()[0];
        let rows = x.numel() / x.shape().last().copied().unwrap_or(1).max(1);
        let padded = padded_vocab(rows, vocab);
        if padded == vocab {
            return normed.linear(head, None, None, None);
        }
        let (d, dtype, device) = (head.shape()[1], head.dtype(), head.device());
        let zero_rows = Tensor::zeros(&[padded - vocab, d], dtype, device)?;
        let head = Tensor::cat(&[head, &zero_rows], 0)?;
        let unmasked = Tensor::zeros(&[vocab], dtype, device)?;
        let masked = Tensor::full(&[padded - vocab], lowest_finite(dtype), dtype, device)?;
        let bias = Tensor::cat(&[&unmasked, &masked], 0)?;
        normed.linear(&head, Some(&bias), None, None)
    }

    /// `logits` over the vocabulary: a view of the first `vocab_size` columns of padded ones.
    fn vocabulary(&self, logits: Tensor) -> Result<Tensor> {
        let vocab = self.config.vocab_size;
        if logits.shape().last() == Some(&vocab) {
            return Ok(logits);
        }
        logits.narrow(-1, 0, vocab)
    }

    /// Mean next-token cross-entropy of `ids [B, T]`: logits at `0..T-1` against ids at
    /// `1..T`, as Hugging Face computes the loss with `labels = input_ids`.
    pub fn loss(&self, ids: &Tensor) -> Result<Tensor> {
        let &[b, t] = ids.shape() else {
            return Err(Error::shape(
                "loss",
                format!(
                    "token ids must be [B, T]; got {:?} {}",
                    ids.shape(),
                    ids.dtype()
                ),
            ));
        };
        if t < 2 {
            return Err(Error::shape(
                "loss",
                format!("need at least 2 tokens per row; got {:?}", ids.shape()),
            ));
        }
        let logits = self.padded_forward(&ids.narrow(1, 0, t - 1)?, None)?;
        let targets = ids.narrow(1, 1, t - 1)?.reshape(&[b * (t - 1)])?;
        self.cross_entropy(logits, &targets)
    }

    /// Mean cross-entropy of the logits of `inputs [B, T]` against `targets [B, T]`; targets
    /// outside the vocabulary are ignored.
    pub fn loss_with_targets(&self, inputs: &Tensor, targets: &Tensor) -> Result<Tensor> {
        if inputs.shape() != targets.shape() {
            return Err(Error::shape(
                "loss",
                format!(
                    "inputs {:?} and targets {:?} differ",
                    inputs.shape(),
                    targets.shape()
                ),
            ));
        }
        let n = inputs.numel();
        let logits = self.padded_forward(inputs, None)?;
        self.cross_entropy(logits, &targets.reshape(&[n])?)
    }

    /// Mean cross-entropy of `logits [.., W]` (padded: W past the vocabulary) against
    /// `targets [N]`, over the vocabulary alone: padded columns hold the dtype's lowest
    /// finite value, so their probabilities are zero, and targets among them are ignored as
    /// every target outside the vocabulary is.
    fn cross_entropy(&self, logits: Tensor, targets: &Tensor) -> Result<Tensor> {
        let width = logits.shape().last().copied().unwrap_or(0);
        let rows = logits.numel() / width.max(1);
        logits
            .reshape(&[rows, width])?
            .cross_entropy_of(targets, self.config.vocab_size)
    }
}

/// Asks a [`ParamSource`] for the parameters of each layer kind.
struct Builder<'s, 'a> {
    source: &'s mut ParamSource<'a>,
    config: &'s TransformerConfig,
}

impl Builder<'_, '_> {
    fn param(&mut self, name: &str, shape: &[usize], kind: InitKind) -> Result<Tensor> {
        (self.source)(name, shape, kind)
    }

    fn linear(
        &mut self,
        name: &str,
        d_in: usize,
        d_out: usize,
        bias: bool,
        std: f64,
    ) -> Result<Linear> {
        Ok(Linear {
            weight: self.param(&join(name, "weight"), &[d_out, d_in], InitKind::Normal(std))?,
            bias: if bias {
                Some(self.param(&join(name, "bias"), &[d_out], InitKind::Zeros)?)
            } else {
                None
            },
        })
    }

    fn norm(&mut self, name: &str) -> Result<Norm> {
        let (d, eps) = (self.config.d_model, self.config.norm_eps);
        let weight = self.param(&join(name, "weight"), &[d], InitKind::Ones)?;
        Ok(match self.config.family {
            Family::Gpt2 => Norm::Layer(LayerNorm {
                weight,
                bias: self.param(&join(name, "bias"), &[d], InitKind::Zeros)?,
                eps,
            }),
            Family::Llama => Norm::Rms(RmsNorm { weight, eps }),
        })
    }
}

impl Module for Transformer {
    fn visit(&self, _prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        let top = self.top();
        self.embed.visit(&join(top, self.embed_name()), f);
        if let Some(p) = &self.positions {
            p.visit(&join(top, "wpe"), f);
        }
        for (i, b) in self.blocks.iter().enumerate() {
            b.visit(&self.block_prefix(i), f);
        }
        self.norm.visit(&join(top, self.norm_name()), f);
        if let Some(h) = &self.lm_head {
            h.visit("lm_head", f);
        }
    }
    fn visit_mut(
        &mut self,
        _prefix: &str,
        f: &mut dyn FnMut(&str, &mut Tensor) -> Result<()>,
    ) -> Result<()> {
        let top = self.top();
        let (embed_name, norm_name) = (self.embed_name(), self.norm_name());
        self.embed.visit_mut(&join(top, embed_name), f)?;
        if let Some(p) = &mut self.positions {
            p.visit_mut(&join(top, "wpe"), f)?;
        }
        let prefixes: Vec<String> = (0..self.blocks.len())
            .map(|i| self.block_prefix(i))
            .collect();
        for (b, p) in self.blocks.iter_mut().zip(prefixes) {
            b.visit_mut(&p, f)?;
        }
        self.norm.visit_mut(&join(top, norm_name), f)?;
        if let Some(h) = &mut self.lm_head {
            h.visit_mut("lm_head", f)?;
        }
        Ok(())
    }
}

impl Transformer {
    fn top(&self) -> &'static str {
        if self.config.family == Family::Gpt2 {
            "transformer"
        } else {
            "model"
        }
    }
    fn embed_name(&self) -> &'static str {
        if self.config.family == Family::Gpt2 {
            "wte"
        } else {
            "embed_tokens"
        }
    }
    fn norm_name(&self) -> &'static str {
        if self.config.family == Family::Gpt2 {
            "ln_f"
        } else {
            "norm"
        }
    }
    fn block_prefix(&self, i: usize) -> String {
        join(
            self.top(),
            &format!(
                "{}.{i}",
                if self.config.family == Family::Gpt2 {
                    "h"
                } else {
                    "layers"
                }
            ),
        )
    }
}
