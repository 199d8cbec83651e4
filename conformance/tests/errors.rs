//! Bad input gives an `Error` that names the op, the shapes and the dtypes: one test per error
//! class, through the Tensor API and at the kernel level.

use std::sync::Arc;

use tessera::{open_device, DType, Device, Error, Layout, Op, ReduceOp, Tensor, TensorRef};

fn cpu() -> Arc<dyn Device> {
    open_device("cpu:0").expect("cpu device")
}

fn tensor(shape: &[usize], dtype: DType, device: &Arc<dyn Device>) -> Tensor {
    let n: usize = shape.iter().product();
    let values: Vec<f64> = (0..n).map(|i| i as f64 * 0.5).collect();
    Tensor::from_f64(&values, shape, dtype, device).expect("tensor")
}

/// Asserts the message names everything in `parts`.
fn mentions(err: &Error, parts: &[&str]) {
    let msg = err.to_string();
    for p in parts {
        assert!(
            msg.contains(p),
            "error message {msg:?} does not mention {p:?}"
        );
    }
}

#[test]
fn mismatched_shapes() {
    let dev = cpu();
    let (a, b) = (
        tensor(&[2, 3], DType::F32, &dev),
        tensor(&[4, 5], DType::F32, &dev),
    );
    let err = a.matmul(&b).expect_err("[2, 3] x [4, 5] must fail");
    assert!(matches!(err, Error::Shape { .. }), "{err:?}");
    mentions(&err, &["matmul", "[2, 3]", "[4, 5]", "f32"]);
    let op = Op::Matmul {
        bias: false,
        activation: None,
        residual: false,
    };
    let err = Tensor::apply(&op, &[&a, &b], &[], None).expect_err("apply must fail too");
    assert!(matches!(err, Error::Shape { .. }), "{err:?}");
    mentions(&err, &["matmul", "[2, 3]", "[4, 5]"]);
}

#[test]
fn mismatched_dtypes() {
    let dev = cpu();
    let (a, b) = (
        tensor(&[2, 3], DType::F32, &dev),
        tensor(&[2, 3], DType::F16, &dev),
    );
    let err = a.add(&b).expect_err("f32 + f16 must fail");
    assert!(matches!(err, Error::DType { .. }), "{err:?}");
    mentions(&err, &["add", "f32", "f16", "[2, 3]"]);
}

#[test]
fn mismatched_devices() {
    let (d0, d1) = (cpu(), cpu());
    assert!(
        !tessera::same_device(&d0, &d1),
        "open_device must give distinct instances"
    );
    let (a, b) = (
        tensor(&[2, 3], DType::F32, &d0),
        tensor(&[2, 3], DType::F32, &d1),
    );
    let err = a.add(&b).expect_err("tensors on two devices must fail");
    assert!(matches!(err, Error::DeviceMismatch { .. }), "{err:?}");
    mentions(&err, &["add", "cpu:0"]);
}

#[test]
fn out_of_range_axis() {
    let dev = cpu();
    let x = tensor(&[2, 3], DType::F32, &dev);
    let err = x
        .sum(&[5], false)
        .expect_err("axis 5 of a rank-2 tensor must fail");
    assert!(
        matches!(
            err,
            Error::Axis {
                axis: 5,
                rank: 2,
                ..
            }
        ),
        "{err:?}"
    );
    mentions(&err, &["sum", "5", "rank 2", "[2, 3]"]);
    let op = Op::Reduce {
        op: ReduceOp::Max,
        axes: vec![5],
        keepdim: false,
    };
    let err = Tensor::apply(&op, &[&x], &[], None).expect_err("apply must fail too");
    assert!(matches!(err, Error::Axis { .. }), "{err:?}");
    mentions(&err, &["max", "[2, 3]"]);
}

#[test]
fn out_of_range_index() {
    let dev = cpu();
    let x = tensor(&[2, 3], DType::F32, &dev);
    let err = x
        .narrow(1, 2, 5)
        .expect_err("narrow past the end must fail");
    assert!(matches!(err, Error::Index { size: 3, .. }), "{err:?}");
    mentions(&err, &["narrow", "[2, 3]"]);
}

#[test]
fn launch_outside_the_buffer() {
    let dev = cpu();
    let op = Op::Unary(tessera::UnaryOp::Neg);
    let kernel = dev.kernel(&op, &[DType::F32]).expect("neg kernel");
    let (small, out) = (
        dev.alloc(4 * 4).expect("alloc"),
        dev.alloc(6 * 4).expect("alloc"),
    );
    let layout = Layout::contiguous(&[2, 3]);
    let err = kernel
        .launch(
            &[TensorRef {
                buffer: &small,
                layout: &layout,
                dtype: DType::F32,
            }],
            &[TensorRef {
                buffer: &out,
                layout: &layout,
                dtype: DType::F32,
            }],
            &[],
        )
        .expect_err("a layout larger than its buffer must be rejected before launch");
    assert!(matches!(err, Error::Invalid { .. }), "{err:?}");
    mentions(&err, &["neg", "[2, 3]"]);
}

#[test]
fn launch_with_wrong_output_shape() {
    let dev = cpu();
    let op = Op::Binary(tessera::BinaryOp::Add);
    let kernel = dev
        .kernel(&op, &[DType::F32, DType::F32])
        .expect("add kernel");
    let buf = |n: usize| dev.alloc(n * 4).expect("alloc");
    let (a, b, out) = (buf(6), buf(6), buf(6));
    let (l, lo) = (Layout::contiguous(&[2, 3]), Layout::contiguous(&[3, 2]));
    let r = |buffer, layout| TensorRef {
        buffer,
        layout,
        dtype: DType::F32,
    };
    let err = kernel
        .launch(&[r(&a, &l), r(&b, &l)], &[r(&out, &lo)], &[])
        .expect_err("wrong output shape must fail");
    assert!(matches!(err, Error::Shape { .. }), "{err:?}");
    mentions(&err, &["add", "[3, 2]", "[2, 3]"]);
}

#[test]
fn empty_where_invalid() {
    let dev = cpu();
    let x = tensor(&[4, 0], DType::F32, &dev);
    let w = tensor(&[0], DType::F32, &dev);
    let err = x
        .layer_norm(&w, &w, 1e-5)
        .expect_err("layer norm over 0 columns must fail");
    assert!(matches!(err, Error::Empty { .. }), "{err:?}");
    mentions(&err, &["layer_norm", "[4, 0]"]);
    let y = tensor(&[3, 0], DType::F32, &dev);
    let err = y
        .max(&[1], false)
        .expect_err("max over an empty axis must fail");
    assert!(matches!(err, Error::Empty { .. }), "{err:?}");
    mentions(&err, &["max", "[3, 0]"]);
    let err = y
        .argmax(1, false)
        .expect_err("argmax over an empty axis must fail");
    assert!(matches!(err, Error::Empty { .. }), "{err:?}");
    mentions(&err, &["argmax", "[3, 0]"]);
}

#[test]
fn wrong_index_dtype() {
    let dev = cpu();
    let w = tensor(&[5, 3], DType::F32, &dev);
    let ids = tensor(&[4], DType::F32, &dev);
    let err = w.embedding(&ids).expect_err("float ids must fail");
    assert!(matches!(err, Error::DType { .. }), "{err:?}");
    mentions(&err, &["embedding", "f32", "[4]"]);
}
