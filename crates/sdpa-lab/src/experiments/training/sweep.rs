//! `training`'s learning-rate sensitivity curves, after Wortsman et al. 2023 ("Small-scale
//! proxies for large-scale Transformer training instabilities"): for every tuned arm, the steps
//! to 99% and the held-out loss at the budget against the learning rate, over the tuning seeds
//! (which are never evaluation seeds). Each arm's best rate, its outcome with an interval, and
//! the width of the rate range that trains within [`SENSITIVITY_FACTOR`] of that best; and, per
//! seed, the same width, so that two arms' widths can be compared pair by pair (a seed starts
//! both arms from the same parameters and batches).

use serde::Serialize;

use super::design::{Condition, SENSITIVITY_FACTOR, Sizes};
use super::{Role, Run};
use crate::measures::training::Arm;
use crate::stats::Estimate;
use crate::stats::hypothesis::{holm, median_ci, sign_test};

/// The level of a curve point's interval: with five seeds the only distribution-free interval
/// for the median is their range, whose coverage is 1 − 2/2⁵ ≈ 94%.
const POINT_LEVEL: f64 = 0.90;

/// One rate of one arm's curve.
#[derive(Debug, Clone, Serialize)]
pub struct SweepPoint {
    /// The learning rate.
    pub lr: f64,
    /// Tuning runs at this rate.
    pub seeds: usize,
    /// How many of them reached 99% within the budget.
    pub reached: usize,
    /// Median steps to 99% over the seeds, a run that never got there counted as +∞ (so a
    /// median of +∞ means most never did), with the order-statistics interval
    /// ([`POINT_LEVEL`]).
    pub steps: Estimate,
    /// Median held-out loss at the budget (a diverged run +∞), same interval.
    pub final_loss: Estimate,
}

/// One arm's curve.
#[derive(Debug, Clone, Serialize)]
pub struct Curve {
    /// The condition.
    pub condition: Condition,
    /// The arm.
    pub arm: Arm,
    /// The grid's rates, in order.
    pub points: Vec<SweepPoint>,
    /// The best rate by median steps to 99% (ties: the lower median loss, then the smaller
    /// rate); `None` when no rate has a finite median.
    pub best: Option<usize>,
    /// The best rate by median held-out loss at the budget.
    pub best_loss: Option<usize>,
    /// The rates around `best` whose median steps are within [`SENSITIVITY_FACTOR`] of its
    /// (the contiguous run of grid points), as (lowest, highest).
    pub good: Option<(f64, f64)>,
    /// Whether that range reaches an end of the grid (the true range may be wider).
    pub good_at_edge: bool,
    /// log₁₀(highest / lowest) of `good`, in decades (0 when there is no best).
    pub width: f64,
    /// The same width per tuning seed, from that seed's own steps at each rate (a seed that
    /// never reached 99% at any rate has width 0).
    pub seed_widths: Vec<(u64, f64)>,
}

/// One arm's sensitivity against 1/√d_k's, per initialization: the per-seed widths paired over
/// seeds and the d_k of [`Sizes::sweep_dims`].
#[derive(Debug, Clone, Serialize)]
pub struct Sensitivity {
    /// The initialization.
    pub init: sdpa_model::QkInit,
    /// The arm compared with 1/√d_k.
    pub arm: Arm,
    /// Pairs (seed, d_k) with both widths.
    pub pairs: usize,
    /// Pairs where the arm's range is narrower.
    pub narrower: usize,
    /// Pairs where it is wider.
    pub wider: usize,
    /// Median width of the arm, in decades.
    pub median_width: f64,
    /// Median width of 1/√d_k.
    pub reference_median_width: f64,
    /// Exact two-sided sign test.
    pub p: f64,
    /// Holm-adjusted over the initializations.
    pub p_holm: f64,
}

/// A run's steps to 99%, +∞ when it never got there.
fn steps(r: &Run) -> f64 {
    r.result.steps_to_target.map_or(f64::INFINITY, |s| s as f64)
}

/// A run's held-out loss at the end, +∞ when it is not finite (diverged).
fn loss(r: &Run) -> f64 {
    let l = r.result.final_loss;
    if l.is_finite() { l } else { f64::INFINITY }
}

/// The contiguous run of grid indices around `best` whose value is at most
/// [`SENSITIVITY_FACTOR`] × the value at `best`.
fn good_range(values: &[f64], best: usize) -> (usize, usize) {
    let limit = SENSITIVITY_FACTOR * values[best];
    let ok = |i: usize| values[i] <= limit;
    let mut lo = best;
    while lo > 0 && ok(lo - 1) {
        lo -= 1;
    }
    let mut hi = best;
    while hi + 1 < values.len() && ok(hi + 1) {
        hi += 1;
    }
    (lo, hi)
}

/// The index of the smallest value (the first on ties), `None` when none is finite.
fn argmin(values: &[f64]) -> Option<usize> {
    values
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .min_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)
}

/// Width in decades of the good range around a curve's best.
fn width(grid: &[f64], values: &[f64]) -> f64 {
    argmin(values).map_or(0.0, |best| {
        let (lo, hi) = good_range(values, best);
        (grid[hi] / grid[lo]).log10()
    })
}

/// The curve of one (condition, arm) from its tuning runs; `None` when it has none.
pub fn curve(cells: &[Run], condition: Condition, arm: Arm, grid: &[f64]) -> Option<Curve> {
    let runs: Vec<&Run> = cells
        .iter()
        .filter(|r| {
            let s = &r.config.spec;
            r.config.role == Role::Tuning
                && s.arm == arm
                && (s.optimizer, s.init, s.d_k)
                    == (condition.optimizer, condition.init, condition.d_k)
        })
        .collect();
    if runs.is_empty() {
        return None;
    }
    let at = |lr: f64| runs.iter().filter(move |r| r.config.spec.lr == lr);
    let points: Vec<SweepPoint> = grid
        .iter()
        .map(|&lr| {
            let s: Vec<f64> = at(lr).map(|r| steps(r)).collect();
            let l: Vec<f64> = at(lr).map(|r| loss(r)).collect();
            SweepPoint {
                lr,
                seeds: s.len(),
                reached: s.iter().filter(|x| x.is_finite()).count(),
                steps: median_ci(&s, POINT_LEVEL),
                final_loss: median_ci(&l, POINT_LEVEL),
            }
        })
        .collect();
    let medians: Vec<f64> = points
        .iter()
        .map(|p| {
            if p.seeds == 0 {
                f64::INFINITY
            } else {
                p.steps.value
            }
        })
        .collect();
    let losses: Vec<f64> = points
        .iter()
        .map(|p| {
            if p.seeds == 0 {
                f64::INFINITY
            } else {
                p.final_loss.value
            }
        })
        .collect();
    // Best by steps; among equal medians, the lower loss, then the smaller rate.
    let best = (0..points.len())
        .filter(|&i| medians[i].is_finite())
        .min_by(|&a, &b| {
            medians[a]
                .total_cmp(&medians[b])
                .then(losses[a].total_cmp(&losses[b]))
                .then(a.cmp(&b))
        });
    let (good, good_at_edge, curve_width) = match best {
        Some(b) => {
            let (lo, hi) = good_range(&medians, b);
            (
                Some((grid[lo], grid[hi])),
                grid.len() > 1 && (lo == 0 || hi + 1 == grid.len()),
                (grid[hi] / grid[lo]).log10(),
            )
        }
        None => (None, false, 0.0),
    };
    let mut seeds: Vec<u64> = runs.iter().map(|r| r.config.spec.seed).collect();
    seeds.sort_unstable();
    seeds.dedup();
    let seed_widths = seeds
        .iter()
        .map(|&seed| {
            let values: Vec<f64> = grid
                .iter()
                .map(|&lr| {
                    at(lr)
                        .find(|r| r.config.spec.seed == seed)
                        .map_or(f64::INFINITY, |r| steps(r))
                })
                .collect();
            (seed, width(grid, &values))
        })
        .collect();
    Some(Curve {
        condition,
        arm,
        points,
        best,
        best_loss: argmin(&losses),
        good,
        good_at_edge,
        width: curve_width,
        seed_widths,
    })
}

/// Every tuned arm's curve, in the design's order.
pub fn curves(cells: &[Run], sizes: &Sizes) -> Vec<Curve> {
    sizes
        .tuned_arms()
        .into_iter()
        .filter_map(|(condition, arm)| curve(cells, condition, arm, sizes.lrs(condition.optimizer)))
        .collect()
}

/// The sensitivity of each of `arms` against 1/√d_k, per initialization, over the sweep's d_k
/// (Holm over the initializations, within one arm).
pub fn sensitivities(curves: &[Curve], sizes: &Sizes, arms: &[Arm]) -> Vec<Sensitivity> {
    let mut out = Vec::new();
    for &arm in arms {
        let mut rows = Vec::new();
        for init in [sdpa_model::QkInit::Default, sdpa_model::QkInit::Unit] {
            let of = |a: Arm, d_k: usize| {
                curves.iter().find(|c| {
                    c.arm == a
                        && c.condition.init == init
                        && c.condition.d_k == d_k
                        && c.condition.optimizer == sdpa_model::OptimizerKind::Adam
                })
            };
            let (mut mine, mut theirs) = (Vec::new(), Vec::new());
            for &d_k in &sizes.sweep_dims {
                let (Some(a), Some(r)) = (of(arm, d_k), of(Arm::Scaled, d_k)) else {
                    continue;
                };
                for &(seed, w) in &a.seed_widths {
                    if let Some(&(_, wr)) = r.seed_widths.iter().find(|(s, _)| *s == seed) {
                        mine.push(w);
                        theirs.push(wr);
                    }
                }
            }
            if mine.is_empty() {
                continue;
            }
            let narrower = mine.iter().zip(&theirs).filter(|(a, b)| a < b).count();
            let wider = mine.iter().zip(&theirs).filter(|(a, b)| a > b).count();
            let p = sign_test(narrower, wider);
            rows.push(Sensitivity {
                init,
                arm,
                pairs: mine.len(),
                narrower,
                wider,
                median_width: crate::stats::median(&mine),
                reference_median_width: crate::stats::median(&theirs),
                p,
                p_holm: p,
            });
        }
        let adjusted = holm(&rows.iter().map(|r| r.p).collect::<Vec<_>>());
        for (r, p) in rows.iter_mut().zip(adjusted) {
            r.p_holm = p;
        }
        out.extend(rows);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_good_range_is_contiguous_around_the_best() {
        let grid = [1e-4, 1e-3, 1e-2, 1e-1];
        // Best 20 at 1e-2; 1e-3 within 2× (40), 1e-4 not (60), 1e-1 never.
        let v = [60.0, 40.0, 20.0, f64::INFINITY];
        assert_eq!(good_range(&v, 2), (1, 2));
        assert!((width(&grid, &v) - 1.0).abs() < 1e-12);
        // A gap breaks the range: 1e-4 is within 2× but 1e-3 is not.
        let v = [30.0, 50.0, 20.0, 35.0];
        assert_eq!(good_range(&v, 2), (2, 3));
        // Nothing reached: no best, width 0.
        assert_eq!(width(&grid, &[f64::INFINITY; 4]), 0.0);
        assert_eq!(argmin(&[f64::INFINITY, 3.0, 3.0]), Some(1));
    }
}
