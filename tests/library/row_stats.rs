//! Row statistics against the weights and scores of the same call, computed on the host in f64;
//! the statistics recorded while training against those of a separate naive pass.

use burn::prelude::*;
use burn::tensor::TensorData;
use sdpa::{AttentionInput, Implementation, ScaledDotProductAttentionConfig};

use crate::common::{bool4, devices, implementations, lcg_values, tensor4, values};

#[test]
fn row_statistics_equal_those_of_the_weights_and_scores_on_every_backend() {
    let (b, h, n, m) = (2, 4, 5, 7);
    for (backend, device) in devices() {
        let q = tensor4(&lcg_values(51, b * h * n * 8), [b, h, n, 8], &device);
        let k = tensor4(&lcg_values(52, b * 2 * m * 8), [b, 2, m, 8], &device);
        let v = tensor4(&lcg_values(53, b * 2 * m * 3), [b, 2, m, 3], &device);
        // Query 1 of batch row 1 sees nothing; scattered hidden keys elsewhere.
        let hidden: Vec<bool> = (0..b * n * m)
            .map(|idx| idx / m == n + 1 || (idx * 7 + 3) % 5 == 0)
            .collect();
        let mask = bool4(&hidden, [b, 1, n, m], &device);
        for sinks in [None, Some([0.5f32, -1.0, 2.0, 0.0])] {
            let mut input = AttentionInput::new(q.clone(), k.clone(), v.clone())
                .mask(mask.clone())
                .causal();
            if let Some(s) = sinks {
                input = input.sinks(Tensor::from_data(TensorData::new(s.to_vec(), [h]), &device));
            }
            let attn = ScaledDotProductAttentionConfig::new().init();
            let out = attn.forward(input.clone().need_row_stats().need_weights().need_scores());
            let stats = out.row_stats.expect("asked for");
            let weights = values(out.weights.expect("weights"));
            let scores = values(out.scores.expect("scores"));
            let combined = values(out.mask.expect("a mask").float());
            let label = format!("{backend}, sinks {sinks:?}");
            let (entropy, max_prob, count) = (
                values(stats.entropy),
                values(stats.max_prob),
                values(stats.visible_keys),
            );
            let (mean, std, max_logit) = (
                values(stats.logit_mean),
                values(stats.logit_std),
                values(stats.max_logit),
            );
            for row in 0..b * h * n {
                let w = &weights[row * m..][..m];
                let s = &scores[row * m..][..m];
                let seen: Vec<usize> = (0..m).filter(|&j| combined[row * m + j] == 0.0).collect();
                assert_eq!(count[row], seen.len() as f64, "{label}: row {row}");
                let h_ref: f64 = w.iter().filter(|&&x| x > 0.0).map(|&x| -x * x.ln()).sum();
                let p_ref = w.iter().cloned().fold(0.0, f64::max);
                assert!(
                    (entropy[row] - h_ref).abs() < 1e-5,
                    "{label}: entropy {row}"
                );
                assert!((max_prob[row] - p_ref).abs() < 1e-6, "{label}: max p {row}");
                if seen.is_empty() {
                    assert!(
                        mean[row].is_nan() && std[row].is_nan(),
                        "{label}: row {row}"
                    );
                    assert_eq!(max_logit[row], f64::NEG_INFINITY, "{label}: row {row}");
                    continue;
                }
                let k = seen.len() as f64;
                let mu: f64 = seen.iter().map(|&j| s[j]).sum::<f64>() / k;
                let sd = (seen.iter().map(|&j| (s[j] - mu).powi(2)).sum::<f64>() / k).sqrt();
                let top = seen.iter().map(|&j| s[j]).fold(f64::NEG_INFINITY, f64::max);
                assert!((mean[row] - mu).abs() < 1e-5, "{label}: mean {row}");
                assert!((std[row] - sd).abs() < 1e-4, "{label}: std {row}");
                assert!(
                    (max_logit[row] - top).abs() < 1e-6,
                    "{label}: max logit {row}"
                );
            }
            // The log-sum-exp statistic is the path's own.
            let lse = values(attn.forward(input.clone().need_lse()).lse.expect("lse"));
            let stat_lse = values(
                attn.forward(input.clone().need_row_stats())
                    .row_stats
                    .expect("asked for")
                    .lse,
            );
            for (a, c) in lse.iter().zip(&stat_lse) {
                assert!(a == c || (a - c).abs() < 1e-5, "{label}: lse {a} vs {c}");
            }
            // Auto keeps its fused path for them (the CPU kernel on flex and ndarray, CubeCL's on
            // wgpu): the statistics are those Naive gives.
            let auto = ScaledDotProductAttentionConfig::new()
                .with_implementation(Implementation::Auto)
                .init();
            let fused = auto
                .forward(input.need_row_stats())
                .row_stats
                .expect("asked for");
            for (name, a, c) in [
                ("entropy", values(fused.entropy), &entropy),
                ("max_prob", values(fused.max_prob), &max_prob),
                ("visible_keys", values(fused.visible_keys), &count),
                ("max_logit", values(fused.max_logit), &max_logit),
                ("logit_std", values(fused.logit_std), &std),
            ] {
                for (x, y) in a.iter().zip(c.iter()) {
                    let same = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() < 1e-4;
                    assert!(same, "{label}: Auto's {name} {x} vs Naive's {y}");
                }
            }
        }
    }
}

#[test]
fn diagnostics_from_row_statistics_equal_those_from_the_weights() {
    let (b, h, n, m) = (2, 3, 6, 9);
    for (backend, device) in devices() {
        let q = tensor4(&lcg_values(61, b * h * n * 4), [b, h, n, 4], &device);
        let k = tensor4(&lcg_values(62, b * h * m * 4), [b, h, m, 4], &device);
        let v = tensor4(&lcg_values(63, b * h * m * 2), [b, h, m, 2], &device);
        // Row 2 of batch row 0 sees no key; row 4 sees one key only.
        let hidden: Vec<bool> = (0..b * n * m)
            .map(|idx| {
                let (row, key) = (idx / m, idx % m);
                row == 2 || (row == 4 && key != 3) || (idx * 5 + 1) % 7 == 0
            })
            .collect();
        let input = AttentionInput::new(q.clone() * 6.0, k, v)
            .mask(bool4(&hidden, [b, 1, n, m], &device))
            .need_row_stats()
            .need_weights()
            .need_scores();
        let out = ScaledDotProductAttentionConfig::new()
            .init()
            .forward(input.clone());
        let from_weights = sdpa::diagnostics::attention_diagnostics(
            out.weights.expect("weights"),
            out.mask,
            out.scores,
        )
        .expect("diagnostics");
        let from_stats =
            sdpa::diagnostics::diagnostics_from_row_stats(&out.row_stats.expect("stats"))
                .expect("diagnostics");
        assert_eq!(from_stats.per_head.len(), h);
        for (head, (a, w)) in from_stats
            .per_head
            .iter()
            .zip(&from_weights.per_head)
            .enumerate()
        {
            for (name, x, y) in [
                ("entropy", a.entropy, w.entropy),
                (
                    "normalized_entropy",
                    a.normalized_entropy,
                    w.normalized_entropy,
                ),
                ("max_prob", a.max_prob, w.max_prob),
                ("effective_keys", a.effective_keys, w.effective_keys),
                (
                    "saturated_fraction",
                    a.saturated_fraction,
                    w.saturated_fraction,
                ),
                (
                    "logit_std",
                    a.logit_std.expect("std"),
                    w.logit_std.expect("std"),
                ),
                (
                    "max_logit",
                    a.max_logit.expect("max"),
                    w.max_logit.expect("max"),
                ),
            ] {
                assert!(
                    (x - y).abs() < 1e-5 * y.abs().max(1.0),
                    "{backend} head {head}: {name} {x} vs {y}"
                );
            }
        }
        // Some rows are saturated at this temperature, so the share is not trivially 0.
        assert!(from_stats.mean().saturated_fraction > 0.0, "{backend}");
    }
}

#[test]
fn asking_for_row_statistics_leaves_every_gradient_unchanged() {
    let (b, h, n, m) = (2, 4, 5, 7);
    for (backend, device) in devices() {
        let device = device.autodiff();
        for implementation in implementations(3, &device) {
            let grads = |stats: bool| -> Option<Vec<f64>> {
                let q =
                    tensor4(&lcg_values(71, b * h * n * 8), [b, h, n, 8], &device).require_grad();
                let k =
                    tensor4(&lcg_values(72, b * 2 * m * 8), [b, 2, m, 8], &device).require_grad();
                let v =
                    tensor4(&lcg_values(73, b * 2 * m * 3), [b, 2, m, 3], &device).require_grad();
                let sinks = Tensor::<1>::from_data(
                    TensorData::new(vec![0.3f32, -1.0, 0.0, 1.5], [h]),
                    &device,
                )
                .require_grad();
                let mut input = AttentionInput::new(q.clone(), k.clone(), v.clone())
                    .causal()
                    .sinks(sinks.clone());
                if stats {
                    input = input.need_row_stats();
                }
                let out = ScaledDotProductAttentionConfig::new()
                    .with_implementation(implementation)
                    .init()
                    .try_forward(input)
                    .ok()?;
                assert_eq!(out.row_stats.is_some(), stats);
                let g = tensor4(&lcg_values(74, b * h * n * 3), [b, h, n, 3], &device);
                let grads = (out.context * g).sum().backward();
                let mut all = Vec::new();
                for t in [&q, &k, &v] {
                    all.extend(values(t.grad(&grads).expect("a gradient")));
                }
                all.extend(values(
                    sinks
                        .grad(&grads)
                        .expect("a gradient")
                        .reshape([1, 1, 1, h]),
                ));
                Some(all)
            };
            let Some(without) = grads(false) else {
                // A path that cannot train this call (sinks under autodiff) says so and is
                // skipped; the tensor-op paths and Auto always serve it.
                assert!(
                    !matches!(
                        implementation,
                        Implementation::Naive
                            | Implementation::Chunked { .. }
                            | Implementation::Auto
                    ),
                    "{backend} {implementation:?} refused"
                );
                continue;
            };
            let with = grads(true).expect("a path that serves the call serves its statistics");
            for (x, y) in with.iter().zip(&without) {
                assert!(
                    (x - y).abs() <= 1e-6,
                    "{backend} {implementation:?}: {x} vs {y}"
                );
            }
        }
    }
}

#[test]
fn the_cpu_kernel_rescales_its_statistics_across_key_tiles() {
    // 700 keys span several of the kernel's key tiles (256 or 512 wide), and the keys grow along
    // the sequence, so a later tile holds a larger max and the accumulators must move to it.
    let (b, h, n, m, d) = (1, 2, 24, 700, 8);
    for (backend, device) in devices() {
        let q = tensor4(&lcg_values(81, b * h * n * d), [b, h, n, d], &device);
        let growth: Vec<f64> = lcg_values(82, b * h * m * d)
            .iter()
            .enumerate()
            .map(|(idx, x)| x * (1.0 + 3.0 * ((idx / d) % m) as f64 / m as f64))
            .collect();
        let k = tensor4(&growth, [b, h, m, d], &device);
        let v = tensor4(&lcg_values(83, b * h * m * 4), [b, h, m, 4], &device);
        // Rows 0..8 see only the first 300 keys; the others every key.
        let hidden: Vec<bool> = (0..n * m)
            .map(|idx| idx / m < 8 && idx % m >= 300)
            .collect();
        for sinks in [None, Some([0.5f32, 30.0])] {
            let mut input = AttentionInput::new(q.clone() * 3.0, k.clone(), v.clone())
                .mask(bool4(&hidden, [1, 1, n, m], &device))
                .need_row_stats();
            if let Some(s) = sinks {
                input = input.sinks(Tensor::from_data(TensorData::new(s.to_vec(), [h]), &device));
            }
            let stats = |implementation| {
                let out = ScaledDotProductAttentionConfig::new()
                    .with_implementation(implementation)
                    .init()
                    .forward(input.clone());
                let s = out.row_stats.expect("asked for");
                [
                    values(s.max_logit),
                    values(s.lse),
                    values(s.entropy),
                    values(s.max_prob),
                    values(s.visible_keys),
                    values(s.logit_mean),
                    values(s.logit_std),
                ]
            };
            let (kernel, naive) = (
                stats(Implementation::CpuKernel),
                stats(Implementation::Naive),
            );
            for (idx, (got, want)) in kernel.iter().zip(&naive).enumerate() {
                for (row, (g, w)) in got.iter().zip(want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                        "{backend}, sinks {sinks:?}: statistic {idx} of row {row}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_cpu_kernel_band_tiles_give_naive_statistics_and_the_same_output() {
    // Causal and windowed calls without a mask: the kernel's band tiles (each row's visible run
    // widened to whole vectors) with runs of every length and offset, n != m (bottom-right
    // alignment), 513 keys over two tiles and a part. Statistics against Naive's (1e-4
    // relative, fixed before the run); output and log-sum-exp bit for bit the same with and
    // without statistics (they do not change the softmax).
    let (b, h, n, m, d) = (1, 2, 130, 513, 16);
    for (backend, device) in crate::common::cpu_devices() {
        let q = tensor4(&lcg_values(91, b * h * n * d), [b, h, n, d], &device) * 2.0;
        let k = tensor4(&lcg_values(92, b * h * m * d), [b, h, m, d], &device);
        let v = tensor4(&lcg_values(93, b * h * m * 4), [b, h, m, 4], &device);
        for (causal, window) in [(true, None), (true, Some((37, 0))), (false, Some((40, 70)))] {
            let mut input = AttentionInput::new(q.clone(), k.clone(), v.clone());
            if causal {
                input = input.causal();
            }
            if let Some((left, right)) = window {
                input = input.window(left, right);
            }
            let run = |implementation, stats: bool| {
                let attention = ScaledDotProductAttentionConfig::new()
                    .with_implementation(implementation)
                    .init();
                let input = input.clone().need_lse();
                attention.forward(if stats { input.need_row_stats() } else { input })
            };
            let label = format!("{backend}, causal {causal}, window {window:?}");
            let (with, without) = (
                run(Implementation::CpuKernel, true),
                run(Implementation::CpuKernel, false),
            );
            let bits = |t: Tensor<4>| -> Vec<u32> {
                t.into_data()
                    .convert::<f32>()
                    .iter::<f32>()
                    .map(f32::to_bits)
                    .collect()
            };
            assert_eq!(
                bits(with.context.clone()),
                bits(without.context),
                "{label}: output"
            );
            let lse = |t: Tensor<3>| bits(t.unsqueeze::<4>());
            assert_eq!(
                lse(with.lse.clone().expect("lse")),
                lse(without.lse.expect("lse")),
                "{label}: log-sum-exp"
            );
            let naive = run(Implementation::Naive, true)
                .row_stats
                .expect("asked for");
            let kernel = with.row_stats.expect("asked for");
            for (name, got, want) in [
                ("max_logit", kernel.max_logit, naive.max_logit),
                ("entropy", kernel.entropy, naive.entropy),
                ("max_prob", kernel.max_prob, naive.max_prob),
                ("visible_keys", kernel.visible_keys, naive.visible_keys),
                ("logit_mean", kernel.logit_mean, naive.logit_mean),
                ("logit_std", kernel.logit_std, naive.logit_std),
            ] {
                for (row, (g, w)) in values(got).iter().zip(values(want)).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                        "{label}: {name} of row {row}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn poisoned_rows_keep_only_their_key_count_in_the_cpu_kernels_statistics() {
    // A NaN in query 2 of head 0 poisons that row: NaN in every statistic but the visible
    // keys, which the causal mask alone decides; the other rows are untouched.
    let (b, h, n, m, d) = (1, 2, 6, 6, 4);
    for (backend, device) in crate::common::cpu_devices() {
        let mut qs = lcg_values(95, b * h * n * d);
        qs[2 * d] = f64::NAN; // head 0, query 2
        let q = tensor4(&qs, [b, h, n, d], &device);
        let k = tensor4(&lcg_values(96, b * h * m * d), [b, h, m, d], &device);
        let v = tensor4(&lcg_values(97, b * h * m * d), [b, h, m, d], &device);
        let out = ScaledDotProductAttentionConfig::new()
            .with_implementation(Implementation::CpuKernel)
            .init()
            .forward(AttentionInput::new(q, k, v).causal().need_row_stats());
        let stats = out.row_stats.expect("asked for");
        let keys = values(stats.visible_keys);
        for (name, column) in [
            ("entropy", values(stats.entropy)),
            ("max_logit", values(stats.max_logit)),
            ("logit_std", values(stats.logit_std)),
        ] {
            assert_eq!(column.len(), h * n);
            for (row, x) in column.iter().enumerate() {
                let poisoned = row == 2;
                assert_eq!(x.is_nan(), poisoned, "{backend}: {name} of row {row}");
            }
        }
        for (row, count) in keys.iter().enumerate() {
            assert_eq!(*count, (row % n + 1) as f64, "{backend}: keys of row {row}");
        }
    }
}
