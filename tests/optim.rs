//! Optimizers against values worked out by hand from PyTorch's documented update rules
//! (`torch.optim.SGD` and `torch.optim.Adam`); AdamW is checked against PyTorch's own output in
//! the model conformance tests.

use tessera::optim::{Adam, Optimizer, ParamGroup, Sgd};
use tessera::{DType, Tensor};

fn param(values: &[f64]) -> (Vec<(String, Tensor)>, Tensor) {
    let device = tessera::open_device("cpu").unwrap();
    let p = Tensor::from_f64(values, &[values.len()], DType::F64, &device)
        .unwrap()
        .requires_grad();
    (vec![("p".to_string(), p.clone())], p)
}

fn set_grad(p: &Tensor, g: &[f64]) {
    p.set_grad(Some(
        Tensor::from_f64(g, &[g.len()], DType::F64, p.device()).unwrap(),
    ));
}

fn close(got: &Tensor, want: &[f64]) {
    let got = got.to_vec_f64().unwrap();
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-12, "got {got:?}, want {want:?}");
    }
}

fn one(p: &Tensor) -> Tensor {
    Tensor::ones(&[1], DType::F32, p.device()).unwrap()
}

#[test]
fn sgd_momentum_with_weight_decay() {
    let (params, p) = param(&[1.0, -2.0]);
    let mut opt = Sgd::new(vec![ParamGroup::new(params, 0.01)], 0.9, 0.0, false).unwrap();
    set_grad(&p, &[0.5, 0.25]);
    opt.step(0.1, &one(&p)).unwrap();
    // d = g + 0.01 p = [0.51, 0.23]; the first buffer is d itself.
    close(&p, &[0.949, -2.023]);
    set_grad(&p, &[0.5, 0.25]);
    opt.step(0.1, &one(&p)).unwrap();
    // d = [0.50949, 0.22977]; buf = 0.9 [0.51, 0.23] + d = [0.96849, 0.43677].
    close(&p, &[0.852151, -2.066677]);
}

#[test]
fn sgd_nesterov_and_grad_scale() {
    let (params, p) = param(&[1.0, -2.0]);
    let mut opt = Sgd::new(vec![ParamGroup::new(params, 0.0)], 0.9, 0.0, true).unwrap();
    set_grad(&p, &[1.0, 0.5]);
    let half = Tensor::full(&[1], 0.5, DType::F32, p.device()).unwrap();
    opt.step(0.1, &half).unwrap();
    // g = 0.5 [1, 0.5]; buf = g; step direction g + 0.9 buf = 1.9 g.
    close(&p, &[1.0 - 0.1 * 1.9 * 0.5, -2.0 - 0.1 * 1.9 * 0.25]);
}

#[test]
fn sgd_dampening_applies_from_the_second_step() {
    let (params, p) = param(&[0.0]);
    let mut opt = Sgd::new(vec![ParamGroup::new(params, 0.0)], 0.5, 0.5, false).unwrap();
    set_grad(&p, &[1.0]);
    opt.step(1.0, &one(&p)).unwrap();
    close(&p, &[-1.0]);
    set_grad(&p, &[1.0]);
    opt.step(1.0, &one(&p)).unwrap();
    // buf = 0.5 * 1 + (1 - 0.5) * 1 = 1.
    close(&p, &[-2.0]);
}

#[test]
fn adam_with_l2_weight_decay() {
    let (params, p) = param(&[1.0]);
    let mut opt =
        Adam::with_l2_decay(vec![ParamGroup::new(params, 0.1)], 0.9, 0.999, 1e-8).unwrap();
    set_grad(&p, &[0.5]);
    opt.step(0.1, &one(&p)).unwrap();
    // g = 0.5 + 0.1 * 1 = 0.6; m = 0.06, v = 0.00036; m / (1 - 0.9) = 0.6,
    // sqrt(v / (1 - 0.999)) = 0.6, so p = 1 - 0.1 * 0.6 / (0.6 + 1e-8).
    close(&p, &[1.0 - 0.1 * 0.6 / (0.6 + 1e-8)]);
    assert_eq!(opt.steps(), 1);
}

/// Parameters, gradients and state packed back to back in one allocation each
/// (`Tensor::zeros_packed`) take one update for the group; it gives the bits that one update
/// per parameter gives.
#[test]
fn adamw_over_packed_parameters_matches_one_update_per_parameter() {
    let device = tessera::open_device("cpu").unwrap();
    let shapes: [&[usize]; 3] = [&[2, 3], &[5], &[4, 2]];
    let values = |k: usize, n: usize| -> Vec<f64> {
        (0..n)
            .map(|i| ((i * 7 + k * 13) % 11) as f64 * 0.25 - 1.2)
            .collect()
    };
    let zeros = |packed: bool| -> Vec<Tensor> {
        match packed {
            true => Tensor::zeros_packed(&shapes, DType::F32, &device).unwrap(),
            false => shapes
                .iter()
                .map(|s| Tensor::zeros(s, DType::F32, &device).unwrap())
                .collect(),
        }
    };
    let run = |packed: bool| -> Vec<Vec<f64>> {
        let (tensors, grads) = (zeros(packed), zeros(packed));
        let mut params = Vec::new();
        for (k, ((t, g), shape)) in tensors.iter().zip(&grads).zip(shapes).enumerate() {
            let n = shape.iter().product();
            t.copy_from(&Tensor::from_f64(&values(k, n), shape, DType::F32, &device).unwrap())
                .unwrap();
            g.copy_from(&Tensor::from_f64(&values(k + 5, n), shape, DType::F32, &device).unwrap())
                .unwrap();
            let p = t.requires_grad();
            p.set_grad(Some(g.clone()));
            params.push((format!("p{k}"), p));
        }
        let refs: Vec<&Tensor> = params.iter().map(|(_, p)| p).collect();
        assert_eq!(Tensor::span(&refs).is_some(), packed);
        let handles: Vec<Tensor> = params.iter().map(|(_, p)| p.clone()).collect();
        let mut opt = Adam::adamw(vec![ParamGroup::new(params, 0.1)], 0.9, 0.95, 1e-8).unwrap();
        let scale = Tensor::full(&[1], 0.5, DType::F32, &device).unwrap();
        for _ in 0..3 {
            opt.step(0.01, &scale).unwrap();
        }
        handles.iter().map(|p| p.to_vec_f64().unwrap()).collect()
    };
    let (packed, separate) = (run(true), run(false));
    for (a, b) in packed.iter().zip(&separate) {
        let bits = |v: &[f64]| v.iter().map(|x| (*x as f32).to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(b));
    }
}
