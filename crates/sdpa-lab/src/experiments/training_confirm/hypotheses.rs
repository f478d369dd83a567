//! The confirmatory hypotheses of [`design`](super::design), computed from paired runs: a pure
//! function, applied to the confirmatory run and, for comparison, to the exploratory `training`
//! run's main part (the same rules on its own seeds and budget).

use sdpa_model::QkInit;
use serde::{Deserialize, Serialize};

use super::design::{ALPHA, SATURATED};
use crate::claims::Outcome;
use crate::stats::hypothesis::{bounded_median_ci, mcnemar_exact, sign_test};
use crate::stats::{Estimate, wilson};

/// One paired run's outcome, as the hypotheses read it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Pair {
    /// Initialization.
    pub init: QkInit,
    /// d_k.
    pub d_k: usize,
    /// 1/√d_k's steps to 99% (`None`: never within the budget).
    pub scaled: Option<usize>,
    /// The unscaled run's.
    pub unscaled: Option<usize>,
    /// Whether the unscaled run ended near chance (never at 99%, held-out accuracy below 0.5).
    pub unscaled_near_chance: bool,
    /// Whether the scaled run did (described beside the unscaled count, never tested).
    pub scaled_near_chance: bool,
    /// The budget.
    pub budget: usize,
}

/// The hypotheses' numbers and outcomes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hypotheses {
    /// Pairs in the saturated conditions / in all.
    pub pairs_saturated: usize,
    /// Pairs in every condition.
    pub pairs_all: usize,
    /// The budget.
    pub budget: usize,
    /// 1: (pairs where only the unscaled run is stuck, only the scaled one), exact p, saturated.
    pub stuck_saturated: (usize, usize, f64),
    /// 2: the same over every condition.
    pub stuck_all: (usize, usize, f64),
    /// 3: (pairs where the unscaled run is later, sooner), exact p, saturated.
    pub later_saturated: (usize, usize, f64),
    /// 4: the share of unscaled runs near chance, saturated (Wilson 95%).
    #[serde(with = "estimate_text")]
    pub near_chance: Estimate,
    /// The same share in the scaled arm's runs is not defined the same way; its stuck share is
    /// given instead (Wilson 95%).
    #[serde(with = "estimate_text")]
    pub scaled_stuck: Estimate,
    /// 5: the median paired ratio of steps (bounded), saturated, 95% interval.
    #[serde(with = "estimate_text")]
    pub ratio: Estimate,
    /// The outcomes of hypotheses 1–6, in order.
    pub outcomes: [Outcome; 6],
}

/// An [`Estimate`] whose ends may be infinite (a ratio bounded only from below), kept through
/// `results.json` (JSON has no ∞: each number is written as its text, `inf` included), so that
/// the report can read the hypotheses back from an experiment's data.
mod estimate_text {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::stats::Estimate;

    #[derive(Serialize, Deserialize)]
    struct Text {
        value: String,
        lo: String,
        hi: String,
        n: usize,
    }

    fn number(text: &str) -> f64 {
        text.parse().unwrap_or(f64::NAN)
    }

    pub fn serialize<S: Serializer>(e: &Estimate, serializer: S) -> Result<S::Ok, S::Error> {
        Text {
            value: e.value.to_string(),
            lo: e.lo.to_string(),
            hi: e.hi.to_string(),
            n: e.n,
        }
        .serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Estimate, D::Error> {
        let t = Text::deserialize(deserializer)?;
        Ok(Estimate {
            value: number(&t.value),
            lo: number(&t.lo),
            hi: number(&t.hi),
            n: t.n,
            ci90: None,
        })
    }
}

fn stuck(p: &Pair) -> (bool, bool) {
    (p.unscaled.is_none(), p.scaled.is_none())
}

/// A run's time, a run that never got there ranked last.
fn time(steps: Option<usize>) -> f64 {
    steps.map_or(f64::INFINITY, |s| s as f64)
}

fn mcnemar(pairs: &[&Pair]) -> (usize, usize, f64) {
    let only_unscaled = pairs.iter().filter(|p| stuck(p) == (true, false)).count();
    let only_scaled = pairs.iter().filter(|p| stuck(p) == (false, true)).count();
    (
        only_unscaled,
        only_scaled,
        mcnemar_exact(only_scaled, only_unscaled),
    )
}

/// A one-directional test's outcome: holds when significant in the claimed direction, fails
/// when significant the other way, undecided otherwise.
fn directional((yes, no, p): (usize, usize, f64)) -> Outcome {
    if p >= ALPHA {
        Outcome::Undecided
    } else {
        Outcome::of(Some(yes > no))
    }
}

/// The median paired ratio of steps (unscaled / scaled) with its order-statistics interval at
/// `level`, a run that never got there bounding its pair's ratio; with `cap`, every run is read
/// as if its budget had been `cap` steps (a run that needed more counts as never there).
pub fn slowdown(pairs: &[&Pair], cap: Option<usize>, level: f64) -> Estimate {
    let bounds: Vec<(f64, f64)> = pairs
        .iter()
        .map(|p| {
            let budget = cap.map_or(p.budget, |c| c.min(p.budget));
            let within = |s: Option<usize>| s.filter(|&s| s <= budget);
            let b = budget as f64;
            match (within(p.scaled), within(p.unscaled)) {
                (Some(a), Some(u)) => (u as f64 / a as f64, u as f64 / a as f64),
                (Some(a), None) => (b / a as f64, f64::INFINITY),
                (None, Some(u)) => (0.0, u as f64 / b),
                (None, None) => (0.0, f64::INFINITY),
            }
        })
        .collect();
    bounded_median_ci(&bounds, level).0
}

/// How much «extremely slow» (hypothesis 5) rests on choices made with the exploratory run in
/// view: the same median ratio under a stricter level, a shorter budget, and a wider set of
/// saturated conditions. Not pre-registered: a reading aid, computed by the rules below.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Robustness {
    /// At the 97.5% level: Bonferroni over the sentence's two halves (its «or»).
    #[serde(with = "estimate_text")]
    pub two_halves: Estimate,
    /// Every run read at [`Robustness::short_budget`] steps (95%).
    #[serde(with = "estimate_text")]
    pub short: Estimate,
    /// The exploratory run's budget.
    pub short_budget: usize,
    /// The condition nearest the saturation cutoff below it, counted as saturated too (95%),
    /// with its outcome by hypothesis 5's rule; `None` when it was not run.
    pub with_nearest: Option<(QkInit, usize, Outcome)>,
    /// Its ratio.
    #[serde(with = "estimate_text")]
    pub nearest: Estimate,
}

/// Hypothesis 5's rule on an interval: lower end ≥ 4 holds, upper end < 4 fails.
pub fn slow_outcome(ratio: &Estimate) -> Outcome {
    if ratio.lo >= 4.0 {
        Outcome::Holds
    } else if ratio.hi < 4.0 {
        Outcome::Fails
    } else {
        Outcome::Undecided
    }
}

/// [`Robustness`] of `pairs` (every condition's): `short_budget` is the exploratory budget and
/// `nearest` the unsaturated condition whose unscaled logits start closest to the cutoff.
pub fn robustness(pairs: &[Pair], short_budget: usize, nearest: (QkInit, usize)) -> Robustness {
    let saturated: Vec<&Pair> = pairs
        .iter()
        .filter(|p| is_saturated(p.init, p.d_k))
        .collect();
    let wider: Vec<&Pair> = pairs
        .iter()
        .filter(|p| is_saturated(p.init, p.d_k) || (p.init, p.d_k) == nearest)
        .collect();
    let ran = wider.len() > saturated.len();
    let nearest_ratio = slowdown(&wider, None, 1.0 - ALPHA);
    Robustness {
        two_halves: slowdown(&saturated, None, 1.0 - ALPHA / 2.0),
        short: slowdown(&saturated, Some(short_budget), 1.0 - ALPHA),
        short_budget,
        with_nearest: ran.then(|| (nearest.0, nearest.1, slow_outcome(&nearest_ratio))),
        nearest: nearest_ratio,
    }
}

/// Whether (init, d_k) is a saturated condition.
pub fn is_saturated(init: QkInit, d_k: usize) -> bool {
    SATURATED.contains(&(init, d_k))
}

/// The hypotheses from `pairs` (`None` when no pair is in a saturated condition).
pub fn hypotheses(pairs: &[Pair]) -> Option<Hypotheses> {
    let all: Vec<&Pair> = pairs.iter().collect();
    let saturated: Vec<&Pair> = pairs
        .iter()
        .filter(|p| is_saturated(p.init, p.d_k))
        .collect();
    if saturated.is_empty() {
        return None;
    }
    let budget = saturated.iter().map(|p| p.budget).max().unwrap_or(0);
    let stuck_saturated = mcnemar(&saturated);
    let stuck_all = mcnemar(&all);
    let later = saturated
        .iter()
        .filter(|p| time(p.unscaled) > time(p.scaled))
        .count();
    let sooner = saturated
        .iter()
        .filter(|p| time(p.unscaled) < time(p.scaled))
        .count();
    let later_saturated = (later, sooner, sign_test(later, sooner));
    let near = saturated.iter().filter(|p| p.unscaled_near_chance).count();
    let near_chance = wilson(near, saturated.len());
    let scaled_stuck = wilson(
        saturated.iter().filter(|p| p.scaled.is_none()).count(),
        saturated.len(),
    );
    let ratio = slowdown(&saturated, None, 1.0 - ALPHA);
    let fails = if near_chance.lo > 0.5 {
        Outcome::Holds
    } else if near_chance.hi < 0.5 {
        Outcome::Fails
    } else {
        Outcome::Undecided
    };
    let slow = slow_outcome(&ratio);
    let sentence = if fails == Outcome::Holds || slow == Outcome::Holds {
        Outcome::Holds
    } else if fails == Outcome::Fails && slow == Outcome::Fails {
        Outcome::Fails
    } else {
        Outcome::Undecided
    };
    Some(Hypotheses {
        pairs_saturated: saturated.len(),
        pairs_all: all.len(),
        budget,
        stuck_saturated,
        stuck_all,
        later_saturated,
        near_chance,
        scaled_stuck,
        ratio,
        outcomes: [
            directional(stuck_saturated),
            directional(stuck_all),
            directional(later_saturated),
            fails,
            slow,
            sentence,
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(init: QkInit, d_k: usize, scaled: Option<usize>, unscaled: Option<usize>) -> Pair {
        Pair {
            init,
            d_k,
            scaled,
            unscaled,
            unscaled_near_chance: unscaled.is_none(),
            scaled_near_chance: scaled.is_none(),
            budget: 600,
        }
    }

    #[test]
    fn each_hypothesis_can_hold_and_fail() {
        // Saturated: unscaled stuck near chance in every pair.
        let stuck: Vec<Pair> = (0..30)
            .map(|_| pair(QkInit::Unit, 256, Some(40), None))
            .collect();
        let h = hypotheses(&stuck).expect("saturated pairs");
        assert_eq!(h.outcomes[0], Outcome::Holds);
        assert_eq!(h.outcomes[2], Outcome::Holds);
        assert_eq!(h.outcomes[3], Outcome::Holds);
        assert_eq!(h.outcomes[4], Outcome::Holds); // 600 / 40 = 15 ≥ 4
        assert_eq!(h.outcomes[5], Outcome::Holds);
        // Saturated, unscaled faster: every hypothesis the other way.
        let fast: Vec<Pair> = (0..30)
            .map(|_| pair(QkInit::Unit, 256, Some(40), Some(30)))
            .collect();
        let h = hypotheses(&fast).expect("saturated pairs");
        assert_eq!(h.outcomes[2], Outcome::Fails);
        assert_eq!(h.outcomes[3], Outcome::Fails);
        assert_eq!(h.outcomes[4], Outcome::Fails);
        assert_eq!(h.outcomes[5], Outcome::Fails);
        // The scaled arm stuck instead: hypothesis 1 fails.
        let reverse: Vec<Pair> = (0..30)
            .map(|_| pair(QkInit::Default, 1024, None, Some(100)))
            .collect();
        assert_eq!(
            hypotheses(&reverse).expect("pairs").outcomes[0],
            Outcome::Fails
        );
        // Through results.json and back, an infinite end included.
        let h = hypotheses(&stuck).expect("saturated pairs");
        let json = serde_json::to_value(&h).expect("json");
        let back: Hypotheses = serde_json::from_value(json).expect("read back");
        assert_eq!(back.outcomes, h.outcomes);
        assert!(
            h.ratio.hi.is_infinite(),
            "every pair bounded below: {:?}",
            h.ratio
        );
        assert_eq!(back.ratio.hi, h.ratio.hi);
        // No saturated condition: nothing to decide.
        let unsaturated = vec![pair(QkInit::Unit, 64, Some(40), None)];
        assert!(hypotheses(&unsaturated).is_none());
    }

    #[test]
    fn the_robustness_readings_move_the_way_their_rules_say() {
        // Unscaled needs 400 steps where scaled needs 50: 8x within 600 steps, but read at 300
        // steps the unscaled run never got there, so its ratio is only bounded below (300 / 50).
        let slow: Vec<Pair> = (0..30)
            .map(|_| pair(QkInit::Unit, 256, Some(50), Some(400)))
            .collect();
        let refs: Vec<&Pair> = slow.iter().collect();
        let full = slowdown(&refs, None, 0.95);
        assert_eq!((full.lo, full.value, full.hi), (8.0, 8.0, 8.0));
        let short = slowdown(&refs, Some(300), 0.95);
        assert_eq!(short.lo, 6.0);
        assert!(short.hi.is_infinite());
        // A stricter level widens the interval, never narrows it.
        let mixed: Vec<Pair> = (0..30)
            .map(|i| pair(QkInit::Unit, 256, Some(50), Some(100 + 10 * i)))
            .collect();
        let refs: Vec<&Pair> = mixed.iter().collect();
        let (at95, at975) = (slowdown(&refs, None, 0.95), slowdown(&refs, None, 0.975));
        assert!(
            at975.lo <= at95.lo && at975.hi >= at95.hi,
            "{at95:?} {at975:?}"
        );
        // The nearest condition counts only where it ran, and can change the outcome: here its
        // pairs are as fast unscaled, pulling the median ratio below 4.
        let r = robustness(&slow, 300, (QkInit::Unit, 64));
        assert!(r.with_nearest.is_none());
        let mut wider = slow.clone();
        wider.extend((0..60).map(|_| pair(QkInit::Unit, 64, Some(50), Some(50))));
        let r = robustness(&wider, 300, (QkInit::Unit, 64));
        assert_eq!(r.with_nearest, Some((QkInit::Unit, 64, Outcome::Fails)));
        assert_eq!(r.two_halves.lo, 8.0);
    }
}
