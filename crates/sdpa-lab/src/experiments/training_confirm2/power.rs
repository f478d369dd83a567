//! The primary hypothesis's power, by simulation with censoring
//! ([`design::SEEDS`](super::design::SEEDS) says the model): resample the frozen first
//! confirmatory run's pairs, censor them at the new budget, decide hypothesis 1 by its rules.

use rand::{Rng, SeedableRng};
use sdpa_model::QkInit;

use super::design::{
    BUDGET, FROZEN_FIRST_CONFIRM, POWER, POWER_SIMULATIONS, PREMISE, SEED_CANDIDATES,
};
use super::frozen::{FrozenRun, of, parse};
use super::hypotheses::decide;
use crate::claims::Outcome;
use crate::experiments::training_confirm::hypotheses::Pair;

/// A frozen pair as the simulation reads it: the scaled run's steps, the unscaled run's
/// (`None`: stuck near chance, at any budget).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Template {
    /// Condition.
    pub condition: (QkInit, usize),
    /// 1/√d_k's steps.
    pub scaled: usize,
    /// The unscaled run's steps; one that never got there but ended above chance is taken to
    /// get there one step after its budget.
    pub unscaled: Option<usize>,
}

/// Every premise condition's frozen pairs (paired by seed), as templates.
pub fn templates() -> Result<Vec<Vec<Template>>, String> {
    let runs = parse(FROZEN_FIRST_CONFIRM)?;
    Ok(PREMISE
        .iter()
        .map(|&(init, d_k)| templates_of(&runs, init, d_k))
        .collect())
}

fn templates_of(runs: &[FrozenRun], init: QkInit, d_k: usize) -> Vec<Template> {
    let unscaled = of(runs, init, d_k, false);
    of(runs, init, d_k, true)
        .into_iter()
        .filter_map(|a| {
            let u = unscaled.iter().find(|u| u.seed == a.seed)?;
            let unscaled = match u.steps {
                Some(s) => Some(s),
                // Stuck near chance, or diverged (NaN accuracy): stuck at any budget.
                None if super::runs::near_chance(None, u.final_accuracy) => None,
                None => Some(u.budget + 1),
            };
            Some(Template {
                condition: (init, d_k),
                scaled: a.steps?,
                unscaled,
            })
        })
        .collect()
}

/// One simulated run of `seeds` pairs per condition at `budget`.
pub fn simulate(
    templates: &[Vec<Template>],
    seeds: usize,
    budget: usize,
    rng: &mut impl Rng,
) -> Vec<Pair> {
    let mut pairs = Vec::with_capacity(seeds * templates.len());
    for condition in templates {
        for _ in 0..seeds {
            let t = condition[rng.random_range(0..condition.len())];
            let within = |s: usize| (s <= budget).then_some(s);
            pairs.push(Pair {
                init: t.condition.0,
                d_k: t.condition.1,
                scaled: within(t.scaled),
                unscaled: t.unscaled.and_then(within),
                unscaled_near_chance: t.unscaled.is_none(),
                scaled_near_chance: false,
                budget,
            });
        }
    }
    pairs
}

/// The share of `simulations` simulated runs of `seeds` pairs per condition in which the
/// primary hypothesis holds (a seeded simulation: the same inputs give the same power).
pub fn power(templates: &[Vec<Template>], seeds: usize, simulations: usize, seed: u64) -> f64 {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ seeds as u64);
    let mut holds = 0;
    for _ in 0..simulations {
        let pairs = simulate(templates, seeds, BUDGET, &mut rng);
        let refs: Vec<&Pair> = pairs.iter().collect();
        if decide(&refs).outcomes[2] == Outcome::Holds {
            holds += 1;
        }
    }
    holds as f64 / simulations as f64
}

/// The seed of the power simulation.
pub const POWER_SEED: u64 = 66;

/// Each candidate seed count with its simulated power, up to the first that reaches
/// [`POWER`].
pub fn power_curve() -> Result<Vec<(usize, f64)>, String> {
    let t = templates()?;
    let mut out = Vec::new();
    for n in SEED_CANDIDATES {
        let p = power(&t, n, POWER_SIMULATIONS, POWER_SEED);
        out.push((n, p));
        if p >= POWER {
            break;
        }
    }
    Ok(out)
}

/// The design's rule: the smallest candidate seed count whose power reaches [`POWER`] (`None`
/// when none does).
pub fn seeds_for_power() -> Result<Option<usize>, String> {
    Ok(power_curve()?
        .into_iter()
        .find(|&(_, p)| p >= POWER)
        .map(|(n, _)| n))
}

#[cfg(test)]
mod tests {
    use super::super::design::SEEDS;
    use super::*;

    #[test]
    fn every_premise_condition_has_its_27_frozen_pairs() {
        let t = templates().expect("parses");
        assert_eq!(t.len(), PREMISE.len());
        assert!(
            t.iter().all(|c| c.len() == 27),
            "{:?}",
            t.iter().map(Vec::len).collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_design_seeds_are_the_power_rule_s() {
        let curve = power_curve().expect("parses");
        eprintln!("power by seeds per condition: {curve:?}");
        assert_eq!(seeds_for_power().expect("parses"), Some(SEEDS), "{curve:?}");
    }

    #[test]
    fn a_simulated_run_censors_at_the_budget() {
        let t = vec![vec![Template {
            condition: (QkInit::Unit, 64),
            scaled: 40,
            unscaled: Some(700),
        }]];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let p = simulate(&t, 3, 600, &mut rng);
        assert_eq!(p.len(), 3);
        assert!(
            p.iter()
                .all(|p| p.unscaled.is_none() && !p.unscaled_near_chance)
        );
        let p = simulate(&t, 1, 1500, &mut rng);
        assert_eq!(p[0].unscaled, Some(700));
    }
}
