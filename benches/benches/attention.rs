//! Causal attention forward and backward in TFLOP/s (FlashAttention's FLOP convention) at
//! GPT-2's head size, at 1024 and 4096 tokens.

use tessera_benches::criterion::{black_box, SamplingMode, Throughput};
use tessera_benches::tessera::rng::RngState;
use tessera_benches::tessera::{no_grad, DType, Tensor};
use tessera_benches::{
    criterion_for, devices, dtype_name, float_dtypes, time_after_setup, Profile,
};

fn main() {
    for device in devices() {
        let sizes = Profile::for_device(&device).sizes();
        let mut c = criterion_for(&device);
        let mut rng = RngState::new(0);
        let dtypes = float_dtypes(&device)
            .into_iter()
            .filter(|&d| sizes.attention_low_precision || d == DType::F32);
        for dtype in dtypes {
            let mut group = c.benchmark_group(format!(
                "attention/{}/{}",
                device.info().id(),
                dtype_name(dtype)
            ));
            group.sampling_mode(SamplingMode::Flat);
            for shape in &sizes.attention {
                let dims = [shape.batch, shape.heads, shape.seq, shape.head_dim];
                let make = |rng: &mut RngState| {
                    Tensor::randn(&dims, 0.0, 1.0, dtype, rng, &device)
                        .expect("randn")
                        .requires_grad()
                };
                let (q, k, v) = (make(&mut rng), make(&mut rng), make(&mut rng));
                let dy = Tensor::randn(&dims, 0.0, 1.0, dtype, &mut rng, &device).expect("randn");
                let scale = 1.0 / (shape.head_dim as f64).sqrt();
                let id = format!(
                    "b{}_h{}_t{}_d{}",
                    shape.batch, shape.heads, shape.seq, shape.head_dim
                );
                group.throughput(Throughput::Elements(shape.forward_flops()));
                group.bench_function(format!("forward_{id}"), |bench| {
                    let _guard = no_grad();
                    bench.iter(|| {
                        black_box(Tensor::attention(&q, &k, &v, true, scale).expect("attention"))
                    })
                });
                group.throughput(Throughput::Elements(shape.backward_flops()));
                group.bench_function(format!("backward_{id}"), |bench| {
                    bench.iter_custom(|iters| {
                        time_after_setup(
                            &device,
                            iters,
                            || {
                                for t in [&q, &k, &v] {
                                    t.zero_grad();
                                }
                                Tensor::attention(&q, &k, &v, true, scale).expect("attention")
                            },
                            |y| y.backward_with(&dy).expect("backward"),
                        )
                    })
                });
            }
            group.finish();
        }
        c.final_summary();
    }
}
