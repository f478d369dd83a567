//! The CPU kernel's online softmax, row by row and tile by tile ([`update_row`]), and the
//! online accumulators of the row statistics (see [`ROW_STATS`]), one entry per query of a
//! block, updated beside the running max and sum.

use super::element::Element;
use super::simd;

/// How many statistics the forward writes per query row when asked (`stats: [ROW_STATS, batch,
/// n_heads, n]`, one column per statistic), in this order: the largest visible logit, the
/// entropy, the largest weight, the number of visible keys, the mean and the (population)
/// standard deviation of the visible logits. They come from accumulators the online softmax carries beside its running max and
/// sum: O(1) extra per row, the `[n, m]` weights never held. A row with no visible key gets
/// −∞, 0, 0, 0, NaN, NaN.
pub(crate) const ROW_STATS: usize = 6;

/// Where the number of visible keys stands among the [`ROW_STATS`] statistics of a row.
pub(crate) const VISIBLE_KEYS: usize = 3;

/// Where a row's scores in a tile may be −∞ (hidden keys): which loop the statistics take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hidden {
    /// Only in the first vector (`.0`) and in the last vector or tail (`.1`) when set: a
    /// plain tile (neither) or a band tile's visible run widened to whole vectors.
    AtEnds(bool, bool),
    /// Anywhere (the mask, the bias, segments).
    Anywhere,
}

/// One tile's update of one row of the online softmax: `scores` (the row's scores in the tile,
/// or the run of them it sees) become the weights `e^(s − new_max)`; the running `(max, sum)`
/// move to the new max; `acc_row` (the row's unnormalized output) is rescaled to it. With
/// `stats` (the block's accumulators and the row's index in the block), the statistics take
/// the tile's terms in the same pass (`hidden`: where a score may be −∞).
#[inline(always)]
pub(crate) fn update_row(
    scores: &mut [f32],
    (row_max, row_sum): (&mut f32, &mut f32),
    acc_row: &mut [f32],
    stats: Option<(&mut StatsScratch, usize)>,
    hidden: Hidden,
) {
    let old_max = *row_max;
    let tile_max = simd::max(scores);
    let new_max = old_max.max(tile_max);
    if new_max == f32::NEG_INFINITY {
        // No visible key yet: this tile adds nothing.
        scores.fill(0.0);
        return;
    }
    let correction = (old_max - new_max).exp(); // exp(-inf) = 0 on the first tile
    let tile_sum = match stats {
        Some((stats, row)) => {
            let maxima = (old_max, new_max, correction);
            stats.add_tile(row, scores, tile_max, maxima, hidden)
        }
        None => simd::exp_sub_sum(scores, new_max),
    };
    if correction != 1.0 {
        simd::scale(acc_row, correction);
    }
    *row_sum = *row_sum * correction + tile_sum;
    *row_max = new_max;
}

/// The online accumulators of the row statistics, one entry per query of the block, in one
/// array per accumulator (so that [`finish_block`](Self::finish_block) runs over the rows in
/// vectors). All are relative to the row's running max `m` (which counts the sink):
/// `keys_sum = Σ_keys e^(s − m)` and `weighted = Σ_keys e^(s − m)·(s − m)` give the entropy
/// `(keys_sum·ln l − weighted) / l` (`l` the running sum); `first = Σ (s − m)` and
/// `second = Σ (s − m)²` over the visible keys, with their count, give the logit mean and std.
/// When `m` grows by `−δ` (δ = m_old − m_new ≤ 0, c = e^δ): `weighted ← c·(weighted +
/// δ·keys_sum)`, `keys_sum ← c·keys_sum`, `second ← second + 2δ·first + count·δ²`,
/// `first ← first + count·δ`.
pub(crate) struct StatsScratch {
    keys_sum: Vec<f32>,
    weighted: Vec<f32>,
    visible_max: Vec<f32>,
    count: Vec<f32>,
    first: Vec<f32>,
    second: Vec<f32>,
}

impl StatsScratch {
    pub(crate) fn new(rows: usize) -> Self {
        Self {
            keys_sum: vec![0.0; rows],
            weighted: vec![0.0; rows],
            visible_max: vec![f32::NEG_INFINITY; rows],
            count: vec![0.0; rows],
            first: vec![0.0; rows],
            second: vec![0.0; rows],
        }
    }

    pub(crate) fn reset(&mut self) {
        for sums in [
            &mut self.keys_sum,
            &mut self.weighted,
            &mut self.count,
            &mut self.first,
            &mut self.second,
        ] {
            sums.fill(0.0);
        }
        self.visible_max.fill(f32::NEG_INFINITY);
    }

    /// One tile of `row`: its scores (largest `tile_max`; `hidden`: where some may be −∞)
    /// become `e^(s − new_max)`, the softmax's weights, in the same pass that sums the tile's
    /// terms; the accumulators move from `old_max` to `new_max` (`correction = e^(old_max −
    /// new_max)`) and take the tile's. Returns the tile's sum of weights.
    #[inline(always)]
    pub(crate) fn add_tile(
        &mut self,
        row: usize,
        scores: &mut [f32],
        tile_max: f32,
        (old_max, new_max, correction): (f32, f32, f32),
        hidden: Hidden,
    ) -> f32 {
        if tile_max == f32::NEG_INFINITY {
            // Nothing visible here: the max did not move, and the weights are zeros.
            return simd::exp_sub_sum(scores, new_max);
        }
        let [sum, weighted, count, first, second] = match hidden {
            Hidden::Anywhere => simd::exp_sub_sum_moments_masked(scores, new_max),
            Hidden::AtEnds(first, last) => {
                simd::exp_sub_sum_moments(scores, new_max, (first, last))
            }
        };
        let n = self.count[row];
        if n > 0.0 && correction != 1.0 {
            let delta = old_max - new_max;
            let keys_sum = self.keys_sum[row];
            self.weighted[row] = correction * (self.weighted[row] + delta * keys_sum);
            self.keys_sum[row] = keys_sum * correction;
            self.second[row] += delta * (2.0 * self.first[row] + n * delta);
            self.first[row] += n * delta;
        }
        self.keys_sum[row] += sum;
        self.weighted[row] += weighted;
        self.count[row] = n + count;
        self.first[row] += first;
        self.second[row] += second;
        self.visible_max[row] = self.visible_max[row].max(tile_max);
        sum
    }

    /// The statistics (see [`ROW_STATS`]) of the block's rows, from their final max, sum and
    /// log-sum-exp, into `columns` (one slice per statistic, one entry per row). Branch-free
    /// per row, so that it runs in vectors.
    pub(crate) fn finish_block(
        &self,
        max: &[f32],
        sum: &[f32],
        lse: &[f32],
        columns: &mut [&mut [f32]; ROW_STATS],
    ) {
        let [
            max_logit,
            entropy,
            max_prob,
            visible_keys,
            logit_mean,
            logit_std,
        ] = columns;
        for row in 0..lse.len().min(max.len()).min(sum.len()) {
            let n = self.count[row];
            let (m, l, lse) = (max[row], sum[row], lse[row]);
            let visible_max = self.visible_max[row];
            let inv_sum = 1.0 / l;
            let h = (self.keys_sum[row] * (lse - m) - self.weighted[row]) * inv_sum;
            // ln l = lse − max, and the largest weight is e^(visible_max − max) / l: 1 / l
            // unless a sink lies above every score.
            let p = if visible_max == m {
                inv_sum
            } else {
                simd::exp_nonpositive(visible_max - lse)
            };
            let mean = self.first[row] / n;
            let variance = (self.second[row] / n - mean * mean).max(0.0);
            // A row with no visible key: −∞, 0, 0, 0, NaN, NaN.
            let seen = n > 0.0;
            max_logit[row] = if seen { visible_max } else { f32::NEG_INFINITY };
            entropy[row] = if seen { h } else { 0.0 };
            max_prob[row] = if seen { p } else { 0.0 };
            visible_keys[row] = n;
            logit_mean[row] = if seen { m + mean } else { f32::NAN };
            logit_std[row] = if seen { variance.sqrt() } else { f32::NAN };
        }
    }
}

/// Normalizes a block's context rows `acc` `[rows, d_v]` by their sums into `out` (in `T`) and
/// writes their log-sum-exps. A query that saw no key keeps a zero row (the naive path's
/// masked-row rule) and a log-sum-exp of +∞, so that its recomputed weights are 0 in the
/// backward pass.
#[inline]
pub(crate) fn finish_rows<T: Element>(
    acc: &mut [f32],
    row_max: &[f32],
    row_sum: &[f32],
    lse: &mut [f32],
    out: &mut [T],
) {
    let d_v = acc.len() / row_sum.len().max(1);
    for (row, (&sum, &max)) in row_sum.iter().zip(row_max).enumerate() {
        let (inv, row_lse) = if sum > 0.0 {
            (1.0 / sum, max + sum.ln())
        } else {
            (0.0, f32::INFINITY)
        };
        lse[row] = row_lse;
        let acc_row = &mut acc[row * d_v..][..d_v];
        simd::scale(acc_row, inv);
        T::store(acc_row, &mut out[row * d_v..][..d_v]);
    }
}
