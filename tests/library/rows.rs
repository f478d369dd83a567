//! `linear_rows` and `cross_entropy` (fused ops on the CPU backends) against Burn's `Linear`
//! and `CrossEntropyLoss`, forward and gradients, on every backend compiled in.

use burn::nn::LinearConfig;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::prelude::*;
use burn::tensor::TensorData;
use sdpa::{AttentionError, linear_rows, try_cross_entropy};

use crate::common::{devices, lcg_values, max_abs_diff, values};

fn tensor<const D: usize>(seed: u64, shape: [usize; D], device: &Device) -> Tensor<D> {
    let n = shape.iter().product();
    let data: Vec<f32> = lcg_values(seed, n).iter().map(|&x| x as f32).collect();
    Tensor::from_data(TensorData::new(data, shape), device)
}

/// Relative agreement, with the tolerance fixed before the run: f32 products of length ≤ 1100
/// summed in another order differ by far less than 1e-4 of the largest value.
fn assert_close(what: &str, got: Vec<f64>, expected: Vec<f64>) {
    let scale = expected.iter().fold(1.0f64, |a, &x| a.max(x.abs()));
    let diff = max_abs_diff(&got, &expected);
    assert!(
        diff <= 1e-4 * scale,
        "{what}: max |Δ| {diff:e} (scale {scale})"
    );
}

#[test]
fn linear_rows_equals_burns_linear_forward_and_backward() {
    // Rows: 3·7 (one partial block) and 2·600 (two blocks and a part), with and without a bias.
    for (backend, plain) in devices() {
        let device = plain.autodiff();
        for (b, s, d_in, d_out, bias) in [(3, 7, 5, 4, true), (2, 600, 16, 24, false)] {
            let layer = LinearConfig::new(d_in, d_out).with_bias(bias).init(&device);
            let x = tensor(1, [b, s, d_in], &device).require_grad();
            let g = tensor(2, [b, s, d_out], &device);
            let ours = linear_rows(&layer, x.clone());
            let reference = layer.forward(x.clone());
            assert_eq!(ours.dims(), [b, s, d_out]);
            let what = format!("{backend} linear [{b}, {s}, {d_in}] -> {d_out}");
            assert_close(
                &what,
                values(ours.clone().inner()),
                values(reference.clone().inner()),
            );
            let grads = (ours * g.clone()).sum().backward();
            let reference_grads = (reference * g).sum().backward();
            let grad = |t: &Tensor<3>, grads| values(t.grad(grads).expect("gradient"));
            assert_close(
                &format!("{what} dx"),
                grad(&x, &grads),
                grad(&x, &reference_grads),
            );
            let weight = |grads| values(layer.weight.grad(grads).expect("weight gradient"));
            assert_close(
                &format!("{what} dW"),
                weight(&grads),
                weight(&reference_grads),
            );
            if let Some(bias) = &layer.bias {
                let db = |grads| values(bias.grad(grads).expect("bias gradient"));
                assert_close(&format!("{what} db"), db(&grads), db(&reference_grads));
            }
        }
    }
}

#[test]
fn cross_entropy_equals_burns_loss_and_its_gradient() {
    for (backend, plain) in devices() {
        let device = plain.autodiff();
        // 300 rows: more than one row block of the CPU op.
        for (rows, classes) in [(5, 3), (300, 17)] {
            let logits = (tensor(3, [rows, classes], &device) * 4.0)
                .detach()
                .require_grad();
            let ids: Vec<i64> = (0..rows as i64).map(|r| r * 7 % classes as i64).collect();
            let targets = Tensor::<1, Int>::from_data(TensorData::new(ids, [rows]), &device);
            let ours = try_cross_entropy(logits.clone(), targets.clone()).expect("valid targets");
            let reference = CrossEntropyLossConfig::new()
                .init(&device)
                .forward(logits.clone(), targets);
            let what = format!("{backend} cross-entropy [{rows}, {classes}]");
            assert_close(
                &what,
                values(ours.clone().inner()),
                values(reference.clone().inner()),
            );
            let grad =
                |loss: Tensor<1>| values(logits.grad(&(loss * 3.0).backward()).expect("gradient"));
            assert_close(&format!("{what} gradient"), grad(ours), grad(reference));
        }
    }
}

#[test]
fn cross_entropy_refuses_targets_that_are_not_classes() {
    for (backend, device) in devices() {
        let logits = tensor(4, [3, 4], &device);
        for (bad, row) in [(4i64, 1usize), (-1, 1)] {
            let targets =
                Tensor::<1, Int>::from_data(TensorData::new(vec![0i64, bad, 2], [3]), &device);
            let e = try_cross_entropy(logits.clone(), targets).unwrap_err();
            assert!(
                matches!(&e, AttentionError::InvalidConfig { .. })
                    && e.to_string().contains(&format!("{bad} (row {row})"))
                    && e.to_string().contains("0..4"),
                "{backend}: {e}"
            );
        }
        let short = Tensor::<1, Int>::from_data(TensorData::new(vec![0i64, 1], [2]), &device);
        let e = try_cross_entropy(logits.clone(), short).unwrap_err();
        assert!(e.to_string().contains("[3, 4]"), "{backend}: {e}");
    }
}

#[test]
fn linear_rows_gives_the_weight_gradient_of_a_frozen_input() {
    for (backend, plain) in devices() {
        let device = plain.autodiff();
        let layer = LinearConfig::new(6, 3).init(&device);
        // An input that carries no gradient: only the parameters are parents of the op.
        let x = tensor(5, [2, 4, 6], &device);
        let g = tensor(6, [2, 4, 3], &device);
        let grads = (linear_rows(&layer, x.clone()) * g.clone())
            .sum()
            .backward();
        let reference = (layer.forward(x) * g).sum().backward();
        let weight = |grads| values(layer.weight.grad(grads).expect("weight gradient"));
        assert_close(
            &format!("{backend} frozen-input dW"),
            weight(&grads),
            weight(&reference),
        );
    }
}
