//! `training`'s analysis: the chosen learning rates, the paired statistics of every comparison
//! (stuck at the budget with McNemar's exact test, failed runs, Kaplan–Meier medians, the sign
//! test and the median paired difference with censored runs ranked last, Holm within each claim's
//! family of conditions, Bonferroni for the intervals a claim decides on), the
//! q/k std of the premise, and the initial-logit mechanism.

use serde::Serialize;

use super::design::{Comparison, Condition, FAILED_ACCURACY, Part, Sizes};
pub use super::mechanism::Mechanism;
use super::mechanism::time;
pub use super::rates::Tuned;
pub use super::sweep::{Curve, SeedMeasure, Sensitivity, SweepPoint};
use super::{Role, Run};
use crate::experiment::Plan;
use crate::measures::training::{Arm, TrainingOutcome};
use crate::stats::hypothesis::{bounded_median_ci, holm, mcnemar_exact, median_ci, sign_test};
use crate::stats::survival::{KmMedian, Observation, km_median};
use crate::stats::{
    Estimate, bonferroni_level, mean, mean_ci, mean_interval, wilson, wilson_interval,
};

/// The paired statistics of one comparison.
#[derive(Debug, Clone, Serialize)]
pub struct PairStats {
    /// What is compared.
    pub comparison: Comparison,
    /// The reference arm's learning rate.
    pub lr_reference: f64,
    /// The other arm's learning rate.
    pub lr_other: f64,
    /// Whether the reference arm's rate is an end of its grid (the best rate may lie beyond).
    pub reference_lr_at_edge: bool,
    /// The other arm's.
    pub other_lr_at_edge: bool,
    /// Conditions in this comparison's family (the same arms and optimizer over every
    /// initialization and d_k): what Holm and the Bonferroni intervals correct for.
    pub family: usize,
    /// Seeds with both arms.
    pub pairs: usize,
    /// The budget.
    pub budget: usize,
    /// Share of the reference arm's runs stuck (not at the target by the budget), Wilson.
    pub reference_stuck: Estimate,
    /// The other arm's.
    pub other_stuck: Estimate,
    /// Pairs where only the reference was stuck.
    pub only_reference_stuck: usize,
    /// Pairs where only the other was stuck.
    pub only_other_stuck: usize,
    /// McNemar's exact two-sided p.
    pub mcnemar_p: f64,
    /// Holm-adjusted across the family.
    pub mcnemar_p_holm: f64,
    /// Share of the other arm's runs that failed completely (held-out accuracy at the budget
    /// below [`FAILED_ACCURACY`], or diverged), Wilson, family-wise 95% (Bonferroni).
    pub other_failed: Estimate,
    /// Kaplan–Meier median steps to the target, reference arm.
    pub reference_km: KmMedian,
    /// The other arm's.
    pub other_km: KmMedian,
    /// Pairs where the other arm got there later (a run that never did ranked last).
    pub other_slower: usize,
    /// Pairs where it got there sooner.
    pub other_faster: usize,
    /// Ties (same step, or neither got there).
    pub ties: usize,
    /// The sign test's exact two-sided p.
    pub sign_p: f64,
    /// Holm-adjusted across the family.
    pub sign_p_holm: f64,
    /// Median paired difference other − reference in steps (±∞ where one arm never got
    /// there; pairs where neither did are left out: their difference is unknown), 95%
    /// order-statistics interval.
    pub difference: Estimate,
    /// Median paired ratio of the steps to the target, other / reference, with a run that never
    /// got there censored at the budget: a pair where only the other never did has a ratio of
    /// at least budget / reference steps (a lower bound, not ∞), one where only the reference
    /// never did at most other steps / budget, one where neither did anything. `value` is the
    /// median of the lower bounds; the family-wise 95% interval (Bonferroni) takes its lower end
    /// from the lower bounds and its upper end from the upper bounds
    /// ([`bounded_median_ci`]).
    pub ratio: Estimate,
    /// The median of the ratios' upper bounds (the sample median is at most this; ∞ when over
    /// half the pairs are censored above).
    pub ratio_upper_median: f64,
    /// Pairs whose ratio is only bounded (a member never got there).
    pub ratio_censored: usize,
    /// The median paired difference's interval at the family-wise 90% level: what the earlier
    /// ±30-step equivalence test read (shown beside the ratio test, see `EQUIVALENCE_RATIO`).
    pub difference_tost: (f64, f64),
    /// The same median ratio's interval at the family-wise 90% level (Bonferroni), from the same
    /// bounds: what the equivalence test reads.
    pub ratio_tost: (f64, f64),
}

/// One evaluation run, flattened (CSV, mechanism plot, premise).
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    /// The condition.
    pub condition: Condition,
    /// The arm.
    pub arm: Arm,
    /// Seed.
    pub seed: u64,
    /// Learning rate.
    pub lr: f64,
    /// Budget.
    pub budget: usize,
    /// The outcome.
    pub outcome: TrainingOutcome,
}

impl RunRow {
    /// A measured run, flattened.
    pub fn of(r: &Run) -> Self {
        let s = &r.config.spec;
        Self {
            condition: Condition::of(s),
            arm: s.arm,
            seed: s.seed,
            lr: s.lr,
            budget: s.budget,
            outcome: r.result.clone(),
        }
    }
}

/// q/k component std at the start and the end of training, over an arm's runs.
#[derive(Debug, Clone, Serialize)]
pub struct PremiseRow {
    /// The condition.
    pub condition: Condition,
    /// The arm.
    pub arm: Arm,
    /// Query std at initialization.
    pub query_initial: Estimate,
    /// Key std at initialization.
    pub key_initial: Estimate,
    /// Query std at the end.
    pub query_final: Estimate,
    /// Key std at the end.
    pub key_final: Estimate,
    /// Query std at the end over at initialization, per run (mean, 95%): what training did.
    pub query_change: Estimate,
    /// The same for the key.
    pub key_change: Estimate,
}

/// What `render` draws and the claims read.
#[derive(Debug, Clone, Serialize)]
pub struct TrainingData {
    /// The sizes.
    pub sizes: Sizes,
    /// The tuning.
    pub tuned: Vec<Tuned>,
    /// Every comparison.
    pub comparisons: Vec<PairStats>,
    /// Every evaluation run.
    pub runs: Vec<RunRow>,
    /// The premise's q/k std.
    pub premise: Vec<PremiseRow>,
    /// The mechanism, within each d_k.
    pub mechanism: Vec<Mechanism>,
    /// Every tuned arm's learning-rate curve.
    pub curves: Vec<Curve>,
    /// The sweep's arms against 1/√d_k, seed by seed: widths, learning-rate sensitivity, loss at
    /// the best rate.
    pub sensitivity: Vec<Sensitivity>,
    /// The confirmatory run's hypotheses computed on this run's main part (the same rules, this
    /// run's seeds and budget), for the report to set beside the confirmatory outcome.
    pub hypotheses: Option<crate::experiments::training_confirm::hypotheses::Hypotheses>,
}

/// Whether a run failed completely: it never reached the target and its held-out accuracy at
/// the budget is below [`FAILED_ACCURACY`], or it diverged (NaN).
pub fn failed(o: &TrainingOutcome) -> bool {
    stuck_below(o.steps_to_target, o.final_accuracy, FAILED_ACCURACY)
}

/// Whether a run never reached the target (`steps` is `None`) and ended with held-out accuracy
/// below `threshold`, or diverged (NaN accuracy, which fails every comparison).
pub fn stuck_below(steps: Option<usize>, final_accuracy: f64, threshold: f64) -> bool {
    steps.is_none()
        && final_accuracy
            .partial_cmp(&threshold)
            .is_none_or(|c| c == std::cmp::Ordering::Less)
}

fn eval_runs(cells: &[Run], condition: Condition, arm: Arm) -> Vec<&Run> {
    let mut rs: Vec<&Run> = cells
        .iter()
        .filter(|r| {
            let s = &r.config.spec;
            r.config.role == Role::Evaluation && s.arm == arm && Condition::of(s) == condition
        })
        .collect();
    rs.sort_by_key(|r| r.config.spec.seed);
    rs
}

/// The paired statistics of one comparison in a family of `family` conditions (Holm left at
/// the raw p; the grid edges unset: both are filled in by [`data`]).
pub fn pair_stats(cells: &[Run], comparison: Comparison, family: usize) -> Option<PairStats> {
    let reference = eval_runs(cells, comparison.condition, comparison.reference);
    let other = eval_runs(cells, comparison.condition, comparison.other);
    let pairs: Vec<(&TrainingOutcome, &TrainingOutcome)> = reference
        .iter()
        .filter_map(|a| {
            other
                .iter()
                .find(|b| b.config.spec.seed == a.config.spec.seed)
                .map(|b| (&a.result, &b.result))
        })
        .collect();
    if pairs.is_empty() {
        return None;
    }
    let n = pairs.len();
    let stuck = |o: &TrainingOutcome| o.steps_to_target.is_none();
    let count = |f: &dyn Fn(&(&TrainingOutcome, &TrainingOutcome)) -> bool| {
        pairs.iter().filter(|p| f(p)).count()
    };
    let only_reference_stuck = count(&|(a, b)| stuck(a) && !stuck(b));
    let only_other_stuck = count(&|(a, b)| !stuck(a) && stuck(b));
    let other_slower = count(&|(a, b)| time(b) > time(a));
    let other_faster = count(&|(a, b)| time(b) < time(a));
    let differences: Vec<f64> = pairs
        .iter()
        .filter(|(a, b)| !(stuck(a) && stuck(b)))
        .map(|(a, b)| {
            if time(a) == time(b) {
                0.0
            } else {
                time(b) - time(a)
            }
        })
        .collect();
    let budget = reference[0].config.spec.budget;
    // Each pair's ratio as the bounds the budget allows (see `PairStats::ratio`).
    let ratio_bounds: Vec<(f64, f64)> = pairs
        .iter()
        .map(|(a, b)| match (a.steps_to_target, b.steps_to_target) {
            (Some(a), Some(b)) => (b as f64 / a as f64, b as f64 / a as f64),
            (Some(a), None) => (budget as f64 / a as f64, f64::INFINITY),
            (None, Some(b)) => (0.0, b as f64 / budget as f64),
            (None, None) => (0.0, f64::INFINITY),
        })
        .collect();
    let ratio_censored = count(&|(a, b)| stuck(a) || stuck(b));
    // A run that never got there is censored at the budget, a diverged one included (it
    // stopped early, but it would never have reached the target).
    let km = |arm: &[(&TrainingOutcome, &TrainingOutcome)], first: bool| {
        let obs: Vec<Observation> = arm
            .iter()
            .map(|(a, b)| {
                let o = if first { a } else { b };
                Observation {
                    time: o.steps_to_target.unwrap_or(budget) as f64,
                    reached: o.steps_to_target.is_some(),
                }
            })
            .collect();
        km_median(&obs)
    };
    let level95 = bonferroni_level(0.95, family);
    let n_failed = count(&|(_, b)| failed(b));
    let (fail_lo, fail_hi) = wilson_interval(n_failed, n, level95);
    let (ratio, ratio_upper_median) = bounded_median_ci(&ratio_bounds, level95);
    let sign_p = sign_test(other_slower, other_faster);
    let mcnemar_p = mcnemar_exact(only_reference_stuck, only_other_stuck);
    Some(PairStats {
        comparison,
        lr_reference: reference[0].config.spec.lr,
        lr_other: other[0].config.spec.lr,
        reference_lr_at_edge: false,
        other_lr_at_edge: false,
        family,
        pairs: n,
        budget,
        reference_stuck: wilson(count(&|(a, _)| stuck(a)), n),
        other_stuck: wilson(count(&|(_, b)| stuck(b)), n),
        only_reference_stuck,
        only_other_stuck,
        mcnemar_p,
        mcnemar_p_holm: mcnemar_p,
        other_failed: Estimate {
            value: n_failed as f64 / n as f64,
            lo: fail_lo,
            hi: fail_hi,
            n,
            ci90: Some(wilson_interval(n_failed, n, bonferroni_level(0.90, family))),
        },
        reference_km: km(&pairs, true),
        other_km: km(&pairs, false),
        other_slower,
        other_faster,
        ties: n - other_slower - other_faster,
        sign_p,
        sign_p_holm: sign_p,
        difference: median_ci(&differences, 0.95),
        ratio,
        ratio_upper_median,
        ratio_censored,
        ratio_tost: {
            let (e, _) = bounded_median_ci(&ratio_bounds, bonferroni_level(0.90, family));
            (e.lo, e.hi)
        },
        difference_tost: {
            let e = median_ci(&differences, bonferroni_level(0.90, family));
            (e.lo, e.hi)
        },
    })
}

/// A comparison's family: the same part, arms and optimizer, over every initialization and
/// d_k (one claim's conditions).
fn family_key(c: &Comparison) -> String {
    format!(
        "{:?}{:?}{:?}{:?}",
        c.part, c.reference, c.other, c.condition.optimizer
    )
}

/// The size of a comparison's family in the design.
pub fn family_size(all: &[Comparison], c: &Comparison) -> usize {
    let key = family_key(c);
    all.iter().filter(|o| family_key(o) == key).count()
}

/// Holm's correction within each family.
pub fn adjust(stats: &mut [PairStats]) {
    let families: Vec<String> = {
        let mut f: Vec<String> = stats.iter().map(|s| family_key(&s.comparison)).collect();
        f.sort();
        f.dedup();
        f
    };
    for f in families {
        let idx: Vec<usize> = (0..stats.len())
            .filter(|&i| family_key(&stats[i].comparison) == f)
            .collect();
        let sign = holm(&idx.iter().map(|&i| stats[i].sign_p).collect::<Vec<_>>());
        let mcnemar = holm(&idx.iter().map(|&i| stats[i].mcnemar_p).collect::<Vec<_>>());
        for (k, &i) in idx.iter().enumerate() {
            stats[i].sign_p_holm = sign[k];
            stats[i].mcnemar_p_holm = mcnemar[k];
        }
    }
}

/// A mean with family-wise intervals: 95% and 90% (what TOST reads), Bonferroni over `k`.
fn family_mean(x: &[f64], k: usize) -> Estimate {
    let (lo, hi) = mean_interval(x, bonferroni_level(0.95, k));
    Estimate {
        value: mean(x),
        lo,
        hi,
        n: x.len(),
        ci90: Some(mean_interval(x, bonferroni_level(0.90, k))),
    }
}

fn premise(cells: &[Run], sizes: &Sizes) -> Vec<PremiseRow> {
    let mut out = Vec::new();
    // The premise is decided on the 1/√d_k arm of every Adam condition, for q and for k.
    let decided = 2 * sizes
        .arms()
        .iter()
        .filter(|(c, a)| *a == Arm::Scaled && c.optimizer == sdpa_model::OptimizerKind::Adam)
        .count();
    for (condition, arm) in sizes.arms() {
        let rs = eval_runs(cells, condition, arm);
        // Adam only: the premise is about trained models, and SGD's diverging runs say nothing
        // about it.
        if rs.is_empty()
            || !matches!(arm, Arm::Scaled | Arm::Unscaled)
            || condition.optimizer != sdpa_model::OptimizerKind::Adam
        {
            continue;
        }
        let values =
            |f: fn(&TrainingOutcome) -> f64| rs.iter().map(|r| f(&r.result)).collect::<Vec<_>>();
        let ci = |f: fn(&TrainingOutcome) -> f64| mean_ci(&values(f));
        out.push(PremiseRow {
            condition,
            arm,
            query_initial: ci(|o| o.initial.query_std),
            key_initial: ci(|o| o.initial.key_std),
            query_final: family_mean(&values(|o| o.last.query_std), decided),
            key_final: family_mean(&values(|o| o.last.key_std), decided),
            query_change: ci(|o| o.last.query_std / o.initial.query_std),
            key_change: ci(|o| o.last.key_std / o.initial.key_std),
        });
    }
    out
}

/// The tables (the claims are decided from them in `claims.rs`).
pub fn data(plan: &Plan, cells: &[Run]) -> TrainingData {
    let sizes = Sizes::new(plan.quick);
    let tuned = super::rates::tuned_table(&sizes, cells);
    let design = sizes.comparisons();
    let mut comparisons: Vec<PairStats> = design
        .iter()
        .filter_map(|c| pair_stats(cells, *c, family_size(&design, c)))
        .collect();
    adjust(&mut comparisons);
    let at_edge = |condition: Condition, arm: Arm| {
        let grid = sizes.lrs(condition.optimizer);
        tuned
            .iter()
            .find(|t: &&Tuned| t.condition == condition && t.arm == arm)
            .and_then(|t| t.chosen)
            .is_some_and(|lr| grid.len() > 1 && (lr == grid[0] || lr == grid[grid.len() - 1]))
    };
    for s in &mut comparisons {
        let c = s.comparison;
        s.reference_lr_at_edge = at_edge(c.condition, c.reference);
        s.other_lr_at_edge = at_edge(c.condition, c.other);
    }
    let runs: Vec<RunRow> = cells
        .iter()
        .filter(|r| r.config.role == Role::Evaluation)
        .map(RunRow::of)
        .collect();
    let curves = super::sweep::curves(cells, &sizes);
    let sensitivity = [
        SeedMeasure::Width,
        SeedMeasure::LrSensitivity,
        SeedMeasure::LossAtBest,
    ]
    .into_iter()
    .flat_map(|measure| {
        super::sweep::sensitivities(
            &curves,
            &sizes,
            &[Arm::Unscaled, Arm::InvDk, Arm::QkNorm],
            measure,
        )
    })
    .collect();
    let main: Vec<&PairStats> = comparisons
        .iter()
        .filter(|s| {
            s.comparison.part == Part::Main
                && s.comparison.reference == Arm::Scaled
                && s.comparison.other == Arm::Unscaled
        })
        .collect();
    let hypotheses = {
        use crate::experiments::training_confirm::hypotheses::hypotheses;
        hypotheses(&pairs_of(&runs, &main))
    };
    TrainingData {
        hypotheses,
        premise: premise(cells, &sizes),
        mechanism: super::mechanism::mechanism(cells, &sizes.main_dims),
        curves,
        sensitivity,
        sizes,
        tuned,
        comparisons,
        runs,
    }
}

/// The comparisons of one part.
pub fn of_part(data: &TrainingData, part: Part) -> impl Iterator<Item = &PairStats> {
    data.comparisons
        .iter()
        .filter(move |s| s.comparison.part == part)
}

/// The premise's cutoff in this run (one rule for every claim about attention without the
/// scale, `training_confirm2::design::PREMISE`): the median starting logit std of the unscaled
/// runs of the article's own example (unit init, d_k 64, Adam) in this run; where this run has
/// no such runs, the article's own 8 (√64).
pub fn premise_std(data: &TrainingData) -> f64 {
    use crate::experiments::training_confirm2::design::ARTICLE_EXAMPLE;
    let stds: Vec<f64> = data
        .runs
        .iter()
        .filter(|r| {
            (r.condition.init, r.condition.d_k) == ARTICLE_EXAMPLE
                && r.condition.optimizer == sdpa_model::OptimizerKind::Adam
                && r.arm == Arm::Unscaled
        })
        .map(|r| r.outcome.initial.logit_std)
        .filter(|x| x.is_finite())
        .collect();
    if stds.is_empty() {
        super::design::SATURATED_LOGIT_STD
    } else {
        crate::stats::median(&stds)
    }
}

/// The median initial logit std of a condition's unscaled runs (`None` when none is finite).
pub fn unscaled_start_std(data: &TrainingData, s: &PairStats) -> Option<f64> {
    let stds: Vec<f64> = data
        .runs
        .iter()
        .filter(|r| r.condition == s.comparison.condition && r.arm == Arm::Unscaled)
        .map(|r| r.outcome.initial.logit_std)
        .filter(|x| x.is_finite())
        .collect();
    (!stds.is_empty()).then(|| crate::stats::median(&stds))
}

/// The pairs behind a set of paired comparisons' runs: every seed run by both arms.
pub fn pairs_of(
    runs: &[RunRow],
    stats: &[&PairStats],
) -> Vec<crate::experiments::training_confirm::hypotheses::Pair> {
    use crate::measures::training::Arm;
    let mut out = Vec::new();
    for s in stats {
        let c = s.comparison.condition;
        let of = |arm: Arm| {
            runs.iter()
                .filter(move |r| r.condition == c && r.arm == arm)
                .collect::<Vec<_>>()
        };
        let unscaled = of(Arm::Unscaled);
        for a in of(Arm::Scaled) {
            if let Some(u) = unscaled.iter().find(|u| u.seed == a.seed) {
                out.push(crate::experiments::training_confirm::hypotheses::Pair {
                    init: c.init,
                    d_k: c.d_k,
                    scaled: a.outcome.steps_to_target,
                    unscaled: u.outcome.steps_to_target,
                    unscaled_near_chance: failed(&u.outcome),
                    scaled_near_chance: failed(&a.outcome),
                    budget: a.budget,
                });
            }
        }
    }
    out
}
