//! The row statistics carried through the chunked path's online softmax, one block of keys at a
//! time: O(rows) extra memory, never the `[n, m]` weights.
//!
//! Beside the running max `m` and sum `l` (which counts the sink), the chunked path keeps
//! `keys_sum = Σ_keys e^(s − m)` and `weighted = Σ_keys e^(s − m)·(s − m)`, both rescaled when
//! `m` grows (`weighted ← c·(weighted + δ·keys_sum)`, `δ = m_old − m_new`, `c = e^δ`), so that
//! the entropy is `(keys_sum·ln l − weighted) / l`; the visible max, the count and the first two
//! moments about a per-row shift (the max of the row's first block with a visible key, so that
//! the second moment does not cancel) give the rest. Everything here is detached.

use burn::prelude::*;

use crate::RowStats;

/// The accumulators, in the chunked path's grouped layout `[b, h_kv, g·n, 1]`, in f32 whatever
/// the call's dtype (sums of squares and counts would overflow or lose integers in f16 and bf16).
pub(crate) struct OnlineStats {
    dtype: burn::tensor::DType,
    keys_sum: Tensor<4>,
    weighted: Tensor<4>,
    visible_max: Tensor<4>,
    count: Tensor<4>,
    shift: Tensor<4>,
    first: Tensor<4>,
    second: Tensor<4>,
}

impl OnlineStats {
    /// Empty accumulators for `rows` `[b, h_kv, g·n, 1]`; the statistics come back in `dtype`.
    pub fn new(rows: [usize; 4], device: &Device, dtype: burn::tensor::DType) -> Self {
        let f32 = burn::tensor::DType::F32;
        let zeros = || Tensor::zeros(rows, (device, f32));
        Self {
            dtype,
            keys_sum: zeros(),
            weighted: zeros(),
            visible_max: Tensor::full(rows, f64::NEG_INFINITY, (device, f32)),
            count: zeros(),
            shift: zeros(),
            first: zeros(),
            second: zeros(),
        }
    }

    /// Adds one block: `scores` `[b, h_kv, g·n, len]` (hidden keys already filled with a finite
    /// most negative value), `hidden` its mask (true = hidden) when something is, `p` the
    /// block's `e^(s − new_max)` with hidden keys 0, `delta = old_max − new_max` `[.., 1]` (None
    /// on the first block).
    pub fn add_block(
        &mut self,
        scores: Tensor<4>,
        hidden: Option<Tensor<4, Bool>>,
        p: Tensor<4>,
        new_max: Tensor<4>,
        delta: Option<Tensor<4>>,
    ) {
        let f32 = burn::tensor::DType::F32;
        let scores = scores.detach().cast(f32);
        let p = p.detach().cast(f32);
        let new_max = new_max.detach().cast(f32);
        let delta = delta.map(|delta| delta.detach().cast(f32));
        // [.., len] -> [.., 1]
        let (count, block_max) = match &hidden {
            Some(hidden) => (
                hidden
                    .clone()
                    .bool_not()
                    .float()
                    .cast(scores.dtype())
                    .sum_dim(3),
                scores
                    .clone()
                    .mask_fill(hidden.clone(), f64::NEG_INFINITY)
                    .max_dim(3),
            ),
            None => {
                let [b, h, rows, len] = scores.dims();
                let count = Tensor::full(
                    [b, h, rows, 1],
                    len as f64,
                    (&scores.device(), scores.dtype()),
                );
                (count, scores.clone().max_dim(3))
            }
        };
        let unseen = self.count.clone().lower_equal_elem(0.0);
        // At least the most negative finite value: a first block whose visible scores all
        // overflowed to −∞ must not shift the next ones by −∞ (−∞ − (−∞) = NaN).
        let floor = crate::mask::most_negative(f32);
        self.shift = self
            .shift
            .clone()
            .mask_where(unseen, block_max.clone().clamp_min(floor));
        let hide = |t: Tensor<4>| match &hidden {
            Some(hidden) => t.mask_fill(hidden.clone(), 0.0),
            None => t,
        };
        let centred = hide(scores.clone() - self.shift.clone());
        self.first = self.first.clone() + centred.clone().sum_dim(3);
        self.second = self.second.clone() + centred.powi_scalar(2).sum_dim(3);
        self.count = self.count.clone() + count;
        self.visible_max = self.visible_max.clone().max_pair(block_max);

        let block_sum = p.clone().sum_dim(3);
        // A score of −∞ has p = 0: its term is 0, not 0 · (−∞) (the clamp leaves every score
        // with p > 0 as it is).
        let block_weighted = (p * hide(scores - new_max).clamp_min(floor)).sum_dim(3);
        match delta {
            Some(delta) => {
                let correction = delta.clone().exp();
                // δ·keys_sum is 0 where nothing was seen yet (δ may be −∞ or huge there).
                // It is 0 where the correction vanishes too (δ may be −∞ there, and
                // (−∞)·0 = NaN).
                let empty = self
                    .keys_sum
                    .clone()
                    .lower_equal_elem(0.0)
                    .bool_or(correction.clone().lower_equal_elem(0.0));
                let moved = (delta * self.keys_sum.clone()).mask_fill(empty, 0.0);
                self.weighted =
                    (self.weighted.clone() + moved) * correction.clone() + block_weighted;
                self.keys_sum = self.keys_sum.clone() * correction + block_sum;
            }
            None => {
                self.weighted = block_weighted;
                self.keys_sum = block_sum;
            }
        }
    }

    /// The statistics `[b, h, n]` with the final sum `l` and log-sum-exp (−∞ where `l` is 0),
    /// both `[b, h_kv, g·n, 1]`.
    pub fn finish(self, sum: Tensor<4>, lse: Tensor<4>, [b, h, n]: [usize; 3]) -> RowStats {
        let f32 = burn::tensor::DType::F32;
        let sum = sum.detach().cast(f32);
        let lse = lse.detach().cast(f32);
        let empty = self.count.clone().lower_equal_elem(0.0);
        let no_term = sum.clone().lower_equal_elem(0.0);
        let safe_sum = sum.mask_fill(no_term, 1.0);
        let entropy = ((self.keys_sum * safe_sum.clone().log() - self.weighted) / safe_sum)
            .mask_fill(empty.clone(), 0.0);
        let safe_lse = lse.clone().mask_fill(empty.clone(), 0.0);
        let max_prob = (self.visible_max.clone() - safe_lse)
            .exp()
            .mask_fill(empty.clone(), 0.0);
        let safe_count = self.count.clone().mask_fill(empty.clone(), 1.0);
        let mean = self.first / safe_count.clone();
        let variance = self.second / safe_count - mean.clone().powi_scalar(2);
        // Rounding may leave it just below 0; a NaN (a row with an infinite score) stays NaN
        // (a clamp keeps NaN on some backends only).
        let variance = variance.clone().mask_fill(variance.lower_elem(0.0), 0.0);
        // [b, h_kv, g·n, 1] -> [b, h, n]
        let rows = |t: Tensor<4>| t.reshape([b, h, n]);
        let stats = RowStats {
            max_logit: rows(self.visible_max),
            lse: rows(lse),
            entropy: rows(entropy),
            max_prob: rows(max_prob),
            visible_keys: rows(self.count),
            logit_mean: rows((self.shift + mean).mask_fill(empty.clone(), f64::NAN)),
            logit_std: rows(variance.sqrt().mask_fill(empty, f64::NAN)),
        };
        stats.cast(self.dtype)
    }
}
