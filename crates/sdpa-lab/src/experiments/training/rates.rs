//! Where `training`'s learning rates come from: the rule that picks one from tuning runs
//! ([`pick_lr`]), and the rates that rule picked in the full sweep, committed here
//! ([`COMMITTED_LRS`]) so that the default report need not run the sweep again.
//!
//! The sweep (7 rates × 5 tuning seeds for every tuned arm: 1 400 runs, about 33 minutes of
//! the 2-core machine) is the largest part of the report. Its seeds, grid and rule are fixed and
//! the runs are deterministic, so it picks the same rates every time it runs on the same code;
//! the default report therefore evaluates at the committed rates, and `sdpa report --tune`
//! runs the sweep (its learning-rate curves and sensitivity claims come with it) and evaluates
//! at the rates it picks, printing any that differ from these.

use sdpa_model::{OptimizerKind, QkInit};
use serde::Serialize;

use super::design::{Condition, Sizes};
use super::{Role, Run};
use crate::measures::training::Arm;

/// The rate every evaluated (condition, arm) of the full design trains at, as the full sweep
/// chose it by [`pick_lr`]: (optimizer, initialization, d_k, arm, rate). Copied from the
/// evaluation runs of the report measured at commit 5a13d16 (`docs/report` until the commit
/// that added this table), whose sweep ran on the same seeds, grid and rule. An arm that
/// trains at another arm's rate ([`Arm::rate_arm`]) is not listed: it takes that arm's rate.
pub const COMMITTED_LRS: [(OptimizerKind, QkInit, usize, Arm, f64); 33] = {
    use Arm::*;
    use OptimizerKind::{Adam, Sgd};
    use QkInit::{Default as D, Unit as U};
    [
        (Adam, D, 16, Scaled, 0.01),
        (Adam, D, 16, Unscaled, 0.01),
        (Adam, D, 64, Scaled, 0.01),
        (Adam, D, 64, Unscaled, 0.003),
        (Adam, D, 64, InvDk, 0.01),
        (Adam, D, 64, Learned, 0.01),
        (Adam, D, 64, UnscaledSmallInit, 0.003),
        (Adam, D, 256, Scaled, 0.01),
        (Adam, D, 256, Unscaled, 0.003),
        (Adam, D, 256, InvDk, 0.01),
        (Adam, D, 256, Learned, 0.003),
        (Adam, D, 256, UnscaledSmallInit, 0.003),
        (Adam, D, 1024, Scaled, 0.01),
        (Adam, D, 1024, Unscaled, 0.003),
        (Adam, U, 16, Scaled, 0.01),
        (Adam, U, 16, Unscaled, 0.01),
        (Adam, U, 64, Scaled, 0.01),
        (Adam, U, 64, Unscaled, 0.003),
        (Adam, U, 64, InvDk, 0.03),
        (Adam, U, 64, Learned, 0.003),
        (Adam, U, 64, UnscaledSmallInit, 0.003),
        (Adam, U, 256, Scaled, 0.01),
        (Adam, U, 256, Unscaled, 0.001),
        (Adam, U, 256, InvDk, 0.03),
        (Adam, U, 256, Learned, 0.01),
        (Adam, U, 256, UnscaledSmallInit, 0.003),
        (Adam, U, 256, SoftCap(super::design::SOFTCAP), 0.001),
        (Adam, U, 256, QkNorm, 0.003),
        (Adam, U, 256, QkNormScaled, 0.003),
        (Adam, U, 1024, Scaled, 0.003),
        (Adam, U, 1024, Unscaled, 0.001),
        (Sgd, U, 64, Scaled, 0.3),
        (Sgd, U, 64, Unscaled, 0.1),
    ]
};

/// The committed rate of `arm` (or of the arm whose rate it takes) in `condition`; `None` where
/// the full design evaluates no such arm (the quick design's controls at d_k = 64, say).
pub fn committed_lr(condition: Condition, arm: Arm) -> Option<f64> {
    let arm = arm.rate_arm();
    COMMITTED_LRS
        .iter()
        .find(|(o, i, d, a, _)| {
            (*o, *i, *d, *a) == (condition.optimizer, condition.init, condition.d_k, arm)
        })
        .map(|e| e.4)
}

/// The rule that chooses a learning rate from tuning runs, given each rate's runs as (steps to
/// the target or `None`, budget): the fewest runs that never reached the target, then the
/// fewest steps (a run that never got there counting its budget), then the smaller rate.
/// Rates without runs are skipped; `None` when no rate has any.
pub fn pick_lr(grid: &[f64], runs_at: impl Fn(f64) -> Vec<(Option<usize>, usize)>) -> Option<f64> {
    grid.iter()
        .copied()
        .filter_map(|lr| {
            let rs = runs_at(lr);
            (!rs.is_empty()).then(|| {
                let censored = rs.iter().filter(|(s, _)| s.is_none()).count();
                let total: usize = rs.iter().map(|(s, budget)| s.unwrap_or(*budget)).sum();
                (censored, total, lr)
            })
        })
        .min_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)).then(a.2.total_cmp(&b.2)))
        .map(|(_, _, lr)| lr)
}

/// The learning rate chosen for one (condition, arm) from its tuning runs, by [`pick_lr`].
/// `None` when no tuning run of it is given.
pub fn tuned_lr(runs: &[&Run], condition: Condition, arm: Arm, grid: &[f64]) -> Option<f64> {
    pick_lr(grid, |lr| tuning_runs(runs, condition, arm, lr))
}

/// (steps to the target, budget) of the tuning runs of (condition, arm) at `lr`.
fn tuning_runs(
    runs: &[&Run],
    condition: Condition,
    arm: Arm,
    lr: f64,
) -> Vec<(Option<usize>, usize)> {
    runs.iter()
        .filter(|r| {
            let s = &r.config.spec;
            r.config.role == Role::Tuning
                && s.arm == arm
                && s.lr == lr
                && Condition::of(s) == condition
        })
        .map(|r| (r.result.steps_to_target, r.config.spec.budget))
        .collect()
}

/// Where an arm's evaluation rate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RateSource {
    /// This run's tuning runs chose it.
    Tuned,
    /// [`COMMITTED_LRS`] (the sweep did not run: no `--tune`).
    Committed,
}

/// Whether the plan tunes `(condition, arm)` (stage 1): every tuned arm with `--tune`;
/// otherwise only an evaluated arm without a committed rate (none in the full design).
pub fn tunes(tune: bool, sizes: &Sizes, condition: Condition, arm: Arm) -> bool {
    tune || (sizes.arms().contains(&(condition, arm)) && committed_lr(condition, arm).is_none())
}

/// The rate the evaluation runs of (condition, arm) train at: the tuning runs' choice with
/// `--tune` (or where no rate is committed), else the committed one.
pub fn evaluation_lr(
    tune: bool,
    tuning: &[&Run],
    condition: Condition,
    arm: Arm,
    grid: &[f64],
) -> Option<(f64, RateSource)> {
    let tuned =
        || tuned_lr(tuning, condition, arm.rate_arm(), grid).map(|lr| (lr, RateSource::Tuned));
    if tune {
        tuned()
    } else {
        committed_lr(condition, arm)
            .map(|lr| (lr, RateSource::Committed))
            .or_else(tuned)
    }
}

/// The learning rate an arm got.
#[derive(Debug, Clone, Serialize)]
pub struct Tuned {
    /// The condition.
    pub condition: Condition,
    /// The arm.
    pub arm: Arm,
    /// Per rate of the grid: (rate, tuning runs that never reached the target, total steps);
    /// empty when this run did not tune the arm.
    pub scores: Vec<(f64, usize, usize)>,
    /// The rate its evaluation runs trained at.
    pub chosen: Option<f64>,
    /// Where that rate came from.
    pub source: Option<RateSource>,
    /// The committed rate, where one is committed: with `--tune`, a rate the sweep chose
    /// differently shows here.
    pub committed: Option<f64>,
}

/// Every evaluated arm's rate: read from its evaluation runs (the rate they trained at), with
/// where it came from (tuning runs of it in `cells`, or the committed table).
pub fn tuned_table(sizes: &Sizes, cells: &[Run]) -> Vec<Tuned> {
    let all: Vec<&Run> = cells.iter().collect();
    sizes
        .arms()
        .into_iter()
        .map(|(condition, arm)| {
            let grid = sizes.lrs(condition.optimizer);
            let scores: Vec<(f64, usize, usize)> = grid
                .iter()
                .map(|&lr| {
                    let rs = tuning_runs(&all, condition, arm.rate_arm(), lr);
                    let stuck = rs.iter().filter(|(s, _)| s.is_none()).count();
                    let total = rs.iter().map(|(s, b)| s.unwrap_or(*b)).sum();
                    (lr, rs.len(), stuck, total)
                })
                .filter(|(_, n, _, _)| *n > 0)
                .map(|(lr, _, stuck, total)| (lr, stuck, total))
                .collect();
            let chosen = cells
                .iter()
                .find(|r| {
                    let s = &r.config.spec;
                    r.config.role == Role::Evaluation
                        && s.arm == arm
                        && Condition::of(s) == condition
                })
                .map(|r| r.config.spec.lr);
            let source = chosen.map(|_| {
                if scores.is_empty() {
                    RateSource::Committed
                } else {
                    RateSource::Tuned
                }
            });
            Tuned {
                condition,
                arm,
                scores,
                chosen,
                source,
                committed: committed_lr(condition, arm),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_evaluated_arm_of_the_full_design_has_a_committed_rate_on_its_grid() {
        let sizes = Sizes::new(false);
        for (condition, arm) in sizes.arms() {
            let lr = committed_lr(condition, arm)
                .unwrap_or_else(|| panic!("no committed rate for {condition:?} {arm:?}"));
            assert!(sizes.lrs(condition.optimizer).contains(&lr), "{lr}");
            assert!(
                !tunes(false, &sizes, condition, arm),
                "{condition:?} {arm:?}"
            );
        }
        // No entry is dead: each is an evaluated rate arm.
        for (o, i, d, a, _) in COMMITTED_LRS {
            let c = Condition {
                optimizer: o,
                init: i,
                d_k: d,
            };
            assert!(
                sizes.arms().contains(&(c, a)) && a.rate_arm() == a,
                "{c:?} {a:?}"
            );
        }
    }

    #[test]
    fn the_confirmatory_run_reuses_the_committed_rates() {
        use crate::experiments::training_confirm::design::LEARNING_RATES;
        for (init, d_k, scaled, unscaled) in LEARNING_RATES {
            let c = Condition {
                optimizer: OptimizerKind::Adam,
                init,
                d_k,
            };
            assert_eq!(committed_lr(c, Arm::Scaled), Some(scaled), "{c:?}");
            assert_eq!(committed_lr(c, Arm::Unscaled), Some(unscaled), "{c:?}");
        }
    }

    #[test]
    fn the_rule_picks_the_fewest_stuck_then_the_fewest_steps_then_the_smaller_rate() {
        let grid = [0.001, 0.01, 0.1];
        let runs = |lr: f64| match lr {
            0.001 => vec![(Some(50), 300), (None, 300)],
            0.01 => vec![(Some(90), 300), (Some(90), 300)],
            _ => vec![(Some(80), 300), (Some(100), 300)],
        };
        assert_eq!(pick_lr(&grid, runs), Some(0.01));
        assert_eq!(pick_lr(&grid, |_| Vec::new()), None);
    }
}
