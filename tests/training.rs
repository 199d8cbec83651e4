//! Training-step properties: mixed precision that learns with f32 master weights, and gradient
//! accumulation that equals one large batch. (Host synchronizations and flat memory are checked
//! on every device by the conformance stress tests.)

use std::sync::Arc;

use serde_json::Value;
use tessera::data::AdditionTask;
use tessera::models::{Transformer, TransformerConfig};
use tessera::optim::{ParamGroup, Schedule};
use tessera::rng::RngState;
use tessera::train::{Precision, TrainOptions, Trainer};
use tessera::{DType, Device, Tensor};

fn cpu() -> Arc<dyn Device> {
    tessera::open_device("cpu").unwrap()
}

fn options(precision: Precision) -> TrainOptions {
    TrainOptions {
        schedule: Schedule::constant(1e-3),
        weight_decay: 0.01,
        betas: (0.9, 0.98),
        eps: 1e-8,
        grad_clip: Some(1.0),
        precision,
    }
}

/// A small GPT-2 of width `d_model` over the task's ids.
fn trainer(
    device: &Arc<dyn Device>,
    task: &AdditionTask,
    precision: Precision,
    d_model: usize,
) -> Trainer {
    let config = TransformerConfig::gpt2(task.vocab_size(), 16, d_model, 2, 2);
    let mut rng = RngState::new(5);
    let model = Transformer::new(&config, device, DType::F32, &mut rng).unwrap();
    Trainer::new(
        model,
        options(precision),
        rng,
        RngState::new(6),
        Value::Null,
    )
    .unwrap()
}

fn batch(task: &AdditionTask, trainer: &mut Trainer, n: usize) -> (Tensor, Tensor) {
    let (inputs, targets, _) = task.sample_batch(n, &mut trainer.state.data_rng);
    let device = trainer.device().clone();
    let shape = [n, task.seq_len()];
    (
        Tensor::from_slice(&inputs, &shape, &device).unwrap(),
        Tensor::from_slice(&targets, &shape, &device).unwrap(),
    )
}

fn learns(precision: Precision, d_model: usize) -> Trainer {
    let device = cpu();
    let task = AdditionTask::new(2).unwrap();
    let mut t = trainer(&device, &task, precision, d_model);
    let (mut losses, mut skipped) = (Vec::new(), 0);
    for _ in 0..120 {
        let b = batch(&task, &mut t, 16);
        let report = t.step(&[b]).unwrap();
        skipped += usize::from(report.skipped);
        losses.push(report.loss.item().unwrap());
    }
    // f16 starts with a loss scale of 2^16 and halves it on each overflow, so its first steps
    // may be skipped; bf16 has f32's range and never needs to skip.
    let allowed = if precision == Precision::F16 { 12 } else { 0 };
    assert!(skipped <= allowed, "{precision:?}: {skipped} steps skipped");
    if precision == Precision::F16 {
        assert!(
            t.state.loss_scale < 65536.0 || skipped == 0,
            "overflow did not lower the loss scale"
        );
    }
    assert_eq!(t.model.dtype(), precision.dtype());
    assert_eq!(
        t.weights().dtype(),
        DType::F32,
        "master weights must stay f32"
    );
    let (first, last) = (
        losses[..10].iter().sum::<f64>() / 10.0,
        losses[110..].iter().sum::<f64>() / 10.0,
    );
    assert!(
        last < 0.7 * first,
        "{precision:?}: loss went from {first} to {last}"
    );
    t
}

/// Whether each parameter group of `model` lies packed in one allocation.
fn packed(model: &Transformer) -> bool {
    ParamGroup::decay_matrices(tessera::nn::parameters(model), 0.0)
        .iter()
        .all(|g| Tensor::span(&g.params.iter().map(|(_, t)| t).collect::<Vec<_>>()).is_some())
}

#[test]
fn bf16_training_learns_with_f32_master_weights() {
    let t = learns(Precision::Bf16, 32);
    assert!(!packed(t.weights()), "32 is no multiple of 64 elements");
}

#[test]
fn f16_training_learns_with_loss_scaling() {
    learns(Precision::F16, 32);
}

/// With every parameter a multiple of 64 elements, the trainer packs each group of master
/// and compute weights (and the master gradients) in one allocation, so that updates, the
/// clipping norm and the cast of master weights take a launch a group; it learns as well.
#[test]
fn bf16_training_learns_with_packed_parameter_groups() {
    let t = learns(Precision::Bf16, 64);
    assert!(packed(t.weights()) && packed(&t.model));
}

#[test]
fn accumulated_micro_batches_give_the_large_batch_gradient() {
    let device = cpu();
    let config = TransformerConfig::llama(64, 16, 32, 2, 4, 2, 64);
    let model = Transformer::new(&config, &device, DType::F32, &mut RngState::new(1)).unwrap();
    let ids: Vec<u32> = (0..8 * 12).map(|i| (i * 7 + 3) % 64).collect();
    let targets: Vec<u32> = (0..8 * 12).map(|i| (i * 5 + 1) % 64).collect();
    let whole = |n: usize, from: usize| {
        (
            Tensor::from_slice(&ids[from * 12..(from + n) * 12], &[n, 12], &device).unwrap(),
            Tensor::from_slice(&targets[from * 12..(from + n) * 12], &[n, 12], &device).unwrap(),
        )
    };
    let (x, y) = whole(8, 0);
    model.loss_with_targets(&x, &y).unwrap().backward().unwrap();
    let large: Vec<Vec<f64>> = tessera::nn::parameters(&model)
        .iter()
        .map(|(_, p)| p.grad().unwrap().to_vec_f64().unwrap())
        .collect();
    tessera::nn::zero_grad(&model);
    for half in [0, 4] {
        let (x, y) = whole(4, half);
        model
            .loss_with_targets(&x, &y)
            .unwrap()
            .mul_scalar(0.5)
            .unwrap()
            .backward()
            .unwrap();
    }
    for ((name, p), want) in tessera::nn::parameters(&model).iter().zip(large) {
        let got = p.grad().unwrap().to_vec_f64().unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-6 + 1e-4 * w.abs(),
                "{name}: accumulated {g} vs large batch {w}"
            );
        }
    }
}

/// A large vocabulary's logits over many rows come from a product padded to whole tiles and
/// narrowed back (the forward's logits are then a view with wider rows); loss and gradients
/// equal those of the same rows in halves too small to be padded, where the op itself
/// ignores targets past the vocabulary.
#[test]
fn a_padded_lm_head_gives_the_unpadded_loss_and_gradients() {
    let device = cpu();
    let (vocab, seq) = (16_400, 160);
    let config = TransformerConfig::gpt2(vocab, seq, 16, 1, 2);
    let model = Transformer::new(&config, &device, DType::F32, &mut RngState::new(3)).unwrap();
    let ids: Vec<u32> = (0..2 * seq)
        .map(|i| ((i * 7919 + 11) % vocab) as u32)
        .collect();
    let mut targets: Vec<u32> = (0..2 * seq)
        .map(|i| ((i * 104_729 + 5) % vocab) as u32)
        .collect();
    // Targets outside the vocabulary are ignored, those among the padded columns too.
    targets[3] = vocab as u32;
    targets[seq + 7] = vocab as u32 + 100;
    let rows = |n: usize, from: usize| {
        let span = from * seq..(from + n) * seq;
        (
            Tensor::from_slice(&ids[span.clone()], &[n, seq], &device).unwrap(),
            Tensor::from_slice(&targets[span], &[n, seq], &device).unwrap(),
        )
    };
    let (x, y) = rows(2, 0);
    let logits = model.forward(&x, None).unwrap();
    assert_eq!(logits.shape(), [2, seq, vocab]);
    assert!(
        !logits.is_contiguous(),
        "320 rows of 16,400 were not padded"
    );
    let (half, _) = rows(1, 0);
    assert!(model.forward(&half, None).unwrap().is_contiguous());

    let whole_loss = model.loss_with_targets(&x, &y).unwrap();
    whole_loss.backward().unwrap();
    let whole: Vec<Vec<f64>> = tessera::nn::parameters(&model)
        .iter()
        .map(|(_, p)| p.grad().unwrap().to_vec_f64().unwrap())
        .collect();
    tessera::nn::zero_grad(&model);
    let mut halves_loss = 0.0;
    for from in [0, 1] {
        let (x, y) = rows(1, from);
        let loss = model
            .loss_with_targets(&x, &y)
            .unwrap()
            .mul_scalar(0.5)
            .unwrap();
        halves_loss += loss.item().unwrap();
        loss.backward().unwrap();
    }
    let whole_loss = whole_loss.item().unwrap();
    assert!(
        (whole_loss - halves_loss).abs() <= 1e-6 * whole_loss.abs(),
        "padded loss {whole_loss} vs halves {halves_loss}"
    );
    for ((name, p), want) in tessera::nn::parameters(&model).iter().zip(whole) {
        let got = p.grad().unwrap().to_vec_f64().unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-7 + 1e-4 * w.abs(),
                "{name}: halves {g} vs padded {w}"
            );
        }
    }
}
