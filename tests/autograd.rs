//! Gradients through narrow views against sums worked out by hand: slices of one tensor that
//! meet in the backward pass (a fused projection split three ways), overlapping slices,
//! slices along different axes, and a slice beside a use of the whole tensor.

use tessera::{DType, Tensor};

/// `sum(view * weight)` for a view of `h` and weights of the view's shape.
fn weighted(view: Tensor, weights: &[f64]) -> Tensor {
    let w = Tensor::from_f64(weights, view.shape(), DType::F64, view.device()).unwrap();
    view.mul(&w).unwrap().sum(&[0, 1], false).unwrap()
}

/// x [2, 6] with gradients; h = 2 x, a tensor with history, as a projection's output is.
fn input() -> (Tensor, Tensor) {
    let device = tessera::open_device("cpu").unwrap();
    let x = Tensor::from_f64(&[0.0; 12], &[2, 6], DType::F64, &device)
        .unwrap()
        .requires_grad();
    let h = x.mul_scalar(2.0).unwrap();
    (x, h)
}

fn backward(terms: Vec<Tensor>) {
    let mut total = terms[0].clone();
    for t in &terms[1..] {
        total = total.add(t).unwrap();
    }
    total.backward().unwrap();
}

#[test]
fn slices_that_tile_a_tensor_give_each_its_weights() {
    let (x, h) = input();
    backward(vec![
        weighted(h.narrow(1, 0, 2).unwrap(), &[1.0, 2.0, 3.0, 4.0]),
        weighted(h.narrow(1, 2, 3).unwrap(), &[5.0, 6.0, 7.0, 8.0, 9.0, 10.0]),
        weighted(h.narrow(1, 5, 1).unwrap(), &[11.0, 12.0]),
    ]);
    let want: Vec<f64> = [
        1.0, 2.0, 5.0, 6.0, 7.0, 11.0, 3.0, 4.0, 8.0, 9.0, 10.0, 12.0,
    ]
    .iter()
    .map(|w| 2.0 * w)
    .collect();
    assert_eq!(x.grad().unwrap().to_vec_f64().unwrap(), want);
}

#[test]
fn overlapping_slices_add_where_they_meet() {
    let (x, h) = input();
    backward(vec![
        weighted(h.narrow(1, 0, 4).unwrap(), &[1.0; 8]),
        weighted(h.narrow(1, 2, 4).unwrap(), &[10.0; 8]),
        weighted(h.narrow(1, 5, 1).unwrap(), &[100.0; 2]),
    ]);
    let row = [1.0, 1.0, 11.0, 11.0, 10.0, 110.0];
    let want: Vec<f64> = row.iter().chain(&row).map(|w| 2.0 * w).collect();
    assert_eq!(x.grad().unwrap().to_vec_f64().unwrap(), want);
}

#[test]
fn slices_along_two_axes_and_the_whole_tensor_all_count() {
    let (x, h) = input();
    backward(vec![
        weighted(h.narrow(1, 1, 2).unwrap(), &[1.0; 4]),
        weighted(h.narrow(0, 1, 1).unwrap(), &[10.0; 6]),
        weighted(h.clone(), &[100.0; 12]),
        weighted(h.narrow(1, 4, 2).unwrap(), &[1000.0; 4]),
    ]);
    let first = [100.0, 101.0, 101.0, 100.0, 1100.0, 1100.0];
    let second = [110.0, 111.0, 111.0, 110.0, 1110.0, 1110.0];
    let want: Vec<f64> = first.iter().chain(&second).map(|w| 2.0 * w).collect();
    assert_eq!(x.grad().unwrap().to_vec_f64().unwrap(), want);
}
