//! The training loop's step: micro-batch accumulation, mixed precision with f32 master
//! weights, dynamic loss scaling, global-norm clipping on the device, AdamW with parameter
//! groups, learning-rate schedules, and checkpoints that resume bit for bit.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::checkpoint::{self, TrainState};
use crate::models::Transformer;
use crate::nn::parameters;
use crate::optim::{clip_grad_norm, Adam, LossScaler, Optimizer, ParamGroup, Schedule};
use crate::rng::RngState;
use crate::{DType, Device, Error, Op, Result, Tensor};

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
    optimizer: Adam,
    pub state: TrainState,
    scaler: LossScaler,
    pub options: TrainOptions,
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
            optimizer,
            scaler: LossScaler::new(scale, 1000),
            state,
            options,
        })
    }

    /// The f32 weights the optimizer updates (what checkpoints hold).
    pub fn weights(&self) -> &Transformer {
        self.master.as_ref().unwrap_or(&self.model)
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        self.model.device()
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
        let n = micro_batches.len() as f64;
        let scale = self.scaler.scale;
        let mut total: Option<Tensor> = None;
        for (inputs, targets) in micro_batches {
            let loss = self.model.loss_with_targets(inputs, targets)?;
            loss.mul_scalar(scale / n)?.backward()?;
            let loss = loss.detach().mul_scalar(1.0 / n)?;
            total = Some(match total {
                Some(t) => t.add(&loss)?,
                None => loss,
            });
        }
        let loss = total.expect("at least one micro-batch");
        if let Some(master) = &self.master {
            for ((_, low), (_, high)) in parameters(&self.model).iter().zip(parameters(master)) {
                high.set_grad(low.grad().map(|g| g.to_dtype(DType::F32)).transpose()?);
                low.zero_grad();
            }
        }
        let max_norm = self.options.grad_clip.unwrap_or(f64::INFINITY);
        let (grad_norm, factor) = clip_grad_norm(self.optimizer.groups(), max_norm, 1.0 / scale)?;
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

    /// Copies the master weights into the compute-precision model (rounding to its dtype).
    fn sync_compute_weights(&self) -> Result<()> {
        let Some(master) = &self.master else {
            return Ok(());
        };
        let cast = Op::Cast {
            to: self.model.dtype(),
        };
        for ((_, low), (_, high)) in parameters(&self.model).iter().zip(parameters(master)) {
            Tensor::apply_in_place(&cast, &[&high], &[low], &[])?;
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
