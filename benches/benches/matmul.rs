//! Matmul throughput in TFLOP/s: square products and the GPT-2 124M projections (as
//! `linear`, the way the model runs them), in every float dtype the device supports.

use std::sync::Arc;

use tessera_benches::criterion::{black_box, SamplingMode, Throughput};
use tessera_benches::tessera::rng::RngState;
use tessera_benches::tessera::{DType, Device, Tensor};
use tessera_benches::{
    criterion_for, devices, dtype_name, float_dtypes, Profile, GPT2_PROJECTIONS,
};

fn randn(shape: &[usize], dtype: DType, rng: &mut RngState, device: &Arc<dyn Device>) -> Tensor {
    Tensor::randn(shape, 0.0, 1.0, dtype, rng, device).expect("randn")
}

fn main() {
    for device in devices() {
        let sizes = Profile::for_device(&device).sizes();
        let mut c = criterion_for(&device);
        let mut rng = RngState::new(0);
        for dtype in float_dtypes(&device) {
            let mut group = c.benchmark_group(format!(
                "matmul/{}/{}",
                device.info().id(),
                dtype_name(dtype)
            ));
            group.sampling_mode(SamplingMode::Flat);
            for &n in &sizes.square {
                let (a, b) = (
                    randn(&[n, n], dtype, &mut rng, &device),
                    randn(&[n, n], dtype, &mut rng, &device),
                );
                group.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
                group.bench_function(format!("square_{n}"), |bench| {
                    bench.iter(|| black_box(a.matmul(&b).expect("matmul")))
                });
            }
            let rows = sizes.gpt2_rows;
            for (name, d_in, d_out) in GPT2_PROJECTIONS {
                let x = randn(&[rows, d_in], dtype, &mut rng, &device);
                let w = randn(&[d_out, d_in], dtype, &mut rng, &device);
                group.throughput(Throughput::Elements(2 * (rows * d_in * d_out) as u64));
                group.bench_function(format!("gpt2_{name}_{rows}x{d_in}x{d_out}"), |bench| {
                    bench.iter(|| black_box(x.linear(&w, None).expect("linear")))
                });
            }
            group.finish();
        }
        c.final_summary();
    }
}
