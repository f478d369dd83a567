//! `linear_rows` and `cross_entropy` (fused ops on the CPU backends) against Burn's `Linear`
//! and `CrossEntropyLoss`, forward and gradients, on every backend compiled in.

use burn::nn::LinearConfig;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::prelude::*;
use burn::tensor::TensorData;
use sdpa::AttentionError;
use sdpa::rows::{linear_rows, try_cross_entropy};

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

/// f64 mean and population std of `xs`.
fn reference_mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let variance = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, variance.sqrt())
}

#[test]
fn mean_and_std_equals_the_f64_reference_on_views_and_under_autodiff() {
    // Heads split by a transpose (a permuted view: read in place on the CPU backends), the same
    // sliced (not a permutation of the whole buffer: copied), and an autodiff tensor; sizes
    // over one block of the CPU pass (65 536) with a tail. Tolerance fixed before the run:
    // f32 lanes summed in f64 blocks differ from f64 by < 1e-5 relative at these sizes.
    for (backend, device) in devices() {
        let x = tensor(7, [3, 130, 4, 65], &device).add_scalar(0.25);
        let all: Vec<f64> = values(x.clone());
        let heads = x.clone().swap_dims(1, 2);
        let sliced = heads.clone().slice(s![.., 1..3, .., ..]);
        let sliced_values: Vec<f64> = values(sliced.clone());
        let autodiff = Tensor::<4>::from_data(x.to_data(), &device.autodiff()).require_grad();
        for (what, t, reference) in [
            ("heads", heads, &all),
            ("sliced heads", sliced, &sliced_values),
            ("autodiff", autodiff.swap_dims(1, 2), &all),
        ] {
            let got: Vec<f64> = values(sdpa::rows::mean_and_std(t));
            let (mean, std) = reference_mean_std(reference);
            assert_eq!(got.len(), 2, "{backend} {what}");
            assert!(
                (got[0] - mean).abs() <= 1e-5 * std,
                "{backend} {what} mean {} vs {mean}",
                got[0]
            );
            assert!(
                (got[1] - std).abs() <= 1e-5 * std,
                "{backend} {what} std {} vs {std}",
                got[1]
            );
        }
    }
}

#[test]
fn accuracy_is_argmax_equal_to_the_target() {
    // Ties (argmax takes the first largest), a target out of the classes and a negative one, then random logits over two CPU blocks (65 536 / 100 rows a task), against Burn's
    // argmax on every backend.
    for (backend, device) in devices() {
        let logits = Tensor::<2>::from_data(
            [
                [1.0, 3.0, 3.0],
                [1.0, 3.0, 3.0],
                [0.0, 0.0, 2.0],
                [0.0, 1.0, 0.0],
                [0.0, 1.0, 0.0],
            ],
            &device,
        );
        let targets = Tensor::<1, Int>::from_data([1, 2, 2, 3, -1], &device);
        let got = sdpa::rows::try_accuracy(logits, targets).expect("one target per row");
        let got: Vec<f64> = values(got);
        // Rows 0 and 2 are right (row 1's largest logit comes first at 1).
        assert!((got[0] - 2.0 / 5.0).abs() < 1e-6, "{backend}: {}", got[0]);

        let (rows, classes) = (1400, 100);
        let logits = tensor(11, [rows, classes], &device);
        let ids: Vec<i64> = (0..rows as i64)
            .map(|r| (r * 37) % classes as i64)
            .collect();
        let targets = Tensor::<1, Int>::from_data(TensorData::new(ids, [rows]), &device);
        let predicted = logits.clone().argmax(1).squeeze_dim::<1>(1);
        let reference: Vec<f64> = values(predicted.equal(targets.clone()).float().mean());
        // Make about half the rows right, so that the count is not trivially 0.
        let boosted = logits.clone().slice_assign(
            s![0..rows / 2, 0..1],
            Tensor::<2>::full([rows / 2, 1], 1e3, &device),
        );
        let first: Vec<i64> = (0..rows as i64)
            .map(|r| if r < rows as i64 / 2 { 0 } else { 1 })
            .collect();
        let first = Tensor::<1, Int>::from_data(TensorData::new(first, [rows]), &device);
        let boosted_reference: Vec<f64> = values(
            boosted
                .clone()
                .argmax(1)
                .squeeze_dim::<1>(1)
                .equal(first.clone())
                .float()
                .mean(),
        );
        for (what, logits, targets, reference) in [
            ("random", logits, targets, reference[0]),
            ("half right", boosted, first, boosted_reference[0]),
        ] {
            let got: Vec<f64> = values(sdpa::rows::accuracy(logits, targets));
            assert!(
                (got[0] - reference).abs() < 1e-6,
                "{backend} {what}: {} vs {reference}",
                got[0]
            );
        }
        assert!(boosted_reference[0] >= 0.5, "the boosted rows are right");
        let empty = sdpa::rows::try_accuracy(
            Tensor::<2>::zeros([0, 3], &device),
            Tensor::<1, Int>::from_data(TensorData::new(Vec::<i64>::new(), [0]), &device),
        );
        assert!(
            values(empty.expect("zero rows"))[0].is_nan(),
            "{backend}: zero rows"
        );
        assert!(matches!(
            sdpa::rows::try_accuracy(
                Tensor::<2>::zeros([2, 0], &device),
                Tensor::<1, Int>::from_data([0, 0], &device)
            ),
            Err(AttentionError::Shape { .. })
        ));
        let short = Tensor::<1, Int>::from_data([0, 1], &device);
        assert!(matches!(
            sdpa::rows::try_accuracy(Tensor::<2>::zeros([3, 2], &device), short),
            Err(AttentionError::Shape { .. })
        ));
    }
}

#[test]
fn accuracy_predicts_as_burns_argmax_with_nan_on_the_cpu_backends() {
    // Burn's argmax on Flex and NdArray picks the first NaN of a row that has one.
    for (backend, device) in crate::common::cpu_devices() {
        let logits = Tensor::<2>::from_data(
            [
                [1.0, f32::NAN, 3.0],
                [f32::NAN, 2.0, f32::NAN],
                [0.0, 5.0, f32::INFINITY],
            ],
            &device,
        );
        let targets = Tensor::<1, Int>::from_data([1, 0, 2], &device);
        let predicted = logits.clone().argmax(1).squeeze_dim::<1>(1);
        let reference: Vec<f64> = values(predicted.equal(targets.clone()).float().mean());
        let got: Vec<f64> = values(sdpa::rows::accuracy(logits, targets));
        assert_eq!(got[0], reference[0], "{backend}");
        assert_eq!(
            got[0], 1.0,
            "{backend}: every row's target is argmax's pick"
        );
    }
}

#[test]
fn mean_and_std_keeps_its_precision_when_the_mean_dwarfs_the_spread() {
    // Values 1000 ± 0.5 (mean / std ≈ 3500): E[x²] − E[x]² in f32 would lose the std to
    // cancellation; within 1e-4 relative of the f64 reference on the CPU backends (the tensor
    // path elsewhere makes no such promise).
    for (backend, device) in crate::common::cpu_devices() {
        let x = tensor(3, [70_000], &device).add_scalar(1000.0);
        let reference = reference_mean_std(&values(x.clone()));
        let got: Vec<f64> = values(sdpa::rows::mean_and_std(x));
        assert!(
            (got[0] - reference.0).abs() <= 1e-6 * reference.0,
            "{backend} mean"
        );
        assert!(
            (got[1] - reference.1).abs() <= 1e-4 * reference.1,
            "{backend} std {} vs {}",
            got[1],
            reference.1
        );
    }
}
