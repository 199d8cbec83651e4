//! Model-level conformance: GPT-2 and Llama logits, loss, every gradient, one AdamW step and a
//! greedy generation against what Hugging Face transformers computed for the same weights
//! (`expected.safetensors` in each fixture directory), on every available device; decoding
//! at device positions against a full forward, and replayed decoding steps against eager
//! ones, bit for bit.
//!
//! Fixture directories: every directory under `$TESSERA_SHARED/fixtures/hf` (else
//! `../shared/fixtures/hf` beside the workspace); `TESSERA_HF_FIXTURES`, a colon-separated
//! list of directories, replaces that list.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tessera::generate::{generate, GenerateOptions, Sampling};
use tessera::io::{self, HostTensor};
use tessera::models::{Transformer, TransformerConfig};
use tessera::nn::KvCache;
use tessera::optim::{Adam, Optimizer, ParamGroup, Schedule};
use tessera::rng::RngState;
use tessera::train::{Precision, TrainOptions, Trainer};
use tessera::{no_grad, DType, Device, ReplayedStep, Tensor};
use tessera_conformance::{devices_under_test, shared_dir};

/// Absolute tolerance of gradients and updated parameters (the f32 bar).
const GRAD_ATOL: f64 = 1e-5;

fn fixture_dirs() -> Vec<PathBuf> {
    if let Ok(list) = std::env::var("TESSERA_HF_FIXTURES") {
        return list
            .split(':')
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect();
    }
    let root = shared_dir().join("fixtures/hf");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("cannot list fixtures in {}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("expected.safetensors").exists())
        .collect();
    dirs.sort();
    dirs
}

/// Asserts `|got - want| <= atol + rtol |want|` elementwise, reporting the worst element.
fn assert_close(what: &str, got: &[f64], want: &HostTensor, rtol: f64, atol: f64) {
    let want = want.to_f64();
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: {} values, expected {}",
        got.len(),
        want.len()
    );
    let mut worst = (0.0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let excess = (g - w).abs() - (atol + rtol * w.abs());
        let excess = if excess.is_nan() {
            f64::INFINITY
        } else {
            excess
        };
        if excess > worst.0 {
            worst = (excess, i);
        }
    }
    let i = worst.1;
    assert!(
        worst.0 <= 0.0,
        "{what}: element {i} is {} but expected {} (rtol {rtol}, atol {atol})",
        got[i],
        want[i]
    );
}

fn ids_of(t: &HostTensor) -> Vec<u32> {
    t.to_f64().into_iter().map(|v| v as u32).collect()
}

fn check_fixture(dir: &Path, device: &Arc<dyn Device>) {
    let label = format!("{} on {}", dir.display(), device.info().id());
    let expected =
        io::load(&dir.join("expected.safetensors")).unwrap_or_else(|e| panic!("{label}: {e}"));
    let get = |k: &str| {
        expected
            .get(k)
            .unwrap_or_else(|| panic!("{label}: expected.safetensors lacks `{k}`"))
    };
    let spec: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("fixture.json")).expect("fixture.json"),
    )
    .expect("fixture.json is JSON");

    let model = Transformer::from_hf_dir(dir, device, DType::F32)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let ids_host = get("input_ids");
    let ids = ids_host.to_tensor(device).unwrap();

    let logits = {
        let _g = tessera::no_grad();
        model.forward(&ids, None).unwrap()
    };
    assert_close(
        &format!("{label}: logits"),
        &logits.to_vec_f64().unwrap(),
        get("logits"),
        1e-4,
        1e-5,
    );

    let loss = model.loss(&ids).unwrap();
    assert_close(
        &format!("{label}: loss"),
        &[loss.item().unwrap()],
        get("loss"),
        1e-4,
        1e-5,
    );

    loss.backward().unwrap();
    let grads = model.grads_hf().unwrap();
    let grad_names: Vec<&String> = expected.keys().filter(|k| k.starts_with("grad.")).collect();
    assert!(
        !grad_names.is_empty(),
        "{label}: no gradients in the fixture"
    );
    for key in grad_names {
        let name = &key["grad.".len()..];
        let got = grads
            .get(name)
            .unwrap_or_else(|| panic!("{label}: no gradient for {name}"));
        assert_close(
            &format!("{label}: {key}"),
            &got.to_f64(),
            &expected[key],
            1e-3,
            GRAD_ATOL,
        );
    }
    assert_eq!(
        grads.len(),
        expected.keys().filter(|k| k.starts_with("grad.")).count(),
        "{label}: parameter count"
    );

    // One AdamW step, twice. Adam's first step moves each element by about lr * g / (|g| + eps):
    // for gradients far below the 1e-5 absolute tolerance to which gradients are compared (GPT-2's
    // key bias is zero up to rounding, since softmax ignores it), that step follows rounding noise.
    // Hence: (a) the update applied to the fixture's own gradients must match every element;
    // (b) the update applied to our gradients must match every element whose expected gradient
    // is pinned down by the gradient comparison, |g| > GRAD_ATOL.
    let adamw = &spec["adamw"];
    let mut ours = adamw_step(&model, adamw);
    let theirs = Transformer::from_hf_dir(dir, device, DType::F32).unwrap();
    for (name, p) in tessera::nn::parameters(&theirs) {
        let g = expected
            .get(&format!("grad.{name}"))
            .unwrap_or_else(|| panic!("{label}: no expected gradient for {name}"));
        let g = Transformer::hf_to_internal_layout(theirs.config.family, &name, g);
        p.set_grad(Some(g.to_tensor(device).unwrap()));
    }
    let theirs_after = adamw_step(&theirs, adamw);
    for key in expected.keys().filter(|k| k.starts_with("after_adamw.")) {
        let name = &key["after_adamw.".len()..];
        let want = &expected[key];
        let got = theirs_after
            .get(name)
            .unwrap_or_else(|| panic!("{label}: no parameter {name}"));
        assert_close(
            &format!("{label}: {key} from the fixture's gradients"),
            &got.to_f64(),
            want,
            1e-3,
            1e-5,
        );
        let conditioned: Vec<bool> = expected[&format!("grad.{name}")]
            .to_f64()
            .iter()
            .map(|g| g.abs() > GRAD_ATOL)
            .collect();
        let keep = |v: Vec<f64>| -> Vec<f64> {
            v.into_iter()
                .zip(&conditioned)
                .filter(|(_, &c)| c)
                .map(|(x, _)| x)
                .collect()
        };
        let mut want_kept = want.clone();
        want_kept.bytes = tessera::encode_f64(&keep(want.to_f64()), want.dtype);
        want_kept.shape = vec![want_kept.bytes.len() / want.dtype.size()];
        let got = ours
            .remove(name)
            .unwrap_or_else(|| panic!("{label}: no parameter {name}"));
        assert_close(
            &format!("{label}: {key} from our gradients"),
            &keep(got.to_f64()),
            &want_kept,
            1e-3,
            1e-5,
        );
    }

    let fresh = Transformer::from_hf_dir(dir, device, DType::F32).unwrap();
    let prompt = ids_of(get("generate.prompt"));
    let want = ids_of(get("generate.greedy"));
    let options = GenerateOptions {
        max_new_tokens: want.len() - prompt.len(),
        sampling: Sampling::greedy(),
        stop_tokens: vec![],
    };
    let mut streamed = Vec::new();
    let got = generate(&fresh, &prompt, &options, &mut RngState::new(0), &mut |t| {
        streamed.push(t)
    })
    .unwrap();
    assert_eq!(got, want, "{label}: greedy generation");
    assert_eq!(streamed, want[prompt.len()..], "{label}: streamed tokens");

    // With a stop token, the output ends at its first occurrence among the new tokens.
    let new_tokens = &want[prompt.len()..];
    let stop = new_tokens[1];
    let end = prompt.len() + new_tokens.iter().position(|&t| t == stop).unwrap_or(1) + 1;
    let options = GenerateOptions {
        stop_tokens: vec![stop],
        ..options
    };
    let got = generate(
        &fresh,
        &prompt,
        &options,
        &mut RngState::new(0),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(
        got,
        want[..end],
        "{label}: greedy generation stopping at {stop}"
    );
}

/// Applies the fixture's AdamW step to every parameter of `model` (whose gradients are set)
/// and returns the parameters afterwards in Hugging Face layout.
fn adamw_step(model: &Transformer, adamw: &Value) -> BTreeMap<String, HostTensor> {
    let num = |v: &Value| v.as_f64().expect("number in fixture.json");
    let groups = vec![ParamGroup::new(
        tessera::nn::parameters(model),
        num(&adamw["weight_decay"]),
    )];
    let mut opt = Adam::adamw(
        groups,
        num(&adamw["betas"][0]),
        num(&adamw["betas"][1]),
        num(&adamw["eps"]),
    )
    .unwrap();
    let one = Tensor::ones(&[1], DType::F32, model.device()).unwrap();
    for _ in 0..adamw["step"].as_u64().unwrap_or(1) {
        opt.step(num(&adamw["lr"]), &one).unwrap();
    }
    model.state_dict().unwrap()
}

#[test]
fn hugging_face_fixtures_match_on_every_device() {
    let dirs = fixture_dirs();
    assert!(!dirs.is_empty(), "no fixture directories found");
    for device in devices_under_test() {
        for dir in &dirs {
            check_fixture(dir, &device);
            println!(
                "model conformance: {} on {}: pass",
                dir.display(),
                device.info().id()
            );
        }
    }
}

/// Asserts that logits decoded through a cache agree with a full forward's to f32 rounding
/// (the kernels differ: few-row matmuls, decoding attention).
fn assert_logits_agree(label: &str, cached: &[f64], full: &[f64], vocab: usize) {
    assert_eq!(cached.len(), full.len(), "{label}: logits");
    for (i, (got, want)) in cached.iter().zip(full).enumerate() {
        assert!(
            (got - want).abs() <= 1e-4 + 1e-4 * want.abs(),
            "{label}: logit {} of position {}: cached {got}, full {want}",
            i % vocab,
            i / vocab
        );
    }
}

/// Decoding through the KV cache (a 5-token prompt, then one token at a time, past the cache's
/// first capacity of 64 positions, so it grows) gives the logits of one forward pass over the
/// whole sequence: GPT-2 (keys and values go into the cache straight from the fused
/// projection) and Llama (rotary embedding, grouped-query heads). Kernels differ between the
/// two ways (few-row matmuls, decoding attention), so they agree to f32 rounding.
/// A small GPT-2 and a small Llama (rotary embedding, grouped-query heads) over `vocab` ids,
/// with room for 96 positions.
fn small_models(vocab: usize) -> [TransformerConfig; 2] {
    [
        TransformerConfig::gpt2(vocab, 96, 32, 2, 4),
        TransformerConfig::llama(vocab, 96, 32, 2, 4, 2, 64),
    ]
}

#[test]
fn cached_decoding_matches_a_full_forward_on_every_device() {
    const VOCAB: usize = 50;
    const LEN: usize = 80;
    const PROMPT: usize = 5;
    let configs = small_models(VOCAB);
    let ids: Vec<u32> = (0..LEN as u32)
        .map(|i| (7 * i + 3) % VOCAB as u32)
        .collect();
    let _no_grad = no_grad();
    for device in devices_under_test() {
        for config in &configs {
            let label = format!("{:?} on {}", config.family, device.info().id());
            let model =
                Transformer::new(config, &device, DType::F32, &mut RngState::new(5)).unwrap();
            let logits = |ids: &[u32], cache: Option<&mut KvCache>| {
                let ids = Tensor::from_slice(ids, &[1, ids.len()], &device).unwrap();
                model.forward(&ids, cache).unwrap().to_vec_f64().unwrap()
            };
            let full = logits(&ids, None);
            let mut cache = KvCache::new(config.n_layer);
            let mut cached = logits(&ids[..PROMPT], Some(&mut cache));
            for id in &ids[PROMPT..] {
                cached.extend(logits(std::slice::from_ref(id), Some(&mut cache)));
            }
            assert_eq!(cache.len(), LEN, "{label}: cached positions");
            assert_logits_agree(&label, &cached, &full, VOCAB);
        }
    }
}

/// Decoding at positions held on the device, into a KV cache of fixed capacity (the
/// prompt, then one token at a time, written with index copies and read by cached
/// attention), gives the logits of one forward pass over the whole sequence.
#[test]
fn decoding_at_device_positions_matches_a_full_forward_on_every_device() {
    const VOCAB: usize = 50;
    const LEN: usize = 40;
    const PROMPT: usize = 5;
    let configs = small_models(VOCAB);
    let ids: Vec<u32> = (0..LEN as u32)
        .map(|i| (5 * i + 2) % VOCAB as u32)
        .collect();
    let _no_grad = no_grad();
    for device in devices_under_test() {
        for config in &configs {
            let label = format!("{:?} on {}", config.family, device.info().id());
            let model =
                Transformer::new(config, &device, DType::F32, &mut RngState::new(6)).unwrap();
            let full_ids = Tensor::from_slice(&ids, &[1, LEN], &device).unwrap();
            let full = model
                .forward(&full_ids, None)
                .unwrap()
                .to_vec_f64()
                .unwrap();
            let mut cache = KvCache::with_capacity(config.n_layer, LEN);
            let mut at = |start: usize, len: usize| {
                let chunk = Tensor::from_slice(&ids[start..start + len], &[1, len], &device);
                let positions: Vec<i32> = (start as i32..(start + len) as i32).collect();
                let positions = Tensor::from_slice(&positions, &[len], &device).unwrap();
                let logits = model.forward_at(&chunk.unwrap(), &positions, &mut cache);
                logits.unwrap().to_vec_f64().unwrap()
            };
            let mut cached = at(0, PROMPT);
            for i in PROMPT..LEN {
                cached.extend(at(i, 1));
            }
            assert_logits_agree(&label, &cached, &full, VOCAB);
        }
    }
}

/// Whether `device`'s backend records work for replay (`Device::begin_recording`).
fn records_work(device: &Arc<dyn Device>) -> bool {
    matches!(device.info().backend.as_str(), "cuda" | "vulkan")
}

/// A decoding step replayed from a recording leaves the same bits as the same step run
/// eagerly: logits copied out of every step, and the chosen tokens, over 24 steps of GPT-2
/// and Llama in f32 and bf16. Devices that record work (CUDA graphs, Vulkan command
/// buffers) must replay it; the others run both eagerly.
#[test]
fn replayed_decoding_steps_give_the_bits_of_eager_ones_on_every_device() {
    const VOCAB: usize = 64;
    const STEPS: usize = 24;
    let configs = small_models(VOCAB);
    let prompt: Vec<u32> = vec![3, 17, 9, 40, 2];
    let _no_grad = no_grad();
    for device in devices_under_test() {
        let records = records_work(&device);
        for config in &configs {
            for dtype in [DType::F32, DType::BF16] {
                if !device.info().dtypes.contains(&dtype) {
                    continue;
                }
                let label = format!("{:?} {dtype} on {}", config.family, device.info().id());
                let model =
                    Transformer::new(config, &device, dtype, &mut RngState::new(8)).unwrap();
                let run = |mut step: ReplayedStep| {
                    let capacity = prompt.len() + STEPS;
                    let mut cache = KvCache::with_capacity(config.n_layer, capacity);
                    let ids = Tensor::from_slice(&prompt, &[1, prompt.len()], &device).unwrap();
                    let first = model.forward(&ids, Some(&mut cache)).unwrap();
                    let token = first.select(1, -1).unwrap().argmax(-1, true).unwrap();
                    let token = token.to_dtype(DType::U32).unwrap();
                    let position =
                        Tensor::full(&[1], prompt.len() as f64, DType::F32, &device).unwrap();
                    let logits_out = Tensor::zeros(&[1, 1, VOCAB], dtype, &device).unwrap();
                    let mut decode = || {
                        let at = position.to_dtype(DType::I32)?;
                        let logits = model.forward_at(&token, &at, &mut cache)?;
                        logits_out.copy_from(&logits)?;
                        let next = logits.select(1, -1)?.argmax(-1, true)?;
                        token.copy_from(&next.to_dtype(DType::U32)?)?;
                        position.copy_from(&position.add_scalar(1.0)?)
                    };
                    let mut trace = Vec::new();
                    for _ in 0..STEPS {
                        step.run(&mut decode).unwrap();
                        let bits = logits_out.to_dtype(DType::F32).unwrap().to_vec::<f32>();
                        trace.push((bits.unwrap(), token.to_vec::<u32>().unwrap()));
                    }
                    (trace, step.is_replayed())
                };
                let (eager, _) = run(ReplayedStep::eager(&device));
                let (replayed, was_replayed) = run(ReplayedStep::new(&device));
                assert_eq!(
                    was_replayed, records,
                    "{label}: whether steps were replayed"
                );
                for (i, (e, r)) in eager.iter().zip(&replayed).enumerate() {
                    let same = e.1 == r.1
                        && e.0
                            .iter()
                            .zip(&r.0)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{label}: step {i}: replayed {r:?}, eager {e:?}");
                }
            }
        }
    }
}

/// Training steps replayed from a recording (the trainer's default where the device records:
/// cuda and vulkan) leave the losses, gradient norms and weights an eager trainer leaves, bit for bit,
/// over steps whose learning rate changes (warm-up, then cosine decay), with clipping and two
/// micro-batches per step, in f32 and in bf16 with f32 master weights.
#[test]
fn replayed_training_steps_give_the_bits_of_eager_ones_on_every_device() {
    const VOCAB: usize = 64;
    const STEPS: usize = 6;
    const SHAPE: [usize; 2] = [2, 12];
    let configs = small_models(VOCAB);
    let mut data_rng = RngState::new(3);
    let data: Vec<Vec<u32>> = (0..STEPS * 4)
        .map(|_| {
            (0..SHAPE[0] * SHAPE[1])
                .map(|_| data_rng.next_below(VOCAB) as u32)
                .collect()
        })
        .collect();
    for device in devices_under_test() {
        let records = records_work(&device);
        for config in &configs {
            for precision in [Precision::F32, Precision::Bf16] {
                if !device.info().dtypes.contains(&precision.dtype()) {
                    continue;
                }
                let label = format!(
                    "{:?} {precision:?} on {}",
                    config.family,
                    device.info().id()
                );
                let run = |replay: bool| {
                    let model =
                        Transformer::new(config, &device, DType::F32, &mut RngState::new(8))
                            .unwrap();
                    let options = TrainOptions {
                        schedule: Schedule {
                            peak: 3e-3,
                            min_lr: 1e-4,
                            warmup: 2,
                            total: STEPS as u64,
                        },
                        weight_decay: 0.1,
                        betas: (0.9, 0.95),
                        eps: 1e-8,
                        grad_clip: Some(0.5),
                        precision,
                    };
                    let (rng, data_rng) = (RngState::new(1), RngState::new(2));
                    let mut trainer =
                        Trainer::new(model, options, rng, data_rng, Value::Null).unwrap();
                    trainer.set_replay(replay);
                    let ids = |i: usize| Tensor::from_slice(&data[i], &SHAPE, &device).unwrap();
                    let mut trace = Vec::new();
                    for step in 0..STEPS {
                        let micro: Vec<(Tensor, Tensor)> = (0..2)
                            .map(|m| (ids(4 * step + 2 * m), ids(4 * step + 2 * m + 1)))
                            .collect();
                        let report = trainer.step(&micro).unwrap();
                        let bits = |t: &Tensor| t.to_vec::<f32>().unwrap()[0].to_bits();
                        trace.push((bits(&report.loss), bits(&report.grad_norm)));
                    }
                    let weights = trainer.weights().state_dict().unwrap();
                    (trace, weights, trainer.replayed_last_step())
                };
                let (eager, eager_weights, _) = run(false);
                let (replayed, replayed_weights, was_replayed) = run(true);
                assert_eq!(
                    was_replayed, records,
                    "{label}: whether steps were replayed"
                );
                assert_eq!(replayed, eager, "{label}: (loss, grad norm) bits per step");
                for (name, w) in &eager_weights {
                    assert!(
                        replayed_weights.get(name) == Some(w),
                        "{label}: weight {name} differs after {STEPS} steps"
                    );
                }
            }
        }
    }
}

#[test]
fn checkpoints_round_trip_through_hugging_face_format() {
    let dir = &fixture_dirs()[0];
    let device = tessera::open_device("cpu").unwrap();
    let model = Transformer::from_hf_dir(dir, &device, DType::F32).unwrap();
    let out = std::env::temp_dir().join(format!("tessera-hf-roundtrip-{}", std::process::id()));
    model.save_hf(&out).unwrap();
    let again = Transformer::from_hf_dir(&out, &device, DType::F32).unwrap();
    assert_eq!(model.state_dict().unwrap(), again.state_dict().unwrap());
    let original = io::load(&dir.join("model.safetensors")).unwrap();
    for (name, t) in model.state_dict().unwrap() {
        let stored = original
            .get(&name)
            .or_else(|| original.get(name.trim_start_matches("transformer.")))
            .unwrap();
        assert_eq!(&t, stored, "{name} changed on the way through");
    }
    std::fs::remove_dir_all(&out).ok();
}
