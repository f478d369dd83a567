//! The row statistics of a golden case: what a path returns with `need_row_stats()` against the
//! f64 reference, the entropy, largest weight and visible keys from the case's
//! `expected.weights`, the largest logit, log-sum-exp, logit mean and std from the naive path's
//! scores and mask of the same call (read back and reduced in f64).

use burn::prelude::*;
use burn_sdpa::RowStats;

use super::case::{GoldenCase, GoldenError, TensorCheck};

/// The f64 reference of every statistic, `[b·h·n]` each, in [`RowStats`]' order.
struct Reference {
    max_logit: Vec<f64>,
    lse: Vec<f64>,
    entropy: Vec<f64>,
    max_prob: Vec<f64>,
    visible_keys: Vec<f64>,
    logit_mean: Vec<f64>,
    logit_std: Vec<f64>,
}

/// The reference of `case` from the naive path's `scores` and `mask` `[b, h, n, m]` (true =
/// hidden) and the case's sinks (quiet softmax: a sink of 0 on every head).
fn reference(case: &GoldenCase, scores: &[f64], mask: Option<&[bool]>) -> Reference {
    let [b, h, n, m] = [
        case.query.shape[0],
        case.query.shape[1],
        case.query.shape[2],
        case.key.shape[2],
    ];
    let weights = &case.expected.weights.data;
    let sink = |head: usize| match (&case.sinks, case.quiet_softmax) {
        (Some(sinks), _) => Some(sinks[head]),
        (None, Some(true)) => Some(0.0),
        _ => None,
    };
    let mut r = Reference {
        max_logit: Vec::new(),
        lse: Vec::new(),
        entropy: Vec::new(),
        max_prob: Vec::new(),
        visible_keys: Vec::new(),
        logit_mean: Vec::new(),
        logit_std: Vec::new(),
    };
    for row in 0..b * h * n {
        let head = (row / n) % h;
        let w = &weights[row * m..][..m];
        r.entropy
            .push(w.iter().filter(|&&x| x > 0.0).map(|&x| -x * x.ln()).sum());
        r.max_prob.push(w.iter().cloned().fold(0.0, f64::max));
        r.visible_keys
            .push(w.iter().filter(|&&x| x > 0.0).count() as f64);
        let seen: Vec<f64> = (0..m)
            .filter(|&j| !mask.is_some_and(|mask| mask[row * m + j]))
            .map(|j| scores[row * m + j])
            .collect();
        let top = seen.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let terms = seen.iter().cloned().chain(sink(head));
        let shift = terms.clone().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = terms.map(|s| (s - shift).exp()).sum();
        r.max_logit.push(top);
        r.lse.push(if sum > 0.0 {
            shift + sum.ln()
        } else {
            f64::NEG_INFINITY
        });
        let k = seen.len() as f64;
        let mean = seen.iter().sum::<f64>() / k;
        r.logit_mean.push(mean);
        r.logit_std
            .push((seen.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / k).sqrt());
    }
    r
}

/// The checks of `got` (the path's statistics) against the reference from the naive path's
/// `scores` and `mask`; equal infinities and NaN where the reference is NaN (a row without a
/// key) pass.
pub(super) fn checks(
    path: &str,
    case: &GoldenCase,
    got: RowStats,
    scores: Tensor<4>,
    mask: Option<Tensor<4, Bool>>,
) -> Result<Vec<TensorCheck>, GoldenError> {
    let err = |reason: String| GoldenError {
        path: path.to_string(),
        reason,
        unsupported: false,
    };
    let read = |name: &str, t: Tensor<3>| {
        t.into_data()
            .convert::<f64>()
            .try_into_vec::<f64>()
            .map_err(|e| err(format!("{name}: cannot read the result: {e:?}")))
    };
    let scores = scores
        .into_data()
        .convert::<f64>()
        .try_into_vec::<f64>()
        .map_err(|e| err(format!("scores: cannot read them: {e:?}")))?;
    // Read as floats: backends store bools differently (wgpu as u32).
    let mask = mask
        .map(|mask| {
            mask.float()
                .into_data()
                .convert::<f64>()
                .try_into_vec::<f64>()
                .map(|values| values.into_iter().map(|x| x > 0.5).collect::<Vec<bool>>())
                .map_err(|e| err(format!("mask: cannot read it: {e:?}")))
        })
        .transpose()?;
    let want = reference(case, &scores, mask.as_deref());
    let pairs: [(&'static str, Tensor<3>, Vec<f64>); 7] = [
        ("row_max_logit", got.max_logit, want.max_logit),
        ("row_lse", got.lse, want.lse),
        ("row_entropy", got.entropy, want.entropy),
        ("row_max_prob", got.max_prob, want.max_prob),
        ("row_visible_keys", got.visible_keys, want.visible_keys),
        ("row_logit_mean", got.logit_mean, want.logit_mean),
        ("row_logit_std", got.logit_std, want.logit_std),
    ];
    pairs
        .into_iter()
        .map(|(name, got, want)| {
            let got = read(name, got)?;
            if got.len() != want.len() {
                return Err(err(format!(
                    "{name}: {} rows, the case has {}",
                    got.len(),
                    want.len()
                )));
            }
            let mut check = TensorCheck {
                name,
                max_abs_err: 0.0,
                passed: true,
                non_finite: false,
            };
            for (g, w) in got.iter().zip(&want) {
                if !w.is_finite() {
                    // −∞ (a row without a term) or NaN (the mean and std of a row without a key).
                    let same = (w.is_nan() && g.is_nan()) || g == w;
                    check.passed &= same;
                    check.non_finite |= !same;
                    continue;
                }
                let e = (g - w).abs();
                if !e.is_finite() {
                    check.passed = false;
                    check.non_finite = true;
                    continue;
                }
                check.max_abs_err = check.max_abs_err.max(e);
                check.passed &= e <= case.tolerance.abs + case.tolerance.rel * w.abs();
            }
            Ok(check)
        })
        .collect()
}
