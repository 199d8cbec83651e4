//! Memory-bound ops in GB/s of the least traffic each must move: layer norm at GPT-2's width,
//! softmax cross-entropy over GPT-2's 50,257-token vocabulary (forward and backward), and the
//! AdamW update of f32 master weights.

use tessera_benches::criterion::{black_box, SamplingMode, Throughput};
use tessera_benches::tessera::optim::{Adam, Optimizer, ParamGroup};
use tessera_benches::tessera::rng::RngState;
use tessera_benches::tessera::{no_grad, DType, Tensor};
use tessera_benches::{
    criterion_for, devices, dtype_name, float_dtypes, time_after_setup, Profile,
};

const WIDTH: usize = 768;
const VOCAB: usize = 50257;

fn main() {
    for device in devices() {
        let sizes = Profile::for_device(&device).sizes();
        let mut c = criterion_for(&device);
        let mut rng = RngState::new(0);
        let dtypes: Vec<DType> = float_dtypes(&device)
            .into_iter()
            .filter(|d| matches!(d, DType::F32 | DType::BF16))
            .collect();
        for &dtype in &dtypes {
            let mut group = c.benchmark_group(format!(
                "bandwidth/{}/{}",
                device.info().id(),
                dtype_name(dtype)
            ));
            group.sampling_mode(SamplingMode::Flat);
            let size = dtype.size() as u64;

            let rows = sizes.norm_rows;
            let x = Tensor::randn(&[rows, WIDTH], 0.0, 1.0, dtype, &mut rng, &device)
                .expect("randn")
                .requires_grad();
            let w = Tensor::ones(&[WIDTH], dtype, &device)
                .expect("ones")
                .requires_grad();
            let b = Tensor::zeros(&[WIDTH], dtype, &device)
                .expect("zeros")
                .requires_grad();
            let dy =
                Tensor::randn(&[rows, WIDTH], 0.0, 1.0, dtype, &mut rng, &device).expect("randn");
            let elems = (rows * WIDTH) as u64;
            group.throughput(Throughput::Bytes(2 * elems * size));
            group.bench_function(format!("layer_norm_forward_{rows}x{WIDTH}"), |bench| {
                let _guard = no_grad();
                bench.iter(|| black_box(x.layer_norm(&w, &b, 1e-5).expect("layer_norm")))
            });
            group.throughput(Throughput::Bytes(3 * elems * size));
            group.bench_function(format!("layer_norm_backward_{rows}x{WIDTH}"), |bench| {
                bench.iter_custom(|iters| {
                    time_after_setup(
                        &device,
                        iters,
                        || {
                            for t in [&x, &w, &b] {
                                t.zero_grad();
                            }
                            x.layer_norm(&w, &b, 1e-5).expect("layer_norm")
                        },
                        |y| y.backward_with(&dy).expect("backward"),
                    )
                })
            });

            let rows = sizes.loss_rows;
            let logits = Tensor::randn(&[rows, VOCAB], 0.0, 1.0, dtype, &mut rng, &device)
                .expect("randn")
                .requires_grad();
            let targets: Vec<u32> = (0..rows).map(|_| rng.next_below(VOCAB) as u32).collect();
            let targets = Tensor::from_slice(&targets, &[rows], &device).expect("targets");
            let elems = (rows * VOCAB) as u64;
            group.throughput(Throughput::Bytes(elems * size));
            group.bench_function(format!("cross_entropy_forward_{rows}x{VOCAB}"), |bench| {
                let _guard = no_grad();
                bench.iter(|| black_box(logits.cross_entropy(&targets).expect("cross_entropy")))
            });
            group.throughput(Throughput::Bytes(2 * elems * size));
            group.bench_function(format!("cross_entropy_backward_{rows}x{VOCAB}"), |bench| {
                bench.iter_custom(|iters| {
                    time_after_setup(
                        &device,
                        iters,
                        || {
                            logits.zero_grad();
                            logits.cross_entropy(&targets).expect("cross_entropy")
                        },
                        |loss| loss.backward().expect("backward"),
                    )
                })
            });
            group.finish();
        }

        let mut group = c.benchmark_group(format!("bandwidth/{}/f32", device.info().id()));
        group.sampling_mode(SamplingMode::Flat);
        let n = sizes.adam_params;
        let p = Tensor::randn(&[n], 0.0, 0.02, DType::F32, &mut rng, &device)
            .expect("randn")
            .requires_grad();
        p.set_grad(Some(
            Tensor::randn(&[n], 0.0, 1e-3, DType::F32, &mut rng, &device).expect("randn"),
        ));
        let mut adam = Adam::adamw(
            vec![ParamGroup::new(vec![("w".into(), p)], 0.01)],
            0.9,
            0.999,
            1e-8,
        )
        .expect("adamw");
        let scale = Tensor::ones(&[1], DType::F32, &device).expect("ones");
        // Reads parameter, gradient and both moments; writes parameter and both moments.
        group.throughput(Throughput::Bytes(7 * 4 * n as u64));
        group.bench_function(format!("adamw_{n}"), |bench| {
            bench.iter(|| adam.step(3e-4, &scale).expect("adamw step"))
        });
        group.finish();
        c.final_summary();
    }
}
