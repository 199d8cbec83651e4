//! The training loop's step: micro-batch accumulation, mixed precision with f32 master
//! weights, dynamic loss scaling, global-norm clipping on the device, AdamW with parameter
//! groups, learning-rate schedules, and checkpoints that resume bit for bit.
//!
//! Steps are replayed where the device records work ([`ReplayedStep`]): the micro-batches
//! are copied into tensors the trainer keeps, the optimizer writes the step's learning rate
//! and bias corrections to the device (`Adam::prepare_step`), and the step's device work
//! (forward, backward, clipping, updates, the cast of master weights) is recorded once and
//! replayed, writing the loss and gradient norm into tensors the trainer keeps, of which each
//! report gets a copy. A replayed step gives the bits an eager one gives. Not replayed: f16
//! steps (dynamic loss scaling reads the gradient norm on the host to decide whether to skip
//! the update) and steps while kernels are profiled ([`Trainer::set_replay`]); a change of
//! micro-batch count or shape records again.
//!
//! In mixed precision each parameter group of the master weights, of the compute weights and
//! of the master gradients is packed in one allocation where every parameter's size allows
//! (`pack_for_updates`): the update, the clipping norm and the cast of the master weights then
//! take a launch a group, and each step's gradients are cast into the packed ones.
//!
//! Data-parallel training ([`Trainer::join`]): every rank runs this trainer on its own
//! device and its own share of each batch. Rank 0's weights are broadcast when a rank
//! joins; in each step the gradients of the last micro-batch's backward pass are summed
//! over the ranks in buckets as they become ready (on the collective's own stream, beside
//! the rest of the pass), and the clipping factor divides by the world size, so the update
//! is the one a single worker makes with the whole batch. Gradients are reduced in f32 (the
//! master weights' dtype). The reported loss is the mean over the ranks.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::checkpoint::{self, TrainState};
use crate::dist::{Collective, GradientBuckets, BUCKET_BYTES};
use crate::models::Transformer;
use crate::nn::{parameters, Module};
use crate::optim::{clip_grad_norm, Adam, LossScaler, Optimizer, ParamGroup, Schedule};
use crate::rng::RngState;
use crate::{DType, Device, Error, Op, ReplayedStep, Result, Tensor};

/// The dtype matmuls and activations run in. Master weights and optimizer state stay f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    F32,
    /// bf16 compute; no loss scaling needed (bf16 has f32's range).
    Bf16,
    /// f16 compute with dynamic loss scaling.
    F16,
}

impl Precision {
    pub fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::Bf16 => DType::BF16,
            Precision::F16 => DType::F16,
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f32" => Some(Precision::F32),
            "bf16" => Some(Precision::Bf16),
            "f16" => Some(Precision::F16),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct TrainOptions {
    pub schedule: Schedule,
    pub weight_decay: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    /// Clip the global gradient norm to this, if set.
    pub grad_clip: Option<f64>,
    pub precision: Precision,
}

/// What one step did. `loss` and `grad_norm` stay on the device until read.
pub struct StepReport {
    pub loss: Tensor,
    pub grad_norm: Tensor,
    pub lr: f64,
    /// The step was skipped because gradients were not finite (f16 loss scaling).
    pub skipped: bool,
}

pub struct Trainer {
    /// The model in compute precision.
    pub model: Transformer,
    /// f32 master weights when computing in lower precision.
    master: Option<Transformer>,
    /// The master weights' gradients, packed by parameter group ([`pack_parameters`]), in
    /// the order `parameters` visits them: where each step's gradients are cast into.
    master_grads: Option<Vec<Tensor>>,
    optimizer: Adam,
    pub state: TrainState,
    scaler: LossScaler,
    pub options: TrainOptions,
    /// Whether steps may be replayed ([`Trainer::set_replay`]).
    replay: bool,
    replayed: Option<Replayed>,
    /// The world this trainer is a rank of, if any ([`Trainer::join`]).
    collective: Option<Arc<dyn Collective>>,
    /// The size of the gradient buckets summed over the ranks.
    bucket_bytes: usize,
}

/// A recorded step and the tensors it talks through.
struct Replayed {
    step: ReplayedStep,
    /// The micro-batches' `(inputs, targets)`, copied in before each step.
    micro_batches: Vec<(Tensor, Tensor)>,
    loss: Tensor,
    grad_norm: Tensor,
}

impl Replayed {
    /// Whether `micro_batches` fit the kept tensors (same count, shapes and dtypes).
    fn fits(&self, micro_batches: &[(Tensor, Tensor)]) -> bool {
        let same = |a: &Tensor, b: &Tensor| a.shape() == b.shape() && a.dtype() == b.dtype();
        self.micro_batches.len() == micro_batches.len()
            && self
                .micro_batches
                .iter()
                .zip(micro_batches)
                .all(|((i, t), (bi, bt))| same(i, bi) && same(t, bt))
    }
}

impl Trainer {
    /// Starts training `model` (held in f32) at step 0.
    pub fn new(
        model: Transformer,
        options: TrainOptions,
        rng: RngState,
        data_rng: RngState,
        run: Value,
    ) -> Result<Self> {
        let state = TrainState {
            step: 0,
            rng,
            data_rng,
            loss_scale: 65536.0,
            run,
        };
        Trainer::assemble(model, options, state)
    }

    fn assemble(weights: Transformer, options: TrainOptions, state: TrainState) -> Result<Self> {
        if weights.dtype() != DType::F32 {
            return Err(Error::invalid(
                "trainer",
                format!("master weights must be f32; got {}", weights.dtype()),
            ));
        }
        let dtype = options.precision.dtype();
        let (model, master) = if dtype == DType::F32 {
            (weights, None)
        } else {
            let mut compute = Transformer::from_host_tensors(
                &weights.config,
                &weights.state_dict()?,
                "master weights",
                weights.device(),
                DType::F32,
            )?;
            compute.to_device(&weights.device().clone(), dtype)?;
            (compute, Some(weights))
        };
        let (mut model, mut master) = (model, master);
        let master_grads = match &mut master {
            Some(high) => pack_for_updates(&mut model, high, options.weight_decay)?,
            None => None,
        };
        let owner = master.as_ref().unwrap_or(&model);
        let groups = ParamGroup::decay_matrices(parameters(owner), options.weight_decay);
        let optimizer = Adam::adamw(groups, options.betas.0, options.betas.1, options.eps)?;
        let scale = if options.precision == Precision::F16 {
            state.loss_scale
        } else {
            1.0
        };
        Ok(Trainer {
            model,
            master,
            master_grads,
            optimizer,
            scaler: LossScaler::new(scale, 1000),
            state,
            options,
            replay: true,
            replayed: None,
            collective: None,
            bucket_bytes: BUCKET_BYTES,
        })
    }

    /// Makes this trainer a rank of `collective`'s world: rank 0's weights replace this
    /// rank's, and every step from now on sums gradients over the ranks. Every rank calls it
    /// at the same step.
    pub fn join(&mut self, collective: Arc<dyn Collective>) -> Result<()> {
        let weights = parameters(self.weights());
        let refs: Vec<_> = weights.iter().map(|(_, t)| t.as_ref()).collect();
        collective.broadcast(&refs, 0)?;
        collective.wait()?;
        self.sync_compute_weights()?;
        self.replayed = None;
        self.collective = Some(collective);
        Ok(())
    }

    /// Sets the size of the buckets gradients are summed over the ranks in (default
    /// [`BUCKET_BYTES`], as PyTorch DDP's `bucket_cap_mb`).
    pub fn set_bucket_bytes(&mut self, bytes: usize) {
        self.bucket_bytes = bytes.max(1);
        self.replayed = None;
    }

    /// The collectives of the world this trainer is a rank of, if any.
    pub fn collective(&self) -> Option<&Arc<dyn Collective>> {
        self.collective.as_ref()
    }

    /// Ranks in the world this trainer belongs to (1 alone).
    pub fn world_size(&self) -> usize {
        self.collective.as_ref().map_or(1, |c| c.world_size())
    }

    /// The f32 weights the optimizer updates (what checkpoints hold).
    pub fn weights(&self) -> &Transformer {
        self.master.as_ref().unwrap_or(&self.model)
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        self.model.device()
    }

    /// Whether steps may be replayed (on by default). Off, every step runs eagerly: to time
    /// its kernels one by one, or as a reference for replayed steps.
    pub fn set_replay(&mut self, on: bool) {
        self.replay = on;
        if !on {
            self.replayed = None;
        }
    }

    /// Whether the last step was replayed from a recording.
    pub fn replayed_last_step(&self) -> bool {
        self.replayed.as_ref().is_some_and(|r| r.step.is_replayed())
    }

    /// One optimizer update over the given micro-batches `(inputs, targets)`, each `[B, T]`
    /// token ids; their mean loss is what is minimized.
    pub fn step(&mut self, micro_batches: &[(Tensor, Tensor)]) -> Result<StepReport> {
        if micro_batches.is_empty() {
            return Err(Error::invalid(
                "train step",
                "needs at least one micro-batch",
            ));
        }
        if !self.replay || self.options.precision == Precision::F16 {
            return self.eager_step(micro_batches);
        }
        let mut replayed = match self.replayed.take() {
            Some(r) if r.fits(micro_batches) => r,
            _ => self.replayable(micro_batches)?,
        };
        let report = self.replayed_step(&mut replayed, micro_batches);
        if report.is_ok() {
            self.replayed = Some(replayed);
        }
        report
    }

    /// Tensors for steps over micro-batches shaped as `micro_batches`, and a step not yet
    /// recorded.
    fn replayable(&self, micro_batches: &[(Tensor, Tensor)]) -> Result<Replayed> {
        let device = self.device();
        let like = |t: &Tensor| Tensor::zeros(t.shape(), t.dtype(), device);
        Ok(Replayed {
            step: ReplayedStep::new(device),
            micro_batches: micro_batches
                .iter()
                .map(|(i, t)| Ok((like(i)?, like(t)?)))
                .collect::<Result<_>>()?,
            loss: Tensor::zeros(&[], DType::F32, device)?,
            grad_norm: Tensor::zeros(&[1], DType::F32, device)?,
        })
    }

    fn replayed_step(
        &mut self,
        replayed: &mut Replayed,
        micro_batches: &[(Tensor, Tensor)],
    ) -> Result<StepReport> {
        for ((inputs, targets), (new_inputs, new_targets)) in
            replayed.micro_batches.iter().zip(micro_batches)
        {
            inputs.copy_from(new_inputs)?;
            targets.copy_from(new_targets)?;
        }
        let lr = self.options.schedule.lr(self.state.step);
        self.optimizer.prepare_step(lr)?;
        let Replayed {
            step,
            micro_batches,
            loss,
            grad_norm,
        } = replayed;
        step.run(&mut || {
            let (step_loss, step_norm) = self.accumulate_and_clip(micro_batches)?;
            self.optimizer.apply_step(&step_norm.1)?;
            self.sync_compute_weights()?;
            self.optimizer.zero_grad();
            loss.copy_from(&step_loss.to_dtype(DType::F32)?)?;
            grad_norm.copy_from(&step_norm.0)
        })?;
        self.state.step += 1;
        Ok(StepReport {
            loss: copied(loss)?,
            grad_norm: copied(grad_norm)?,
            lr,
            skipped: false,
        })
    }

    fn eager_step(&mut self, micro_batches: &[(Tensor, Tensor)]) -> Result<StepReport> {
        let (loss, (grad_norm, factor)) = self.accumulate_and_clip(micro_batches)?;
        let skipped = if self.options.precision == Precision::F16 {
            !self.scaler.update(grad_norm.item()?.is_finite())
        } else {
            false
        };
        let lr = self.options.schedule.lr(self.state.step);
        if !skipped {
            self.optimizer.step(lr, &factor)?;
            self.state.step += 1;
            self.sync_compute_weights()?;
        }
        self.optimizer.zero_grad();
        self.state.loss_scale = self.scaler.scale;
        Ok(StepReport {
            loss,
            grad_norm,
            lr,
            skipped,
        })
    }

    /// Forward and backward over every micro-batch, gradients moved to the master weights
    /// (and summed over the ranks of a world) as each becomes ready in the last backward
    /// pass, and the global norm with the factor that clips it (and removes the loss scale
    /// and the sum over ranks): the mean loss and `(norm, factor)`.
    fn accumulate_and_clip(
        &self,
        micro_batches: &[(Tensor, Tensor)],
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let n = micro_batches.len() as f64;
        let scale = self.scaler.scale;
        let compute: Vec<Tensor> = parameters(&self.model)
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        let master: Option<Vec<Tensor>> = self
            .master
            .as_ref()
            .map(|m| parameters(m).into_iter().map(|(_, t)| t).collect());
        let mut buckets = self
            .collective
            .clone()
            .map(|c| GradientBuckets::new(c, self.bucket_bytes));
        let mut total: Option<Tensor> = None;
        for (k, (inputs, targets)) in micro_batches.iter().enumerate() {
            let loss = self.model.loss_with_targets(inputs, targets)?;
            let scaled = loss.mul_scalar(scale / n)?;
            if k + 1 < micro_batches.len() {
                scaled.backward()?;
            } else {
                let seed = Tensor::ones(scaled.shape(), scaled.dtype(), scaled.device())?;
                scaled.backward_with_hooks(&seed, &compute, &mut |i| {
                    let high = master.as_ref().map(|m| &m[i]);
                    let slot = self.master_grads.as_ref().map(|g| &g[i]);
                    gradient_ready(&compute[i], high, slot, &mut buckets)
                })?;
            }
            let loss = loss.detach().mul_scalar(1.0 / n)?;
            total = Some(match total {
                Some(t) => t.add(&loss)?,
                None => loss,
            });
        }
        let mut loss = total.expect("at least one micro-batch");
        let world = self.world_size() as f64;
        if let Some(mut buckets) = buckets {
            loss = loss.to_dtype(DType::F32)?;
            buckets.push(loss.clone())?;
            buckets.finish()?;
            loss = loss.mul_scalar(1.0 / world)?;
        }
        let max_norm = self.options.grad_clip.unwrap_or(f64::INFINITY);
        let clipped = clip_grad_norm(self.optimizer.groups(), max_norm, 1.0 / (scale * world))?;
        Ok((loss, clipped))
    }

    /// Copies the master weights into the compute-precision model (rounding to its dtype):
    /// one cast a parameter group where both sides are packed, else one a parameter.
    fn sync_compute_weights(&self) -> Result<()> {
        if self.master.is_none() {
            return Ok(());
        }
        let cast = Op::Cast {
            to: self.model.dtype(),
        };
        let low: HashMap<String, Tensor> = parameters(&self.model).into_iter().collect();
        for group in self.optimizer.groups() {
            let pairs: Vec<(&Tensor, &Tensor)> = group
                .params
                .iter()
                .map(|(name, high)| {
                    low.get(name).map(|l| (high, l)).ok_or_else(|| {
                        Error::invalid("trainer", format!("no compute weight `{name}`"))
                    })
                })
                .collect::<Result<_>>()?;
            let highs: Vec<&Tensor> = pairs.iter().map(|(h, _)| *h).collect();
            let lows: Vec<&Tensor> = pairs.iter().map(|(_, l)| *l).collect();
            if let (Some(high), Some(low)) = (Tensor::span(&highs), Tensor::span(&lows)) {
                Tensor::apply_in_place(&cast, &[&high], &[&low], &[])?;
                continue;
            }
            for (high, low) in pairs {
                Tensor::apply_in_place(&cast, &[high], &[low], &[])?;
            }
        }
        Ok(())
    }

    /// Writes a checkpoint atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        checkpoint::save(path, self.weights(), &self.optimizer, &self.state)
    }

    /// Continues from a checkpoint on `device`; `options` must match the run that wrote it
    /// for the continuation to be exact.
    pub fn resume(path: &Path, device: &Arc<dyn Device>, options: TrainOptions) -> Result<Self> {
        Trainer::from_checkpoint(checkpoint::load(path)?, device, options, path)
    }

    /// [`Trainer::resume`] from a checkpoint already read; `path` names it in errors.
    pub fn from_checkpoint(
        loaded: checkpoint::Loaded,
        device: &Arc<dyn Device>,
        options: TrainOptions,
        path: &Path,
    ) -> Result<Self> {
        let weights = Transformer::from_host_tensors(
            &loaded.config,
            &loaded.model,
            &path.display().to_string(),
            device,
            DType::F32,
        )?;
        let mut trainer = Trainer::assemble(weights, options, loaded.state)?;
        trainer.optimizer.load_state(&loaded.optimizer)?;
        if trainer.optimizer.steps() != trainer.state.step {
            return Err(Error::format(
                path.display().to_string(),
                "optimizer and training step counts differ",
            ));
        }
        Ok(trainer)
    }
}

/// The last backward pass has finished `param`'s gradient: it moves to the f32 master
/// weight, where there is one (cast into `slot`, the master's packed gradient, where there is
/// one), and joins the buckets summed over the ranks, where there are any (a parameter the
/// pass did not reach joins with zeros, so that every rank reduces the same tensors). The sum
/// is written in place, so a gradient whose storage another tensor may still use in the rest
/// of the pass (an add passes one gradient to both its inputs) is copied first.
fn gradient_ready(
    param: &Tensor,
    master: Option<&Tensor>,
    slot: Option<&Tensor>,
    buckets: &mut Option<GradientBuckets>,
) -> Result<()> {
    let owner = match master {
        Some(high) => {
            let grad = match (param.grad(), slot) {
                (Some(g), Some(slot)) => {
                    Tensor::apply_in_place(&Op::Cast { to: DType::F32 }, &[&g], &[slot], &[])?;
                    Some(slot.clone())
                }
                (g, _) => g.map(|g| g.to_dtype(DType::F32)).transpose()?,
            };
            high.set_grad(grad);
            param.zero_grad();
            high
        }
        None => param,
    };
    let Some(buckets) = buckets else {
        return Ok(());
    };
    // A packed gradient's storage is the trainer's alone.
    let exclusive = slot.is_some() || owner.grad_is_exclusive();
    let grad = match owner.grad() {
        Some(g) if exclusive => g,
        Some(g) => {
            let own = copied(&g)?;
            owner.set_grad(Some(own.clone()));
            own
        }
        None => {
            let zeros = Tensor::zeros(owner.shape(), owner.dtype(), owner.device())?;
            owner.set_grad(Some(zeros.clone()));
            zeros
        }
    };
    buckets.push(grad)
}

/// Elements every parameter's count must be a multiple of for parameters to be packed: each
/// then starts on 256 bytes in f32 and 128 in 16 bits, as aligned as a lone tensor for the
/// kernels' widest loads.
const PACKED_MULTIPLE: usize = 64;

/// Packs each parameter group of the compute weights `low` and the master weights `high`
/// ([`pack_parameters`]) and returns the master's gradients packed alike, in the order
/// `parameters` visits them: the optimizer's updates, the clipping norm and the cast of the
/// master weights then take one launch a group instead of one a parameter. `None`, packing
/// nothing, where a parameter's size is not a multiple of [`PACKED_MULTIPLE`].
fn pack_for_updates(
    low: &mut Transformer,
    high: &mut Transformer,
    weight_decay: f64,
) -> Result<Option<Vec<Tensor>>> {
    let params = parameters(high);
    if params
        .iter()
        .any(|(_, t)| !t.numel().is_multiple_of(PACKED_MULTIPLE))
    {
        return Ok(None);
    }
    let groups: Vec<Vec<(String, Tensor)>> = ParamGroup::decay_matrices(params, weight_decay)
        .into_iter()
        .map(|g| g.params)
        .collect();
    pack_parameters(high, &groups)?;
    pack_parameters(low, &groups)?;
    let mut grads = HashMap::new();
    for group in &groups {
        let Some((_, first)) = group.first() else {
            continue;
        };
        let shapes: Vec<&[usize]> = group.iter().map(|(_, t)| t.shape()).collect();
        let packed = Tensor::zeros_packed(&shapes, DType::F32, first.device())?;
        grads.extend(group.iter().map(|(name, _)| name.clone()).zip(packed));
    }
    parameters(high)
        .into_iter()
        .map(|(name, _)| {
            grads
                .remove(&name)
                .ok_or_else(|| Error::invalid("trainer", format!("no gradient for `{name}`")))
        })
        .collect::<Result<_>>()
        .map(Some)
}

/// Moves each group's parameters of `model` (named as in `groups`) into one allocation,
/// back to back in the group's order ([`Tensor::zeros_packed`]), as fresh leaves.
fn pack_parameters(model: &mut Transformer, groups: &[Vec<(String, Tensor)>]) -> Result<()> {
    let _guard = crate::no_grad();
    let current: HashMap<String, Tensor> = parameters(model).into_iter().collect();
    let mut packed = HashMap::new();
    for group in groups {
        let tensors: Vec<&Tensor> = group
            .iter()
            .map(|(name, _)| {
                current
                    .get(name)
                    .ok_or_else(|| Error::invalid("trainer", format!("no weight `{name}`")))
            })
            .collect::<Result<_>>()?;
        let Some(first) = tensors.first() else {
            continue;
        };
        let shapes: Vec<&[usize]> = tensors.iter().map(|t| t.shape()).collect();
        let slots = Tensor::zeros_packed(&shapes, first.dtype(), first.device())?;
        for (((name, _), old), slot) in group.iter().zip(&tensors).zip(slots) {
            slot.copy_from(old)?;
            packed.insert(name.clone(), slot.requires_grad());
        }
    }
    model.visit_mut("", &mut |name, t| {
        if let Some(p) = packed.remove(name) {
            *t = p;
        }
        Ok(())
    })
}

/// A copy of `t` in a new buffer (a report's, which later steps do not overwrite).
fn copied(t: &Tensor) -> Result<Tensor> {
    Ok(Tensor::apply(&Op::Copy, &[t], &[], None)?.remove(0))
}
