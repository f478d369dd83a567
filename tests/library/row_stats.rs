//! Row statistics (issue 35, first step: the paths that materialize the scores) against the
//! weights and scores of the same call, computed on the host in f64.

use burn::prelude::*;
use burn::tensor::TensorData;
use sdpa::{AttentionInput, Implementation, ScaledDotProductAttentionConfig};

use crate::common::{bool4, devices, lcg_values, tensor4, values};

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
            // Auto takes Naive for it; a fused path names what it cannot do.
            let cpu = ScaledDotProductAttentionConfig::new()
                .with_implementation(Implementation::Chunked { block_size: 2 })
                .init();
            let e = cpu.try_forward(input.need_row_stats()).unwrap_err();
            assert!(e.to_string().contains("row statistics"), "{e}");
        }
    }
}
