//! Per-row statistics of the attention, `[b, h, n]` each: what researchers watch while training
//! (entropy collapse, logit growth, saturation) without the `[b, h, n, m]` weights.

use burn::prelude::*;

use crate::mask::most_negative;

/// The statistics of every query row, `[b, h, n]` each, without a gradient. The keys count as
/// they count in the weights (masks, padding, causal alignment, windows, segments, bias, ALiBi,
/// soft-cap, grouped-query heads; sinks and quiet softmax join the denominator only). A row with
/// no visible key has `visible_keys` 0, `max_logit` and `lse` −∞, `entropy` and `max_prob` 0,
/// and `logit_mean` and `logit_std` NaN (there is no logit).
#[derive(Debug, Clone)]
pub struct RowStats {
    /// The largest visible score (scaled, soft-capped, with bias and ALiBi).
    pub max_logit: Tensor<3>,
    /// The log of the softmax's denominator (the sink's term included).
    pub lse: Tensor<3>,
    /// `−Σ_j p_ij ln p_ij` over the visible keys (nats).
    pub entropy: Tensor<3>,
    /// The largest weight of the row.
    pub max_prob: Tensor<3>,
    /// How many keys the row sees.
    pub visible_keys: Tensor<3>,
    /// The mean of the visible scores.
    pub logit_mean: Tensor<3>,
    /// The standard deviation (population) of the visible scores.
    pub logit_std: Tensor<3>,
}

impl RowStats {
    /// Every statistic cast to `dtype`.
    pub(crate) fn cast(self, dtype: burn::tensor::DType) -> Self {
        Self {
            max_logit: self.max_logit.cast(dtype),
            lse: self.lse.cast(dtype),
            entropy: self.entropy.cast(dtype),
            max_prob: self.max_prob.cast(dtype),
            visible_keys: self.visible_keys.cast(dtype),
            logit_mean: self.logit_mean.cast(dtype),
            logit_std: self.logit_std.cast(dtype),
        }
    }

    /// The statistics from the CubeCL kernel's packed form: `stats` `[b, h, n, 6]` holding,
    /// per row, the largest visible logit, the entropy, the largest weight, the visible keys,
    /// the logit mean and std (in that order), and `lse` `[b, h, n]`. A row without a visible
    /// key gets −∞ and NaN where the kernel writes placeholders (WGSL has neither). (The CPU
    /// kernel's are split on the host: `paths::cpu::row_stats_tensors`.)
    #[cfg(feature = "cube")]
    pub(crate) fn from_packed(stats: Tensor<4>, lse: Tensor<3>) -> Self {
        let [b, h, n, _] = stats.dims();
        // [b, h, n, 6] -> [b, h, n] for statistic `idx`
        let column = |idx: usize| {
            stats
                .clone()
                .slice(s![.., .., .., idx..idx + 1])
                .reshape([b, h, n])
        };
        let count = column(3);
        let empty = count.clone().lower_equal_elem(0.0);
        Self {
            max_logit: column(0).mask_fill(empty.clone(), f64::NEG_INFINITY),
            lse,
            entropy: column(1),
            max_prob: column(2),
            visible_keys: count,
            logit_mean: column(4).mask_fill(empty.clone(), f64::NAN),
            logit_std: column(5).mask_fill(empty, f64::NAN),
        }
    }

    /// NaN in every statistic of the `rows` `[b, h, n]` (true = poisoned by a non-finite input)
    /// but the count of visible keys, which the mask alone decides.
    pub(crate) fn poisoned(self, rows: Tensor<3, Bool>) -> Self {
        let poison = |t: Tensor<3>| t.mask_fill(rows.clone(), f64::NAN);
        Self {
            max_logit: poison(self.max_logit),
            lse: poison(self.lse),
            entropy: poison(self.entropy),
            max_prob: poison(self.max_prob),
            visible_keys: self.visible_keys,
            logit_mean: poison(self.logit_mean),
            logit_std: poison(self.logit_std),
        }
    }

    /// The statistics of `scores` `[b, h, n, m]` (true in `mask` = hidden), with the sinks
    /// `[1, h, 1, 1]` (finite or −∞) in the denominators when given.
    pub(crate) fn from_scores(
        scores: Tensor<4>,
        mask: Option<&Tensor<4, Bool>>,
        sinks: Option<Tensor<4>>,
    ) -> Self {
        let [b, h, n, m] = scores.dims();
        // Reduced in f32 whatever the scores' dtype (sums of squares and counts would overflow
        // or lose integers in f16 and bf16), returned in it.
        let dtype = scores.dtype();
        let f32 = burn::tensor::DType::F32;
        let scores = scores.detach().cast(f32);
        let sinks = sinks.map(|sinks| sinks.detach().cast(f32));
        let visible = match mask {
            Some(mask) => mask.clone().bool_not(),
            None => Tensor::<4, Bool>::full([b, h, n, m], true, &scores.device()),
        };
        // [b, h, n, m] -> [b, h, n, 1]
        let count = visible.clone().float().cast(f32).sum_dim(3);
        let empty = count.clone().lower_equal_elem(0.0);
        let zeroed = scores
            .clone()
            .mask_where(visible.clone().bool_not(), scores.zeros_like());
        let filled = scores.mask_fill(visible.clone().bool_not(), most_negative(f32));
        let max_logit = filled
            .clone()
            .max_dim(3)
            .mask_fill(empty.clone(), f64::NEG_INFINITY);
        let lse = crate::paths::naive::row_lse(filled.clone(), mask, sinks).reshape([b, h, n, 1]);
        let no_term = lse.clone().is_inf();
        let safe_lse = lse.clone().mask_fill(no_term.clone(), 0.0);
        let p = (filled.clone() - safe_lse.clone())
            .exp()
            .mask_fill(visible.clone().bool_not(), 0.0);
        // −Σ p (s − lse), each masked key's term 0.
        // A score of −∞ has p = 0: its term is 0, not 0 · ∞ (the clamp leaves every score with
        // p > 0 as it is).
        let entropy = (p.clone()
            * (safe_lse.clone() - zeroed.clone()).clamp_max(-most_negative(f32)))
        .sum_dim(3)
        .mask_fill(empty.clone(), 0.0);
        let max_prob = (max_logit.clone() - safe_lse)
            .exp()
            .mask_fill(empty.clone(), 0.0);
        let safe_count = count.clone().mask_fill(empty.clone(), 1.0);
        let mean = zeroed.clone().sum_dim(3) / safe_count.clone();
        let square = zeroed.powi_scalar(2).sum_dim(3) / safe_count;
        let variance = square - mean.clone().powi_scalar(2);
        // Rounding may leave it just below 0; a NaN (a row with an infinite score) stays NaN
        // (a clamp keeps NaN on some backends only).
        let std = variance
            .clone()
            .mask_fill(variance.lower_elem(0.0), 0.0)
            .sqrt();
        let rows = |t: Tensor<4>| t.reshape([b, h, n]);
        let stats = Self {
            max_logit: rows(max_logit),
            lse: rows(lse),
            entropy: rows(entropy),
            max_prob: rows(max_prob),
            visible_keys: rows(count),
            logit_mean: rows(mean.mask_fill(empty.clone(), f64::NAN)),
            logit_std: rows(std.mask_fill(empty, f64::NAN)),
        };
        stats.cast(dtype)
    }
}
