//! Optimizers, gradient clipping, learning-rate schedules and loss scaling.
//!
//! Updates run in place on the parameters' storage, Adam as one catalog op per parameter
//! group and SGD as one per parameter, and read every gradient through a `[1]` device scalar
//! (`grad_scale`) so that clipping and loss-scale removal need no host round trip. Adam also
//! reads what changes from step to step (learning rate, bias corrections) from the device, so
//! a recorded training step replays with each step's values; SGD takes its learning rate as a
//! launch value, which a recording would keep. State tensors are named after their
//! parameter, which is what checkpoints store.
//!
//! A group's state is packed in one allocation ([`Tensor::zeros_packed`]). Where the group's
//! parameters and gradients are packed too (the trainer packs them in mixed precision), Adam
//! updates the whole group as one tensor ([`Tensor::span`]) and the clipping norm sums it as
//! one: on a GPU that is one launch a group instead of one a parameter. Otherwise each
//! parameter is its own operand, with the same result.

mod adam;
mod clip;
mod schedule;
mod sgd;

pub use adam::Adam;
pub use clip::clip_grad_norm;
pub use schedule::{LossScaler, Schedule};
pub use sgd::Sgd;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::io::HostTensor;
use crate::{Error, Result, Tensor};

/// Parameters that share hyperparameters, e.g. no weight decay for biases and norms.
#[derive(Clone)]
pub struct ParamGroup {
    pub params: Vec<(String, Tensor)>,
    pub weight_decay: f64,
    /// Multiplies the learning rate given to [`Optimizer::step`].
    pub lr_scale: f64,
}

impl ParamGroup {
    pub fn new(params: Vec<(String, Tensor)>, weight_decay: f64) -> Self {
        ParamGroup {
            params,
            weight_decay,
            lr_scale: 1.0,
        }
    }

    /// Splits parameters the usual way: matrices (rank >= 2) decay, vectors (biases, norm
    /// weights) do not.
    pub fn decay_matrices(params: Vec<(String, Tensor)>, weight_decay: f64) -> Vec<ParamGroup> {
        let (matrices, vectors): (Vec<_>, Vec<_>) =
            params.into_iter().partition(|(_, t)| t.rank() >= 2);
        vec![
            ParamGroup::new(matrices, weight_decay),
            ParamGroup::new(vectors, 0.0),
        ]
    }
}

pub trait Optimizer {
    /// Applies one update with learning rate `lr` to every parameter that has a gradient,
    /// reading gradients multiplied by `grad_scale` (`[1]` f32 on the parameters' device).
    fn step(&mut self, lr: f64, grad_scale: &Tensor) -> Result<()>;
    /// Updates taken so far.
    fn steps(&self) -> u64;
    /// State tensors by name, for checkpoints.
    fn state(&self) -> Result<BTreeMap<String, HostTensor>>;
    /// Restores what [`Optimizer::state`] saved.
    fn load_state(&mut self, state: &BTreeMap<String, HostTensor>) -> Result<()>;
    /// Every parameter, by group.
    fn groups(&self) -> &[ParamGroup];
    /// Clears every gradient.
    fn zero_grad(&self) {
        for g in self.groups() {
            for (_, p) in &g.params {
                p.zero_grad();
            }
        }
    }
}

/// One state tensor per parameter, zero-initialized like the parameter; a group's packed
/// in one allocation ([`Tensor::zeros_packed`]) where its parameters share a dtype and a
/// device, so that an update over parameters that are packed too is one launch.
pub(crate) fn zeros_like_params(groups: &[ParamGroup]) -> Result<Vec<Vec<Tensor>>> {
    groups
        .iter()
        .map(|g| {
            let Some((_, first)) = g.params.first() else {
                return Ok(Vec::new());
            };
            let uniform = g.params.iter().all(|(_, p)| {
                p.dtype() == first.dtype() && Arc::ptr_eq(p.device(), first.device())
            });
            if uniform {
                let shapes: Vec<&[usize]> = g.params.iter().map(|(_, p)| p.shape()).collect();
                return Tensor::zeros_packed(&shapes, first.dtype(), first.device());
            }
            g.params
                .iter()
                .map(|(_, p)| Tensor::zeros(p.shape(), p.dtype(), p.device()))
                .collect()
        })
        .collect()
}

/// Saves state tensors as `prefix.param_name`.
pub(crate) fn save_state(
    out: &mut BTreeMap<String, HostTensor>,
    prefix: &str,
    groups: &[ParamGroup],
    state: &[Vec<Tensor>],
) -> Result<()> {
    for (g, s) in groups.iter().zip(state) {
        for ((name, _), t) in g.params.iter().zip(s) {
            out.insert(format!("{prefix}.{name}"), HostTensor::from_tensor(t)?);
        }
    }
    Ok(())
}

/// Loads state tensors saved by [`save_state`] into place, checking every shape and dtype.
pub(crate) fn load_state_into(
    saved: &BTreeMap<String, HostTensor>,
    prefix: &str,
    groups: &[ParamGroup],
    state: &mut [Vec<Tensor>],
) -> Result<()> {
    for (g, s) in groups.iter().zip(state.iter_mut()) {
        for ((name, p), t) in g.params.iter().zip(s.iter_mut()) {
            let key = format!("{prefix}.{name}");
            let h = saved
                .get(&key)
                .ok_or_else(|| Error::format("optimizer state", format!("missing `{key}`")))?;
            if h.shape != p.shape() || h.dtype != p.dtype() {
                return Err(Error::format(
                    "optimizer state",
                    format!(
                        "`{key}` is {:?} {}, expected {:?} {}",
                        h.shape,
                        h.dtype,
                        p.shape(),
                        p.dtype()
                    ),
                ));
            }
            // Written into the state's own storage, which may be packed with its group's.
            t.copy_from(&h.to_tensor(p.device())?)?;
        }
    }
    Ok(())
}

/// The step count as a one-element f64 host tensor.
pub(crate) fn step_tensor(step: u64) -> HostTensor {
    HostTensor::from_f64(&[step as f64], &[1], crate::DType::F64)
}

pub(crate) fn read_step(saved: &BTreeMap<String, HostTensor>) -> Result<u64> {
    let h = saved
        .get("optim.step")
        .ok_or_else(|| Error::format("optimizer state", "missing `optim.step`"))?;
    let v = h.to_f64();
    match v.as_slice() {
        [s] if *s >= 0.0 && s.fract() == 0.0 => Ok(*s as u64),
        _ => Err(Error::format(
            "optimizer state",
            "`optim.step` is not a step count",
        )),
    }
}
