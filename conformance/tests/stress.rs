//! Stress on every device under test: many threads sharing one device get the results one
//! thread gets, bit for bit; running out of memory is an error the device recovers from; a
//! training step never waits for the device; and a read started early returns the values of
//! its time. (Memory over many steps: `soak.rs`, a process of its own.)

use std::sync::Arc;

use tessera::data::AdditionTask;
use tessera::models::{Transformer, TransformerConfig};
use tessera::rng::RngState;
use tessera::{DType, Device, Error, Tensor};
use tessera_conformance::devices_under_test;

mod common;
use common::{batch, small_gpt_trainer};

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
        let expected: Vec<Vec<Vec<f64>>> = (0..8)
            .map(|s| forward_backward(&model_on(&device), &ids(&device, s)))
            .collect();
        let results: Vec<Vec<Vec<f64>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8u32)
                .map(|s| {
                    let device = device.clone();
                    scope.spawn(move || {
                        let model = model_on(&device);
                        let mut result = forward_backward(&model, &ids(&device, s));
                        for _ in 0..2 {
                            result = forward_backward(&model, &ids(&device, s));
                        }
                        result
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (s, (got, want)) in results.iter().zip(&expected).enumerate() {
            assert!(
                got == want,
                "{}: thread {s} differs from the single-threaded result",
                device.info().id()
            );
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
        assert!(
            matches!(err, Error::OutOfMemory { requested, .. } if requested >= 4 << 20),
            "{id}: {err}"
        );
        let next = small
            .add(&small)
            .unwrap()
            .sum_all()
            .unwrap()
            .item()
            .unwrap();
        assert_eq!(
            next, 2048.0,
            "{id}: the device is unusable after out-of-memory"
        );
        device.set_memory_limit(None);
        assert_eq!(
            Tensor::zeros(&[1 << 20], DType::F32, &device)
                .unwrap()
                .numel(),
            1 << 20
        );
    }
}

#[test]
fn a_loop_that_never_synchronizes_reuses_memory() {
    for device in devices_under_test() {
        let id = device.info().id();
        let x = Tensor::ones(&[4 << 20], DType::F32, &device).unwrap();
        let before = device.memory().reserved;
        for _ in 0..40 {
            drop(x.add(&x).unwrap());
        }
        let grown = device.memory().reserved - before;
        let block = tessera::memory::size_class(16 << 20);
        // Each result's block serves the next result; a pool that handed a block out again
        // only after the queue finished with it would hold all 40 here.
        assert!(
            grown <= 2 * block,
            "{id}: 40 unsynchronized 16 MiB results reserved {grown} bytes"
        );
        device.synchronize().unwrap();
    }
}

#[test]
fn a_read_started_early_sees_the_values_of_its_time() {
    for device in devices_under_test() {
        let id = device.info().id();
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &device).unwrap();
        let doubled = x.add(&x).unwrap();
        let early = doubled.to_vec_later::<f32>().unwrap();
        doubled.copy_from(&x.mul(&doubled).unwrap()).unwrap();
        let late = doubled.to_vec_later::<f32>().unwrap();
        let syncs = device.host_syncs();
        assert_eq!(
            early.wait().unwrap(),
            [2.0, 4.0, 6.0],
            "{id}: the early read"
        );
        assert_eq!(
            late.wait().unwrap(),
            [2.0, 8.0, 18.0],
            "{id}: the late read"
        );
        assert_eq!(
            device.host_syncs(),
            syncs,
            "{id}: waiting is not another sync"
        );
        let wrong = doubled.to_vec_later::<i32>().err();
        assert!(
            matches!(wrong, Some(Error::DType { .. })),
            "{id}: {wrong:?}"
        );
    }
}

#[test]
fn a_training_step_never_waits_for_the_device() {
    for device in devices_under_test() {
        let task = AdditionTask::new(2).unwrap();
        let mut t = small_gpt_trainer(&device, &task);
        for _ in 0..3 {
            let b = batch(&task, &mut t);
            let before = device.host_syncs();
            let report = t.step(&[b]).unwrap();
            assert_eq!(
                device.host_syncs(),
                before,
                "{}: the step waited for the device",
                device.info().id()
            );
            report.loss.item().unwrap();
            assert_eq!(
                device.host_syncs(),
                before + 1,
                "reading the loss is the one synchronization"
            );
        }
    }
}

/// On devices that record work for replay: a recorded step (run once before, as
/// `ReplayedStep` does) runs nothing until replayed, each
/// replay runs it on the values its buffers hold then (a counter stepped once per run counts
/// every replay), and host copies and waits inside the recording are refused with an error
/// that leaves the recording and the device usable. Devices that do not record say
/// `Unsupported`.
#[test]
fn a_recorded_step_replays_on_current_values_and_refuses_host_copies() {
    for device in devices_under_test() {
        let id = device.info().id();
        let counter = Tensor::zeros(&[1000], DType::F32, &device).unwrap();
        let step = || counter.copy_from(&counter.add_scalar(1.0)?);
        // Run once first, as `ReplayedStep` does, so that its kernels are loaded.
        step().unwrap();
        match device.begin_recording() {
            Ok(()) => {}
            Err(Error::Unsupported { .. }) => continue,
            Err(e) => panic!("{id}: begin_recording: {e}"),
        }
        step().unwrap();
        let read = counter
            .to_vec::<f32>()
            .expect_err("a read inside a recording");
        assert!(read.to_string().contains("read"), "{id}: {read}");
        let wait = device.synchronize().expect_err("a wait inside a recording");
        assert!(wait.to_string().contains("synchronize"), "{id}: {wait}");
        let recording = device.end_recording().unwrap();
        let values = |t: &Tensor| t.to_vec::<f32>().unwrap();
        assert_eq!(values(&counter), vec![1.0; 1000], "{id}: before any replay");
        for _ in 0..3 {
            recording.replay().unwrap();
        }
        assert_eq!(
            values(&counter),
            vec![4.0; 1000],
            "{id}: after three replays"
        );
        step().unwrap();
        recording.replay().unwrap();
        assert_eq!(
            values(&counter),
            vec![6.0; 1000],
            "{id}: eager and replayed runs"
        );
        drop(recording);
        let again = device
            .end_recording()
            .expect_err("no recording in progress");
        assert!(matches!(again, Error::Invalid { .. }), "{id}: {again:?}");
    }
}
