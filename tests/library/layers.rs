//! The mask helpers, the multi-head layer, dropout, diagnostics, and the module with and
//! without autodiff on every backend.

use burn::module::Module;
use burn::prelude::*;
use burn::tensor::Distribution;
use sdpa::diagnostics::attention_diagnostics;
use sdpa::mask::{
    causal_mask, combine_causal_and_padding, padding_mask_from_lengths, padding_mask_from_tokens,
};
use sdpa::{
    AttentionInput, CausalAlignment, MultiHeadSdpaConfig, MultiHeadSdpaInput, ScalePolicy,
    ScaledDotProductAttentionConfig,
};

use crate::common::{devices, max_abs_diff, tensor4, values};

fn bools(t: Tensor<2, Bool>) -> Vec<bool> {
    t.into_data()
        .convert::<bool>()
        .try_into_vec::<bool>()
        .expect("bool data")
}

#[test]
fn causal_masks_follow_their_alignment() {
    for (backend, device) in devices() {
        // n = 2 queries, m = 4 keys.
        let top_left = bools(causal_mask(2, 4, CausalAlignment::TopLeft, &device));
        assert_eq!(
            top_left,
            [false, true, true, true, false, false, true, true],
            "{backend}"
        );
        let bottom_right = bools(causal_mask(2, 4, CausalAlignment::BottomRight, &device));
        assert_eq!(
            bottom_right,
            [false, false, false, true, false, false, false, false],
            "{backend}"
        );
        // n = m: the same lower-triangular mask (the article's §5.1).
        let a = bools(causal_mask(4, 4, CausalAlignment::TopLeft, &device));
        let b = bools(causal_mask(4, 4, CausalAlignment::BottomRight, &device));
        assert_eq!(a, b);
        assert_eq!(a.iter().filter(|&&x| x).count(), 6);
    }
}

#[test]
fn padding_masks_from_lengths_and_tokens() {
    for (backend, device) in devices() {
        let lengths = Tensor::<1, Int>::from_data([2, 0, 4], &device);
        let pad = bools(padding_mask_from_lengths(lengths, 3));
        assert_eq!(
            pad,
            [false, false, true, true, true, true, false, false, false],
            "{backend}"
        );
        let tokens = Tensor::<2, Int>::from_data([[7, 3, 0], [0, 0, 0]], &device);
        let pad = bools(padding_mask_from_tokens(tokens, 0));
        assert_eq!(pad, [false, false, true, true, true, true], "{backend}");
    }
}

#[test]
fn causal_and_padding_combine_like_the_article() {
    for (backend, device) in devices() {
        let tokens = Tensor::<2, Int>::from_data([[5, 6, 0], [4, 0, 0]], &device);
        let combined = combine_causal_and_padding(
            causal_mask(3, 3, CausalAlignment::TopLeft, &device),
            padding_mask_from_tokens(tokens, 0),
        )
        .expect("shapes fit");
        assert_eq!(combined.dims(), [2, 1, 3, 3]);
        let got: Vec<bool> = combined
            .into_data()
            .convert::<bool>()
            .try_into_vec()
            .expect("bools");
        #[rustfmt::skip]
        let want = [
            false, true, true,   false, false, true,   false, false, true,
            false, true, true,   false, true, true,    false, true, true,
        ];
        assert_eq!(got, want, "{backend}");
        let e = combine_causal_and_padding(
            causal_mask(3, 3, CausalAlignment::TopLeft, &device),
            Tensor::<2, Bool>::empty([2, 4], &device),
        )
        .expect_err("m differs");
        assert!(e.to_string().contains("[2, 4]"), "{e}");
    }
}

#[test]
fn multi_head_attention_with_gqa_padding_and_causal() {
    for (backend, device) in devices() {
        device.seed(3);
        let mha = MultiHeadSdpaConfig::new(32, 4)
            .with_n_kv_heads(Some(2))
            .with_d_k(Some(16))
            .init(&device);
        assert_eq!(mha.key.weight.dims(), [32, 32]);
        assert_eq!(mha.query.weight.dims(), [32, 64]);
        let x = Tensor::<3>::random([2, 5, 32], Distribution::Normal(0.0, 1.0), &device);
        let lengths = Tensor::<1, Int>::from_data([5, 3], &device);
        let out = mha.forward(
            MultiHeadSdpaInput::self_attn(x.clone())
                .padding_mask(padding_mask_from_lengths(lengths, 5))
                .causal()
                .need_weights(),
        );
        assert_eq!(out.context.dims(), [2, 5, 32], "{backend}");
        let w = values(out.weights.expect("weights"));
        assert_eq!(w.len(), 2 * 4 * 5 * 5);
        for (r, row) in w.chunks(5).enumerate() {
            let (bi, i) = (r / 20, r % 5);
            for (j, &p) in row.iter().enumerate() {
                if j > i || (bi == 1 && j >= 3) {
                    assert_eq!(p, 0.0, "{backend}: row {r} key {j} must be hidden");
                }
            }
            assert!(
                (row.iter().sum::<f64>() - 1.0).abs() < 1e-5,
                "{backend}: row {r}"
            );
        }
        // Padded query rows still attend to the visible keys: the sequence of length 3 gives the
        // same first three outputs as the same sequence cut to 3 tokens.
        let short = x.clone().slice(s![1..2, 0..3, ..]);
        let out_short = mha
            .forward(MultiHeadSdpaInput::self_attn(short).causal())
            .context;
        let full = out.context.slice(s![1..2, 0..3, ..]);
        let diff = max_abs_diff(&values(full), &values(out_short));
        assert!(
            diff < 1e-5,
            "{backend}: padding differs from truncation by {diff}"
        );
    }
}

#[test]
fn works_with_and_without_autodiff_on_every_backend() {
    for (backend, device) in devices() {
        for autodiff in [false, true] {
            let dev = if autodiff {
                device.clone().autodiff()
            } else {
                device.clone()
            };
            let q = Tensor::<4>::random([1, 2, 4, 8], Distribution::Normal(0.0, 1.0), &dev);
            let attn = ScaledDotProductAttentionConfig::new().init();
            let out = attn.forward(AttentionInput::new(q.clone(), q.clone(), q).causal());
            assert_eq!(out.context.is_autodiff(), autodiff, "{backend}");
            assert!(
                values(out.context).iter().all(|x| x.is_finite()),
                "{backend}"
            );
        }
    }
}

#[test]
fn dropout_only_in_training_on_autodiff_devices() {
    for (backend, device) in devices() {
        device.seed(5);
        let attn = ScaledDotProductAttentionConfig::new()
            .with_dropout(0.5)
            .init();
        let plain = ScaledDotProductAttentionConfig::new().init();
        let make = |dev: &Device| {
            let q = tensor4(&crate::common::lcg_values(1, 2 * 8 * 8), [1, 2, 8, 8], dev);
            AttentionInput::new(q.clone(), q.clone(), q).need_weights()
        };
        let reference = values(plain.forward(make(&device)).context);
        // Not autodiff: no dropout.
        let inference = values(attn.forward(make(&device)).context);
        assert!(max_abs_diff(&reference, &inference) < 1e-6, "{backend}");
        // Autodiff, training: dropout changes the context, but not the returned weights.
        let ad = device.clone().autodiff();
        let out = attn.forward(make(&ad));
        let training = values(out.context);
        assert!(
            max_abs_diff(&reference, &training) > 1e-3,
            "{backend}: dropout had no effect"
        );
        let w = values(out.weights.expect("weights"));
        let w_ref = values(plain.forward(make(&device)).weights.expect("weights"));
        assert!(
            max_abs_diff(&w, &w_ref) < 1e-6,
            "{backend}: weights are returned before dropout"
        );
        // valid(): no dropout even on an autodiff device.
        let eval = values(attn.valid().forward(make(&ad)).context);
        assert!(max_abs_diff(&reference, &eval) < 1e-6, "{backend}");
    }
}

#[test]
fn huge_unscaled_logits_stay_finite() {
    for (backend, device) in devices() {
        // Logits of 1e4: q·k = 100·100.
        let mut q = vec![0.0; 4];
        q[0] = 100.0;
        let k = vec![100.0, 0.0, 0.0, 0.0, -100.0, 0.0, 0.0, 0.0];
        let attn = ScaledDotProductAttentionConfig::new()
            .with_scale(ScalePolicy::Unscaled)
            .init();
        let out = attn.forward(
            AttentionInput::new(
                tensor4(&q, [1, 1, 1, 4], &device),
                tensor4(&k, [1, 1, 2, 4], &device),
                tensor4(&[1.0, 2.0], [1, 1, 2, 1], &device),
            )
            .need_weights(),
        );
        let w = values(out.weights.expect("weights"));
        assert_eq!(w, [1.0, 0.0], "{backend}");
        assert_eq!(values(out.context), [1.0], "{backend}");
    }
}

#[test]
fn negative_infinite_bias_masks_and_never_gives_nan() {
    for (backend, device) in devices() {
        let q = tensor4(&[1.0, 0.5, -0.5, 1.0], [1, 1, 2, 2], &device);
        let bias = tensor4(
            &[0.0, f64::NEG_INFINITY, f64::NEG_INFINITY, f64::NEG_INFINITY],
            [1, 1, 2, 2],
            &device,
        );
        let attn = ScaledDotProductAttentionConfig::new().init();
        let out = attn.forward(
            AttentionInput::new(q.clone(), q.clone(), q)
                .bias(bias)
                .need_weights(),
        );
        assert_eq!(
            values(out.weights.expect("weights")),
            [1.0, 0.0, 0.0, 0.0],
            "{backend}"
        );
        let ctx = values(out.context);
        assert_eq!(ctx, [1.0, 0.5, 0.0, 0.0], "{backend}");
    }
}

#[test]
fn diagnostics_of_uniform_one_hot_and_masked_rows() {
    for (backend, device) in devices() {
        // Head 0: uniform over 4 keys; head 1: one-hot.
        let mut w = vec![0.25; 8];
        w.extend([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
        let weights = tensor4(&w, [1, 2, 2, 4], &device);
        let scores = tensor4(&[0.0, 1.0, 2.0, 3.0].repeat(4), [1, 2, 2, 4], &device);
        let d = attention_diagnostics(weights, None, Some(scores)).expect("shapes fit");
        let (u, o) = (d.per_head[0], d.per_head[1]);
        let ln4 = 4f64.ln();
        assert!(
            (u.entropy - ln4).abs() < 1e-5 && (u.normalized_entropy - 1.0).abs() < 1e-5,
            "{backend}: {u:?}"
        );
        assert!(
            (u.max_prob - 0.25).abs() < 1e-6 && (u.effective_keys - 4.0).abs() < 1e-4,
            "{backend}: {u:?}"
        );
        assert_eq!(u.saturated_fraction, 0.0);
        assert!(
            o.entropy.abs() < 1e-6
                && (o.max_prob - 1.0).abs() < 1e-6
                && o.saturated_fraction == 1.0,
            "{backend}: {o:?}"
        );
        // std of [0, 1, 2, 3] is sqrt(1.25).
        assert!(
            (u.logit_std.expect("std") - 1.25f64.sqrt()).abs() < 1e-5,
            "{backend}: {u:?}"
        );

        // A fully masked row is left out; a mask shrinks ln(k) for the normalized entropy.
        let w = vec![0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let mask = Tensor::<4, Bool>::from_data(
            burn::tensor::TensorData::new(
                vec![false, false, true, true, true, true, true, true],
                [1, 1, 2, 4],
            ),
            &device,
        );
        let d = attention_diagnostics(tensor4(&w, [1, 1, 2, 4], &device), Some(mask), None)
            .expect("fit");
        let h = d.per_head[0];
        assert!(
            (h.normalized_entropy - 1.0).abs() < 1e-5 && (h.max_prob - 0.5).abs() < 1e-6,
            "{backend}: {h:?}"
        );
        assert!(h.logit_std.is_none());
        assert!((d.mean().entropy - 2f64.ln()).abs() < 1e-5);
    }
}

#[test]
fn diagnostics_from_a_forward_pass_see_the_saturation_of_unscaled_logits() {
    for (backend, device) in devices() {
        device.seed(11);
        let d_k = 256;
        let q = Tensor::<4>::random([1, 1, 64, d_k], Distribution::Normal(0.0, 1.0), &device);
        let k = Tensor::<4>::random([1, 1, 64, d_k], Distribution::Normal(0.0, 1.0), &device);
        let run = |scale| {
            let attn = ScaledDotProductAttentionConfig::new()
                .with_scale(scale)
                .init();
            let out = attn.forward(
                AttentionInput::new(q.clone(), k.clone(), k.clone())
                    .need_weights()
                    .need_scores(),
            );
            attention_diagnostics(out.weights.expect("w"), out.mask, out.scores)
                .expect("fit")
                .mean()
        };
        let scaled = run(ScalePolicy::InvSqrtDk);
        let unscaled = run(ScalePolicy::Unscaled);
        println!("{backend}: scaled {scaled:?}\n{backend}: unscaled {unscaled:?}");
        assert!(
            (scaled.logit_std.expect("std") - 1.0).abs() < 0.15,
            "{backend}"
        );
        assert!(
            (unscaled.logit_std.expect("std") - 16.0).abs() < 2.5,
            "{backend}"
        );
        assert!(
            unscaled.saturated_fraction > 0.2 && scaled.saturated_fraction == 0.0,
            "{backend}"
        );
    }
}

#[test]
fn value_width_and_learned_temperature_of_the_multi_head_layer() {
    for (backend, device) in devices() {
        let device = device.autodiff();
        let x = Tensor::<3>::random([2, 5, 16], Distribution::Normal(0.0, 1.0), &device);
        // d_v independent of d_k: the value and output projections follow d_v.
        device.seed(3);
        let mha = MultiHeadSdpaConfig::new(16, 2)
            .with_d_k(Some(8))
            .with_d_v(Some(3))
            .with_scale(ScalePolicy::Unscaled)
            .with_learned_temperature(Some(2.0))
            .init(&device);
        assert_eq!(mha.value.weight.dims(), [16, 6], "{backend}");
        assert_eq!(mha.output.weight.dims(), [6, 16], "{backend}");
        let out = mha.forward(MultiHeadSdpaInput::self_attn(x.clone()).need_weights());
        assert_eq!(out.context.dims(), [2, 5, 16], "{backend}");
        // A learned temperature starting at 2 on unscaled scores is a fixed scale of 2 at start:
        // the same layer (same parameters) without it, scaled by 2.
        let mut fixed = mha.clone();
        fixed.log_temperature = None;
        fixed.attention.scale = ScalePolicy::Fixed(2.0);
        let reference = fixed.forward(MultiHeadSdpaInput::self_attn(x.clone()).need_weights());
        let diff = max_abs_diff(
            &values(out.weights.clone().expect("weights").without_autodiff()),
            &values(reference.weights.expect("weights").without_autodiff()),
        );
        assert!(diff < 1e-5, "{backend}: {diff}");
        // θ is a parameter: it gets a gradient.
        let grads = out.context.square().sum().backward();
        let theta = mha.log_temperature.as_ref().expect("a learned temperature");
        let g = values(theta.grad(&grads).expect("θ has a gradient"));
        assert!(g[0].is_finite() && g[0] != 0.0, "{backend}: {g:?}");
        assert!(
            MultiHeadSdpaConfig::new(16, 2)
                .with_d_v(Some(0))
                .try_init(&device)
                .is_err()
        );
    }
}
