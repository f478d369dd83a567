//! `training-variants`' rows, paired comparisons and claims (all the lab's: the article trains
//! nothing, and its Q1 sentence is decided in `training`).

use serde::Serialize;

use super::Run;
use super::design::{ARMS, LEARNED_ACCURACY, Sizes, Variant};
use crate::experiments::training::Role;
use crate::measures::training::{Arm, EVAL_EVERY, TrainingOutcome};
use crate::stats::hypothesis::{holm, sign_test};
use crate::stats::median;
use crate::stats::survival::{KmMedian, Observation, km_median};

/// One evaluation run.
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    /// The variant.
    pub variant: Variant,
    /// The arm.
    pub arm: Arm,
    /// Its learning rate.
    pub lr: f64,
    /// Its seed.
    pub seed: u64,
    /// Its step budget.
    pub budget: usize,
    /// What it gave.
    pub outcome: TrainingOutcome,
}

/// One (variant, arm) over its evaluation runs.
#[derive(Debug, Clone, Serialize)]
pub struct ArmRow {
    /// The variant.
    pub variant: Variant,
    /// The arm.
    pub arm: Arm,
    /// The tuned rate.
    pub lr: f64,
    /// The runs' step budget.
    pub budget: usize,
    /// Whether it is an end of the grid (the arm may be under-tuned).
    pub lr_at_edge: bool,
    /// Kaplan–Meier median of the steps to 99%, with its interval.
    pub km: KmMedian,
    /// Medians over the runs: normalized entropy at step 0, the largest logit at step 0 and at
    /// the budget, the held-out accuracy at the budget.
    pub medians: Medians,
}

/// Medians over one (variant, arm)'s runs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Medians {
    /// Normalized entropy at step 0.
    pub initial_entropy: f64,
    /// Largest logit at step 0.
    pub initial_max_logit: f64,
    /// Largest logit at the budget.
    pub final_max_logit: f64,
    /// Held-out accuracy at the budget.
    pub final_accuracy: f64,
}

/// What a paired comparison reads from a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Measure {
    /// Steps to 99% (+∞ when never).
    Steps,
    /// Mean normalized entropy while neither run of the pair has learned ([`early_entropy`]).
    EarlyEntropy,
    /// Largest logit at the budget.
    FinalMaxLogit,
}

impl Measure {
    /// The values of a pair of runs, (unscaled, 1/√d_k) (NaN where a run has none: it
    /// diverged, or recorded no attention, or the pair has no step to compare).
    pub fn of_pair(self, unscaled: &TrainingOutcome, scaled: &TrainingOutcome) -> (f64, f64) {
        match self {
            Measure::Steps => (steps(unscaled), steps(scaled)),
            Measure::EarlyEntropy => {
                let until = learned_at(unscaled).min(learned_at(scaled));
                (early_entropy(unscaled, until), early_entropy(scaled, until))
            }
            Measure::FinalMaxLogit => (final_max_logit(unscaled), final_max_logit(scaled)),
        }
    }
}

/// Steps to 99% (+∞ when never).
fn steps(o: &TrainingOutcome) -> f64 {
    o.steps_to_target.map_or(f64::INFINITY, |s| s as f64)
}

/// The largest logit at the last evaluation (NaN for a run that diverged).
pub fn final_max_logit(o: &TrainingOutcome) -> f64 {
    match (o.diverged_at, o.curve.last()) {
        (None, Some(p)) => p.max_logit,
        _ => f64::NAN,
    }
}

/// The first step whose held-out accuracy reached [`LEARNED_ACCURACY`] (`usize::MAX` when
/// none did).
pub fn learned_at(o: &TrainingOutcome) -> usize {
    o.curve
        .iter()
        .find(|p| p.accuracy >= LEARNED_ACCURACY)
        .map_or(usize::MAX, |p| p.step)
}

/// The unscaled arm against 1/√d_k on one measure in one variant, pair by pair.
#[derive(Debug, Clone, Serialize)]
pub struct Paired {
    /// The variant.
    pub variant: Variant,
    /// The measure.
    pub measure: Measure,
    /// Pairs where the unscaled run's value is the larger.
    pub larger: usize,
    /// Where it is the smaller.
    pub smaller: usize,
    /// Where they are equal (both never at 99% included).
    pub ties: usize,
    /// Pairs without a value in one arm (dropped).
    pub excluded: usize,
    /// Exact two-sided sign test.
    pub p: f64,
    /// Holm-adjusted over the variants.
    pub p_holm: f64,
    /// Median over the unscaled runs.
    pub median_unscaled: f64,
    /// Median over the 1/√d_k runs.
    pub median_scaled: f64,
}

/// What `render` draws.
#[derive(Debug, Clone, Serialize)]
pub struct VariantsData {
    /// The sizes of the design.
    pub sizes: Sizes,
    /// Every evaluation run.
    pub runs: Vec<RunRow>,
    /// Per (variant, arm).
    pub arms: Vec<ArmRow>,
    /// Every paired comparison.
    pub paired: Vec<Paired>,
    /// Whether this run tuned the rates (`--tune`); else they are the committed ones.
    pub tuned: bool,
}

/// The mean normalized entropy over the recorded steps from the first update
/// ([`EVAL_EVERY`]) up to, not including, `until`: for a pair, `until` is the step where the
/// first of its two runs learned ([`learned_at`]), so both arms are read over the same steps
/// while neither has learned (a run's own window would be longer for the arm that learns later,
/// and the entropy falls with time). NaN when there is no such step.
pub fn early_entropy(o: &TrainingOutcome, until: usize) -> f64 {
    let window: Vec<f64> = o
        .curve
        .iter()
        .filter(|p| p.step >= EVAL_EVERY && p.step < until)
        .map(|p| p.entropy)
        .filter(|e| e.is_finite())
        .collect();
    if window.is_empty() {
        f64::NAN
    } else {
        window.iter().sum::<f64>() / window.len() as f64
    }
}

fn runs_of(rows: &[RunRow], variant: Variant, arm: Arm) -> Vec<&RunRow> {
    rows.iter()
        .filter(|r| r.variant == variant && r.arm == arm)
        .collect()
}

fn finite_median(values: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = values.filter(|x| !x.is_nan()).collect();
    if v.is_empty() { f64::NAN } else { median(&v) }
}

fn arm_row(rows: &[RunRow], variant: Variant, arm: Arm, lrs: &[f64]) -> Option<ArmRow> {
    let runs = runs_of(rows, variant, arm);
    let (lr, budget) = runs.first().map(|r| (r.lr, r.budget))?;
    let obs: Vec<Observation> = runs
        .iter()
        .map(|r| Observation {
            time: r.outcome.steps_to_target.unwrap_or(budget) as f64,
            reached: r.outcome.steps_to_target.is_some(),
        })
        .collect();
    let at =
        |f: &dyn Fn(&TrainingOutcome) -> f64| finite_median(runs.iter().map(|r| f(&r.outcome)));
    let first = |o: &TrainingOutcome, f: fn(&crate::measures::training::CurvePoint) -> f64| {
        o.curve.first().map_or(f64::NAN, f)
    };
    Some(ArmRow {
        variant,
        arm,
        lr,
        budget,
        lr_at_edge: lrs.first() == Some(&lr) || lrs.last() == Some(&lr),
        km: km_median(&obs),
        medians: Medians {
            initial_entropy: at(&|o| first(o, |p| p.entropy)),
            initial_max_logit: at(&|o| first(o, |p| p.max_logit)),
            final_max_logit: at(&final_max_logit),
            final_accuracy: at(&|o| o.final_accuracy),
        },
    })
}

/// The unscaled arm against 1/√d_k on `measure` in `variant`, over the seeds both ran
/// (`p_holm` is filled in over the variants by [`analyze`]).
fn paired(rows: &[RunRow], variant: Variant, measure: Measure) -> Option<Paired> {
    let scaled = runs_of(rows, variant, Arm::Scaled);
    let pairs: Vec<(f64, f64)> = runs_of(rows, variant, Arm::Unscaled)
        .iter()
        .filter_map(|u| {
            let s = scaled.iter().find(|s| s.seed == u.seed)?;
            Some(measure.of_pair(&u.outcome, &s.outcome))
        })
        .collect();
    if pairs.is_empty() {
        return None;
    }
    let valid: Vec<(f64, f64)> = pairs
        .iter()
        .copied()
        .filter(|(u, s)| !u.is_nan() && !s.is_nan())
        .collect();
    let larger = valid.iter().filter(|(u, s)| u > s).count();
    let smaller = valid.iter().filter(|(u, s)| u < s).count();
    let p = sign_test(larger, smaller);
    Some(Paired {
        variant,
        measure,
        larger,
        smaller,
        ties: valid.len() - larger - smaller,
        excluded: pairs.len() - valid.len(),
        p,
        p_holm: p,
        median_unscaled: finite_median(valid.iter().map(|v| v.0)),
        median_scaled: finite_median(valid.iter().map(|v| v.1)),
    })
}

/// Rows and paired comparisons.
pub fn data(sizes: Sizes, cells: &[Run]) -> VariantsData {
    let runs: Vec<RunRow> = cells
        .iter()
        .filter(|c| c.config.role == Role::Evaluation)
        .map(|c| RunRow {
            variant: c.config.variant,
            arm: c.config.arm,
            lr: c.config.lr,
            seed: c.config.seed,
            budget: c.config.budget,
            outcome: c.result.clone(),
        })
        .collect();
    let arms = Variant::ALL
        .iter()
        .flat_map(|&v| ARMS.iter().map(move |&a| (v, a)))
        .filter_map(|(v, a)| arm_row(&runs, v, a, &sizes.lrs))
        .collect();
    let mut all = Vec::new();
    for measure in [
        Measure::Steps,
        Measure::EarlyEntropy,
        Measure::FinalMaxLogit,
    ] {
        let mut family: Vec<Paired> = Variant::ALL
            .iter()
            .filter_map(|&v| paired(&runs, v, measure))
            .collect();
        let adjusted = holm(&family.iter().map(|p| p.p).collect::<Vec<_>>());
        for (p, h) in family.iter_mut().zip(adjusted) {
            p.p_holm = h;
        }
        all.extend(family);
    }
    VariantsData {
        sizes,
        runs,
        arms,
        paired: all,
        tuned: cells.iter().any(|c| c.config.role == Role::Tuning),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measures::training::CurvePoint;

    fn outcome(points: &[(f64, f64, f64)], steps: Option<usize>) -> TrainingOutcome {
        TrainingOutcome {
            steps_to_target: steps,
            steps_run: 300,
            final_accuracy: points.last().map_or(0.0, |p| p.0),
            final_loss: 0.1,
            diverged_at: None,
            initial: Default::default(),
            last: Default::default(),
            curve: points
                .iter()
                .enumerate()
                .map(|(i, &(accuracy, entropy, max_logit))| CurvePoint {
                    step: 10 * i,
                    accuracy,
                    loss: 1.0,
                    eval_loss: 1.0,
                    entropy,
                    max_logit,
                })
                .collect(),
            final_temperature: None,
        }
    }

    #[test]
    fn early_entropy_reads_both_runs_of_a_pair_over_the_same_steps() {
        // The unscaled run learns (0.6 ≥ 0.5) at step 30, the scaled one at step 10: the pair's
        // window is [10, 10), empty, so the pair has no value.
        let slow = outcome(
            &[
                (0.1, 0.9, 1.0),
                (0.2, 0.4, 2.0),
                (0.3, 0.2, 3.0),
                (0.6, 0.1, 9.0),
            ],
            Some(30),
        );
        let fast = outcome(&[(0.1, 0.8, 1.0), (0.7, 0.5, 2.0)], Some(10));
        let (u, s) = Measure::EarlyEntropy.of_pair(&slow, &fast);
        assert!(u.is_nan() && s.is_nan());
        // Scaled learns at step 30 too: the window is steps 10 and 20 in both (step 0 and the
        // steps after learning never count, however low the entropy there).
        let other = outcome(
            &[
                (0.1, 0.95, 1.0),
                (0.2, 0.7, 2.0),
                (0.4, 0.5, 3.0),
                (0.9, 0.0, 9.0),
            ],
            Some(30),
        );
        let (u, s) = Measure::EarlyEntropy.of_pair(&slow, &other);
        assert!((u - 0.3).abs() < 1e-12, "{u}");
        assert!((s - 0.6).abs() < 1e-12, "{s}");
        assert_eq!(learned_at(&slow), 30);
        // Never learned: every step after the first update.
        let never = outcome(&[(0.1, 0.2, 1.0), (0.2, 0.4, 1.0), (0.2, 0.6, 1.0)], None);
        assert_eq!(learned_at(&never), usize::MAX);
        assert!((early_entropy(&never, usize::MAX) - 0.5).abs() < 1e-12);
    }

    fn run(variant: Variant, arm: Arm, seed: u64, o: TrainingOutcome) -> RunRow {
        RunRow {
            variant,
            arm,
            lr: 3e-3,
            seed,
            budget: 300,
            outcome: o,
        }
    }

    #[test]
    fn pairs_rank_never_last_and_tie_two_nevers() {
        let mut rows = Vec::new();
        // Seed 0: unscaled never, scaled at 50 (later). Seed 1: both never (tie). Seed 2:
        // unscaled at 40, scaled at 60 (sooner). Seed 3: only scaled ran (no pair).
        for (seed, u, s) in [
            (0, None, Some(50)),
            (1, None, None),
            (2, Some(40), Some(60)),
        ] {
            rows.push(run(
                Variant::Long,
                Arm::Unscaled,
                seed,
                outcome(&[(0.1, 0.5, 1.0)], u),
            ));
            rows.push(run(
                Variant::Long,
                Arm::Scaled,
                seed,
                outcome(&[(0.1, 0.5, 1.0)], s),
            ));
        }
        rows.push(run(
            Variant::Long,
            Arm::Scaled,
            3,
            outcome(&[(0.1, 0.5, 1.0)], Some(10)),
        ));
        let p = paired(&rows, Variant::Long, Measure::Steps).unwrap();
        assert_eq!((p.larger, p.smaller, p.ties, p.excluded), (1, 1, 1, 0));
    }

    #[test]
    fn a_diverged_run_has_no_final_logit() {
        let mut o = outcome(&[(0.1, 0.5, 3.0)], None);
        assert_eq!(final_max_logit(&o), 3.0);
        o.diverged_at = Some(5);
        assert!(final_max_logit(&o).is_nan());
    }
}
