//! The CPU kernel's online accumulators of the row statistics (see [`ROW_STATS`]), one
//! entry per query of a block, updated tile by tile beside the running max and sum.

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

/// The online accumulators of the row statistics, one entry per query of the block: beside the
/// running max `m` and sum `l` (which counts the sink), `keys_sum = Σ_keys e^(s − m)` and
/// `weighted = Σ_keys e^(s − m)·(s − m)`, both rescaled when `m` grows, give the entropy
/// `(keys_sum·ln l − weighted) / l`; the visible max, the count and the moments about `shift`
/// (the row's first visible tile max, so that the second moment does not cancel) give the rest.
pub(crate) struct StatsScratch {
    keys_sum: Vec<f32>,
    weighted: Vec<f32>,
    visible_max: Vec<f32>,
    count: Vec<f32>,
    shift: Vec<f32>,
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
            shift: vec![0.0; rows],
            first: vec![0.0; rows],
            second: vec![0.0; rows],
        }
    }

    pub(crate) fn reset(&mut self) {
        self.keys_sum.fill(0.0);
        self.weighted.fill(0.0);
        self.visible_max.fill(f32::NEG_INFINITY);
        self.count.fill(0.0);
        self.first.fill(0.0);
        self.second.fill(0.0);
    }

    /// Counts a tile's visible scores of `row` (before the softmax overwrites them).
    pub(crate) fn observe(&mut self, row: usize, scores: &[f32], tile_max: f32) {
        if tile_max == f32::NEG_INFINITY {
            return;
        }
        if self.count[row] == 0.0 {
            self.shift[row] = tile_max;
        }
        let (count, first, second) = simd::moments(scores, self.shift[row]);
        self.count[row] += count;
        self.first[row] += first;
        self.second[row] += second;
        self.visible_max[row] = self.visible_max[row].max(tile_max);
    }

    /// Rescales `row`'s sums from the old max to the new one (`delta = old − new ≤ 0`,
    /// `correction = e^delta`) and adds the tile's.
    pub(crate) fn rescale(&mut self, row: usize, delta: f32, correction: f32, tile: (f32, f32)) {
        let keys_sum = self.keys_sum[row];
        self.weighted[row] = if keys_sum > 0.0 {
            correction * (self.weighted[row] + delta * keys_sum) + tile.1
        } else {
            tile.1
        };
        self.keys_sum[row] = correction * keys_sum + tile.0;
    }

    /// `row`'s statistics (see [`ROW_STATS`]) with its final sum `sum` and log-sum-exp `lse`.
    pub(crate) fn finish(&self, row: usize, sum: f32, lse: f32, out: &mut [f32]) {
        let count = self.count[row];
        if count == 0.0 {
            out.copy_from_slice(&[f32::NEG_INFINITY, 0.0, 0.0, 0.0, f32::NAN, f32::NAN]);
            return;
        }
        let keys_sum = self.keys_sum[row];
        let entropy = (keys_sum * sum.ln() - self.weighted[row]) / sum;
        let mean = self.first[row] / count;
        let variance = (self.second[row] / count - mean * mean).max(0.0);
        out.copy_from_slice(&[
            self.visible_max[row],
            entropy,
            (self.visible_max[row] - lse).exp(),
            count,
            self.shift[row] + mean,
            variance.sqrt(),
        ]);
    }
}
