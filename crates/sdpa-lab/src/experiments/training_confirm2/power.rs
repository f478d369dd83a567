//! The primary hypothesis's power, by simulation with censoring
//! ([`design::SEEDS`](super::design::SEEDS) says the model): resample the frozen first
//! confirmatory run's pairs, censor them at the new budget, decide hypothesis 1 by its rules.
//! And the level of its «extremely slow» half, by simulation at the design's sizes where the
//! true median slowdown is exactly the boundary ([`level_draws`]).

use rand::{Rng, SeedableRng};
use sdpa_model::QkInit;

use super::design::{
    BUDGET, FROZEN_FIRST_CONFIRM, HALF_ALPHA, POWER, POWER_SIMULATIONS, PREMISE, SEED_CANDIDATES,
    SEEDS,
};
use super::frozen::{FrozenRun, of, parse};
use super::hypotheses::{decide, ratio_median, slow_outcome};
use crate::claims::Outcome;
use crate::experiments::training_confirm::hypotheses::Pair;
use crate::stats::distributions::normal_quantile;

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

/// How the simulated unscaled runs are cut off by the budget in [`level_draws`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Censoring {
    /// Each pair's ratio is drawn apart from its scaled steps: a pair is cut off at
    /// budget / scaled steps whatever its ratio.
    Independent,
    /// The larger a pair's ratio, the faster its scaled run (drawn comonotone from the frozen
    /// steps): a large ratio comes with a high cut-off, the case where Kaplan–Meier's
    /// assumption (that when a pair is cut off says nothing of its ratio) fails.
    TiedToRatio,
}

/// The spread (sd of the natural log) of the simulated paired ratios in [`level_draws`].
pub const LEVEL_LOG_SPREAD: f64 = 1.0;

/// The number of simulated runs behind [`level_draws`].
pub const LEVEL_SIMULATIONS: usize = 2000;

/// One simulated run of [`level_draws`]: how many of its pairs the budget cut off (a stuck
/// run included), the Kaplan–Meier lower end of the median ratio (`None`: not reached), and
/// whether «extremely slow» held.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LevelDraw {
    /// Pairs in the run.
    pub pairs: usize,
    /// Pairs whose unscaled run the budget cut off, stuck ones included.
    pub cut_off: usize,
    /// The 97.5% interval's lower end.
    pub lower_end: Option<f64>,
    /// Whether «extremely slow» held.
    pub holds: bool,
}

/// The level of hypothesis 1b («extremely slow», tested at [`HALF_ALPHA`]) by simulation:
/// `simulations` runs at the design's sizes ([`SEEDS`] pairs per premise condition, the
/// [`BUDGET`]), scaled steps resampled from the frozen first confirmatory run, and the unscaled
/// steps drawn so that the true median paired ratio is `true_ratio`, cut off by the budget as
/// `censoring` says. A share `stuck_share` of the unscaled runs is stuck near chance (never
/// finishing, cut off at the budget); the others' log ratio is normal (sd
/// [`LEVEL_LOG_SPREAD`]) with its median set so that the median over all pairs is still
/// `true_ratio` (a share of ½ or more leaves no such median: no draws). At `true_ratio` =
/// [`SLOW_FACTOR`](super::design::SLOW_FACTOR) and a level of 2.5%, about 2.5% of the runs or
/// fewer should read «holds». Seeded: the same inputs give the same draws.
pub fn level_draws(
    templates: &[Vec<Template>],
    censoring: Censoring,
    (true_ratio, stuck_share): (f64, f64),
    simulations: usize,
    seed: u64,
) -> Vec<LevelDraw> {
    use rand_distr::{Distribution, Normal};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let Ok(noise) = Normal::new(0.0, LEVEL_LOG_SPREAD) else {
        return Vec::new();
    };
    if !(0.0..0.5).contains(&stuck_share) {
        return Vec::new();
    }
    // P(ratio ≤ r) = (1 − stuck) · Φ(−shift / sd) = ½ for the finishing pairs' log median
    // ln r − shift.
    let shift = LEVEL_LOG_SPREAD * normal_quantile(0.5 / (1.0 - stuck_share));
    let mut draws = Vec::with_capacity(simulations);
    for _ in 0..simulations {
        let mut pairs = Vec::with_capacity(SEEDS * templates.len());
        for condition in templates.iter().filter(|c| !c.is_empty()) {
            let mut steps: Vec<usize> = condition.iter().map(|t| t.scaled).collect();
            steps.sort_unstable();
            for _ in 0..SEEDS {
                let (scaled, z) = match censoring {
                    Censoring::Independent => (
                        condition[rng.random_range(0..condition.len())].scaled,
                        noise.sample(&mut rng),
                    ),
                    // Comonotone: the larger z, the faster the scaled run (a lower quantile of
                    // the frozen steps), so the higher the pair's cut-off budget / scaled.
                    Censoring::TiedToRatio => {
                        let q: f64 = rng.random_range(1e-9..1.0 - 1e-9);
                        let z = LEVEL_LOG_SPREAD * normal_quantile(q);
                        let idx = (((1.0 - q) * steps.len() as f64) as usize).min(steps.len() - 1);
                        (steps[idx], z)
                    }
                };
                let stuck = rng.random_range(0.0..1.0) < stuck_share;
                let u = (true_ratio * scaled as f64 * (z - shift).exp()).round() as usize;
                pairs.push(Pair {
                    init: condition[0].condition.0,
                    d_k: condition[0].condition.1,
                    scaled: Some(scaled),
                    unscaled: (!stuck && u <= BUDGET).then_some(u.max(1)),
                    unscaled_near_chance: stuck,
                    scaled_near_chance: false,
                    budget: BUDGET,
                });
            }
        }
        let refs: Vec<&Pair> = pairs.iter().collect();
        let ratio = ratio_median(&refs, 1.0 - HALF_ALPHA);
        draws.push(LevelDraw {
            pairs: pairs.len(),
            cut_off: pairs.iter().filter(|p| p.unscaled.is_none()).count(),
            lower_end: ratio.km.lo,
            holds: slow_outcome(&ratio) == Outcome::Holds,
        });
    }
    draws
}

/// How many of `draws` read «holds», and the share of their pairs the budget cut off.
pub fn level_summary(draws: &[LevelDraw]) -> (usize, f64) {
    let holds = draws.iter().filter(|d| d.holds).count();
    let cut: usize = draws.iter().map(|d| d.cut_off).sum();
    let pairs: usize = draws.iter().map(|d| d.pairs).sum();
    (holds, cut as f64 / pairs.max(1) as f64)
}

/// The seed of the level simulation.
pub const LEVEL_SEED: u64 = 67;

#[cfg(test)]
mod tests {
    use super::super::design::SLOW_FACTOR;
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

    /// The level at the boundary, at the design's sizes: «holds» reads the lower end of a 97.5%
    /// interval, a one-sided 1.25%; at a true 1.25%, more than 40 of 2,000 (25 expected,
    /// binomial sd 5) would come out less than once in 1,000.
    #[test]
    fn extremely_slow_keeps_its_level_at_the_boundary() {
        let t = templates().expect("parses");
        // Stuck shares 0 and 0.4 (the second run had 25 of 60 unscaled runs stuck).
        for (censoring, stuck) in [
            (Censoring::Independent, 0.0),
            (Censoring::TiedToRatio, 0.0),
            (Censoring::Independent, 0.4),
            (Censoring::TiedToRatio, 0.4),
        ] {
            let draws = level_draws(
                &t,
                censoring,
                (SLOW_FACTOR, stuck),
                LEVEL_SIMULATIONS,
                LEVEL_SEED,
            );
            let (holds, cut) = level_summary(&draws);
            eprintln!(
                "{censoring:?}, stuck {stuck}: «extremely slow» holds in {holds} of \
                 {LEVEL_SIMULATIONS}; {:.0}% of pairs cut off",
                100.0 * cut
            );
            assert_eq!(draws.len(), LEVEL_SIMULATIONS);
            assert!(
                holds <= 40,
                "{censoring:?}, {stuck}: {holds} of {LEVEL_SIMULATIONS}"
            );
        }
    }

    /// The same simulation reads «holds» nearly always where the true median slowdown is
    /// well above the boundary (16×): the level above is not low because the test never holds.
    #[test]
    fn the_level_simulation_holds_where_the_slowdown_is_real() {
        let t = templates().expect("parses");
        let draws = level_draws(&t, Censoring::Independent, (16.0, 0.0), 200, LEVEL_SEED);
        let (holds, _) = level_summary(&draws);
        assert!(holds >= 180, "{holds} of 200");
    }
}
