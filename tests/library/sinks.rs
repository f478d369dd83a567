//! Attention sinks and quiet softmax on every path and backend compiled in: each against the
//! construction the golden README names (the sink as one more key in front, with a zero value
//! row and the sink as its bias), forward and backward, the sinks' own gradient included; the
//! policy for non-finite sinks; the multi-head layer's learned sinks with its cache. (The
//! PyTorch cases of `extensions3/` run through `golden.rs`.)

use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use sdpa::{
    AttentionError, AttentionInput, Implementation, KvCache, MultiHeadSdpaConfig,
    MultiHeadSdpaInput, ScaledDotProductAttentionConfig,
};

use crate::common::{bool4, devices, lcg_values, max_abs_diff, tensor4, values};

/// b 2, h 4 over h_kv 2, n 5, m 7, d_k 8, d_v 3.
const SHAPE: [usize; 6] = [2, 4, 2, 5, 7, 8];

/// A mask `[b, 1, n, m]` (true = hidden) with every key of query 1 of batch row 1 hidden, and
/// scattered hidden keys elsewhere.
fn mask(device: &Device) -> Tensor<4, Bool> {
    let [b, _, _, n, m, _] = SHAPE;
    let hidden: Vec<bool> = (0..b * n * m)
        .map(|idx| {
            let (row, j) = (idx / m, idx % m);
            row == n + 1 || (idx * 7 + 3) % 5 == 0 && j != 0
        })
        .collect();
    bool4(&hidden, [b, 1, n, m], device)
}

/// The context of one call and its gradients (dQ, dK, dV, d sinks) of `loss = Σ context · w`.
struct Run {
    context: Vec<f64>,
    grads: [Vec<f64>; 4],
}

fn tensors(device: &Device) -> [Tensor<4>; 3] {
    let [b, h, h_kv, n, m, d_k] = SHAPE;
    [
        tensor4(&lcg_values(31, b * h * n * d_k), [b, h, n, d_k], device),
        tensor4(
            &lcg_values(32, b * h_kv * m * d_k),
            [b, h_kv, m, d_k],
            device,
        ),
        tensor4(&lcg_values(33, b * h_kv * m * 3), [b, h_kv, m, 3], device),
    ]
}

/// `loss = Σ context · w` with a fixed, non-uniform `w`.
fn loss(context: Tensor<4>, device: &Device) -> Tensor<1> {
    let dims = context.dims();
    let w = tensor4(&lcg_values(34, dims.iter().product()), dims, device);
    (context * w).sum()
}

/// The module with `sinks` on `implementation`; `None` when the path refuses the call.
fn with_sinks(implementation: Implementation, sinks: &[f32], device: &Device) -> Option<Run> {
    let device = device.clone().autodiff();
    let [q, k, v] = tensors(&device).map(Tensor::require_grad);
    let s = Tensor::<1>::from_data(TensorData::new(sinks.to_vec(), [sinks.len()]), &device)
        .require_grad();
    let attn = ScaledDotProductAttentionConfig::new()
        .with_implementation(implementation)
        .init();
    let input = AttentionInput::new(q.clone(), k.clone(), v.clone())
        .mask(mask(&device))
        .sinks(s.clone());
    let out = attn.try_forward(input).ok()?;
    let grads = loss(out.context.clone(), &device).backward();
    let grad = |t: &Tensor<4>| values(t.grad(&grads).expect("a gradient"));
    Some(Run {
        context: values(out.context),
        grads: [
            grad(&q),
            grad(&k),
            grad(&v),
            values(s.grad(&grads).expect("the sinks' gradient")),
        ],
    })
}

/// The same attention built by hand on the naive path: one more key in front with a zero key
/// and value row, its score the sink through a bias column, never masked (a −∞ sink is masked
/// instead); the sinks' gradient is the bias column's, summed over batch rows and queries.
fn by_hand(sinks: &[f32], device: &Device) -> Run {
    let device = device.clone().autodiff();
    let [b, h, h_kv, n, m, d_k] = SHAPE;
    let [q, k, v] = tensors(&device).map(Tensor::require_grad);
    let s = Tensor::<1>::from_data(TensorData::new(sinks.to_vec(), [h]), &device).require_grad();
    // [h] -> [1, h, 1, 1] -> [b, h, n, 1]
    let absent = s
        .clone()
        .is_inf()
        .reshape([1, h, 1, 1])
        .expand([b, h, n, 1]);
    let column = s
        .clone()
        .mask_fill(s.clone().is_inf(), 0.0)
        .reshape([1, h, 1, 1])
        .expand([b, h, n, 1]);
    let bias = Tensor::cat(vec![column, Tensor::zeros([b, h, n, m], &device)], 3);
    let hidden = Tensor::cat(vec![absent, mask(&device).expand([b, h, n, m])], 3);
    let zero_row =
        |t: Tensor<4>, d: usize| Tensor::cat(vec![Tensor::zeros([b, h_kv, 1, d], &device), t], 2);
    let attn = ScaledDotProductAttentionConfig::new()
        .with_implementation(Implementation::Naive)
        .init();
    // The scale 1/√d_k would scale the zero key's score 0: the sink is in the bias, unscaled.
    let out = attn.forward(
        AttentionInput::new(q.clone(), zero_row(k.clone(), d_k), zero_row(v.clone(), 3))
            .mask(hidden)
            .bias(bias),
    );
    let grads = loss(out.context.clone(), &device).backward();
    let grad = |t: &Tensor<4>| values(t.grad(&grads).expect("a gradient"));
    Run {
        context: values(out.context),
        grads: [
            grad(&q),
            grad(&k),
            grad(&v),
            values(s.grad(&grads).expect("the sinks' gradient")),
        ],
    }
}

#[test]
fn sinks_equal_one_more_key_with_a_zero_value_on_every_path_and_backend() {
    // One head with a −∞ sink: no sink at all.
    let sinks = [0.5, -1.0, 2.0, f32::NEG_INFINITY];
    let mut served = Vec::new();
    for (backend, device) in devices() {
        let want = by_hand(&sinks, &device);
        // The reference differs from plain attention (so the comparison can fail).
        let plain = with_sinks(Implementation::Naive, &[f32::NEG_INFINITY; 4], &device)
            .expect("naive serves every call");
        assert!(
            max_abs_diff(&plain.context, &want.context) > 1e-2,
            "{backend}"
        );
        for implementation in Implementation::all(3) {
            let Some(got) = with_sinks(implementation, &sinks, &device) else {
                continue;
            };
            served.push((backend, implementation));
            let label = format!("{backend} {implementation:?}");
            let diff = max_abs_diff(&got.context, &want.context);
            assert!(diff < 1e-5, "{label}: context differs by {diff}");
            for (name, (g, w)) in ["dQ", "dK", "dV", "d sinks"]
                .iter()
                .zip(got.grads.iter().zip(&want.grads))
            {
                let diff = max_abs_diff(g, w);
                assert!(diff < 2e-5, "{label}: {name} differs by {diff}");
            }
            // The −∞ sink has no gradient; the others have one.
            let d_sinks = &got.grads[3];
            assert_eq!(d_sinks[3], 0.0, "{label}");
            assert!(
                d_sinks[..3].iter().all(|g| g.abs() > 1e-4),
                "{label}: {d_sinks:?}"
            );
        }
    }
    // Every path served the call on some backend (the CubeCL kernel where wgpu or CUDA runs; the
    // tensor-core path takes no f32 call: its sinks are checked by the half-precision golden
    // cases with sinks, `golden.rs`).
    for implementation in Implementation::all(3) {
        let wgpu_only = matches!(
            implementation,
            Implementation::CubeKernel | Implementation::CubeTensorCores
        );
        assert!(
            wgpu_only || served.iter().any(|(_, i)| *i == implementation),
            "{implementation:?} served no backend"
        );
    }
}

#[test]
fn a_nan_or_infinite_sink_makes_its_head_nan_on_every_path() {
    // Head 0 NaN, head 1 +∞: every row NaN; heads 2 and 3 as with their own sinks alone.
    let sinks = [f32::NAN, f32::INFINITY, 0.25, -0.5];
    let [b, h, _, n, _, _] = SHAPE;
    for (backend, device) in devices() {
        let clean = with_sinks(Implementation::Naive, &[0.0, 0.0, 0.25, -0.5], &device)
            .expect("naive serves every call");
        for implementation in Implementation::all(3) {
            let Some(got) = with_sinks(implementation, &sinks, &device) else {
                continue;
            };
            let label = format!("{backend} {implementation:?}");
            let d_v = 3;
            for (idx, (g, c)) in got.context.iter().zip(&clean.context).enumerate() {
                // [b, h, n, d_v] row-major
                let head = idx / (n * d_v) % h;
                if head < 2 {
                    assert!(g.is_nan(), "{label}: element {idx} of head {head} is {g}");
                } else {
                    assert!((g - c).abs() < 1e-5, "{label}: element {idx}: {g} vs {c}");
                }
            }
            assert_eq!(got.context.len(), b * h * n * d_v);
            // Poisoned rows are constants: the other heads' gradients are finite.
            assert!(got.grads[0].iter().all(|g| g.is_finite()), "{label}");
        }
    }
}

#[test]
fn quiet_softmax_is_the_zero_sink_without_a_gradient_and_excludes_sinks() {
    for (backend, device) in devices() {
        let [q, k, v] = tensors(&device);
        let zero = with_sinks(Implementation::Naive, &[0.0; 4], &device).expect("naive");
        for implementation in Implementation::all(3) {
            let attn = ScaledDotProductAttentionConfig::new()
                .with_quiet_softmax(true)
                .with_implementation(implementation)
                .init();
            let input = AttentionInput::new(q.clone(), k.clone(), v.clone()).mask(mask(&device));
            let Ok(out) = attn.try_forward(input.clone()) else {
                continue;
            };
            let diff = max_abs_diff(&values(out.context), &zero.context);
            assert!(diff < 1e-5, "{backend} {implementation:?}: {diff}");
            let sinks = Tensor::<1>::zeros([4], &device);
            let e = attn.try_forward(input.sinks(sinks)).unwrap_err();
            assert!(
                matches!(
                    e,
                    AttentionError::InvalidConfig {
                        field: "softmax",
                        ..
                    }
                ),
                "{e:?}"
            );
        }
    }
}

#[test]
fn sinks_of_the_wrong_shape_or_dtype_are_refused_by_name() {
    let device = Device::flex();
    let [q, k, v] = tensors(&device);
    let attn = ScaledDotProductAttentionConfig::new().init();
    let input = AttentionInput::new(q, k, v);
    let e = attn
        .try_forward(input.clone().sinks(Tensor::zeros([2], &device)))
        .unwrap_err();
    assert!(e.to_string().contains("attention sinks"), "{e}");
    assert!(e.to_string().contains("[h] = [4]"), "{e}");
    let f64_sinks = Tensor::<1>::zeros([4], (&device, DType::F64));
    let e = attn.try_forward(input.sinks(f64_sinks)).unwrap_err();
    assert!(
        matches!(
            e,
            AttentionError::DtypeMismatch {
                other: "attention sinks",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn a_layer_with_learned_sinks_trains_them_and_decodes_with_its_cache() {
    for (backend, device) in devices() {
        device.seed(5);
        let training = device.clone().autodiff();
        let mha = MultiHeadSdpaConfig::new(16, 4)
            .with_n_kv_heads(Some(2))
            .with_sinks(true)
            .init(&training);
        let sinks = mha.sinks.as_ref().expect("learned sinks");
        assert_eq!(values(sinks.val()), [0.0; 4], "{backend}: sinks start at 0");
        let x = Tensor::<3>::random(
            [2, 6, 16],
            burn::tensor::Distribution::Normal(0.0, 1.0),
            &training,
        );
        let out = mha.forward(MultiHeadSdpaInput::self_attn(x.clone()).causal());
        let grads = loss(out.context.clone().unsqueeze(), &training).backward();
        let grad = values(sinks.grad(&grads).expect("the sinks' gradient"));
        assert!(grad.iter().all(|g| g.abs() > 1e-6), "{backend}: {grad:?}");
        // Giving the input sinks beside the layer's is refused.
        let e = mha
            .try_forward(
                MultiHeadSdpaInput::self_attn(x.clone()).sinks(Tensor::zeros([4], &training)),
            )
            .unwrap_err();
        assert!(e.to_string().contains("own learned sinks"), "{e}");

        // Decoding token by token with the cache equals the full causal forward.
        let mha = mha.valid();
        let x = x.inner();
        let full = values(
            mha.forward(MultiHeadSdpaInput::self_attn(x.clone()).causal())
                .context,
        );
        let mut cache = KvCache::new();
        let mut steps = Vec::new();
        for t in 0..6 {
            let token = x.clone().slice(s![.., t..t + 1, ..]);
            let out = mha.forward_cache(MultiHeadSdpaInput::self_attn(token).causal(), &mut cache);
            steps.push(out.context);
        }
        let decoded = values(Tensor::cat(steps, 1));
        let diff = max_abs_diff(&decoded, &full);
        assert!(diff < 1e-5, "{backend}: cached decoding differs by {diff}");
    }
}

#[test]
fn sinks_with_causal_windows_and_n_not_m_agree_with_naive_on_every_path() {
    // The Fused path's extra key in front must keep the bottom-right diagonal of the real keys.
    let sinks = [0.5f32, -1.0, 2.0, 0.0];
    for (backend, device) in devices() {
        for (n, m) in [(5, 7), (7, 5)] {
            let device = device.clone().autodiff();
            let make = |seed: u64, shape: [usize; 4]| {
                tensor4(&lcg_values(seed, shape.iter().product()), shape, &device).require_grad()
            };
            let run = |implementation: Implementation| {
                let (q, k, v) = (
                    make(41, [1, 4, n, 8]),
                    make(42, [1, 2, m, 8]),
                    make(43, [1, 2, m, 3]),
                );
                let s = Tensor::<1>::from_data(TensorData::new(sinks.to_vec(), [4]), &device)
                    .require_grad();
                let attn = ScaledDotProductAttentionConfig::new()
                    .with_implementation(implementation)
                    .init();
                let input = AttentionInput::new(q.clone(), k.clone(), v.clone())
                    .causal()
                    .window(2, 0)
                    .sinks(s.clone());
                let out = attn.try_forward(input).ok()?;
                let grads = loss(out.context.clone(), &device).backward();
                Some((
                    values(out.context),
                    values(q.grad(&grads).expect("dQ")),
                    values(s.grad(&grads).expect("d sinks")),
                ))
            };
            let want = run(Implementation::Naive).expect("naive serves every call");
            for implementation in Implementation::all(3) {
                let Some(got) = run(implementation) else {
                    continue;
                };
                let label = format!("{backend} {implementation:?} n {n} m {m}");
                for (name, g, w) in [
                    ("context", &got.0, &want.0),
                    ("dQ", &got.1, &want.1),
                    ("d sinks", &got.2, &want.2),
                ] {
                    let diff = max_abs_diff(g, w);
                    assert!(diff < 2e-5, "{label}: {name} differs by {diff}");
                }
            }
        }
    }
}
