//! The CubeCL flash kernel against `Naive` on wgpu, forward and backward: scale,
//! soft-cap, causal in both alignments, windows, grouped-query heads, padding, masks and biases
//! in broadcast shapes, −∞ bias entries, fully masked rows, segments and ALiBi; context and
//! log-sum-exp.

#![cfg(feature = "wgpu")]

use burn::prelude::*;
use burn::tensor::Distribution;
use sdpa::{
    AttentionInput, AttentionPath, BackendKind, CausalAlignment, Implementation,
    ScaledDotProductAttentionConfig,
};

use crate::common::{max_abs_diff, values};

/// A call of the kernel and of `Naive` on the same inputs: (context, lse) of each.
fn both(
    input: &AttentionInput,
    alignment: CausalAlignment,
    softcap: Option<f64>,
) -> [(Vec<f64>, Vec<f64>); 2] {
    [Implementation::CubeKernel, Implementation::Naive].map(|implementation| {
        let attention = ScaledDotProductAttentionConfig::new()
            .with_implementation(implementation)
            .with_causal_alignment(alignment)
            .with_softcap(softcap)
            .init();
        let out = attention.forward(input.clone().need_lse());
        let lse = out.lse.expect("lse asked for");
        // −∞ (a row with no visible key) as a large negative number, comparable.
        let lse = values(lse.clamp_min(-1.0e30));
        (values(out.context), lse)
    })
}

#[test]
fn the_cube_kernel_equals_naive_on_wgpu() {
    crate::common::in_child("cube::child_the_cube_kernel_equals_naive_on_wgpu", &[]);
}

/// The body of [`the_cube_kernel_equals_naive_on_wgpu`], run in a child process: its own wgpu device, so that lavapipe
/// compiles its kernels on the second core while this binary's other tests use the first
/// (`common::in_child`).
#[test]
#[ignore = "run by its parent test in a child process"]
fn child_the_cube_kernel_equals_naive_on_wgpu() {
    let device = BackendKind::Wgpu.device().expect("wgpu (lavapipe in CI)");
    device.seed(3);
    for (n, m, h, h_kv, d_k, d_v) in [
        (37, 53, 4, 2, 16, 8),
        (64, 64, 2, 2, 32, 32),
        (5, 70, 3, 1, 8, 12),
        (300, 260, 2, 1, 16, 8),
    ] {
        let q = Tensor::<4>::random([2, h, n, d_k], Distribution::Normal(0.0, 1.0), &device);
        let k = Tensor::<4>::random([2, h_kv, m, d_k], Distribution::Normal(0.0, 1.0), &device);
        let v = Tensor::<4>::random([2, h_kv, m, d_v], Distribution::Normal(0.0, 1.0), &device);
        let plain = AttentionInput::new(q, k, v);
        let bernoulli = |shape: [usize; 4], p: f64| {
            Tensor::<4>::random(shape, Distribution::Uniform(0.0, 1.0), &device).lower_elem(p)
        };
        // [b, m]: the last quarter of batch element 1's keys are padding.
        let padding = Tensor::<1, Int>::arange(0..m as i64, &device)
            .reshape([1, m])
            .expand([2, m])
            .greater_equal_elem((3 * m / 4) as i64)
            .bool_and(
                Tensor::<2, Bool>::from_data(
                    burn::tensor::TensorData::new(vec![false, true], [2, 1]),
                    &device,
                )
                .expand([2, m]),
            );
        let mask = bernoulli([2, 1, n, m], 0.3);
        let head_mask = bernoulli([1, h, 1, m], 0.3);
        // Row 0 of every head sees nothing.
        let row_mask = Tensor::<1, Int>::arange(0..n as i64, &device)
            .reshape([1, 1, n, 1])
            .expand([2, h, n, m])
            .equal_elem(0);
        let bias = Tensor::<4>::random([1, h, n, m], Distribution::Normal(0.0, 1.0), &device);
        let lengths = |len: usize| {
            let docs = [len / 3, len / 3, len - 2 * (len / 3)];
            sdpa::mask::segment_ids_from_lengths(&[docs.to_vec(), docs.to_vec()], len, &device)
                .unwrap()
        };
        let (q_ids, k_ids) = (lengths(n), lengths(m));
        let slopes = Tensor::<1>::from_floats(sdpa::mask::alibi_slopes(h).as_slice(), &device);
        let cases = [
            ("plain", plain.clone(), CausalAlignment::BottomRight, None),
            (
                "causal",
                plain.clone().causal(),
                CausalAlignment::BottomRight,
                None,
            ),
            (
                "causal top-left",
                plain.clone().causal(),
                CausalAlignment::TopLeft,
                None,
            ),
            (
                "window",
                plain.clone().window(3, 2),
                CausalAlignment::BottomRight,
                None,
            ),
            (
                "causal window, soft-cap",
                plain.clone().causal().window(4, 0),
                CausalAlignment::TopLeft,
                Some(2.0),
            ),
            (
                "window 0",
                plain.clone().window(0, 0),
                CausalAlignment::TopLeft,
                None,
            ),
            (
                "padding",
                plain.clone().padding_mask(padding.clone()),
                CausalAlignment::BottomRight,
                None,
            ),
            (
                "mask [b, 1, n, m]",
                plain.clone().mask(mask.clone()),
                CausalAlignment::BottomRight,
                None,
            ),
            (
                "mask [1, h, 1, m], causal",
                plain.clone().mask(head_mask.clone()).causal(),
                CausalAlignment::TopLeft,
                None,
            ),
            (
                "bias [1, h, n, m], padding, soft-cap",
                plain
                    .clone()
                    .bias(bias.clone())
                    .padding_mask(padding.clone()),
                CausalAlignment::BottomRight,
                Some(3.0),
            ),
            (
                "bias with −∞, causal",
                plain
                    .clone()
                    .bias(bias.clone().mask_fill(head_mask.clone(), f32::NEG_INFINITY))
                    .causal(),
                CausalAlignment::BottomRight,
                None,
            ),
            (
                "fully masked rows",
                plain.clone().mask(row_mask.clone()),
                CausalAlignment::BottomRight,
                None,
            ),
            (
                "segments, causal",
                plain
                    .clone()
                    .segments(q_ids.clone(), k_ids.clone())
                    .causal(),
                CausalAlignment::BottomRight,
                None,
            ),
            (
                "ALiBi, window",
                plain.clone().alibi(slopes.clone()).window(5, 1),
                CausalAlignment::BottomRight,
                None,
            ),
        ];
        for (name, input, alignment, softcap) in cases {
            let [(context, lse), (expected_context, expected_lse)] =
                both(&input, alignment, softcap);
            let dc = max_abs_diff(&context, &expected_context);
            let dl = max_abs_diff(&lse, &expected_lse);
            assert!(
                dc < 1e-4 && dl < 1e-3,
                "{name} n {n} m {m}: context {dc}, lse {dl}"
            );
        }
    }
    let attention = ScaledDotProductAttentionConfig::new()
        .with_implementation(Implementation::CubeKernel)
        .init();
    let x = Tensor::<4>::zeros([1, 1, 4, 8], &device);
    let input = AttentionInput::new(x.clone(), x.clone(), x);
    assert_eq!(attention.path(&input).unwrap(), AttentionPath::CubeKernel);
}

/// The context and the gradients of q, k, v (of the loss Σ context ∘ w, with fixed random w) of
/// `implementation` on an autodiff wgpu device.
fn gradients(
    input: &AttentionInput,
    implementation: Implementation,
    alignment: CausalAlignment,
    softcap: Option<f64>,
    weights: &Tensor<4>,
) -> [Vec<f64>; 5] {
    let leaf = |t: &Tensor<4>| t.clone().detach().require_grad();
    let (q, k, v) = (leaf(&input.query), leaf(&input.key), leaf(&input.value));
    let mut input = input.clone();
    (input.query, input.key, input.value) = (q.clone(), k.clone(), v.clone());
    let bias = input.bias.as_ref().map(leaf);
    input.bias = bias.clone();
    let attention = ScaledDotProductAttentionConfig::new()
        .with_implementation(implementation)
        .with_causal_alignment(alignment)
        .with_softcap(softcap)
        .init();
    let context = attention.forward(input).context;
    let grads = (context.clone() * weights.clone()).sum().backward();
    let grad = |t: &Tensor<4>| values(t.grad(&grads).expect("a gradient"));
    let bias_grad = bias.as_ref().map(grad).unwrap_or_default();
    [values(context), grad(&q), grad(&k), grad(&v), bias_grad]
}

/// Runs `input` through the kernel and through `Naive` (see [`gradients`]) and asserts the same
/// context and gradients: NaN exactly where `Naive` has NaN, elsewhere within 1e-4. Returns the
/// kernel's.
pub(crate) fn assert_trains_like_naive(
    label: &str,
    input: &AttentionInput,
    alignment: CausalAlignment,
    softcap: Option<f64>,
    weights: &Tensor<4>,
) -> [Vec<f64>; 5] {
    let got = gradients(
        input,
        Implementation::CubeKernel,
        alignment,
        softcap,
        weights,
    );
    let expected = gradients(input, Implementation::Naive, alignment, softcap, weights);
    for (what, (g, e)) in ["context", "dq", "dk", "dv", "dbias"]
        .iter()
        .zip(got.iter().zip(&expected))
    {
        assert_eq!(g.len(), e.len(), "{label}: {what}");
        for (idx, (a, b)) in g.iter().zip(e).enumerate() {
            assert_eq!(a.is_nan(), b.is_nan(), "{label}: {what}[{idx}]: {a} vs {b}");
            assert!(
                a.is_nan() || (a - b).abs() < 1e-4,
                "{label}: {what}[{idx}]: {a} vs {b}"
            );
        }
    }
    got
}

#[test]
fn the_cube_kernel_trains_like_naive_on_wgpu() {
    let device = BackendKind::Wgpu.device().expect("wgpu").autodiff();
    device.seed(5);
    // Short rows (one block of queries and keys, 1 or 2 rows per unit) and long ones (several
    // blocks, 4 rows per unit, n ≠ m, so the tiles outside the causal band and the window are
    // skipped per block); head sizes that take the plane broadcasts (multiples of 8) and one
    // that takes the workgroup-memory tiles (12).
    for (n, m, h, h_kv, d_k, d_v) in [
        (37, 53, 4, 2, 16, 8),
        (33, 33, 2, 1, 8, 8),
        (300, 260, 2, 1, 12, 12),
        (260, 300, 2, 2, 16, 16),
    ] {
        let random =
            |shape: [usize; 4]| Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let plain = AttentionInput::new(
            random([2, h, n, d_k]),
            random([2, h_kv, m, d_k]),
            random([2, h_kv, m, d_v]),
        );
        let weights = random([2, h, n, d_v]);
        let mask = Tensor::<4>::random([2, 1, n, m], Distribution::Uniform(0.0, 1.0), &device)
            .lower_elem(0.3);
        let slopes = Tensor::<1>::from_floats(sdpa::mask::alibi_slopes(h).as_slice(), &device);
        // Three documents per row (segment ids 0, 1, 2).
        let thirds = |len: usize| {
            let docs = vec![len / 3, len / 3, len - 2 * (len / 3)];
            sdpa::mask::segment_ids_from_lengths(&[docs.clone(), docs], len, &device).unwrap()
        };
        let cases = [
            ("plain", plain.clone(), CausalAlignment::BottomRight, None),
            (
                "causal top-left, soft-cap",
                plain.clone().causal(),
                CausalAlignment::TopLeft,
                Some(2.0),
            ),
            (
                "window, mask",
                plain.clone().window(4, 1).mask(mask.clone()),
                CausalAlignment::BottomRight,
                None,
            ),
            (
                "ALiBi, causal",
                plain.clone().alibi(slopes.clone()).causal(),
                CausalAlignment::BottomRight,
                None,
            ),
            (
                "bias [1, h, n, m], mask, soft-cap",
                plain.clone().bias(random([1, h, n, m])).mask(mask.clone()),
                CausalAlignment::BottomRight,
                Some(2.5),
            ),
            (
                "bias [2, 1, 1, m], causal",
                plain.clone().bias(random([2, 1, 1, m])).causal(),
                CausalAlignment::TopLeft,
                None,
            ),
            (
                "segments",
                plain.clone().segments(thirds(n), thirds(m)),
                CausalAlignment::TopLeft,
                None,
            ),
            (
                "segments, ALiBi, causal, soft-cap",
                plain
                    .clone()
                    .segments(thirds(n), thirds(m))
                    .alibi(slopes.clone())
                    .causal(),
                CausalAlignment::BottomRight,
                Some(3.0),
            ),
        ];
        for (name, input, alignment, softcap) in cases {
            let label = format!("{name} n {n} m {m}");
            assert_trains_like_naive(&label, &input, alignment, softcap, &weights);
        }
    }
}

/// More (batch·head) rows than one axis of a Vulkan or Metal grid holds (65 535): the kernels
/// spread them over two axes; every row still computed, forward and backward.
#[test]
fn the_cube_kernel_serves_more_rows_than_one_grid_axis_holds() {
    let device = BackendKind::Wgpu.device().expect("wgpu").autodiff();
    device.seed(9);
    let b = 65_537;
    let random =
        |shape: [usize; 4]| Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let input = AttentionInput::new(
        random([b, 1, 2, 8]),
        random([b, 1, 3, 8]),
        random([b, 1, 3, 8]),
    )
    .causal();
    let weights = random([b, 1, 2, 8]);
    let label = format!("b = {b}");
    assert_trains_like_naive(&label, &input, CausalAlignment::BottomRight, None, &weights);
}

/// The non-finite policy, applied key by key in the kernel: a NaN value row poisons exactly the
/// rows that see its key, a NaN bias entry the row that sees it (not a row whose causal mask
/// hides it), an infinite query its own row; the other rows' outputs and every gradient equal
/// Naive's (which applies the policy with tensor ops), NaN rows included.
#[test]
fn the_cube_kernel_follows_the_non_finite_policy_in_training() {
    let device = BackendKind::Wgpu.device().expect("wgpu").autodiff();
    device.seed(13);
    let (h, n, d) = (2, 6, 8);
    let random =
        |shape: [usize; 4]| Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let plant = |t: Tensor<4>, idx: [usize; 4], value: f32| {
        let shape = t.dims();
        let flat = ((idx[0] * shape[1] + idx[1]) * shape[2] + idx[2]) * shape[3] + idx[3];
        let mut data = t
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .expect("f32");
        data[flat] = value;
        Tensor::<4>::from_data(burn::tensor::TensorData::new(data, shape), &device)
    };
    let q = plant(random([1, h, n, d]), [0, 1, 2, 5], f32::INFINITY);
    let k = random([1, 1, n, d]);
    let v = plant(random([1, 1, n, d]), [0, 0, 4, 2], f32::NAN);
    let bias = plant(random([1, h, n, n]), [0, 0, 1, 1], f32::NAN);
    let bias = plant(bias, [0, 1, 0, 3], f32::NAN); // hidden by the causal mask
    let input = AttentionInput::new(q, k, v).bias(bias).causal();
    let weights = random([1, h, n, d]);
    let got = assert_trains_like_naive(
        "non-finite",
        &input,
        CausalAlignment::BottomRight,
        None,
        &weights,
    );
    // Rows 4 and 5 of both heads see the NaN value; row 1 of head 0 its NaN bias entry; row 2 of
    // head 1 has an infinite query.
    let context = &got[0];
    for head in 0..h {
        for row in 0..n {
            let poisoned = row >= 4 || (head, row) == (0, 1) || (head, row) == (1, 2);
            let values = &context[(head * n + row) * d..(head * n + row + 1) * d];
            assert!(
                values.iter().all(|x| x.is_nan() == poisoned),
                "head {head} row {row}: {values:?}"
            );
        }
    }
}
