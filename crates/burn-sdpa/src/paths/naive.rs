//! The naive path: the scores and weights `[b, h, n, m]` are materialized, so it is the path that
//! can return them, and the reference every other path is tested against.

use burn::prelude::*;
use burn::tensor::activation::softmax;

use crate::error::AttentionError;
use crate::input::AttentionOutput;
use crate::mask::most_negative;
use crate::paths::call::Call;

/// Why the naive path cannot serve `call`: it serves every call.
pub(crate) fn blocker(_call: &Call) -> Option<&'static str> {
    None
}

/// softmax(QKᵀ·scale + bias, masked)·V with every intermediate materialized.
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

    let row_stats = call
        .input
        .need_row_stats
        .then(|| crate::RowStats::from_scores(scores.clone(), mask.as_ref(), sinks.clone()));
    // The statistics hold the log-sum-exp: computed once when both are asked for.
    let lse = call.input.need_lse.then(|| match &row_stats {
        Some(stats) => stats.lse.clone(),
        None => row_lse(scores.clone(), mask.as_ref(), sinks.clone()),
    });
    let weights = match (&mask, sinks) {
        (mask, Some(sinks)) => softmax_with_sinks(scores, mask.as_ref(), sinks),
        (Some(mask), None) => {
            let fill = most_negative(scores.dtype());
            // Masked keys get the most negative finite value, so they vanish from the softmax
            // of a row that has a visible key; a row with none becomes uniform and is zeroed
            // right after, which also makes its gradient exactly zero.
            softmax(scores.mask_fill(mask.clone(), fill), 3).mask_fill(mask.clone(), 0.0)
        }
        (None, None) => softmax(scores, 3),
    };
    let dropped = match &call.dropout {
        Some(dropout) => dropout.forward(weights.clone()),
        None => weights.clone(),
    };
    // [b, h, n, m] -> [b, h_kv, g·n, m] @ [b, h_kv, m, d_v] -> [b, h_kv, g·n, d_v]
    let context = dropped
        .reshape([b, h_kv, group * n, m])
        .matmul(call.values(0..m))
        // -> [b, h, n, d_v]
        .reshape([b, h, n, d_v]);

    Ok(AttentionOutput {
        context,
        weights: call.input.need_weights.then_some(weights),
        scores: scores_out,
        mask,
        lse,
        row_stats,
    })
}

/// The softmax of each row over its visible scores and its head's sink, `[b, h, n, m]` (`sinks`
/// `[1, h, 1, 1]`, finite or −∞): `exp(s_ij) / (exp(sink_h) + Σ_j' exp(s_ij'))`, masked keys 0,
/// and a zero row where the denominator has no term (every key masked and a sink of −∞).
fn softmax_with_sinks(
    scores: Tensor<4>,
    mask: Option<&Tensor<4, Bool>>,
    sinks: Tensor<4>,
) -> Tensor<4> {
    let (_, mut p, sink_term) = sink_softmax_terms(scores, mask, sinks);
    if let Some(mask) = mask {
        p = p.mask_fill(mask.clone(), 0.0);
    }
    let sum = p.clone().sum_dim(3) + sink_term;
    let empty = sum.clone().lower_equal_elem(0.0);
    p / sum.mask_fill(empty, 1.0)
}

/// The terms of a softmax with sinks: the row maximum over the visible scores and the sink
/// `[b, h, n, 1]` (detached), `exp(s − max)` `[b, h, n, m]` (masked keys not yet zeroed) and
/// the sink's `exp(sink − max)` `[b, h, n, 1]`.
fn sink_softmax_terms(
    scores: Tensor<4>,
    mask: Option<&Tensor<4, Bool>>,
    sinks: Tensor<4>,
) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
    let [b, h, n, _] = scores.dims();
    let fill = most_negative(scores.dtype());
    let filled = match mask {
        Some(mask) => scores.mask_fill(mask.clone(), fill),
        None => scores,
    };
    // [b, h, n, m] -> [b, h, n, 1], at least the sink (or the most negative value for −∞).
    let max = filled
        .clone()
        .detach()
        .max_dim(3)
        .max_pair(super::sinks::start_max(sinks.clone()).expand([b, h, n, 1]));
    let p = (filled - max.clone()).exp();
    let sink_term = (sinks - max.clone()).exp();
    (max, p, sink_term)
}

/// The log-sum-exp of each row's visible scores (and its head's sink, `sinks` `[1, h, 1, 1]`),
/// `[b, h, n, m] -> [b, h, n]`, −∞ for a row with none (detached: the log-sum-exp is returned as
/// a statistic, without a gradient).
pub(crate) fn row_lse(
    scores: Tensor<4>,
    mask: Option<&Tensor<4, Bool>>,
    sinks: Option<Tensor<4>>,
) -> Tensor<3> {
    let [b, h, n, _] = scores.dims();
    let scores = scores.detach();
    let (max, sum) = match sinks {
        Some(sinks) => {
            let (max, mut p, sink_term) = sink_softmax_terms(scores, mask, sinks.detach());
            if let Some(mask) = mask {
                p = p.mask_fill(mask.clone(), 0.0);
            }
            (max, p.sum_dim(3) + sink_term)
        }
        None => {
            let fill = most_negative(scores.dtype());
            let filled = match mask {
                Some(mask) => scores.mask_fill(mask.clone(), fill),
                None => scores,
            };
            // [b, h, n, m] -> [b, h, n, 1]
            let max = filled.clone().max_dim(3);
            let mut p = (filled - max.clone()).exp();
            if let Some(mask) = mask {
                p = p.mask_fill(mask.clone(), 0.0);
            }
            (max, p.sum_dim(3))
        }
    };
    let empty = sum.clone().lower_equal_elem(0.0);
    // log(0) = −∞ already; the fill keeps it so on every backend.
    (max + sum.log())
        .mask_fill(empty, f64::NEG_INFINITY)
        .reshape([b, h, n])
}
