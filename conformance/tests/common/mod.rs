//! What the stress and soak tests share: a small GPT trainer on the addition task.

use std::sync::Arc;

use serde_json::Value;
use tessera::data::AdditionTask;
use tessera::models::{Transformer, TransformerConfig};
use tessera::optim::Schedule;
use tessera::rng::RngState;
use tessera::train::{Precision, TrainOptions, Trainer};
use tessera::{DType, Device, Tensor};

/// A two-layer GPT of width 32 for `task`, AdamW with clipping, in f32.
pub fn small_gpt_trainer(device: &Arc<dyn Device>, task: &AdditionTask) -> Trainer {
    let config = TransformerConfig::gpt2(task.vocab_size(), 16, 32, 2, 2);
    let mut rng = RngState::new(5);
    let model = Transformer::new(&config, device, DType::F32, &mut rng).unwrap();
    let options = TrainOptions {
        schedule: Schedule::constant(1e-3),
        weight_decay: 0.01,
        betas: (0.9, 0.98),
        eps: 1e-8,
        grad_clip: Some(1.0),
        precision: Precision::F32,
    };
    Trainer::new(model, options, rng, RngState::new(6), Value::Null).unwrap()
}

/// A batch of 8 problems of `task` from the trainer's data generator.
pub fn batch(task: &AdditionTask, trainer: &mut Trainer) -> (Tensor, Tensor) {
    let (inputs, targets, _) = task.sample_batch(8, &mut trainer.state.data_rng);
    let device = trainer.device().clone();
    let shape = [8, task.seq_len()];
    (
        Tensor::from_slice(&inputs, &shape, &device).unwrap(),
        Tensor::from_slice(&targets, &shape, &device).unwrap(),
    )
}
