//! The CubeCL forward kernel's row statistics: the accumulators it keeps per query row when
//! [`FlashConfig::has_stats`] (`paths/online_stats.rs`'s recurrence, key by key) and what it
//! writes per row.

use cubecl::prelude::*;

use super::config::{FlashConfig, HIDDEN};

/// The row statistics the forward pass writes per query row when `has_stats`
/// (`stats [b, h, n, ROW_STATS]`): the largest visible logit ([`HIDDEN`] for a row without a
/// key), the entropy, the largest weight, the number of visible keys, the logit mean and std (0
/// for a row without a key; the module makes them NaN).
pub(crate) const ROW_STATS: usize = 6;

/// The accumulators of the unit's rows (one element each when the call has no statistics):
/// beside the running max m and sum l, `keys_sum` = Σ e^(s − m) over the keys (the sink apart)
/// and `weighted` = Σ e^(s − m)·(s − m), rescaled when m grows; the visible max, the count and
/// the moments about the row's first visible score (`shift`).
#[derive(CubeType)]
pub(crate) struct StatsAcc {
    keys_sum: Array<f32>,
    weighted: Array<f32>,
    visible_max: Array<f32>,
    count: Array<f32>,
    shift: Array<f32>,
    first_moment: Array<f32>,
    second_moment: Array<f32>,
}

#[cube]
impl StatsAcc {
    /// Empty accumulators for the unit's rows.
    pub fn new(#[comptime] config: FlashConfig) -> StatsAcc {
        let len = comptime!(if config.has_stats { config.rows } else { 1 });
        let mut acc = StatsAcc {
            keys_sum: Array::<f32>::new(len),
            weighted: Array::<f32>::new(len),
            visible_max: Array::<f32>::new(len),
            count: Array::<f32>::new(len),
            shift: Array::<f32>::new(len),
            first_moment: Array::<f32>::new(len),
            second_moment: Array::<f32>::new(len),
        };
        if config.has_stats {
            #[unroll]
            for r in 0..config.rows {
                acc.keys_sum[r] = 0.0f32;
                acc.weighted[r] = 0.0f32;
                acc.visible_max[r] = <f32 as Float>::new(HIDDEN);
                acc.count[r] = 0.0f32;
                acc.shift[r] = 0.0f32;
                acc.first_moment[r] = 0.0f32;
                acc.second_moment[r] = 0.0f32;
            }
        }
        acc
    }

    /// Adds the visible score `s` of row `r`, whose running max went from `old_max` to
    /// `new_max` (`correction` = e^(old_max − new_max), `p` = e^(s − new_max)).
    pub fn add(&mut self, r: usize, s: f32, p: f32, correction: f32, old_max: f32, new_max: f32) {
        if self.count[r] < 0.5f32 {
            self.shift[r] = s;
        }
        let centred = s - self.shift[r];
        self.count[r] += 1.0f32;
        self.first_moment[r] += centred;
        self.second_moment[r] += centred * centred;
        self.visible_max[r] = f32::max(self.visible_max[r], s);
        // keys_sum is 0 until the first key, so δ·keys_sum is too.
        let delta = old_max - new_max;
        self.weighted[r] =
            correction * (self.weighted[r] + delta * self.keys_sum[r]) + p * (s - new_max);
        self.keys_sum[r] = self.keys_sum[r] * correction + p;
    }

    /// Writes row `r`'s statistics at `stats[base..base + ROW_STATS]` from its final max and
    /// sum (see [`ROW_STATS`]).
    pub fn write(
        &self,
        stats: &mut Tensor<f32>,
        base: usize,
        r: usize,
        row_max: f32,
        row_sum: f32,
    ) {
        let count = self.count[r];
        let mut entropy = 0.0f32;
        let mut max_prob = 0.0f32;
        let mut mean = 0.0f32;
        let mut std = 0.0f32;
        if count > 0.5f32 {
            let log_sum = row_sum.ln();
            entropy = (self.keys_sum[r] * log_sum - self.weighted[r]) / row_sum;
            max_prob = (self.visible_max[r] - row_max - log_sum).exp();
            let centred_mean = self.first_moment[r] / count;
            mean = self.shift[r] + centred_mean;
            std = f32::max(
                self.second_moment[r] / count - centred_mean * centred_mean,
                0.0f32,
            )
            .sqrt();
        }
        stats[base] = self.visible_max[r];
        stats[base + 1] = entropy;
        stats[base + 2] = max_prob;
        stats[base + 3] = count;
        stats[base + 4] = mean;
        stats[base + 5] = std;
    }
}
