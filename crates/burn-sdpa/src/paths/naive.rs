//! The naive path: the scores and weights `[b, h, n, m]` are materialized, so it is the path that
//! can return them, and the reference every other path is tested against.

use burn::prelude::*;

use crate::error::AttentionError;
use crate::input::AttentionOutput;
use crate::mask::most_negative;
use crate::paths::call::Call;
use crate::paths::overflow;

/// Why the naive path cannot serve `call`: it serves every call.
pub(crate) fn blocker(_call: &Call) -> Option<&'static str> {
    None
}

/// softmax(QKᵀ·scale + bias, masked)·V with every intermediate materialized; scores that
/// overflow follow the rule of [`overflow`].
///
/// # Shapes
/// - query `[b, h, n, d_k]`, key `[b, h_kv, m, d_k]`, value `[b, h_kv, m, d_v]`
/// - context `[b, h, n, d_v]`; weights, scores and mask `[b, h, n, m]`
pub(crate) fn run(call: Call) -> Result<AttentionOutput, AttentionError> {
    let [b, h, n, m] = call.dims.scores_shape();
    let (h_kv, d_v) = (call.dims.n_kv_heads, call.dims.d_v);
    let group = call.dims.group();
    let query = call.grouped_query();
    let (scores, mask) = call.scores(&query, 0..m);
    let scores_out = call.input.need_scores.then(|| scores.clone());
    let sinks = call
        .input
        .sinks
        .as_ref()
        .map(|sinks| super::sinks::per_head(sinks, &call.dims).cast(scores.dtype()));
    // [b, h, n, 1]: rows that see a key, and (for the statistics) rows with a visible +∞ score.
    let rows_asked = call.input.need_lse || call.input.need_row_stats;
    let (seen, above) = overflow::seen_and_above(&scores, mask.as_ref(), rows_asked);

    let row_stats = call
        .input
        .need_row_stats
        .then(|| crate::RowStats::from_scores(scores.clone(), mask.as_ref(), sinks.clone()));
    let (max, p, sum) = softmax_terms(overflow::cap_positive(scores), mask.as_ref(), sinks);
    // A row without a term (no visible key, or every visible score −∞, and no finite sink) is
    // divided by 1: its weights are 0, and so is its gradient.
    let empty = sum.clone().lower_equal_elem(0.0);
    // [b, h, n, 1]: a row that sees a key but has no term has no limit (issue 51, item 6).
    let no_limit = seen.bool_and(empty.clone());
    let weights = p / sum.clone().mask_fill(empty.clone(), 1.0);
    // The statistics of an overflowed row are NaN (see `overflow`).
    let overflowed = above.map(|above| above.bool_or(no_limit.clone()).reshape([b, h, n]));
    // The statistics hold the log-sum-exp: computed once when both are asked for.
    let lse = call.input.need_lse.then(|| match &row_stats {
        Some(stats) => stats.lse.clone(),
        None => lse_of(max, sum, empty).reshape([b, h, n]),
    });
    let dropped = match &call.dropout {
        Some(dropout) => dropout.forward(weights.clone()),
        None => weights.clone(),
    };
    // [b, h, n, m] -> [b, h_kv, g·n, m] @ [b, h_kv, m, d_v] -> [b, h_kv, g·n, d_v]
    let context = dropped
        .reshape([b, h_kv, group * n, m])
        .matmul(call.values(0..m))
        // -> [b, h, n, d_v]
        .reshape([b, h, n, d_v])
        .mask_fill(no_limit.clone().expand([b, h, n, d_v]), f64::NAN);

    Ok(AttentionOutput {
        context,
        weights: call
            .input
            .need_weights
            .then(|| weights.mask_fill(no_limit.expand([b, h, n, m]), f64::NAN)),
        scores: scores_out,
        mask,
        lse: lse.map(|lse| match &overflowed {
            Some(rows) => lse.mask_fill(rows.clone(), f64::NAN),
            None => lse,
        }),
        row_stats: row_stats.map(|stats| match overflowed {
            Some(rows) => stats.poisoned(rows),
            None => stats,
        }),
    })
}

/// The terms of the softmax of each row over its visible scores and its head's sink: the row
/// maximum `[b, h, n, 1]` (detached; at least the sink, and at least the most negative finite
/// value, so that a row whose visible scores are all −∞ gets terms exp(−∞ − fill) = 0, never
/// −∞ − (−∞)), `exp(s − max)` `[b, h, n, m]` with masked keys 0, and the row's sum with the
/// sink's term `[b, h, n, 1]` (0 where the row has no term).
///
/// `scores` `[b, h, n, m]` hold no +∞ ([`overflow::cap_positive`]); `sinks` are `[1, h, 1, 1]`,
/// finite or −∞.
fn softmax_terms(
    scores: Tensor<4>,
    mask: Option<&Tensor<4, Bool>>,
    sinks: Option<Tensor<4>>,
) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
    let [b, h, n, _] = scores.dims();
    let fill = most_negative(scores.dtype());
    let filled = match mask {
        Some(mask) => scores.mask_fill(mask.clone(), fill),
        None => scores,
    };
    // [b, h, n, m] -> [b, h, n, 1]
    let mut max = filled.clone().detach().max_dim(3).clamp_min(fill);
    if let Some(sinks) = &sinks {
        max = max.max_pair(super::sinks::start_max(sinks.clone()).expand([b, h, n, 1]));
    }
    let mut p = (filled - max.clone()).exp();
    if let Some(mask) = mask {
        // A row whose keys are all masked has max = fill and exp(fill − fill) = 1.
        p = p.mask_fill(mask.clone(), 0.0);
    }
    let mut sum = p.clone().sum_dim(3);
    if let Some(sinks) = sinks {
        sum = sum + (sinks - max.clone()).exp();
    }
    (max, p, sum)
}

/// The log-sum-exp `max + ln(sum)` of [`softmax_terms`]' rows `[b, h, n, 1]`, −∞ where `empty`
/// (detached).
fn lse_of(max: Tensor<4>, sum: Tensor<4>, empty: Tensor<4, Bool>) -> Tensor<4> {
    // log(0) = −∞ already; the fill keeps it so on every backend.
    (max.detach() + sum.detach().log()).mask_fill(empty, f64::NEG_INFINITY)
}

/// The log-sum-exp of each row's visible scores (and its head's sink, `sinks` `[1, h, 1, 1]`),
/// `[b, h, n, m] -> [b, h, n]`, −∞ for a row with none (detached: the log-sum-exp is returned as
/// a statistic, without a gradient). A +∞ score counts as the dtype's largest finite value.
pub(crate) fn row_lse(
    scores: Tensor<4>,
    mask: Option<&Tensor<4, Bool>>,
    sinks: Option<Tensor<4>>,
) -> Tensor<3> {
    let [b, h, n, _] = scores.dims();
    let scores = overflow::cap_positive(scores.detach());
    let (max, _, sum) = softmax_terms(scores, mask, sinks.map(Tensor::detach));
    let empty = sum.clone().lower_equal_elem(0.0);
    lse_of(max, sum, empty).reshape([b, h, n])
}
