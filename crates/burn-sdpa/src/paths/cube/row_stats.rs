//! The CubeCL forward kernel's row statistics: what it writes per query row when `has_stats`
//! (its accumulators follow `paths/online_stats.rs`'s recurrence, key by key).

use cubecl::prelude::*;

/// The row statistics the forward pass writes per query row when `has_stats`
/// (`stats [b, h, n, ROW_STATS]`): the largest visible logit (the kernel's `HIDDEN` for a row without a
/// key), the entropy, the largest weight, the number of visible keys, the logit mean and std (0
/// for a row without a key; the module makes them NaN).
pub(crate) const ROW_STATS: usize = 6;

/// Writes one row's statistics at `stats[base..base + ROW_STATS]` from its accumulators and
/// final max and sum (see [`ROW_STATS`]).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_stats(
    stats: &mut Tensor<f32>,
    base: usize,
    row_max: f32,
    row_sum: f32,
    keys_sum: f32,
    weighted: f32,
    visible_max: f32,
    count: f32,
    shift: f32,
    first_moment: f32,
    second_moment: f32,
) {
    let mut entropy = 0.0f32;
    let mut max_prob = 0.0f32;
    let mut mean = 0.0f32;
    let mut std = 0.0f32;
    if count > 0.5f32 {
        let log_sum = row_sum.ln();
        entropy = (keys_sum * log_sum - weighted) / row_sum;
        max_prob = (visible_max - row_max - log_sum).exp();
        let centred_mean = first_moment / count;
        mean = shift + centred_mean;
        std = f32::max(second_moment / count - centred_mean * centred_mean, 0.0f32).sqrt();
    }
    stats[base] = visible_max;
    stats[base + 1] = entropy;
    stats[base + 2] = max_prob;
    stats[base + 3] = count;
    stats[base + 4] = mean;
    stats[base + 5] = std;
}
