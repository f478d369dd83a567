//! The chunked path: online softmax over blocks of keys (the FlashAttention recurrence: running
//! max, running sum, rescaled accumulator), written in Burn tensor ops so that it runs on every
//! backend and under autodiff. For inference it never holds more than `n × block_size` scores
//! per (batch, head).

use burn::prelude::*;

use crate::error::AttentionError;
use crate::input::AttentionOutput;
use crate::mask::most_negative;
use crate::paths::call::Call;
use crate::paths::online_stats::OnlineStats;
use crate::paths::overflow;

/// Why the chunked path cannot serve `call`, if it cannot.
pub(crate) fn blocker(call: &Call) -> Option<&'static str> {
    if call.input.need_weights || call.input.need_scores {
        Some("it cannot return the weights or scores")
    } else {
        None
    }
}

/// Runs the chunked path with blocks of `block_size` keys: the same semantics as the naive path
/// (masks, bias, causal alignments, windows, soft-capping, grouped-query heads, dropout on the
/// weights, zero output for rows without a visible key, the rule of [`overflow`] for scores
/// that overflow); key blocks that the causal mask or the window hide from every query are never
/// computed.
pub(crate) fn run(call: Call, block_size: usize) -> Result<AttentionOutput, AttentionError> {
    let (context, rows) = context(&call, block_size);
    let mut output = AttentionOutput::from_context(context);
    output.lse = rows.lse;
    output.row_stats = rows.stats;
    Ok(output)
}

/// What the chunked pass returns per row besides the context, when the call asks (detached).
pub(crate) struct RowOutputs {
    /// The log-sum-exp `[b, h, n]` (−∞ for a row with no visible key).
    pub lse: Option<Tensor<3>>,
    /// The row statistics.
    pub stats: Option<crate::RowStats>,
}

/// The context `[b, h, n, d_v]` of `call`, one block of keys at a time, and the log-sum-exp and
/// row statistics when the call asks for them (carried through the online softmax).
pub(crate) fn context(call: &Call, block_size: usize) -> (Tensor<4>, RowOutputs) {
    let [b, h, n, _] = call.dims.scores_shape();
    let (h_kv, d_v) = (call.dims.n_kv_heads, call.dims.d_v);
    let group = call.dims.group();
    let block_size = block_size.max(1);
    let device = call.input.query.device();
    let query = call.grouped_query();
    let dtype = query.dtype();
    let fill = most_negative(dtype);

    // Running statistics, in the grouped layout: max and sum [b, h_kv, g·n, 1], acc [.., d_v].
    let mut run_max: Option<Tensor<4>> = None;
    let mut run_sum: Option<Tensor<4>> = None;
    let mut acc: Option<Tensor<4>> = None;
    let mut stats = call
        .input
        .need_row_stats
        .then(|| OnlineStats::new([b, h_kv, group * n, 1], &device, dtype));
    // [b, h, n, 1]: the rows that saw a key so far, and (for the log-sum-exp and statistics) a
    // visible +∞ score.
    let rows_asked = call.input.need_lse || stats.is_some();
    let mut seen: Option<Tensor<4, Bool>> = None;
    let mut above: Option<Tensor<4, Bool>> = None;
    if let Some(sinks) = &call.input.sinks {
        // Every row starts with its head's sink: one term exp(sink − max), no value.
        // [b, h_kv, g·n, 1]
        let sinks = super::sinks::per_grouped_row(sinks, &call.dims).cast(dtype);
        let max = super::sinks::start_max(sinks.clone());
        run_sum = Some((sinks - max.clone()).exp());
        run_max = Some(max);
        acc = Some(Tensor::zeros([b, h_kv, group * n, d_v], (&device, dtype)));
    }
    let reachable = call.reachable_keys();
    let mut start = reachable.start;
    while start < reachable.end {
        let len = block_size.min(reachable.end - start);
        let keys = start..start + len;
        // [b, h, n, len], mask expanded to the same shape
        let (scores, mask) = call.scores(&query, keys.clone());
        let (block_seen, block_above) =
            overflow::seen_and_above(&scores, mask.as_ref(), rows_asked);
        seen = Some(match seen.take() {
            Some(seen) => seen.bool_or(block_seen),
            None => block_seen,
        });
        above = match (above.take(), block_above) {
            (Some(above), Some(block)) => Some(above.bool_or(block)),
            (above, block) => above.or(block),
        };
        let mut scores = overflow::cap_positive(scores);
        if let Some(mask) = &mask {
            scores = scores.mask_fill(mask.clone(), fill);
        }
        // [b, h, n, len] -> [b, h_kv, g·n, len]
        let scores = scores.reshape([b, h_kv, group * n, len]);
        // The shift only keeps exp() in range; it does not change the result, so it is detached.
        let block_max = scores.clone().detach().max_dim(3);
        // At least the fill (a sink's start is too): a row whose visible scores so far are all
        // −∞ gets terms exp(−∞ − fill) = 0, never −∞ − (−∞).
        let new_max = match &run_max {
            Some(prev) => prev.clone().max_pair(block_max),
            None => block_max.clamp_min(fill),
        };
        let stats_scores = stats.is_some().then(|| scores.clone());
        let mut p = (scores - new_max.clone()).exp();
        // [b, h, n, len] -> [b, h_kv, g·n, len]
        let mask = mask.map(|mask| mask.reshape([b, h_kv, group * n, len]));
        if let Some(mask) = &mask {
            // A row whose keys so far are all masked has max = fill and exp(fill − fill) = 1:
            // zero the masked entries explicitly.
            p = p.mask_fill(mask.clone(), 0.0);
        }
        if let (Some(stats), Some(scores)) = (&mut stats, stats_scores) {
            let delta = run_max.as_ref().map(|prev| prev.clone() - new_max.clone());
            stats.add_block(scores, mask, p.clone(), new_max.clone(), delta);
        }
        let block_sum = p.clone().sum_dim(3);
        // Dropout acts on the normalized weights p/l; being element-wise, it can act on p here
        // while the running sum l keeps the undropped values.
        if let Some(dropout) = &call.dropout {
            p = dropout.forward(p);
        }
        // [b, h_kv, g·n, len] @ [b, h_kv, len, d_v] -> [b, h_kv, g·n, d_v]
        let block_acc = p.matmul(call.values(keys));
        match (run_max.take(), run_sum.take(), acc.take()) {
            (Some(prev_max), Some(prev_sum), Some(prev_acc)) => {
                let correction = (prev_max - new_max.clone()).exp();
                run_sum = Some(prev_sum * correction.clone() + block_sum);
                acc = Some(prev_acc * correction + block_acc);
            }
            _ => {
                run_sum = Some(block_sum);
                acc = Some(block_acc);
            }
        }
        run_max = Some(new_max);
        start += len;
    }
    let acc = acc.unwrap_or_else(|| Tensor::zeros([b, h_kv, group * n, d_v], (&device, dtype)));
    let sum = run_sum.unwrap_or_else(|| Tensor::zeros([b, h_kv, group * n, 1], (&device, dtype)));
    // Rows without a visible key have sum 0 and acc 0: divide them by 1 (not by a tiny number,
    // whose square would underflow to 0 in the backward pass and make 0/0 = NaN).
    let empty = sum.clone().lower_equal_elem(0.0);
    // [b, h, n, 1] -> [b, h_kv, g·n, 1]
    let grouped = |rows: Tensor<4, Bool>| rows.reshape([b, h_kv, group * n, 1]);
    // A row that saw a key but has no term has no limit (see `overflow`): NaN.
    let no_limit = seen.map(|seen| grouped(seen).bool_and(empty.clone()));
    // The rows whose log-sum-exp and statistics are NaN: those, and a visible +∞ score.
    let overflowed = match (above.map(grouped), &no_limit) {
        (Some(above), Some(no_limit)) => Some(above.bool_or(no_limit.clone())),
        (above, no_limit) => above.or(no_limit.clone()),
    };
    // [b, h_kv, g·n, 1]
    let grouped_lse = rows_asked.then(|| {
        let max = run_max
            .clone()
            .unwrap_or_else(|| Tensor::zeros([b, h_kv, group * n, 1], (&device, dtype)));
        let lse =
            (max.detach() + sum.clone().detach().log()).mask_fill(empty.clone(), f64::NEG_INFINITY);
        match &overflowed {
            Some(rows) => lse.mask_fill(rows.clone(), f64::NAN),
            None => lse,
        }
    });
    let stats = stats.zip(grouped_lse.clone()).map(|(stats, lse)| {
        let stats = stats.finish(sum.clone(), lse, [b, h, n]);
        match &overflowed {
            Some(rows) => stats.poisoned(rows.clone().reshape([b, h, n])),
            None => stats,
        }
    });
    let rows = RowOutputs {
        // [b, h_kv, g·n, 1] -> [b, h, n]
        lse: grouped_lse
            .filter(|_| call.input.need_lse)
            .map(|lse| lse.reshape([b, h, n])),
        stats,
    };
    let mut context = acc / sum.mask_fill(empty, 1.0);
    if let Some(rows) = no_limit {
        // A constant: no gradient flows through the row.
        context = context.mask_fill(rows.expand([b, h_kv, group * n, d_v]), f64::NAN);
    }
    // [b, h_kv, g·n, d_v] -> [b, h, n, d_v]
    let context = context.reshape([b, h, n, d_v]);
    (context, rows)
}

#[cfg(test)]
mod tests {
    use crate::{AttentionInput, Implementation, ScaledDotProductAttentionConfig};
    use burn::prelude::*;
    use burn::tensor::Distribution;

    #[test]
    fn every_block_size_matches_the_naive_path() {
        let device = Device::flex();
        device.seed(2);
        let q = Tensor::<4>::random([2, 4, 6, 8], Distribution::Normal(0.0, 1.0), &device);
        let k = Tensor::<4>::random([2, 2, 7, 8], Distribution::Normal(0.0, 1.0), &device);
        let v = Tensor::<4>::random([2, 2, 7, 3], Distribution::Normal(0.0, 1.0), &device);
        let input = AttentionInput::new(q, k, v).causal();
        let naive = ScaledDotProductAttentionConfig::new()
            .with_implementation(Implementation::Naive)
            .init()
            .forward(input.clone())
            .context;
        for block_size in [1, 2, 3, 7, 100] {
            let chunked = ScaledDotProductAttentionConfig::new()
                .with_implementation(Implementation::Chunked { block_size })
                .init()
                .forward(input.clone())
                .context;
            let diff = (chunked - naive.clone()).abs().max().into_scalar::<f32>();
            assert!(diff < 1e-5, "block {block_size}: {diff}");
        }
    }
}
