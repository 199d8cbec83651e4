//! Adam and AdamW.

use std::collections::BTreeMap;

use super::{
    load_state_into, read_step, save_state, step_tensor, zeros_like_params, Optimizer, ParamGroup,
};
use crate::io::HostTensor;
use crate::ops::{adam_factors, stats_dtype};
use crate::{Op, Result, Tensor};

/// Adam with L2 weight decay, or AdamW with decoupled weight decay (PyTorch's formulas; bias
/// corrections computed on the host in f64).
///
/// A step is two halves, so that its device work can be recorded once and replayed
/// (`crate::ReplayedStep`): [`Adam::prepare_step`] counts the step and writes what changes
/// with it (learning rate, bias corrections) into a device tensor per group, on the host's
/// side of a recording; [`Adam::apply_step`] queues the updates, which read those tensors, the
/// same launches every step. [`Optimizer::step`] does both.
pub struct Adam {
    groups: Vec<ParamGroup>,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    decoupled: bool,
    step: u64,
    m: Vec<Vec<Tensor>>,
    v: Vec<Vec<Tensor>>,
    /// Per group, `[step size, decay, sqrt of bias correction 2]` of the prepared step
    /// (`ops::adam_factors`) on the parameters' device, f32 (f64 for f64 parameters); `None`
    /// for an empty group.
    factors: Vec<Option<Tensor>>,
}

impl Adam {
    pub fn adamw(groups: Vec<ParamGroup>, beta1: f64, beta2: f64, eps: f64) -> Result<Self> {
        Adam::new(groups, beta1, beta2, eps, true)
    }

    /// Adam with L2 weight decay added to the gradient (PyTorch's `Adam`).
    pub fn with_l2_decay(
        groups: Vec<ParamGroup>,
        beta1: f64,
        beta2: f64,
        eps: f64,
    ) -> Result<Self> {
        Adam::new(groups, beta1, beta2, eps, false)
    }

    fn new(
        groups: Vec<ParamGroup>,
        beta1: f64,
        beta2: f64,
        eps: f64,
        decoupled: bool,
    ) -> Result<Self> {
        let (m, v) = (zeros_like_params(&groups)?, zeros_like_params(&groups)?);
        let factors = groups
            .iter()
            .map(|g| {
                g.params
                    .first()
                    .map(|(_, p)| Tensor::zeros(&[3], stats_dtype(p.dtype()), p.device()))
                    .transpose()
            })
            .collect::<Result<_>>()?;
        Ok(Adam {
            groups,
            beta1,
            beta2,
            eps,
            decoupled,
            step: 0,
            m,
            v,
            factors,
        })
    }

    /// Counts one more step and writes its factors for learning rate `lr` to the device (host
    /// writes: outside any recording).
    pub fn prepare_step(&mut self, lr: f64) -> Result<()> {
        self.step += 1;
        let t = self.step as i32;
        let (bc1, bc2) = (1.0 - self.beta1.powi(t), 1.0 - self.beta2.powi(t));
        for (group, factors) in self.groups.iter().zip(&self.factors) {
            let Some(factors) = factors else { continue };
            let values = adam_factors(lr * group.lr_scale, group.weight_decay, bc1, bc2);
            let values = Tensor::from_f64(&values, &[3], factors.dtype(), factors.device())?;
            factors.copy_from(&values)?;
        }
        Ok(())
    }

    /// Queues the prepared step's update of every parameter that has a gradient, one op per
    /// group, reading gradients multiplied by `grad_scale` (`[1]` f32 on the parameters'
    /// device). The same launches every step: what changes comes from the device.
    pub fn apply_step(&self, grad_scale: &Tensor) -> Result<()> {
        let op = Op::AdamUpdate {
            decoupled_weight_decay: self.decoupled,
        };
        for (gi, group) in self.groups.iter().enumerate() {
            let Some(factors) = &self.factors[gi] else {
                continue;
            };
            let scalars = [self.beta1, self.beta2, self.eps, group.weight_decay];
            let grad_scale = grad_scale.to_dtype(factors.dtype())?;
            let step_values = Tensor::cat(&[&grad_scale, factors], 0)?;
            let mut updated = Vec::new();
            let mut grads = Vec::new();
            for (pi, (_, p)) in group.params.iter().enumerate() {
                if let Some(grad) = p.grad() {
                    updated.push(pi);
                    grads.push(grad);
                }
            }
            if updated.is_empty() {
                continue;
            }
            let params: Vec<&Tensor> = updated.iter().map(|&pi| &group.params[pi].1).collect();
            let m: Vec<&Tensor> = updated.iter().map(|&pi| &self.m[gi][pi]).collect();
            let v: Vec<&Tensor> = updated.iter().map(|&pi| &self.v[gi][pi]).collect();
            let grads: Vec<&Tensor> = grads.iter().collect();
            // Parameters, gradients and state each packed back to back: one update of all.
            let spans = [&params, &grads, &m, &v].map(|list| Tensor::span(list));
            if let [Some(p), Some(g), Some(m), Some(v)] = &spans {
                Tensor::apply_in_place(&op, &[p, g, m, v, &step_values], &[p, m, v], &scalars)?;
                continue;
            }
            let inputs: Vec<&Tensor> = params
                .iter()
                .copied()
                .chain(grads.iter().copied())
                .chain(m.iter().copied())
                .chain(v.iter().copied())
                .chain([&step_values])
                .collect();
            let outputs: Vec<&Tensor> = params.iter().chain(&m).chain(&v).copied().collect();
            Tensor::apply_in_place(&op, &inputs, &outputs, &scalars)?;
        }
        Ok(())
    }
}

impl Optimizer for Adam {
    fn step(&mut self, lr: f64, grad_scale: &Tensor) -> Result<()> {
        self.prepare_step(lr)?;
        self.apply_step(grad_scale)
    }

    fn steps(&self) -> u64 {
        self.step
    }

    fn state(&self) -> Result<BTreeMap<String, HostTensor>> {
        let mut out = BTreeMap::new();
        out.insert("optim.step".into(), step_tensor(self.step));
        save_state(&mut out, "optim.exp_avg", &self.groups, &self.m)?;
        save_state(&mut out, "optim.exp_avg_sq", &self.groups, &self.v)?;
        Ok(out)
    }

    fn load_state(&mut self, state: &BTreeMap<String, HostTensor>) -> Result<()> {
        self.step = read_step(state)?;
        load_state_into(state, "optim.exp_avg", &self.groups, &mut self.m)?;
        load_state_into(state, "optim.exp_avg_sq", &self.groups, &mut self.v)
    }

    fn groups(&self) -> &[ParamGroup] {
        &self.groups
    }
}
