//! Linear, Embedding, norms, dropout and the two feed-forward blocks.

use super::{join, Init, Module};
use crate::ops::NormKind;
use crate::rng::RngState;
use crate::{is_grad_enabled, Result, Tensor, UnaryOp};

/// `y = x W^T + b` with `W` stored `[out, in]`, as PyTorch's `nn.Linear`.
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    pub fn new(
        init: &mut Init<'_>,
        d_in: usize,
        d_out: usize,
        bias: bool,
        std: f64,
    ) -> Result<Self> {
        Ok(Linear {
            weight: init.normal(&[d_out, d_in], std)?,
            bias: if bias {
                Some(init.full(&[d_out], 0.0)?)
            } else {
                None
            },
        })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.linear(&self.weight, self.bias.as_ref())
    }

    /// `forward(x) + residual`, the addition fused into the matmul.
    pub fn forward_plus(&self, x: &Tensor, residual: Option<&Tensor>) -> Result<Tensor> {
        x.linear_fused(&self.weight, self.bias.as_ref(), None, residual)
    }
}

impl Module for Linear {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        f(&join(prefix, "weight"), &self.weight);
        if let Some(b) = &self.bias {
            f(&join(prefix, "bias"), b);
        }
    }
    fn visit_mut(
        &mut self,
        prefix: &str,
        f: &mut dyn FnMut(&str, &mut Tensor) -> Result<()>,
    ) -> Result<()> {
        f(&join(prefix, "weight"), &mut self.weight)?;
        if let Some(b) = &mut self.bias {
            f(&join(prefix, "bias"), b)?;
        }
        Ok(())
    }
}

/// A `[V, D]` lookup table.
pub struct Embedding {
    pub weight: Tensor,
}

impl Embedding {
    pub fn new(init: &mut Init<'_>, count: usize, dim: usize, std: f64) -> Result<Self> {
        Ok(Embedding {
            weight: init.normal(&[count, dim], std)?,
        })
    }
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.weight.embedding(ids)
    }
}

impl Module for Embedding {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        f(&join(prefix, "weight"), &self.weight);
    }
    fn visit_mut(
        &mut self,
        prefix: &str,
        f: &mut dyn FnMut(&str, &mut Tensor) -> Result<()>,
    ) -> Result<()> {
        f(&join(prefix, "weight"), &mut self.weight)
    }
}

pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f64,
}

impl LayerNorm {
    pub fn new(init: &mut Init<'_>, dim: usize, eps: f64) -> Result<Self> {
        Ok(LayerNorm {
            weight: init.full(&[dim], 1.0)?,
            bias: init.full(&[dim], 0.0)?,
            eps,
        })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(&self.weight, &self.bias, self.eps)
    }
}

impl Module for LayerNorm {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        f(&join(prefix, "weight"), &self.weight);
        f(&join(prefix, "bias"), &self.bias);
    }
    fn visit_mut(
        &mut self,
        prefix: &str,
        f: &mut dyn FnMut(&str, &mut Tensor) -> Result<()>,
    ) -> Result<()> {
        f(&join(prefix, "weight"), &mut self.weight)?;
        f(&join(prefix, "bias"), &mut self.bias)
    }
}

pub struct RmsNorm {
    pub weight: Tensor,
    pub eps: f64,
}

impl RmsNorm {
    pub fn new(init: &mut Init<'_>, dim: usize, eps: f64) -> Result<Self> {
        Ok(RmsNorm {
            weight: init.full(&[dim], 1.0)?,
            eps,
        })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.rms_norm(&self.weight, self.eps)
    }
}

impl Module for RmsNorm {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        f(&join(prefix, "weight"), &self.weight);
    }
    fn visit_mut(
        &mut self,
        prefix: &str,
        f: &mut dyn FnMut(&str, &mut Tensor) -> Result<()>,
    ) -> Result<()> {
        f(&join(prefix, "weight"), &mut self.weight)
    }
}

/// Layer norm (GPT-2) or RMS norm (Llama).
pub enum Norm {
    Layer(LayerNorm),
    Rms(RmsNorm),
}

impl Norm {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Norm::Layer(n) => n.forward(x),
            Norm::Rms(n) => n.forward(x),
        }
    }

    /// Which norm, its parameters (weight, then bias for a layer norm) and its eps.
    fn parts(&self) -> (NormKind, Vec<&Tensor>, f64) {
        match self {
            Norm::Layer(n) => (NormKind::Layer, vec![&n.weight, &n.bias], n.eps),
            Norm::Rms(n) => (NormKind::Rms, vec![&n.weight], n.eps),
        }
    }
}

/// A layer's input `x` before its norm, as a pre-norm block hands it on. A product that reads
/// it alone folds the norm into itself where nothing records gradients
/// ([`Tensor::norm_linear`]: one launch instead of two, which is what a decoding step's time
/// goes to); a layer that reads it more than once normalizes it once
/// ([`PreNormed::normalized`]).
#[derive(Clone, Copy)]
pub struct PreNormed<'a> {
    pub x: &'a Tensor,
    pub norm: &'a Norm,
}

impl PreNormed<'_> {
    /// `norm(x)`.
    pub fn normalized(&self) -> Result<Tensor> {
        self.norm.forward(self.x)
    }

    /// `act(norm(x) @ weight^T + bias) + residual`.
    pub fn linear(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        activation: Option<UnaryOp>,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        if is_grad_enabled() {
            return self
                .normalized()?
                .linear_fused(weight, bias, activation, residual);
        }
        let (kind, params, eps) = self.norm.parts();
        self.x
            .norm_linear(kind, &params, eps, weight, bias, activation, residual)
    }
}

impl Module for Norm {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        match self {
            Norm::Layer(n) => n.visit(prefix, f),
            Norm::Rms(n) => n.visit(prefix, f),
        }
    }
    fn visit_mut(
        &mut self,
        prefix: &str,
        f: &mut dyn FnMut(&str, &mut Tensor) -> Result<()>,
    ) -> Result<()> {
        match self {
            Norm::Layer(n) => n.visit_mut(prefix, f),
            Norm::Rms(n) => n.visit_mut(prefix, f),
        }
    }
}

/// Inverted dropout, active only in training mode.
#[derive(Clone, Copy, Debug)]
pub struct Dropout {
    pub p: f64,
}

impl Dropout {
    pub fn forward(&self, x: &Tensor, training: bool, rng: &mut RngState) -> Result<Tensor> {
        if training && self.p > 0.0 {
            x.dropout(self.p, rng)
        } else {
            Ok(x.clone())
        }
    }
}

/// GPT-2's MLP: `proj(gelu(fc(x)))`. Without gradients the GELU runs in the first matmul's
/// epilogue; with them it stays a separate op, whose backward is cheaper than recomputing the
/// pre-activation.
pub struct Mlp {
    pub fc: Linear,
    pub proj: Linear,
    /// Hugging Face names of the two projections (`c_fc`, `c_proj` for GPT-2).
    pub names: [&'static str; 2],
}

impl Mlp {
    /// `proj(gelu(fc(norm(x)))) + residual`, the residual added in the last matmul.
    pub fn forward(&self, x: PreNormed<'_>, residual: Option<&Tensor>) -> Result<Tensor> {
        let h = if is_grad_enabled() {
            self.fc.forward(&x.normalized()?)?.gelu()?
        } else {
            x.linear(
                &self.fc.weight,
                self.fc.bias.as_ref(),
                Some(UnaryOp::Gelu),
                None,
            )?
        };
        self.proj.forward_plus(&h, residual)
    }
}

impl Module for Mlp {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        self.fc.visit(&join(prefix, self.names[0]), f);
        self.proj.visit(&join(prefix, self.names[1]), f);
    }
    fn visit_mut(
        &mut self,
        prefix: &str,
        f: &mut dyn FnMut(&str, &mut Tensor) -> Result<()>,
    ) -> Result<()> {
        self.fc.visit_mut(&join(prefix, self.names[0]), f)?;
        self.proj.visit_mut(&join(prefix, self.names[1]), f)
    }
}

/// Llama's MLP: `down(silu(gate(x)) * up(x))`.
pub struct SwiGluMlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl SwiGluMlp {
    /// `down(silu(gate(h)) * up(h)) + residual` for `h = norm(x)`, the residual added in the
    /// last matmul.
    pub fn forward(&self, x: PreNormed<'_>, residual: Option<&Tensor>) -> Result<Tensor> {
        let x = x.normalized()?;
        let h = Tensor::swiglu(&self.gate.forward(&x)?, &self.up.forward(&x)?)?;
        self.down.forward_plus(&h, residual)
    }
}

impl Module for SwiGluMlp {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        self.gate.visit(&join(prefix, "gate_proj"), f);
        self.up.visit(&join(prefix, "up_proj"), f);
        self.down.visit(&join(prefix, "down_proj"), f);
    }
    fn visit_mut(
        &mut self,
        prefix: &str,
        f: &mut dyn FnMut(&str, &mut Tensor) -> Result<()>,
    ) -> Result<()> {
        self.gate.visit_mut(&join(prefix, "gate_proj"), f)?;
        self.up.visit_mut(&join(prefix, "up_proj"), f)?;
        self.down.visit_mut(&join(prefix, "down_proj"), f)
    }
}

pub enum FeedForward {
    Gelu(Mlp),
    SwiGlu(SwiGluMlp),
}

impl FeedForward {
    /// The MLP of `norm(x)`, plus `residual` if given (fused into the last matmul).
    pub fn forward(&self, x: PreNormed<'_>, residual: Option<&Tensor>) -> Result<Tensor> {
        match self {
            FeedForward::Gelu(m) => m.forward(x, residual),
            FeedForward::SwiGlu(m) => m.forward(x, residual),
        }
    }
}

impl Module for FeedForward {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        match self {
            FeedForward::Gelu(m) => m.visit(prefix, f),
            FeedForward::SwiGlu(m) => m.visit(prefix, f),
        }
    }
    fn visit_mut(
        &mut self,
        prefix: &str,
        f: &mut dyn FnMut(&str, &mut Tensor) -> Result<()>,
    ) -> Result<()> {
        match self {
            FeedForward::Gelu(m) => m.visit_mut(prefix, f),
            FeedForward::SwiGlu(m) => m.visit_mut(prefix, f),
        }
    }
}
