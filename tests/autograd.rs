//! Gradients through narrow views against sums worked out by hand: slices of one tensor that
//! meet in the backward pass (a fused projection split three ways), overlapping slices,
//! slices along different axes, and a slice beside a use of the whole tensor; what the graph
//! keeps, a second backward pass, and gradients shared between inputs.

use std::sync::Arc;

use tessera::{DType, Device, Tensor};

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

/// A vector on `device` that takes gradients.
fn leaf(device: &Arc<dyn Device>, values: &[f32]) -> Tensor {
    Tensor::from_slice(values, &[values.len()], device)
        .unwrap()
        .requires_grad()
}

/// An intermediate tensor whose data no backward reads is freed once the caller drops
/// it, while one a backward reads lives on in the graph; the gradients are the same.
#[test]
fn the_graph_keeps_only_what_backward_passes_read() {
    let a = leaf(&tessera::open_device("cpu").unwrap(), &[0.5, -1.0]);
    let unread = a.exp().unwrap();
    let doubled = unread.add(&unread).unwrap();
    let read = a.exp().unwrap();
    let sine = read.sin().unwrap();
    let (unread_storage, read_storage) = (
        Arc::downgrade(unread.buffer()),
        Arc::downgrade(read.buffer()),
    );
    drop((unread, read));
    assert!(
        unread_storage.upgrade().is_none(),
        "an add's input was kept"
    );
    assert!(read_storage.upgrade().is_some(), "sin's input was dropped");
    let loss = doubled.add(&sine).unwrap().sum(&[0], false).unwrap();
    loss.backward().unwrap();
    let grad = a.grad().unwrap().to_vec::<f32>().unwrap();
    for (g, x) in grad.iter().zip([0.5f32, -1.0]) {
        let expected = 2.0 * x.exp() + x.exp().cos() * x.exp();
        assert!((g - expected).abs() < 1e-5, "{g} vs {expected}");
    }
}

/// A backward pass frees what the graph saved, so a second one through the same graph
/// is refused with an error that says so (PyTorch's rule without `retain_graph`).
#[test]
fn a_second_backward_pass_through_one_graph_is_refused() {
    let a = leaf(&tessera::open_device("cpu").unwrap(), &[0.5, -1.0]);
    let loss = a.exp().unwrap().sum(&[0], false).unwrap();
    loss.backward().unwrap();
    let err = loss.backward().unwrap_err().to_string();
    assert!(err.contains("already backpropagated"), "{err}");
}

/// A parameter added to a same-shaped tensor gets the very gradient the other input
/// gets: it is not the leaf's alone until that input's own backward has run. (The add's
/// gradient is a product's output here; a sum's gradient would reach it as a broadcast view,
/// which the leaf copies and then holds alone.)
#[test]
fn a_gradient_passed_on_to_another_input_is_not_exclusive() {
    let device = tessera::open_device("cpu").unwrap();
    let (x, bias, scale) = (
        leaf(&device, &[1.0, 2.0]),
        leaf(&device, &[0.5, 0.5]),
        leaf(&device, &[3.0, 3.0]),
    );
    let weights = Tensor::from_slice(&[2.0f32, -1.0], &[2], &device).unwrap();
    let loss = x
        .mul(&scale)
        .unwrap()
        .add(&bias)
        .unwrap()
        .mul(&weights)
        .unwrap()
        .sum(&[0], false)
        .unwrap();
    let seed = Tensor::ones(&[], DType::F32, &device).unwrap();
    let leaves = [bias.clone(), scale.clone()];
    let mut seen = Vec::new();
    loss.backward_with_hooks(&seed, &leaves, &mut |i| {
        seen.push((i, leaves[i].grad_is_exclusive()));
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, vec![(0, false), (1, true)]);
}
