//! Stress on every device under test: many threads sharing one device get the results one
//! thread gets, bit for bit; running out of memory is an error the device recovers from.

use std::sync::Arc;

use tessera::models::{Transformer, TransformerConfig};
use tessera::rng::RngState;
use tessera::{DType, Device, Error, Tensor};
use tessera_conformance::devices_under_test;

/// Logits and every gradient of a small Llama on `ids`, as host bytes.
fn forward_backward(model: &Transformer, ids: &Tensor) -> Vec<Vec<f64>> {
    let loss = model.loss(ids).unwrap();
    loss.backward().unwrap();
    let mut out = vec![vec![loss.item().unwrap()]];
    for (_, p) in tessera::nn::parameters(model) {
        out.push(p.grad().unwrap().to_vec_f64().unwrap());
        p.zero_grad();
    }
    out
}

fn model_on(device: &Arc<dyn Device>) -> Transformer {
    let config = TransformerConfig::llama(96, 64, 48, 2, 4, 2, 96);
    Transformer::new(&config, device, DType::F32, &mut RngState::new(11)).unwrap()
}

fn ids(device: &Arc<dyn Device>, seed: u32) -> Tensor {
    let values: Vec<u32> = (0..2 * 40).map(|i| (i * 31 + seed * 17) % 96).collect();
    Tensor::from_slice(&values, &[2, 40], device).unwrap()
}

#[test]
fn eight_threads_on_one_device_match_one_thread() {
    for device in devices_under_test() {
        let expected: Vec<Vec<Vec<f64>>> = (0..8).map(|s| forward_backward(&model_on(&device), &ids(&device, s))).collect();
        let results: Vec<Vec<Vec<f64>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8u32)
                .map(|s| {
                    let device = device.clone();
                    scope.spawn(move || {
                        let model = model_on(&device);
                        (0..3).map(|_| forward_backward(&model, &ids(&device, s))).last().unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (s, (got, want)) in results.iter().zip(&expected).enumerate() {
            assert!(got == want, "{}: thread {s} differs from the single-threaded result", device.info().id());
        }
    }
}

#[test]
fn out_of_memory_is_an_error_and_the_device_recovers() {
    for device in devices_under_test() {
        let id = device.info().id();
        let small = Tensor::ones(&[1024], DType::F32, &device).unwrap();
        let in_use = device.memory().in_use;
        device.set_memory_limit(Some(in_use + (1 << 20)));
        let err = Tensor::zeros(&[1 << 20], DType::F32, &device).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory { requested, .. } if requested >= 4 << 20), "{id}: {err}");
        let next = small.add(&small).unwrap().sum_all().unwrap().item().unwrap();
        assert_eq!(next, 2048.0, "{id}: the device is unusable after out-of-memory");
        device.set_memory_limit(None);
        assert_eq!(Tensor::zeros(&[1 << 20], DType::F32, &device).unwrap().numel(), 1 << 20);
    }
}
