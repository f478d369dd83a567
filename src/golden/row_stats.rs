//! The row statistics of a golden case: what a path returns with `need_row_stats()` against the
//! f64 reference, the entropy, largest weight and visible keys from the case's
//! `expected.weights`, the largest logit, log-sum-exp, logit mean and std from the naive path's
//! scores of the same call (read back and reduced in f64), over the keys the case leaves
//! visible ([`hidden`]: read from the case itself, never from its weights, where a visible key's
//! weight may underflow to 0).

use burn::prelude::*;
use burn_sdpa::RowStats;

use super::case::{Causal, GoldenCase, GoldenError, TensorCheck};

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

/// A shape of rank 1 to 4 (the case was validated) left-padded with 1s to rank 4.
fn padded(shape: &[usize]) -> [usize; 4] {
    let mut out = [1; 4];
    let rank = shape.len().min(4);
    out[4 - rank..].copy_from_slice(&shape[shape.len() - rank..]);
    out
}

/// The index of `idx` `[b, h, n, m]` in a row-major tensor of `shape` (left-padded to rank 4)
/// that broadcasts to it: an axis of size 1 is read at 0.
fn broadcast_index(shape: &[usize], idx: [usize; 4]) -> usize {
    idx.iter()
        .zip(padded(shape))
        .fold(0, |acc, (&i, d)| acc * d + if d == 1 { 0 } else { i })
}

/// Whether key `j` is hidden from query `i` of batch row `b`, query head `h` (of `n` queries and
/// `m` keys) by what the case hides: its mask (true = hidden), a bias entry that is −∞ in the f32
/// the runner passes, the causal band, the window (centred on `i + (m − n)`) and the segments
/// (the format's contract, `shared/golden/README.md`). A key that none of them hides is visible,
/// whatever its weight: a weight that underflows to 0 (scores hundreds apart) is still a visible
/// key's.
fn hidden(case: &GoldenCase, [b, h, i, j]: [usize; 4], n: usize, m: usize) -> bool {
    let idx = [b, h, i, j];
    let masked = case
        .mask
        .as_ref()
        .is_some_and(|mask| mask.data[broadcast_index(&mask.shape, idx)]);
    let biased_out = case.bias.as_ref().is_some_and(|bias| {
        bias.data[broadcast_index(&bias.shape, idx)] as f32 == f32::NEG_INFINITY
    });
    let segments = case
        .segments
        .as_ref()
        .is_some_and(|seg| seg.query[b][i] != seg.key[b][j]);
    // Signed positions: the diagonal `c` may lie before the first key.
    let (row, key) = (i as i128, j as i128);
    let diagonal = row + m as i128 - n as i128;
    let causal = match case.causal {
        Causal::None => false,
        Causal::TopLeft => key > row,
        Causal::BottomRight => key > diagonal,
    };
    let window = case.window.is_some_and(|[left, right]| {
        left.is_some_and(|left| key < diagonal - left as i128)
            || right.is_some_and(|right| key > diagonal + right as i128)
    });
    masked || biased_out || segments || causal || window
}

/// The reference of `case` from the naive path's `scores` `[b, h, n, m]`, the keys the case
/// leaves visible and the case's sinks (quiet softmax: a sink of 0 on every head).
///
/// A row whose scores overflowed f32 (the contract of `tests/data/golden-overflow/README.md`):
/// one with a visible score of +∞, or one that sees keys whose scores are all −∞ and has no
/// finite sink, has NaN in every statistic but its visible keys.
fn reference(case: &GoldenCase, scores: &[f64]) -> Reference {
    // [b, h_q, n, m], validated against the inputs.
    let [b, h, n, m] = padded(&case.expected.weights.shape);
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
        let visible: Vec<usize> = (0..m)
            .filter(|&j| !hidden(case, [row / (h * n), head, row % n, j], n, m))
            .collect();
        r.visible_keys.push(visible.len() as f64);
        let seen: Vec<f64> = visible.iter().map(|&j| scores[row * m + j]).collect();
        let finite_sink = sink(head).is_some_and(|s| (s as f32).is_finite());
        let overflowed = seen.contains(&f64::INFINITY)
            || (!seen.is_empty() && !finite_sink && seen.iter().all(|&s| s == f64::NEG_INFINITY));
        if overflowed {
            for stat in [
                &mut r.max_logit,
                &mut r.lse,
                &mut r.entropy,
                &mut r.max_prob,
                &mut r.logit_mean,
                &mut r.logit_std,
            ] {
                stat.push(f64::NAN);
            }
            continue;
        }
        r.entropy
            .push(w.iter().filter(|&&x| x > 0.0).map(|&x| -x * x.ln()).sum());
        r.max_prob.push(w.iter().cloned().fold(0.0, f64::max));
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
/// `scores` and the keys the case leaves visible; equal infinities and NaN where the reference is
/// NaN (a row without a key, or one whose scores overflowed) pass.
pub(super) fn checks(
    path: &str,
    case: &GoldenCase,
    got: RowStats,
    scores: Tensor<4>,
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
    let want = reference(case, &scores);
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
                cannot_fail: false,
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
