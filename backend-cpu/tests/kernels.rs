//! Kernel tests against hand-computed values and, for backward ops, central finite
//! differences in f64.

use std::sync::Arc;

use tessera_core::ops::adam_factors;
use tessera_core::{
    decode_f64, encode_f64, BinaryOp, Buffer, Conv2dParams, DType, Device, Error, Layout, Op,
    ReduceOp, TensorRef, UnaryOp,
};
use tessera_cpu::CpuDevice;

struct T {
    buf: Arc<dyn Buffer>,
    layout: Layout,
    dtype: DType,
}

impl T {
    fn r(&self) -> TensorRef<'_> {
        TensorRef {
            buffer: &self.buf,
            layout: &self.layout,
            dtype: self.dtype,
        }
    }
}

fn tensor(dev: &CpuDevice, shape: &[usize], values: &[f64], dtype: DType) -> T {
    let bytes = encode_f64(values, dtype);
    let buf = dev.alloc(bytes.len()).unwrap();
    dev.write(&buf, 0, &bytes).unwrap();
    T {
        buf,
        layout: Layout::contiguous(shape),
        dtype,
    }
}

fn zeros(dev: &CpuDevice, shape: &[usize], dtype: DType) -> T {
    let n: usize = shape.iter().product();
    tensor(dev, shape, &vec![0.0; n], dtype)
}

fn get(dev: &CpuDevice, t: &T) -> Vec<f64> {
    let size = t.dtype.size();
    let mut bytes = vec![0; t.layout.numel() * size];
    dev.read(&t.buf, t.layout.offset * size, &mut bytes)
        .unwrap();
    decode_f64(&bytes, t.dtype)
}

fn launch(
    dev: &CpuDevice,
    op: Op,
    inputs: &[&T],
    outputs: &[&T],
    scalars: &[f64],
) -> Result<(), Error> {
    let dtypes: Vec<DType> = inputs.iter().map(|t| t.dtype).collect();
    let kernel = dev.kernel(&op, &dtypes)?;
    let ins: Vec<TensorRef<'_>> = inputs.iter().map(|t| t.r()).collect();
    let outs: Vec<TensorRef<'_>> = outputs.iter().map(|t| t.r()).collect();
    kernel.launch(&ins, &outs, scalars)
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "lengths differ: {got:?} vs {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: got {g}, want {w}\n{got:?}\n{want:?}"
        );
    }
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

/// Checks `grad` against the central difference of `sum(dy * f(x))` with respect to `x`.
fn check_grad(f: impl Fn(&[f64]) -> Vec<f64>, x: &[f64], dy: &[f64], grad: &[f64]) {
    let h = 1e-6;
    let numeric: Vec<f64> = (0..x.len())
        .map(|i| {
            let mut xp = x.to_vec();
            xp[i] += h;
            let mut xm = x.to_vec();
            xm[i] -= h;
            let (p, m) = (f(&xp), f(&xm));
            p.iter()
                .zip(&m)
                .zip(dy)
                .map(|((a, b), d)| (a - b) * d)
                .sum::<f64>()
                / (2.0 * h)
        })
        .collect();
    assert_close(grad, &numeric, 1e-6);
}

#[test]
fn matmul_2x3_by_3x2() {
    let dev = CpuDevice::new();
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let a = tensor(&dev, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], dtype);
        let b = tensor(&dev, &[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0], dtype);
        let y = zeros(&dev, &[2, 2], dtype);
        launch(
            &dev,
            Op::Matmul {
                bias: false,
                activation: None,
                residual: false,
            },
            &[&a, &b],
            &[&y],
            &[],
        )
        .unwrap();
        assert_eq!(get(&dev, &y), [58.0, 64.0, 139.0, 154.0], "{dtype}");
    }
}

#[test]
fn matmul_epilogue_and_transposed_broadcast_operand() {
    let dev = CpuDevice::new();
    let a = tensor(&dev, &[2, 1, 2], &[1.0, -1.0, 2.0, 0.0], DType::F32);
    // b is [[1, 3], [2, 4]] stored transposed, shared by both batches through stride 0.
    let mut b = tensor(&dev, &[2, 2], &[1.0, 2.0, 3.0, 4.0], DType::F32);
    b.layout = Layout {
        shape: vec![2, 2, 2],
        strides: vec![0, 1, 2],
        offset: 0,
    };
    let bias = tensor(&dev, &[2], &[0.5, 0.0], DType::F32);
    let res = tensor(&dev, &[2, 1, 2], &[10.0, 20.0, 30.0, 40.0], DType::F32);
    let y = zeros(&dev, &[2, 1, 2], DType::F32);
    let op = Op::Matmul {
        bias: true,
        activation: Some(UnaryOp::Relu),
        residual: true,
    };
    launch(&dev, op, &[&a, &b, &bias, &res], &[&y], &[]).unwrap();
    // a @ b: [1 - 2, 3 - 4] = [-1, -1] and [2, 6]; + bias, relu, + residual.
    assert_eq!(get(&dev, &y), [10.0, 20.0, 32.5, 46.0]);
}

#[test]
fn softmax_of_one_two_three() {
    let dev = CpuDevice::new();
    let x = tensor(&dev, &[1, 3], &[1.0, 2.0, 3.0], DType::F32);
    let y = zeros(&dev, &[1, 3], DType::F32);
    launch(&dev, Op::Softmax, &[&x], &[&y], &[]).unwrap();
    assert_close(
        &get(&dev, &y),
        &[0.090_030_573, 0.244_728_471, 0.665_240_956],
        1e-6,
    );
    launch(&dev, Op::LogSoftmax, &[&x], &[&y], &[]).unwrap();
    assert_close(
        &get(&dev, &y),
        &[-2.407_605_964, -1.407_605_964, -0.407_605_964],
        1e-6,
    );
}

#[test]
fn layer_norm_of_a_row() {
    let dev = CpuDevice::new();
    let x = tensor(&dev, &[1, 4], &[1.0, 2.0, 3.0, 4.0], DType::F32);
    let w = tensor(&dev, &[4], &[1.0, 1.0, 2.0, 1.0], DType::F32);
    let b = tensor(&dev, &[4], &[0.0, 0.0, 0.0, 1.0], DType::F32);
    let (y, mean, rstd) = (
        zeros(&dev, &[1, 4], DType::F32),
        zeros(&dev, &[1], DType::F32),
        zeros(&dev, &[1], DType::F32),
    );
    launch(
        &dev,
        Op::LayerNorm,
        &[&x, &w, &b],
        &[&y, &mean, &rstd],
        &[0.0],
    )
    .unwrap();
    // mean 2.5, biased variance 1.25, rstd 1 / sqrt(1.25).
    assert_close(&get(&dev, &mean), &[2.5], 1e-7);
    assert_close(&get(&dev, &rstd), &[0.894_427_191], 1e-7);
    assert_close(
        &get(&dev, &y),
        &[-1.341_640_786, -0.447_213_595, 0.894_427_191, 2.341_640_786],
        1e-6,
    );
}

#[test]
fn cross_entropy_ignores_out_of_range_targets() {
    let dev = CpuDevice::new();
    let logits = tensor(&dev, &[2, 2], &[0.0, 0.0, 1.0, 2.0], DType::F32);
    let targets = tensor(&dev, &[2], &[1.0, -100.0], DType::I32);
    let (loss, lse) = (zeros(&dev, &[2], DType::F32), zeros(&dev, &[2], DType::F32));
    launch(
        &dev,
        Op::CrossEntropy,
        &[&logits, &targets],
        &[&loss, &lse],
        &[],
    )
    .unwrap();
    assert_close(&get(&dev, &loss), &[std::f64::consts::LN_2, 0.0], 1e-6);
    assert_close(
        &get(&dev, &lse),
        &[std::f64::consts::LN_2, 2.313_261_687],
        1e-6,
    );
    let dloss = tensor(&dev, &[2], &[1.0, 1.0], DType::F32);
    let dlogits = zeros(&dev, &[2, 2], DType::F32);
    launch(
        &dev,
        Op::CrossEntropyBackward,
        &[&logits, &targets, &lse, &dloss],
        &[&dlogits],
        &[],
    )
    .unwrap();
    assert_close(&get(&dev, &dlogits), &[0.5, -0.5, 0.0, 0.0], 1e-6);
}

#[test]
fn elementwise_reads_transposed_and_broadcast_views() {
    let dev = CpuDevice::new();
    let mut x = tensor(&dev, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], DType::F32);
    x.layout = x.layout.transpose(0, 1);
    let y = zeros(&dev, &[3, 2], DType::F32);
    launch(&dev, Op::Unary(UnaryOp::Neg), &[&x], &[&y], &[]).unwrap();
    assert_eq!(get(&dev, &y), [-1.0, -4.0, -2.0, -5.0, -3.0, -6.0]);
    let mut row = tensor(&dev, &[2], &[10.0, 20.0], DType::F32);
    row.layout = Layout {
        shape: vec![3, 2],
        strides: vec![0, 1],
        offset: 0,
    };
    launch(&dev, Op::Binary(BinaryOp::Add), &[&x, &row], &[&y], &[]).unwrap();
    assert_eq!(get(&dev, &y), [11.0, 24.0, 12.0, 25.0, 13.0, 26.0]);
}

#[test]
fn copy_writes_a_strided_output_and_reduce_any_axes() {
    let dev = CpuDevice::new();
    let x = tensor(&dev, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], DType::F32);
    let mut y = zeros(&dev, &[3, 2], DType::F32);
    y.layout = y.layout.transpose(0, 1);
    launch(&dev, Op::Copy, &[&x], &[&y], &[]).unwrap();
    y.layout = Layout::contiguous(&[3, 2]);
    assert_eq!(get(&dev, &y), [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    let s = zeros(&dev, &[3], DType::F32);
    launch(
        &dev,
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![0],
            keepdim: false,
        },
        &[&x],
        &[&s],
        &[],
    )
    .unwrap();
    assert_eq!(get(&dev, &s), [5.0, 7.0, 9.0]);
    let m = zeros(&dev, &[2, 1], DType::F32);
    launch(
        &dev,
        Op::Reduce {
            op: ReduceOp::Max,
            axes: vec![1],
            keepdim: true,
        },
        &[&x],
        &[&m],
        &[],
    )
    .unwrap();
    assert_eq!(get(&dev, &m), [3.0, 6.0]);
}

#[test]
fn adamw_updates_in_place() {
    let dev = CpuDevice::new();
    let p = tensor(&dev, &[1], &[1.0], DType::F32);
    let g = tensor(&dev, &[1], &[0.5], DType::F32);
    let m = tensor(&dev, &[1], &[0.0], DType::F32);
    let v = tensor(&dev, &[1], &[0.0], DType::F32);
    let op = Op::AdamUpdate {
        decoupled_weight_decay: true,
    };
    let (lr, b1, b2, eps, wd) = (0.1, 0.9, 0.999, 1e-8, 0.01);
    let [step_size, decay, bc2_sqrt] = adam_factors(lr, wd, 1.0 - b1, 1.0 - b2);
    let step = [2.0, step_size, decay, bc2_sqrt];
    let step = tensor(&dev, &[4], &step, DType::F32);
    launch(
        &dev,
        op,
        &[&p, &g, &m, &v, &step],
        &[&p, &m, &v],
        &[b1, b2, eps, wd],
    )
    .unwrap();
    // g = 1; p = 1 - lr wd = 0.999; m = 0.1; v = 0.001; p -= (lr / 0.1) * 0.1 / (1 + eps).
    assert_close(&get(&dev, &m), &[0.1], 1e-7);
    assert_close(&get(&dev, &v), &[0.001], 1e-7);
    assert_close(&get(&dev, &p), &[0.999 - 0.1 / (1.0 + 1e-8)], 1e-7);
}

#[test]
fn pool_limit_gives_out_of_memory_then_recovers() {
    let dev = CpuDevice::new();
    dev.set_memory_limit(Some(1000));
    let a = dev.alloc(600).unwrap();
    let err = dev.alloc(600).unwrap_err();
    assert!(
        matches!(err, Error::OutOfMemory { requested: 600, .. }),
        "{err}"
    );
    drop(a);
    let b = dev.alloc(600).unwrap();
    assert_eq!(b.len(), 600);
    let stats = dev.memory();
    assert_eq!((stats.allocations, stats.reuses), (2, 1));
    drop(b);
    dev.empty_cache();
    assert_eq!(dev.memory().reserved, 0);
}

#[test]
fn host_transfers_are_bounds_checked_and_counted() {
    let dev = CpuDevice::new();
    let buf = dev.alloc(8).unwrap();
    assert!(dev.write(&buf, 4, &[0; 8]).is_err());
    assert!(dev.read(&buf, usize::MAX, &mut [0; 2]).is_err());
    dev.synchronize().unwrap();
    assert_eq!(dev.host_syncs(), 2);
}

#[test]
fn kernels_are_cached_and_nonsense_is_unsupported() {
    let dev = CpuDevice::new();
    let a = dev.kernel(&Op::Softmax, &[DType::F16]).unwrap();
    let b = dev.kernel(&Op::Softmax, &[DType::F16]).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    let err = dev
        .kernel(&Op::Unary(UnaryOp::Exp), &[DType::I32])
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
}

#[test]
fn embedding_gather_and_scatter_add_skip_out_of_range() {
    let dev = CpuDevice::new();
    let w = tensor(&dev, &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], DType::BF16);
    let ids = tensor(&dev, &[3], &[2.0, 7.0, 0.0], DType::U32);
    let y = zeros(&dev, &[3, 2], DType::BF16);
    launch(&dev, Op::Embedding, &[&w, &ids], &[&y], &[]).unwrap();
    assert_eq!(get(&dev, &y), [5.0, 6.0, 0.0, 0.0, 1.0, 2.0]);
    let dy = tensor(&dev, &[3, 2], &[1.0, 1.0, 5.0, 5.0, 2.0, 3.0], DType::F32);
    let dw = zeros(&dev, &[3, 2], DType::F32);
    let ids0 = tensor(&dev, &[3], &[0.0, 9.0, 0.0], DType::I32);
    launch(&dev, Op::EmbeddingBackward, &[&ids0, &dy], &[&dw], &[]).unwrap();
    assert_eq!(get(&dev, &dw), [3.0, 4.0, 0.0, 0.0, 0.0, 0.0]);
    let x = tensor(&dev, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], DType::I32);
    let index = tensor(&dev, &[2, 2], &[2.0, 0.0, -1.0, 1.0], DType::I32);
    let g = zeros(&dev, &[2, 2], DType::I32);
    launch(&dev, Op::Gather { axis: 1 }, &[&x, &index], &[&g], &[]).unwrap();
    assert_eq!(get(&dev, &g), [3.0, 1.0, 0.0, 5.0]);
    let src = tensor(&dev, &[2, 2], &[1.0, 2.0, 3.0, 4.0], DType::F32);
    let out = zeros(&dev, &[2, 3], DType::F32);
    let index = tensor(&dev, &[2, 2], &[1.0, 1.0, 3.0, 0.0], DType::I32);
    launch(
        &dev,
        Op::ScatterAdd { axis: 1 },
        &[&index, &src],
        &[&out],
        &[],
    )
    .unwrap();
    assert_eq!(get(&dev, &out), [0.0, 3.0, 0.0, 4.0, 0.0, 0.0]);
}

#[test]
fn attention_forward_by_hand() {
    let dev = CpuDevice::new();
    let q = tensor(&dev, &[1, 1, 2, 1], &[1.0, 1.0], DType::F64);
    let k = tensor(&dev, &[1, 1, 2, 1], &[0.0, 1.0], DType::F64);
    let v = tensor(&dev, &[1, 1, 2, 1], &[1.0, 3.0], DType::F64);
    let (out, lse) = (
        zeros(&dev, &[1, 1, 2, 1], DType::F64),
        zeros(&dev, &[1, 1, 2], DType::F64),
    );
    launch(
        &dev,
        Op::Attention { causal: true },
        &[&q, &k, &v],
        &[&out, &lse],
        &[1.0],
    )
    .unwrap();
    // Row 0 sees key 0 only; row 1 sees scores [0, 1].
    let e = std::f64::consts::E;
    assert_close(&get(&dev, &out), &[1.0, (1.0 + 3.0 * e) / (1.0 + e)], 1e-12);
    assert_close(&get(&dev, &lse), &[0.0, (1.0 + e).ln()], 1e-12);
}

#[test]
fn random_ops_are_reproducible_and_in_range() {
    let dev = CpuDevice::new();
    let a = zeros(&dev, &[1000], DType::F16);
    let b = zeros(&dev, &[1000], DType::F16);
    let s = [1.0, 2.0, 3.0, 0.0, -2.0, 2.0];
    launch(&dev, Op::RandUniform { dtype: DType::F16 }, &[], &[&a], &s).unwrap();
    launch(&dev, Op::RandUniform { dtype: DType::F16 }, &[], &[&b], &s).unwrap();
    let (x, y) = (get(&dev, &a), get(&dev, &b));
    assert_eq!(x, y);
    assert!(x.iter().all(|v| (-2.0..=2.0).contains(v)));
    let mean = x.iter().sum::<f64>() / 1000.0;
    assert!(mean.abs() < 0.2, "{mean}");
}

#[test]
fn layer_and_rms_norm_backward_match_finite_differences() {
    let dev = CpuDevice::new();
    let (rows, n) = (3, 5);
    let (x0, w0, b0, dy0) = (
        values(rows * n, 1),
        values(n, 2),
        values(n, 3),
        values(rows * n, 4),
    );
    let f64t = |shape: &[usize], v: &[f64]| tensor(&dev, shape, v, DType::F64);
    let layer = |x: &[f64], w: &[f64], b: &[f64]| {
        let (y, mean, rstd) = (
            zeros(&dev, &[rows, n], DType::F64),
            zeros(&dev, &[rows], DType::F64),
            zeros(&dev, &[rows], DType::F64),
        );
        launch(
            &dev,
            Op::LayerNorm,
            &[&f64t(&[rows, n], x), &f64t(&[n], w), &f64t(&[n], b)],
            &[&y, &mean, &rstd],
            &[1e-5],
        )
        .unwrap();
        (get(&dev, &y), mean, rstd)
    };
    let (_, mean, rstd) = layer(&x0, &w0, &b0);
    let (dx, dw, db) = (
        zeros(&dev, &[rows, n], DType::F64),
        zeros(&dev, &[n], DType::F64),
        zeros(&dev, &[n], DType::F64),
    );
    let ins = [
        &f64t(&[rows, n], &x0),
        &f64t(&[n], &w0),
        &mean,
        &rstd,
        &f64t(&[rows, n], &dy0),
    ];
    launch(&dev, Op::LayerNormBackward, &ins, &[&dx, &dw, &db], &[]).unwrap();
    check_grad(|x| layer(x, &w0, &b0).0, &x0, &dy0, &get(&dev, &dx));
    check_grad(|w| layer(&x0, w, &b0).0, &w0, &dy0, &get(&dev, &dw));
    check_grad(|b| layer(&x0, &w0, b).0, &b0, &dy0, &get(&dev, &db));

    let rms = |x: &[f64], w: &[f64]| {
        let (y, rstd) = (
            zeros(&dev, &[rows, n], DType::F64),
            zeros(&dev, &[rows], DType::F64),
        );
        launch(
            &dev,
            Op::RmsNorm,
            &[&f64t(&[rows, n], x), &f64t(&[n], w)],
            &[&y, &rstd],
            &[1e-5],
        )
        .unwrap();
        (get(&dev, &y), rstd)
    };
    let (_, rstd) = rms(&x0, &w0);
    let (dx, dw) = (
        zeros(&dev, &[rows, n], DType::F64),
        zeros(&dev, &[n], DType::F64),
    );
    let ins = [
        &f64t(&[rows, n], &x0),
        &f64t(&[n], &w0),
        &rstd,
        &f64t(&[rows, n], &dy0),
    ];
    launch(&dev, Op::RmsNormBackward, &ins, &[&dx, &dw], &[]).unwrap();
    check_grad(|x| rms(x, &w0).0, &x0, &dy0, &get(&dev, &dx));
    check_grad(|w| rms(&x0, w).0, &w0, &dy0, &get(&dev, &dw));
}

#[test]
fn attention_backward_matches_finite_differences() {
    let dev = CpuDevice::new();
    // Two query heads share one key/value head; a KV cache gives one more key than queries.
    let (hq, tq, tk, d, dv) = (2, 2, 3, 2, 3);
    let (qs, ks, vs, os) = (
        [1, hq, tq, d],
        [1, 1, tk, d],
        [1, 1, tk, dv],
        [1, hq, tq, dv],
    );
    let (q0, k0, v0, dout) = (
        values(hq * tq * d, 5),
        values(tk * d, 6),
        values(tk * dv, 7),
        values(hq * tq * dv, 8),
    );
    let scale = 0.7;
    let fwd = |q: &[f64], k: &[f64], v: &[f64]| {
        let (out, lse) = (
            zeros(&dev, &os, DType::F64),
            zeros(&dev, &[1, hq, tq], DType::F64),
        );
        let ins = [
            &tensor(&dev, &qs, q, DType::F64),
            &tensor(&dev, &ks, k, DType::F64),
            &tensor(&dev, &vs, v, DType::F64),
        ];
        launch(
            &dev,
            Op::Attention { causal: true },
            &ins,
            &[&out, &lse],
            &[scale],
        )
        .unwrap();
        (out, lse)
    };
    let (out, lse) = fwd(&q0, &k0, &v0);
    let (dq, dk, dvt) = (
        zeros(&dev, &qs, DType::F64),
        zeros(&dev, &ks, DType::F64),
        zeros(&dev, &vs, DType::F64),
    );
    let ins = [
        &tensor(&dev, &qs, &q0, DType::F64),
        &tensor(&dev, &ks, &k0, DType::F64),
        &tensor(&dev, &vs, &v0, DType::F64),
        &out,
        &lse,
        &tensor(&dev, &os, &dout, DType::F64),
    ];
    launch(
        &dev,
        Op::AttentionBackward { causal: true },
        &ins,
        &[&dq, &dk, &dvt],
        &[scale],
    )
    .unwrap();
    check_grad(
        |q| get(&dev, &fwd(q, &k0, &v0).0),
        &q0,
        &dout,
        &get(&dev, &dq),
    );
    check_grad(
        |k| get(&dev, &fwd(&q0, k, &v0).0),
        &k0,
        &dout,
        &get(&dev, &dk),
    );
    check_grad(
        |v| get(&dev, &fwd(&q0, &k0, v).0),
        &v0,
        &dout,
        &get(&dev, &dvt),
    );
}

#[test]
fn conv2d_backward_matches_finite_differences() {
    let dev = CpuDevice::new();
    let params = Conv2dParams {
        stride: [2, 1],
        padding: [1, 1],
        dilation: [1, 2],
    };
    let (xs, ws) = ([2, 2, 4, 5], [3, 2, 3, 2]);
    let [oh, ow] = params.output_size([4, 5], [3, 2]).unwrap();
    let ys = [2, 3, oh, ow];
    let n = |s: &[usize]| s.iter().product::<usize>();
    let (x0, w0, dy0) = (values(n(&xs), 9), values(n(&ws), 10), values(n(&ys), 11));
    let fwd = |x: &[f64], w: &[f64]| {
        let y = zeros(&dev, &ys, DType::F64);
        let ins = [
            &tensor(&dev, &xs, x, DType::F64),
            &tensor(&dev, &ws, w, DType::F64),
        ];
        launch(
            &dev,
            Op::Conv2d {
                params,
                bias: false,
            },
            &ins,
            &[&y],
            &[],
        )
        .unwrap();
        get(&dev, &y)
    };
    let (dx, dw) = (zeros(&dev, &xs, DType::F64), zeros(&dev, &ws, DType::F64));
    let dy = tensor(&dev, &ys, &dy0, DType::F64);
    launch(
        &dev,
        Op::Conv2dBackwardData { params },
        &[&dy, &tensor(&dev, &ws, &w0, DType::F64)],
        &[&dx],
        &[],
    )
    .unwrap();
    launch(
        &dev,
        Op::Conv2dBackwardWeight { params },
        &[&tensor(&dev, &xs, &x0, DType::F64), &dy],
        &[&dw],
        &[],
    )
    .unwrap();
    check_grad(|x| fwd(x, &w0), &x0, &dy0, &get(&dev, &dx));
    check_grad(|w| fwd(&x0, w), &w0, &dy0, &get(&dev, &dw));
}

#[test]
fn row_op_backwards_match_finite_differences() {
    let dev = CpuDevice::new();
    let shape = [2, 4];
    let (x0, up0, dy0) = (values(8, 12), values(8, 13), values(8, 14));
    let unary_out = |op: Op, x: &[f64]| {
        let y = zeros(&dev, &shape, DType::F64);
        launch(
            &dev,
            op,
            &[&tensor(&dev, &shape, x, DType::F64)],
            &[&y],
            &[],
        )
        .unwrap();
        y
    };
    for (fwd, bwd) in [
        (Op::Softmax, Op::SoftmaxBackward),
        (Op::LogSoftmax, Op::LogSoftmaxBackward),
    ] {
        let y = unary_out(fwd.clone(), &x0);
        let dx = zeros(&dev, &shape, DType::F64);
        launch(
            &dev,
            bwd,
            &[&y, &tensor(&dev, &shape, &dy0, DType::F64)],
            &[&dx],
            &[],
        )
        .unwrap();
        check_grad(
            |x| get(&dev, &unary_out(fwd.clone(), x)),
            &x0,
            &dy0,
            &get(&dev, &dx),
        );
    }
    let gelu = get(&dev, &unary_out(Op::Unary(UnaryOp::Gelu), &x0));
    let dx = zeros(&dev, &shape, DType::F64);
    let (x, dy) = (
        tensor(&dev, &shape, &x0, DType::F64),
        tensor(&dev, &shape, &dy0, DType::F64),
    );
    launch(
        &dev,
        Op::UnaryBackward(UnaryOp::Gelu),
        &[&x, &dy],
        &[&dx],
        &[],
    )
    .unwrap();
    assert!(gelu
        .iter()
        .zip(&x0)
        .all(|(g, x)| (g - UnaryOp::Gelu.eval(*x, &[])).abs() < 1e-15));
    check_grad(
        |x| get(&dev, &unary_out(Op::Unary(UnaryOp::Gelu), x)),
        &x0,
        &dy0,
        &get(&dev, &dx),
    );

    let swiglu = |g: &[f64], u: &[f64]| {
        let y = zeros(&dev, &shape, DType::F64);
        let ins = [
            &tensor(&dev, &shape, g, DType::F64),
            &tensor(&dev, &shape, u, DType::F64),
        ];
        launch(&dev, Op::SwiGlu, &ins, &[&y], &[]).unwrap();
        get(&dev, &y)
    };
    let (dg, du) = (
        zeros(&dev, &shape, DType::F64),
        zeros(&dev, &shape, DType::F64),
    );
    let up = tensor(&dev, &shape, &up0, DType::F64);
    launch(&dev, Op::SwiGluBackward, &[&x, &up, &dy], &[&dg, &du], &[]).unwrap();
    check_grad(|g| swiglu(g, &up0), &x0, &dy0, &get(&dev, &dg));
    check_grad(|u| swiglu(&x0, u), &up0, &dy0, &get(&dev, &du));

    let targets = tensor(&dev, &[2], &[3.0, 1.0], DType::U32);
    let dloss0 = values(2, 15);
    let ce = |l: &[f64]| {
        let (loss, lse) = (zeros(&dev, &[2], DType::F64), zeros(&dev, &[2], DType::F64));
        launch(
            &dev,
            Op::CrossEntropy,
            &[&tensor(&dev, &shape, l, DType::F64), &targets],
            &[&loss, &lse],
            &[],
        )
        .unwrap();
        (loss, lse)
    };
    let (_, lse) = ce(&x0);
    let dl = zeros(&dev, &shape, DType::F64);
    let ins = [&x, &targets, &lse, &tensor(&dev, &[2], &dloss0, DType::F64)];
    launch(&dev, Op::CrossEntropyBackward, &ins, &[&dl], &[]).unwrap();
    check_grad(|l| get(&dev, &ce(l).0), &x0, &dloss0, &get(&dev, &dl));
}

#[test]
fn launches_are_validated() {
    let dev = CpuDevice::new();
    let x = tensor(&dev, &[2, 3], &[0.0; 6], DType::F32);
    let y = zeros(&dev, &[3, 2], DType::F32);
    assert!(launch(&dev, Op::Softmax, &[&x], &[&y], &[]).is_err());
    let kernel = dev.kernel(&Op::Softmax, &[DType::F64]).unwrap();
    let y = zeros(&dev, &[2, 3], DType::F32);
    assert!(kernel.launch(&[x.r()], &[y.r()], &[]).is_err());
}

#[test]
fn large_matmul_and_sum_match_naive_f64() {
    let dev = CpuDevice::new();
    let (batch, m, k, n) = (3, 65, 70, 80);
    let (a0, b0) = (values(batch * m * k, 16), values(batch * n * k, 17));
    let a = tensor(&dev, &[batch, m, k], &a0, DType::F32);
    // b is stored as [batch, N, K] and read transposed.
    let mut b = tensor(&dev, &[batch, n, k], &b0, DType::F32);
    b.layout = b.layout.transpose(1, 2);
    let y = zeros(&dev, &[batch, m, n], DType::F32);
    launch(
        &dev,
        Op::Matmul {
            bias: false,
            activation: None,
            residual: false,
        },
        &[&a, &b],
        &[&y],
        &[],
    )
    .unwrap();
    let f32r = |v: f64| f64::from(v as f32);
    let mut want = vec![0.0; batch * m * n];
    for bi in 0..batch {
        for i in 0..m {
            for j in 0..n {
                want[(bi * m + i) * n + j] = (0..k)
                    .map(|p| f32r(a0[(bi * m + i) * k + p]) * f32r(b0[(bi * n + j) * k + p]))
                    .sum();
            }
        }
    }
    assert_close(&get(&dev, &y), &want, 1e-5);

    let x0 = values(5000, 18);
    let x = tensor(&dev, &[5000], &x0, DType::F32);
    let s = zeros(&dev, &[], DType::F32);
    launch(
        &dev,
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![0],
            keepdim: false,
        },
        &[&x],
        &[&s],
        &[],
    )
    .unwrap();
    assert_close(&get(&dev, &s), &[x0.iter().map(|&v| f32r(v)).sum()], 1e-5);
}
