//! Packed sequences, ALiBi and the log-sum-exp (issue 21): every path against the naive one and
//! against a host reference; a packed batch equals its documents run one by one; two halves of
//! the keys merged by their log-sum-exp equal all keys (ring attention's building block).

use burn::prelude::*;
use burn::tensor::Distribution;
use sdpa::lse::merge_partial;
use sdpa::mask::{alibi_slopes, segment_ids_from_lengths};
use sdpa::{AttentionInput, Implementation, ScaledDotProductAttentionConfig};

use crate::common::{devices, implementations, max_abs_diff, values};

fn random(shape: [usize; 4], device: &Device) -> Tensor<4> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
}

fn attn(implementation: Implementation) -> sdpa::ScaledDotProductAttention {
    ScaledDotProductAttentionConfig::new()
        .with_implementation(implementation)
        .init()
}

#[test]
fn the_log_sum_exp_of_every_path_is_that_of_the_scores() {
    for (backend, device) in devices() {
        let (q, k, v) = (
            random([2, 4, 5, 8], &device),
            random([2, 2, 7, 8], &device),
            random([2, 2, 7, 8], &device),
        );
        // Batch row 1 hides every key from query 0 (a fully masked row).
        let mut mask = vec![false; 2 * 5 * 7];
        mask[5 * 7..5 * 7 + 7].fill(true);
        let mask = Tensor::<4, Bool>::from_data(TensorData::new(mask, [2, 1, 5, 7]), &device);
        let input = AttentionInput::new(q, k, v)
            .causal()
            .mask(mask.clone())
            .need_lse();
        // The reference: log Σ exp over the visible naive scores, on the host in f64.
        let naive = attn(Implementation::Naive)
            .forward(input.clone().need_scores())
            .clone();
        let scores = values(naive.scores.expect("scores"));
        let hidden: Vec<bool> =
            sdpa::util::read_back("mask", naive.mask.expect("mask").expand([2, 4, 5, 7])).unwrap();
        let want: Vec<f64> = scores
            .chunks(7)
            .zip(hidden.chunks(7))
            .map(|(row, hidden)| {
                let visible: Vec<f64> = row
                    .iter()
                    .zip(hidden)
                    .filter(|(_, h)| !**h)
                    .map(|(s, _)| *s)
                    .collect();
                let max = visible.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if visible.is_empty() {
                    f64::NEG_INFINITY
                } else {
                    max + visible.iter().map(|s| (s - max).exp()).sum::<f64>().ln()
                }
            })
            .collect();
        assert!(want.contains(&f64::NEG_INFINITY));
        for path in implementations(3, &device) {
            let got = values(attn(path).forward(input.clone()).lse.expect("lse"));
            for (g, w) in got.iter().zip(&want) {
                if w.is_infinite() {
                    assert_eq!(
                        *g,
                        f64::NEG_INFINITY,
                        "{backend} {path}: a fully masked row"
                    );
                } else {
                    assert!((g - w).abs() < 1e-4, "{backend} {path}: {g} vs {w}");
                }
            }
        }
    }
}

#[test]
fn two_halves_merged_by_their_log_sum_exp_equal_all_keys() {
    for (backend, device) in devices() {
        let (q, k, v) = (
            random([1, 2, 6, 8], &device),
            random([1, 2, 10, 8], &device),
            random([1, 2, 10, 8], &device),
        );
        let whole = values(
            attn(Implementation::Naive)
                .forward(AttentionInput::new(q.clone(), k.clone(), v.clone()))
                .context,
        );
        for path in implementations(3, &device) {
            let part = |keys: std::ops::Range<usize>| {
                let input = AttentionInput::new(
                    q.clone(),
                    k.clone().slice(s![.., .., keys.clone(), ..]),
                    v.clone().slice(s![.., .., keys, ..]),
                )
                .need_lse();
                let out = attn(path).forward(input);
                (out.context, out.lse.expect("lse"))
            };
            let (merged, _) = merge_partial(part(0..4), part(4..10));
            let err = max_abs_diff(&values(merged), &whole);
            assert!(err < 1e-5, "{backend} {path}: {err}");
        }
    }
}

#[test]
fn a_packed_batch_equals_its_documents_one_by_one() {
    let lengths = [3usize, 5, 4];
    let total: usize = lengths.iter().sum();
    for (backend, device) in devices() {
        let device = device.autodiff();
        let (q, k, v) = (
            random([1, 2, total, 8], &device).require_grad(),
            random([1, 2, total, 8], &device).require_grad(),
            random([1, 2, total, 8], &device).require_grad(),
        );
        let ids = segment_ids_from_lengths(&[lengths.to_vec()], total, &device).unwrap();
        let slopes = Tensor::<1>::from_data(
            TensorData::new(
                alibi_slopes(2)
                    .iter()
                    .map(|&x| x as f32)
                    .collect::<Vec<_>>(),
                [2],
            ),
            &device,
        );
        for alibi in [false, true] {
            // One by one: each document alone, causal.
            let mut alone = Vec::new();
            let mut start = 0;
            for len in lengths {
                let part = |t: &Tensor<4>| t.clone().slice(s![.., .., start..start + len, ..]);
                let mut input = AttentionInput::new(part(&q), part(&k), part(&v)).causal();
                if alibi {
                    input = input.alibi(slopes.clone());
                }
                alone.push(attn(Implementation::Naive).forward(input).context);
                start += len;
            }
            let want = Tensor::cat(alone, 2);
            let want_grads = want.clone().sum().backward();
            let grad =
                |t: &Tensor<4>, g: &burn::tensor::Gradients| values(t.grad(g).expect("grad"));
            let want_dq = grad(&q, &want_grads);
            let want_dk = grad(&k, &want_grads);
            for path in implementations(3, &device) {
                let mut input = AttentionInput::new(q.clone(), k.clone(), v.clone())
                    .causal()
                    .segments(ids.clone(), ids.clone());
                if alibi {
                    input = input.alibi(slopes.clone());
                }
                // The CPU kernel has no backward pass on the GPU backends: a path that cannot serve a
                // training call says so, and is skipped here.
                let got = match attn(path).try_forward(input) {
                    Ok(out) => out.context,
                    Err(sdpa::AttentionError::Unsupported { .. })
                        if matches!(backend, sdpa::BackendKind::Wgpu | sdpa::BackendKind::Cuda) =>
                    {
                        continue;
                    }
                    Err(e) => panic!("{backend} {path}: {e}"),
                };
                let err = max_abs_diff(&values(got.clone()), &values(want.clone()));
                assert!(err < 1e-5, "{backend} {path} alibi {alibi}: {err}");
                let grads = got.sum().backward();
                let err_q = max_abs_diff(&grad(&q, &grads), &want_dq);
                let err_k = max_abs_diff(&grad(&k, &grads), &want_dk);
                assert!(
                    err_q < 1e-4 && err_k < 1e-4,
                    "{backend} {path} alibi {alibi}: gradients {err_q} {err_k}"
                );
            }
        }
    }
}

#[test]
fn alibi_slopes_are_the_reference_ones() {
    assert_eq!(alibi_slopes(1), [2f64.powi(-8)]);
    assert_eq!(
        alibi_slopes(8),
        (1..=8).map(|i| 2f64.powi(-i)).collect::<Vec<_>>()
    );
    // Not a power of two: those of 4, then every other one of 8's.
    assert_eq!(
        alibi_slopes(6),
        [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]
    );
    let device = Device::flex();
    assert!(segment_ids_from_lengths(&[vec![4, 3]], 6, &device).is_err());
}
