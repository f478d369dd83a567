//! `training`'s learning-rate sensitivity curves, after Wortsman et al. 2023 ("Small-scale
//! proxies for large-scale Transformer training instabilities"): for every tuned arm, the steps
//! to 99% and the held-out loss at the budget against the learning rate, over the tuning seeds
//! (which are never evaluation seeds). Each arm's best rate, its outcome with an interval, and
//! the width of the rate range that trains within [`SENSITIVITY_FACTOR`] of that best, in grid
//! steps; and, per tuning seed, three numbers that two arms compare pair by pair (a seed starts
//! both arms from the same parameters and batches): that width, Wortsman et al.'s learning-rate
//! sensitivity on the final held-out loss, and the final loss at the arm's best rate.

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
    /// (90%: the range of five seeds).
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
    /// The number of grid steps `good` spans (0: one rate; the grid's steps are ×3 and ×3.33,
    /// about half a decade each). Counted in steps, not decades, so that a range moved along the
    /// grid keeps its width.
    pub width: usize,
    /// Per tuning seed: the same width from that seed's own steps at each rate (`None` when the
    /// seed never reached 99% at any rate: not a width, counted apart), Wortsman et al.'s
    /// learning-rate sensitivity (see [`lr_sensitivity`]) and the final held-out loss at the
    /// curve's best rate by loss.
    pub seeds: Vec<SeedMeasures>,
}

/// One tuning seed's numbers over an arm's grid.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SeedMeasures {
    /// The seed.
    pub seed: u64,
    /// Width in grid steps of its range within [`SENSITIVITY_FACTOR`] of its best steps.
    pub width: Option<usize>,
    /// [`lr_sensitivity`] of its final losses.
    pub lr_sensitivity: f64,
    /// Its final loss at the curve's best rate by median loss (+∞ when it diverged there).
    pub loss_at_best: f64,
}

/// Wortsman et al. 2023's learning-rate sensitivity of one run's final losses over the grid:
/// the mean over rates of min(L(rate), L₀) − L*, where L₀ is the loss at initialization (a rate
/// that diverges or gets worse than the start counts as no progress at all) and L* the best loss
/// over the grid. 0 when every rate reaches the best; larger when fewer rates train well. No
/// threshold is involved.
pub fn lr_sensitivity(losses: &[f64], initial: f64) -> f64 {
    let capped: Vec<f64> = losses
        .iter()
        .map(|&l| {
            if l.is_finite() {
                l.min(initial)
            } else {
                initial
            }
        })
        .collect();
    let best = capped.iter().copied().fold(f64::INFINITY, f64::min);
    if capped.is_empty() || !best.is_finite() {
        return f64::NAN;
    }
    capped.iter().map(|l| l - best).sum::<f64>() / capped.len() as f64
}

/// What a paired comparison of tuning seeds compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SeedMeasure {
    /// The width in grid steps of the rates within the factor of the seed's best steps (higher
    /// is better); pairs where either seed never reached 99% at any rate are left out.
    Width,
    /// Wortsman et al.'s learning-rate sensitivity on the final loss (lower is better).
    LrSensitivity,
    /// The final loss at the arm's best rate (lower is better).
    LossAtBest,
}

/// One arm against 1/√d_k on one [`SeedMeasure`], per initialization: the tuning seeds paired
/// over seeds and the d_k of [`Sizes::sweep_dims`].
#[derive(Debug, Clone, Serialize)]
pub struct Sensitivity {
    /// The initialization.
    pub init: sdpa_model::QkInit,
    /// The arm compared with 1/√d_k.
    pub arm: Arm,
    /// What is compared.
    pub measure: SeedMeasure,
    /// Pairs (seed, d_k) with both values.
    pub pairs: usize,
    /// Pairs where the arm is worse (narrower, more sensitive, higher loss).
    pub worse: usize,
    /// Pairs where it is better.
    pub better: usize,
    /// The arm's median value.
    pub median: f64,
    /// 1/√d_k's median value over the same pairs.
    pub reference_median: f64,
    /// Seeds (× d_k) left out because the arm never reached 99% at any rate ([`SeedMeasure::Width`]).
    pub never_arm: usize,
    /// Those left out because 1/√d_k never did.
    pub never_reference: usize,
    /// Exact two-sided sign test.
    pub p: f64,
    /// Holm-adjusted over every (arm, initialization) of the measure.
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

/// Width in grid steps of the good range around the best, `None` when nothing reached 99%.
fn width(values: &[f64]) -> Option<usize> {
    argmin(values).map(|best| {
        let (lo, hi) = good_range(values, best);
        hi - lo
    })
}

/// The curve of one (condition, arm) from its tuning runs; `None` when it has none.
pub fn curve(cells: &[Run], condition: Condition, arm: Arm, grid: &[f64]) -> Option<Curve> {
    let runs: Vec<&Run> = cells
        .iter()
        .filter(|r| {
            let s = &r.config.spec;
            r.config.role == Role::Tuning && s.arm == arm && Condition::of(s) == condition
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
                hi - lo,
            )
        }
        None => (None, false, 0),
    };
    let best_loss = argmin(&losses);
    let mut seed_ids: Vec<u64> = runs.iter().map(|r| r.config.spec.seed).collect();
    seed_ids.sort_unstable();
    seed_ids.dedup();
    let seeds = seed_ids
        .iter()
        .map(|&seed| {
            let of_seed: Vec<Option<&&Run>> = grid
                .iter()
                .map(|&lr| at(lr).find(|r| r.config.spec.seed == seed))
                .collect();
            let step_values: Vec<f64> = of_seed
                .iter()
                .map(|r| r.map_or(f64::INFINITY, |r| steps(r)))
                .collect();
            let loss_values: Vec<f64> = of_seed
                .iter()
                .map(|r| r.map_or(f64::INFINITY, |r| loss(r)))
                .collect();
            // The loss at initialization: the first held-out evaluation (step 0), the same for
            // every rate of the seed.
            let initial = of_seed
                .iter()
                .flatten()
                .find_map(|r| r.result.curve.first().map(|p| p.eval_loss))
                .unwrap_or(f64::NAN);
            SeedMeasures {
                seed,
                width: width(&step_values),
                lr_sensitivity: lr_sensitivity(&loss_values, initial),
                loss_at_best: best_loss.map_or(f64::NAN, |i| loss_values[i]),
            }
        })
        .collect();
    Some(Curve {
        condition,
        arm,
        points,
        best,
        best_loss,
        good,
        good_at_edge,
        width: curve_width,
        seeds,
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

/// Each of `arms` against 1/√d_k on `measure`, per initialization, over the sweep's d_k (Holm
/// over every (arm, initialization) of the measure).
pub fn sensitivities(
    curves: &[Curve],
    sizes: &Sizes,
    arms: &[Arm],
    measure: SeedMeasure,
) -> Vec<Sensitivity> {
    let mut out = Vec::new();
    for &arm in arms {
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
            let (mut never_arm, mut never_reference) = (0, 0);
            for &d_k in &sizes.sweep_dims {
                let (Some(a), Some(r)) = (of(arm, d_k), of(Arm::Scaled, d_k)) else {
                    continue;
                };
                for x in &a.seeds {
                    let Some(y) = r.seeds.iter().find(|y| y.seed == x.seed) else {
                        continue;
                    };
                    // Oriented so that larger is worse.
                    let pair = match measure {
                        SeedMeasure::Width => match (x.width, y.width) {
                            (Some(a), Some(b)) => Some((-(a as f64), -(b as f64))),
                            (a, b) => {
                                never_arm += usize::from(a.is_none());
                                never_reference += usize::from(b.is_none());
                                None
                            }
                        },
                        SeedMeasure::LrSensitivity => Some((x.lr_sensitivity, y.lr_sensitivity)),
                        SeedMeasure::LossAtBest => Some((x.loss_at_best, y.loss_at_best)),
                    };
                    if let Some((a, b)) = pair.filter(|(a, b)| !a.is_nan() && !b.is_nan()) {
                        mine.push(a);
                        theirs.push(b);
                    }
                }
            }
            if mine.is_empty() && never_arm + never_reference == 0 {
                continue;
            }
            let worse = mine.iter().zip(&theirs).filter(|(a, b)| a > b).count();
            let better = mine.iter().zip(&theirs).filter(|(a, b)| a < b).count();
            let p = sign_test(worse, better);
            let unorient = |v: f64| if measure == SeedMeasure::Width { -v } else { v };
            out.push(Sensitivity {
                init,
                arm,
                measure,
                pairs: mine.len(),
                worse,
                better,
                median: unorient(crate::stats::median(&mine)),
                reference_median: unorient(crate::stats::median(&theirs)),
                never_arm,
                never_reference,
                p,
                p_holm: p,
            });
        }
    }
    let adjusted = holm(&out.iter().map(|r| r.p).collect::<Vec<_>>());
    for (r, p) in out.iter_mut().zip(adjusted) {
        r.p_holm = p;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_good_range_is_contiguous_around_the_best() {
        // Best 20 at index 2; index 1 within 2× (40), index 0 not (60), index 3 never.
        let v = [60.0, 40.0, 20.0, f64::INFINITY];
        assert_eq!(good_range(&v, 2), (1, 2));
        assert_eq!(width(&v), Some(1));
        // A gap breaks the range: index 0 is within 2× but index 1 is not.
        let v = [30.0, 50.0, 20.0, 35.0];
        assert_eq!(good_range(&v, 2), (2, 3));
        // Nothing reached: no width at all (not a width of 0).
        assert_eq!(width(&[f64::INFINITY; 4]), None);
        assert_eq!(argmin(&[f64::INFINITY, 3.0, 3.0]), Some(1));
    }

    #[test]
    fn lr_sensitivity_is_the_mean_excess_over_the_best_capped_at_the_start() {
        // Best 0.1; 2.0 is worse than the start (1.0): capped there; NaN (diverged) too.
        let s = lr_sensitivity(&[0.1, 0.3, 2.0, f64::NAN], 1.0);
        assert!((s - (0.0 + 0.2 + 0.9 + 0.9) / 4.0).abs() < 1e-12, "{s}");
        assert_eq!(lr_sensitivity(&[0.5, 0.5], 1.0), 0.0);
    }
}
