//! Neural-network building blocks over [`Tensor`].
//!
//! A [`Module`] exposes its parameters by dotted name (the Hugging Face names for the model
//! families here), so loading, saving, optimizers and device moves all work by walking names.
//! Parameters are leaf tensors that record gradients; optimizers update their storage in place.

mod attention;
mod layers;

pub use attention::{CausalSelfAttention, KvCache, LayerCache, Positions, QkvProjection, Rotary};
pub use layers::{
    Dropout, Embedding, FeedForward, LayerNorm, Linear, Mlp, Norm, PreNormed, RmsNorm, SwiGluMlp,
};

use std::sync::Arc;

use crate::rng::RngState;
use crate::{DType, Device, Result, Tensor};

/// Something with named parameters.
pub trait Module {
    /// Calls `f` with the full name (`prefix` + local name) and tensor of every parameter.
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor));
    /// Calls `f` on every parameter, which may replace it.
    fn visit_mut(
        &mut self,
        prefix: &str,
        f: &mut dyn FnMut(&str, &mut Tensor) -> Result<()>,
    ) -> Result<()>;
}

/// `prefix.name`, or `name` without a prefix.
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// Every parameter with its full name, in a stable order.
pub fn parameters(module: &dyn Module) -> Vec<(String, Tensor)> {
    let mut out = Vec::new();
    module.visit("", &mut |name, t| out.push((name.to_string(), t.clone())));
    out
}

/// Moves every parameter to `device` (and `dtype`), as fresh leaves that record gradients.
pub fn to_device(module: &mut dyn Module, device: &Arc<dyn Device>, dtype: DType) -> Result<()> {
    module.visit_mut("", &mut |_, t| {
        *t = t.to_device(device)?.to_dtype(dtype)?.requires_grad();
        Ok(())
    })
}

/// Clears every parameter's gradient.
pub fn zero_grad(module: &dyn Module) {
    module.visit("", &mut |_, t| t.zero_grad());
}

/// Random initialization, GPT-2 style: normal weights, zero biases, unit norm weights.
pub struct Init<'a> {
    pub device: &'a Arc<dyn Device>,
    pub dtype: DType,
    pub rng: &'a mut RngState,
}

impl Init<'_> {
    pub fn normal(&mut self, shape: &[usize], std: f64) -> Result<Tensor> {
        Ok(Tensor::randn(shape, 0.0, std, self.dtype, self.rng, self.device)?.requires_grad())
    }
    pub fn full(&mut self, shape: &[usize], value: f64) -> Result<Tensor> {
        Ok(Tensor::full(shape, value, self.dtype, self.device)?.requires_grad())
    }
}
