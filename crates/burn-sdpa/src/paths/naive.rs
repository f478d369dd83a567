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
    let lse = call
        .input
        .need_lse
        .then(|| row_lse(scores.clone(), mask.as_ref()));

    let weights = match &mask {
        Some(mask) => {
            let fill = most_negative(scores.dtype());
            // Masked keys get the most negative finite value, so they vanish from the softmax
            // of a row that has a visible key; a row with none becomes uniform and is zeroed
            // right after, which also makes its gradient exactly zero.
            softmax(scores.mask_fill(mask.clone(), fill), 3).mask_fill(mask.clone(), 0.0)
        }
        None => softmax(scores, 3),
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
    })
}

/// The log-sum-exp of each row's visible scores, `[b, h, n, m] -> [b, h, n]`, −∞ for a row with
/// none (detached: the log-sum-exp is returned as a statistic, without a gradient).
pub(crate) fn row_lse(scores: Tensor<4>, mask: Option<&Tensor<4, Bool>>) -> Tensor<3> {
    let [b, h, n, _] = scores.dims();
    let scores = scores.detach();
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
    let sum = p.sum_dim(3);
    let empty = sum.clone().lower_equal_elem(0.0);
    // log(0) = −∞ already; the fill keeps it so on every backend.
    (max + sum.log())
        .mask_fill(empty, f64::NEG_INFINITY)
        .reshape([b, h, n])
}
