//! Stochastic gradient descent with momentum, dampening, Nesterov and weight decay.

use std::collections::BTreeMap;

use super::{
    load_state_into, read_step, save_state, step_tensor, zeros_like_params, Optimizer, ParamGroup,
};
use crate::io::HostTensor;
use crate::{Error, Op, Result, Tensor};

/// PyTorch's SGD: on the first step the momentum buffer takes the gradient itself.
pub struct Sgd {
    groups: Vec<ParamGroup>,
    pub momentum: f64,
    pub dampening: f64,
    pub nesterov: bool,
    step: u64,
    buf: Vec<Vec<Tensor>>,
}

impl Sgd {
    pub fn new(
        groups: Vec<ParamGroup>,
        momentum: f64,
        dampening: f64,
        nesterov: bool,
    ) -> Result<Self> {
        if nesterov && (momentum <= 0.0 || dampening != 0.0) {
            return Err(Error::invalid(
                "sgd",
                "Nesterov momentum needs momentum > 0 and zero dampening",
            ));
        }
        let buf = if momentum != 0.0 {
            zeros_like_params(&groups)?
        } else {
            groups.iter().map(|_| Vec::new()).collect()
        };
        Ok(Sgd {
            groups,
            momentum,
            dampening,
            nesterov,
            step: 0,
            buf,
        })
    }
}

impl Optimizer for Sgd {
    fn step(&mut self, lr: f64, grad_scale: &Tensor) -> Result<()> {
        let with_momentum = self.momentum != 0.0;
        let op = Op::SgdUpdate {
            momentum: with_momentum,
            nesterov: self.nesterov,
        };
        let grad_coef = if self.step == 0 {
            1.0
        } else {
            1.0 - self.dampening
        };
        self.step += 1;
        for (gi, group) in self.groups.iter().enumerate() {
            let scalars = [
                lr * group.lr_scale,
                self.momentum,
                grad_coef,
                group.weight_decay,
            ];
            for (pi, (_, p)) in group.params.iter().enumerate() {
                let Some(grad) = p.grad() else { continue };
                if with_momentum {
                    let b = &self.buf[gi][pi];
                    Tensor::apply_in_place(&op, &[p, &grad, b, grad_scale], &[p, b], &scalars)?;
                } else {
                    Tensor::apply_in_place(&op, &[p, &grad, grad_scale], &[p], &scalars)?;
                }
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
        if self.momentum != 0.0 {
            save_state(&mut out, "optim.momentum_buffer", &self.groups, &self.buf)?;
        }
        Ok(out)
    }

    fn load_state(&mut self, state: &BTreeMap<String, HostTensor>) -> Result<()> {
        self.step = read_step(state)?;
        if self.momentum != 0.0 {
            load_state_into(state, "optim.momentum_buffer", &self.groups, &mut self.buf)?;
        }
        Ok(())
    }

    fn groups(&self) -> &[ParamGroup] {
        &self.groups
    }
}
