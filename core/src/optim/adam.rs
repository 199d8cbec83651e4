//! Adam and AdamW.

use std::collections::BTreeMap;

use super::{
    load_state_into, read_step, save_state, step_tensor, zeros_like_params, Optimizer, ParamGroup,
};
use crate::io::HostTensor;
use crate::{Op, Result, Tensor};

/// Adam with L2 weight decay, or AdamW with decoupled weight decay (PyTorch's formulas; bias
/// corrections computed on the host in f64).
pub struct Adam {
    groups: Vec<ParamGroup>,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    decoupled: bool,
    step: u64,
    m: Vec<Vec<Tensor>>,
    v: Vec<Vec<Tensor>>,
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
        Ok(Adam {
            groups,
            beta1,
            beta2,
            eps,
            decoupled,
            step: 0,
            m,
            v,
        })
    }
}

impl Optimizer for Adam {
    fn step(&mut self, lr: f64, grad_scale: &Tensor) -> Result<()> {
        self.step += 1;
        let t = self.step as i32;
        let (bc1, bc2) = (1.0 - self.beta1.powi(t), 1.0 - self.beta2.powi(t));
        let op = Op::AdamUpdate {
            decoupled_weight_decay: self.decoupled,
        };
        for (gi, group) in self.groups.iter().enumerate() {
            let scalars = [
                lr * group.lr_scale,
                self.beta1,
                self.beta2,
                self.eps,
                group.weight_decay,
                bc1,
                bc2,
            ];
            for (pi, (_, p)) in group.params.iter().enumerate() {
                let Some(grad) = p.grad() else { continue };
                let (m, v) = (&self.m[gi][pi], &self.v[gi][pi]);
                Tensor::apply_in_place(&op, &[p, &grad, m, v, grad_scale], &[p, m, v], &scalars)?;
            }
        }
        Ok(())
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
