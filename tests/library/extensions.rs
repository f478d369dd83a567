//! Soft-capping, windows, QK-norm and cached decoding on every backend compiled in: each against
//! an explicit construction of the same thing (a hand-built mask, the float64 reference, the full
//! forward pass).

use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::Distribution;
use sdpa::mask::window_mask;
use sdpa::{
    AttentionInput, CausalAlignment, Implementation, KvCache, MultiHeadSdpa, MultiHeadSdpaConfig,
    MultiHeadSdpaInput, QkNorm, ScaledDotProductAttentionConfig, Window,
};

use crate::common::{bool4, devices, implementations, lcg_values, max_abs_diff, tensor4, values};
use crate::reference::{Problem, attention};

/// `[b, h, n, d_k]` query, `[b, h_kv, m, d]` key and value, deterministic.
fn qkv(n: usize, m: usize, seed: u64, device: &Device) -> [Tensor<4>; 3] {
    [
        tensor4(&lcg_values(seed, 2 * 4 * n * 8), [2, 4, n, 8], device),
        tensor4(&lcg_values(seed + 1, 2 * 2 * m * 8), [2, 2, m, 8], device),
        tensor4(&lcg_values(seed + 2, 2 * 2 * m * 3), [2, 2, m, 3], device),
    ]
}

/// (context, gradients of q, k, v when `grads`) of one call; `None` when the path refuses it.
fn run(
    implementation: Implementation,
    alignment: CausalAlignment,
    device: &Device,
    grads: bool,
    build: impl Fn(AttentionInput) -> AttentionInput,
) -> Option<(Vec<f64>, Vec<Vec<f64>>)> {
    let [q, k, v] = qkv(5, 7, 11, device);
    let [q, k, v] = if grads {
        [q.require_grad(), k.require_grad(), v.require_grad()]
    } else {
        [q, k, v]
    };
    let attn = ScaledDotProductAttentionConfig::new()
        .with_causal_alignment(alignment)
        .with_implementation(implementation)
        .init();
    let out = attn
        .try_forward(build(AttentionInput::new(q.clone(), k.clone(), v.clone())))
        .ok()?;
    let context = values(out.context.clone());
    let gradients = if grads {
        let g = out.context.clone().ones_like();
        let weights = Tensor::arange(0..out.context.dims()[3] as i64, device)
            .float()
            .reshape([1, 1, 1, 3]);
        let gr = (out.context * g * weights).sum().backward();
        [q, k, v]
            .iter()
            .map(|t| values(t.grad(&gr).expect("a gradient")))
            .collect()
    } else {
        Vec::new()
    };
    Some((context, gradients))
}

#[test]
fn a_window_equals_the_same_keys_masked_by_hand_on_every_path_and_backend() {
    crate::common::in_child(
        "extensions::child_a_window_equals_the_same_keys_masked_by_hand_on_every_path_and_backend",
        &[],
    );
}

/// The body of [`a_window_equals_the_same_keys_masked_by_hand_on_every_path_and_backend`], run in a child process: its own wgpu device, so that lavapipe
/// compiles its kernels on the second core while this binary's other tests use the first
/// (`common::in_child`).
#[test]
#[ignore = "run by its parent test in a child process"]
fn child_a_window_equals_the_same_keys_masked_by_hand_on_every_path_and_backend() {
    let (n, m) = (5, 7);
    let windows = [
        Window::new(Some(2), Some(0)),
        Window::new(Some(1), Some(1)),
        Window::new(None, Some(1)),
        Window::new(Some(3), None),
        Window::new(Some(0), Some(0)),
    ];
    let mut compared = 0;
    for (backend, device) in devices() {
        let padding = Tensor::<2, Bool>::from_data(
            [[false; 7], [false, false, false, false, false, true, true]],
            &device,
        );
        for alignment in [CausalAlignment::BottomRight, CausalAlignment::TopLeft] {
            for causal in [false, true] {
                for window in windows {
                    let hand = window_mask(n, m, window, alignment, &device).reshape([1, 1, n, m]);
                    let common = |input: AttentionInput| {
                        let input = input.padding_mask(padding.clone());
                        if causal { input.causal() } else { input }
                    };
                    for implementation in implementations(3, &device) {
                        for autodiff in [false, true] {
                            let dev = if autodiff {
                                device.clone().autodiff()
                            } else {
                                device.clone()
                            };
                            let by_window = run(implementation, alignment, &dev, autodiff, |i| {
                                common(i).window(window.left, window.right)
                            });
                            let by_mask = run(implementation, alignment, &dev, autodiff, |i| {
                                common(i).mask(hand.clone())
                            });
                            let what = format!(
                                "{backend} {implementation} {alignment:?} causal={causal} {window:?} autodiff={autodiff}"
                            );
                            match (by_window, by_mask) {
                                (Some((c1, g1)), Some((c2, g2))) => {
                                    let diff = max_abs_diff(&c1, &c2);
                                    assert!(diff < 1e-5, "{what}: context differs by {diff}");
                                    for (a, b) in g1.iter().zip(&g2) {
                                        let diff = max_abs_diff(a, b);
                                        assert!(diff < 1e-5, "{what}: gradient differs by {diff}");
                                    }
                                    assert!(c1.iter().all(|x| x.is_finite()), "{what}");
                                    compared += 1;
                                }
                                (None, None) => {}
                                (a, b) => panic!(
                                    "{what}: served with the window: {}, with the mask: {}",
                                    a.is_some(),
                                    b.is_some()
                                ),
                            }
                        }
                    }
                }
            }
        }
    }
    // Naive, chunked and auto serve everything: at least 3 paths × 2 × 2 × 2 × 5 per backend.
    assert!(compared >= 120, "only {compared} comparisons");
}

#[test]
fn a_window_hides_exactly_its_keys_in_the_weights() {
    for (backend, device) in devices() {
        let [q, k, v] = qkv(4, 6, 3, &device);
        let attn = ScaledDotProductAttentionConfig::new()
            .with_implementation(Implementation::Naive)
            .init();
        // Bottom-right: query i has centre i + 2 and sees keys i + 1 ..= i + 2.
        let out = attn.forward(AttentionInput::new(q, k, v).window(1, 0).need_weights());
        let w = values(out.weights.expect("weights"));
        for (r, row) in w.chunks(6).enumerate() {
            let i = r % 4;
            for (j, &p) in row.iter().enumerate() {
                let inside = (i + 1..=i + 2).contains(&j);
                assert_eq!(p > 0.0, inside, "{backend}: row {r} key {j} weight {p}");
            }
        }
    }
}

#[test]
fn soft_capping_agrees_with_the_f64_reference_on_every_path_and_backend() {
    // Logits of a few tens (unscaled, d_k = 8, inputs of size ~3): the cap matters.
    let (b, h, h_kv, n, m, d_k, d_v) = (2, 4, 2, 5, 7, 8, 3);
    let scaled = |xs: Vec<f64>| xs.into_iter().map(|x| 3.0 * x).collect::<Vec<_>>();
    let mask: Vec<bool> = (0..b * n * m).map(|i| i % 5 == 0).collect();
    let problem = |softcap| Problem {
        b,
        h,
        h_kv,
        n,
        m,
        d_k,
        d_v,
        q: scaled(lcg_values(21, b * h * n * d_k)),
        k: scaled(lcg_values(22, b * h_kv * m * d_k)),
        v: lcg_values(23, b * h_kv * m * d_v),
        mask: Some(([b, 1, n, m], mask.clone())),
        bias: Some(([1, h, n, m], lcg_values(24, h * n * m))),
        causal: Some(CausalAlignment::BottomRight),
        scale: 1.0,
        softcap,
        window: None,
    };
    let capped = problem(Some(5.0));
    let (want, _) = attention(&capped);
    let (uncapped, _) = attention(&problem(None));
    // The cap changes the answer (else this test could not fail).
    assert!(max_abs_diff(&want, &uncapped) > 0.1);
    for (backend, device) in devices() {
        for implementation in implementations(3, &device) {
            let attn = ScaledDotProductAttentionConfig::new()
                .with_scale(sdpa::ScalePolicy::Unscaled)
                .with_softcap(Some(5.0))
                .with_implementation(implementation)
                .init();
            let input = AttentionInput::new(
                tensor4(&capped.q, [b, h, n, d_k], &device),
                tensor4(&capped.k, [b, h_kv, m, d_k], &device),
                tensor4(&capped.v, [b, h_kv, m, d_v], &device),
            )
            .mask(bool4(&mask, [b, 1, n, m], &device))
            .bias(tensor4(
                &capped.bias.as_ref().expect("bias").1,
                [1, h, n, m],
                &device,
            ))
            .causal();
            let got = values(attn.forward(input.clone()).context);
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 1e-4 + 1e-3 * w.abs(),
                    "{backend} {implementation}: {g} vs {w}"
                );
            }
            if implementation == Implementation::Naive {
                // The scores the module reports are the capped ones plus the bias.
                let scores = values(attn.forward(input.need_scores()).scores.expect("scores"));
                let bias = &capped.bias.as_ref().expect("bias").1;
                for (idx, s) in scores.iter().enumerate() {
                    let capped_part = s - bias[idx % (h * n * m)];
                    assert!(capped_part.abs() <= 5.0 + 1e-4, "{backend}: {capped_part}");
                }
            }
        }
    }
}

/// A small causal multi-head layer with grouped-query heads and QK-norm.
fn layer(qk_norm: QkNorm, device: &Device) -> MultiHeadSdpa {
    device.seed(5);
    MultiHeadSdpaConfig::new(32, 4)
        .with_n_kv_heads(Some(2))
        .with_qk_norm(qk_norm)
        .init(device)
}

#[test]
fn cached_decoding_equals_the_full_causal_forward() {
    for (backend, device) in devices() {
        for qk_norm in [QkNorm::None, QkNorm::RmsNorm] {
            let mha = layer(qk_norm, &device);
            let x = Tensor::<3>::random([2, 9, 32], Distribution::Normal(0.0, 1.0), &device);
            let full = values(
                mha.forward(MultiHeadSdpaInput::self_attn(x.clone()).causal())
                    .context,
            );
            let mut cache = KvCache::new();
            // A prompt of 4 tokens at once, then one token at a time.
            let mut decoded = vec![
                mha.forward_cache(
                    MultiHeadSdpaInput::self_attn(x.clone().slice(s![.., 0..4, ..])).causal(),
                    &mut cache,
                )
                .context,
            ];
            for t in 4..9 {
                let token = x.clone().slice(s![.., t..t + 1, ..]);
                decoded.push(
                    mha.forward_cache(MultiHeadSdpaInput::self_attn(token).causal(), &mut cache)
                        .context,
                );
            }
            assert_eq!((cache.len(), cache.cached()), (9, 9), "{backend}");
            let decoded = values(Tensor::cat(decoded, 1));
            let diff = max_abs_diff(&full, &decoded);
            assert!(
                diff < 1e-4,
                "{backend} {qk_norm:?}: cached decoding differs by {diff}"
            );
        }
    }
}

#[test]
fn a_sliding_cache_equals_the_windowed_causal_forward() {
    for (backend, device) in devices() {
        let mha = layer(QkNorm::LayerNorm, &device);
        let x = Tensor::<3>::random([1, 10, 32], Distribution::Normal(0.0, 1.0), &device);
        for window in [1, 3, 20] {
            let full = values(
                mha.forward(
                    MultiHeadSdpaInput::self_attn(x.clone())
                        .causal()
                        .window(window - 1, 0),
                )
                .context,
            );
            let mut cache = KvCache::sliding(window);
            let decoded: Vec<Tensor<3>> = (0..10)
                .map(|t| {
                    let token = x.clone().slice(s![.., t..t + 1, ..]);
                    mha.forward_cache(MultiHeadSdpaInput::self_attn(token).causal(), &mut cache)
                        .context
                })
                .collect();
            assert_eq!(cache.cached(), window.min(10), "{backend}");
            let diff = max_abs_diff(&full, &values(Tensor::cat(decoded, 1)));
            assert!(diff < 1e-4, "{backend} window {window}: differs by {diff}");
        }
        // Without the window the full forward differs (the test can fail).
        let unwindowed = values(
            mha.forward(MultiHeadSdpaInput::self_attn(x.clone()).causal())
                .context,
        );
        let mut cache = KvCache::sliding(2);
        let decoded: Vec<Tensor<3>> = (0..10)
            .map(|t| {
                let token = x.clone().slice(s![.., t..t + 1, ..]);
                mha.forward_cache(MultiHeadSdpaInput::self_attn(token).causal(), &mut cache)
                    .context
            })
            .collect();
        assert!(max_abs_diff(&unwindowed, &values(Tensor::cat(decoded, 1))) > 1e-3);
    }
}

#[test]
fn a_cache_refuses_a_foreign_batch_and_keeps_its_tokens() {
    let device = Device::flex();
    let mha = layer(QkNorm::None, &device);
    let mut cache = KvCache::new();
    let x = Tensor::<3>::zeros([2, 3, 32], &device);
    mha.forward_cache(MultiHeadSdpaInput::self_attn(x).causal(), &mut cache);
    let other = Tensor::<3>::zeros([3, 1, 32], &device);
    let e = mha
        .try_forward_cache(MultiHeadSdpaInput::self_attn(other), &mut cache)
        .unwrap_err();
    assert!(e.to_string().contains("b = 2"), "{e}");
    assert_eq!((cache.len(), cache.cached()), (3, 3));
    // A call that fails after the projection (a mask for 7 keys where there are 3 + 1) leaves
    // the cache as it was too.
    let token = Tensor::<3>::zeros([2, 1, 32], &device);
    let wrong_mask = Tensor::<4, Bool>::full([1, 1, 1, 7], false, &device);
    let e = mha
        .try_forward_cache(
            MultiHeadSdpaInput::self_attn(token).mask(wrong_mask),
            &mut cache,
        )
        .unwrap_err();
    assert!(e.to_string().contains("mask"), "{e}");
    assert_eq!((cache.len(), cache.cached()), (3, 3));
    let e = mha
        .try_forward_cache(
            MultiHeadSdpaInput::self_attn(Tensor::<3>::zeros([2, 1, 32], &device)).window(1, 0),
            &mut KvCache::sliding(4),
        )
        .unwrap_err();
    assert!(e.to_string().contains("sliding-window cache"), "{e}");
}

/// Multiplies the query and key projection weights by `factor`.
fn scale_qk(mha: MultiHeadSdpa, factor: f64) -> MultiHeadSdpa {
    let mut mha = mha;
    for linear in [&mut mha.query, &mut mha.key] {
        let weight = linear.weight.val().mul_scalar(factor);
        linear.weight = Param::from_tensor(weight);
    }
    mha
}

#[test]
fn qk_norm_makes_the_scores_independent_of_the_projections_scale() {
    for (backend, device) in devices() {
        for qk_norm in [QkNorm::LayerNorm, QkNorm::RmsNorm] {
            device.seed(9);
            let config = MultiHeadSdpaConfig::new(32, 4)
                .with_bias(false)
                .with_qk_norm(qk_norm);
            let mha = config.init(&device);
            let x = Tensor::<3>::random([2, 6, 32], Distribution::Normal(0.0, 1.0), &device);
            let scores = |mha: &MultiHeadSdpa| {
                values(
                    mha.forward(MultiHeadSdpaInput::self_attn(x.clone()).need_scores())
                        .scores
                        .expect("scores"),
                )
            };
            let before = scores(&mha);
            let after = scores(&scale_qk(mha, 30.0));
            let diff = max_abs_diff(&before, &after);
            assert!(diff < 1e-3, "{backend} {qk_norm:?}: scores moved by {diff}");
        }
        // Without QK-norm the same change multiplies the scores by 900.
        device.seed(9);
        let plain = MultiHeadSdpaConfig::new(32, 4)
            .with_bias(false)
            .init(&device);
        let x = Tensor::<3>::random([2, 6, 32], Distribution::Normal(0.0, 1.0), &device);
        let s1 = values(
            plain
                .forward(MultiHeadSdpaInput::self_attn(x.clone()).need_scores())
                .scores
                .expect("s"),
        );
        let s2 = values(
            scale_qk(plain, 30.0)
                .forward(MultiHeadSdpaInput::self_attn(x).need_scores())
                .scores
                .expect("s"),
        );
        let ratio = s2[1] / s1[1];
        assert!((ratio - 900.0).abs() < 1.0, "{backend}: ratio {ratio}");
    }
}

#[test]
fn qk_norm_parameters_learn() {
    for (backend, device) in devices() {
        let device = device.autodiff();
        let mha = layer(QkNorm::RmsNorm, &device);
        assert_eq!(
            mha.num_params(),
            layer(QkNorm::None, &device).num_params() + 2 * 8
        );
        let x = Tensor::<3>::random([2, 5, 32], Distribution::Normal(0.0, 1.0), &device);
        let out = mha
            .forward(MultiHeadSdpaInput::self_attn(x).causal())
            .context;
        let grads = out.powf_scalar(2.0).sum().backward();
        for (name, norm) in [("query", &mha.query_norm), ("key", &mha.key_norm)] {
            let Some(sdpa::HeadNorm::RmsNorm(norm)) = norm else {
                panic!("{backend}: no {name} norm");
            };
            let grad = values(norm.gamma.val().grad(&grads).expect("gamma gradient"));
            assert_eq!(grad.len(), 8);
            assert!(
                grad.iter().any(|g| g.abs() > 0.0) && grad.iter().all(|g| g.is_finite()),
                "{backend}: {name} gamma gradient {grad:?}"
            );
        }
    }
}
