//! The learning rates of the test runs, chosen from the tuning runs by the design's rules
//! ([`RateScheme`]): each arm's own best rate, and one rate shared by both.

use sdpa_model::QkInit;
use serde::{Deserialize, Serialize};

use super::design::RateScheme;
use super::runs::Row;

/// One rate's tuning scores: the sum of the steps to 99% over the tuning seeds, a run that never
/// got there counting `stuck_cost`; `None` for an arm without tuning runs at it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Score {
    /// The rate.
    pub lr: f64,
    /// 1/√d_k's score.
    pub scaled: Option<usize>,
    /// The unscaled arm's.
    pub unscaled: Option<usize>,
    /// Tuning runs of 1/√d_k that never got there.
    pub scaled_stuck: usize,
    /// Of the unscaled arm.
    pub unscaled_stuck: usize,
}

/// One condition's chosen rates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chosen {
    /// Initialization.
    pub init: QkInit,
    /// d_k.
    pub d_k: usize,
    /// Every rate's scores.
    pub scores: Vec<Score>,
    /// 1/√d_k's own best rate.
    pub own_scaled: f64,
    /// The unscaled arm's own best rate.
    pub own_unscaled: f64,
    /// The shared rate.
    pub shared: f64,
    /// The shared rate's larger regret (score over own best score).
    pub shared_regret: f64,
    /// Whether a chosen rate is the grid's smallest or largest.
    pub at_edge: bool,
}

impl Chosen {
    /// (1/√d_k's rate, the unscaled arm's rate) under `scheme`.
    pub fn rates(&self, scheme: RateScheme) -> (f64, f64) {
        match scheme {
            RateScheme::Own => (self.own_scaled, self.own_unscaled),
            RateScheme::Shared => (self.shared, self.shared),
        }
    }
}

/// An arm's score at `lr`, and its stuck runs; a tuning seed without a run counts as stuck (a
/// rate with missing runs never looks better for it), and no run at all gives no score.
fn score(
    rows: &[&Row],
    scaled: bool,
    lr: f64,
    stuck_cost: usize,
    seeds: usize,
) -> (Option<usize>, usize) {
    let runs: Vec<&&Row> = rows
        .iter()
        .filter(|r| r.scaled == scaled && r.lr == lr)
        .collect();
    if runs.is_empty() {
        return (None, 0);
    }
    let missing = seeds.saturating_sub(runs.len());
    let stuck = runs.iter().filter(|r| r.steps.is_none()).count() + missing;
    (
        Some(
            runs.iter()
                .map(|r| r.steps.unwrap_or(stuck_cost))
                .sum::<usize>()
                + missing * stuck_cost,
        ),
        stuck,
    )
}

/// The rates of one condition from its tuning rows, `seeds` per (arm, rate) (`None` when an arm
/// has no tuning run):
/// own best = the smallest score (ties: the smaller rate); shared = the smallest larger regret
/// (ties: the smaller rate).
pub fn choose(
    init: QkInit,
    d_k: usize,
    tuning: &[&Row],
    grid: &[f64],
    stuck_cost: usize,
    seeds: usize,
) -> Option<Chosen> {
    let rows: Vec<&Row> = tuning
        .iter()
        .copied()
        .filter(|r| r.tuning && r.init == init && r.d_k == d_k)
        .collect();
    let scores: Vec<Score> = grid
        .iter()
        .map(|&lr| {
            let (scaled, scaled_stuck) = score(&rows, true, lr, stuck_cost, seeds);
            let (unscaled, unscaled_stuck) = score(&rows, false, lr, stuck_cost, seeds);
            Score {
                lr,
                scaled,
                unscaled,
                scaled_stuck,
                unscaled_stuck,
            }
        })
        .collect();
    let best = |arm: fn(&Score) -> Option<usize>| {
        scores
            .iter()
            .filter_map(|s| Some((arm(s)?, s.lr)))
            .min_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)))
    };
    let (best_scaled, own_scaled) = best(|s| s.scaled)?;
    let (best_unscaled, own_unscaled) = best(|s| s.unscaled)?;
    let (shared_regret, shared) = scores
        .iter()
        .filter_map(|s| {
            let regret = (s.scaled? as f64 / best_scaled.max(1) as f64)
                .max(s.unscaled? as f64 / best_unscaled.max(1) as f64);
            Some((regret, s.lr))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)))?;
    let edge = |lr: f64| grid.first() == Some(&lr) || grid.last() == Some(&lr);
    Some(Chosen {
        init,
        d_k,
        scores,
        own_scaled,
        own_unscaled,
        shared,
        shared_regret,
        at_edge: edge(own_scaled) || edge(own_unscaled) || edge(shared),
    })
}

/// The rates of every condition of `sizes` from `tuning` (a condition without tuning runs of
/// both arms is left out).
pub fn choose_all(sizes: &super::Sizes, tuning: &[&Row]) -> Vec<Chosen> {
    sizes
        .conditions
        .iter()
        .filter_map(|&(init, d_k)| {
            choose(
                init,
                d_k,
                tuning,
                &sizes.grid,
                sizes.stuck_cost,
                sizes.tuning_seeds,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(scaled: bool, lr: f64, steps: Option<usize>) -> Row {
        Row {
            tuning: true,
            init: QkInit::Unit,
            d_k: 64,
            scaled,
            seed: 1,
            lr,
            budget: 100,
            steps,
            final_accuracy: 1.0,
            initial_logit_std: 1.0,
            near_chance: false,
        }
    }

    #[test]
    fn own_rates_and_the_fair_shared_rate() {
        // scaled: 0.01 best (20), 0.001 at 2× (40); unscaled: 0.001 best (30), 0.01 stuck
        // (200 = 2 × budget): regrets at 0.001: max(2, 1) = 2; at 0.01: max(1, 6.7) = 6.7.
        let rows = [
            row(true, 0.001, Some(40)),
            row(true, 0.01, Some(20)),
            row(false, 0.001, Some(30)),
            row(false, 0.01, None),
        ];
        let refs: Vec<&Row> = rows.iter().collect();
        let c = choose(QkInit::Unit, 64, &refs, &[0.001, 0.01], 200, 1).expect("both arms tuned");
        assert_eq!(
            (c.own_scaled, c.own_unscaled, c.shared),
            (0.01, 0.001, 0.001)
        );
        assert_eq!(c.shared_regret, 2.0);
        assert!(c.at_edge);
        assert_eq!(c.rates(RateScheme::Shared), (0.001, 0.001));
        assert_eq!(c.scores[1].unscaled_stuck, 1);
    }

    #[test]
    fn a_missing_tuning_run_counts_as_stuck() {
        // Two seeds per rate; 0.01 has one fast run and one missing: 5 + 200 > 40 + 40.
        let rows = [
            row(true, 0.001, Some(40)),
            row(true, 0.001, Some(40)),
            row(true, 0.01, Some(5)),
            row(false, 0.001, Some(30)),
            row(false, 0.001, Some(30)),
            row(false, 0.01, Some(30)),
            row(false, 0.01, Some(30)),
        ];
        let refs: Vec<&Row> = rows.iter().collect();
        let c = choose(QkInit::Unit, 64, &refs, &[0.001, 0.01], 200, 2).expect("tuned");
        assert_eq!(c.own_scaled, 0.001);
        assert_eq!(c.scores[1].scaled, Some(205));
        assert_eq!(c.scores[1].scaled_stuck, 1);
    }

    #[test]
    fn ties_go_to_the_smaller_rate_and_an_arm_without_runs_gives_none() {
        let rows = [row(true, 0.001, Some(20)), row(true, 0.01, Some(20))];
        let refs: Vec<&Row> = rows.iter().collect();
        assert!(choose(QkInit::Unit, 64, &refs, &[0.001, 0.01], 200, 1).is_none());
        let rows = [
            row(true, 0.001, Some(20)),
            row(true, 0.01, Some(20)),
            row(false, 0.001, Some(5)),
            row(false, 0.01, Some(5)),
        ];
        let refs: Vec<&Row> = rows.iter().collect();
        let c = choose(QkInit::Unit, 64, &refs, &[0.001, 0.01], 200, 1).expect("tuned");
        assert_eq!(
            (c.own_scaled, c.own_unscaled, c.shared),
            (0.001, 0.001, 0.001)
        );
    }
}
