//! The CPU kernel's online softmax, row by row and tile by tile ([`update_row`]), and the
//! online accumulators of the row statistics (see [`ROW_STATS`]), one entry per query of a
//! block, updated beside the running max and sum.

use super::simd;

/// How many statistics the forward writes per query row when asked (`stats: [batch, n_heads, n,
/// ROW_STATS]`), in this order: the largest visible logit, the entropy, the largest weight, the
/// number of visible keys, the mean and the (population) standard deviation of the visible
/// logits. They come from accumulators the online softmax carries beside its running max and
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

/// One row's accumulators, all relative to the row's running max `m` (which counts the sink):
/// `keys_sum = Σ_keys e^(s − m)` and `weighted = Σ_keys e^(s − m)·(s − m)` give the entropy
/// `(keys_sum·ln l − weighted) / l` (`l` the running sum); `first = Σ (s − m)` and
/// `second = Σ (s − m)²` over the visible keys, with their count, give the logit mean and std.
/// When `m` grows by `−δ` (δ = m_old − m_new ≤ 0, c = e^δ): `weighted ← c·(weighted +
/// δ·keys_sum)`, `keys_sum ← c·keys_sum`, `second ← second + 2δ·first + count·δ²`,
/// `first ← first + count·δ`.
#[derive(Debug, Clone, Copy)]
struct RowAccumulators {
    keys_sum: f32,
    weighted: f32,
    visible_max: f32,
    count: f32,
    first: f32,
    second: f32,
}

impl RowAccumulators {
    const EMPTY: Self = Self {
        keys_sum: 0.0,
        weighted: 0.0,
        visible_max: f32::NEG_INFINITY,
        count: 0.0,
        first: 0.0,
        second: 0.0,
    };
}

/// The online accumulators of the row statistics, one [`RowAccumulators`] per query of the
/// block.
pub(crate) struct StatsScratch {
    rows: Vec<RowAccumulators>,
}

impl StatsScratch {
    pub(crate) fn new(rows: usize) -> Self {
        Self {
            rows: vec![RowAccumulators::EMPTY; rows],
        }
    }

    pub(crate) fn reset(&mut self) {
        self.rows.fill(RowAccumulators::EMPTY);
    }

    /// One tile of `row`: its scores (largest `tile_max`; `masked` when some may be −∞) become
    /// `e^(s − new_max)`, the softmax's weights, in the same pass that sums the tile's terms;
    /// the accumulators move from `old_max` to `new_max` (`correction = e^(old_max −
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
        let acc = &mut self.rows[row];
        if acc.count > 0.0 && correction != 1.0 {
            let delta = old_max - new_max;
            acc.weighted = correction * (acc.weighted + delta * acc.keys_sum);
            acc.keys_sum *= correction;
            acc.second += delta * (2.0 * acc.first + acc.count * delta);
            acc.first += acc.count * delta;
        }
        acc.keys_sum += sum;
        acc.weighted += weighted;
        acc.count += count;
        acc.first += first;
        acc.second += second;
        acc.visible_max = acc.visible_max.max(tile_max);
        sum
    }

    /// `row`'s statistics (see [`ROW_STATS`]) with its final max, sum and log-sum-exp.
    pub(crate) fn finish(&self, row: usize, max: f32, sum: f32, lse: f32, out: &mut [f32]) {
        let acc = self.rows[row];
        if acc.count == 0.0 {
            out.copy_from_slice(&[f32::NEG_INFINITY, 0.0, 0.0, 0.0, f32::NAN, f32::NAN]);
            return;
        }
        // ln l = lse − max, and the largest weight is e^(visible_max − max) / l: 1 / l unless a
        // sink lies above every score (no logarithm or exponential per row otherwise).
        let inv_sum = 1.0 / sum;
        let entropy = (acc.keys_sum * (lse - max) - acc.weighted) * inv_sum;
        let max_prob = if acc.visible_max == max {
            inv_sum
        } else {
            (acc.visible_max - lse).exp()
        };
        let mean = acc.first / acc.count;
        let variance = (acc.second / acc.count - mean * mean).max(0.0);
        out.copy_from_slice(&[
            acc.visible_max,
            entropy,
            max_prob,
            acc.count,
            max + mean,
            variance.sqrt(),
        ]);
    }
}
