//! `training`'s lines of the report's abstract: the article's question (does dividing by √d_k
//! matter, how much, under which initialization and optimizer) answered from this run's paired
//! statistics. Every number and every verdict word below is computed; only the words around
//! them are fixed.

use super::analyze::{PairStats, TrainingData, of_part, unscaled_start_std};
use super::claims::direction;
use super::design::{ALPHA, Part, SLOW_FACTOR};
use crate::claims::{Claim, Outcome, Tally, show_p};
use crate::measures::training::{Arm, init_name};

/// How the unscaled arm compares with 1/√d_k over a set of conditions.
struct Direction {
    conditions: usize,
    later: usize,
    sooner: usize,
    pairs_later: usize,
    pairs_sooner: usize,
    /// The largest Holm-adjusted sign-test p among the conditions where it is later.
    largest_p_later: Option<f64>,
}

impl Direction {
    fn of(stats: &[&PairStats]) -> Self {
        let later: Vec<&&PairStats> = stats
            .iter()
            .filter(|s| direction(s, true) == Outcome::Holds)
            .collect();
        Self {
            conditions: stats.len(),
            later: later.len(),
            sooner: stats
                .iter()
                .filter(|s| direction(s, false) == Outcome::Holds)
                .count(),
            pairs_later: stats.iter().map(|s| s.other_slower).sum(),
            pairs_sooner: stats.iter().map(|s| s.other_faster).sum(),
            largest_p_later: later.iter().map(|s| s.sign_p_holm).reduce(f64::max),
        }
    }

    /// `later in 8 of 8 conditions (…)`, with the split when it is not one-sided.
    fn words(&self) -> String {
        let p = self
            .largest_p_later
            .map(|p| format!(", largest Holm-adjusted p {}", show_p(p)))
            .unwrap_or_default();
        let mut s = match (self.later == self.conditions, self.conditions) {
            (true, 1) => format!("later in the one condition{p}"),
            (true, n) => format!("later in all {n} conditions{p}"),
            (false, n) => format!("later in {} of {n} {}{p}", self.later, noun(n, "condition")),
        };
        if self.sooner > 0 {
            s.push_str(&format!(", sooner in {}", self.sooner));
        }
        let undecided = self.conditions - self.later - self.sooner;
        if undecided > 0 && self.later < self.conditions {
            s.push_str(&format!(", no difference detected in {undecided}"));
        }
        s.push_str(&format!(
            "; pooled over seeds {} pairs later, {} sooner",
            self.pairs_later, self.pairs_sooner
        ));
        s
    }

    /// The answer's first word.
    fn answer(&self) -> &'static str {
        if self.conditions == 0 {
            "not measured"
        } else if self.later == self.conditions {
            "yes, in every condition tested"
        } else if self.later > 0 && self.sooner == 0 {
            "yes, in some conditions"
        } else if self.later > 0 {
            "it depends on the condition"
        } else if self.sooner > 0 {
            "no: training without it is faster where a difference shows"
        } else {
            "no difference was detected"
        }
    }
}

/// `word` or its plural, for `n` of them.
fn noun(n: usize, word: &str) -> String {
    if n == 1 {
        word.to_string()
    } else {
        format!("{word}s")
    }
}

/// The abstract's lines from `training` (empty when the main part did not run).
pub fn lines(data: &TrainingData, claims: &[Claim]) -> Vec<String> {
    let main = unscaled_against_scaled(data, Part::Main);
    if main.is_empty() {
        return Vec::new();
    }
    let inits = inits(&main);
    let mut out = vec![
        question_line(&main, &inits),
        how_much_line(&main),
        conditions_line(data, &main, &inits),
    ];
    out.extend(learning_rate_line(data, claims));
    out.push(caveat_line(data, &main));
    out.extend(article_words_line(data, claims, &main));
    out
}

/// The paired comparisons of a part where the unscaled arm is compared with 1/√d_k.
fn unscaled_against_scaled(data: &TrainingData, part: Part) -> Vec<&PairStats> {
    of_part(data, part)
        .filter(|s| s.comparison.reference == Arm::Scaled && s.comparison.other == Arm::Unscaled)
        .collect()
}

/// The initializations of `main`, in their order (repeats next to each other merged).
fn inits(main: &[&PairStats]) -> Vec<&'static str> {
    let mut i: Vec<&'static str> = main
        .iter()
        .map(|s| init_name(s.comparison.condition.init))
        .collect();
    i.dedup();
    i
}

/// "Does dividing by √d_k matter?": the secondary endpoint (steps to 99%) over every condition,
/// then the primary one (whether a run reaches 99% at all within the budget).
fn question_line(main: &[&PairStats], inits: &[&str]) -> String {
    let all = Direction::of(main);
    let dims = {
        let mut d: Vec<usize> = main.iter().map(|s| s.comparison.condition.d_k).collect();
        d.sort_unstable();
        d.dedup();
        d.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let pairs = main.iter().map(|s| s.pairs).min().unwrap_or(0);
    // The primary endpoint: whether a run reaches 99% at all within the budget.
    let primary = main
        .iter()
        .filter(|s| s.mcnemar_p_holm < ALPHA && s.only_other_stuck > s.only_reference_stuck)
        .count();
    let primary_other = main
        .iter()
        .filter(|s| s.mcnemar_p_holm < ALPHA && s.only_other_stuck < s.only_reference_stuck)
        .count();
    format!(
        "**Does dividing by √d_k matter?** With Adam, by the steps to 99% (the secondary endpoint), {}: \
         without it, the model reached 99% held-out accuracy {} ({} initialization × d_k {dims}; exact sign \
         tests on {pairs} paired seeds per condition). The primary endpoint, whether a run reaches 99% at all within the budget \
         (exact McNemar on the pairs, Holm), separates the arms in {primary} of {} {} (the unscaled arm \
         stuck more often where they separate){}.",
        all.answer(),
        all.words(),
        inits.join(" and "),
        main.len(),
        noun(main.len(), "condition"),
        if primary_other > 0 {
            format!(", the other way in {primary_other}")
        } else {
            String::new()
        },
    )
}

/// "How much": runs that never got there, and the medians of steps.
fn how_much_line(main: &[&PairStats]) -> String {
    let stuck_other: usize = main.iter().map(|s| s.other_km.censored).sum();
    let stuck_reference: usize = main.iter().map(|s| s.reference_km.censored).sum();
    let runs_other: usize = main.iter().map(|s| s.other_km.n).sum();
    let runs_reference: usize = main.iter().map(|s| s.reference_km.n).sum();
    let budget = main.iter().map(|s| s.budget).max().unwrap_or(0);
    format!(
        "**How much:** {stuck_other} of {runs_other} unscaled runs against {stuck_reference} of \
         {runs_reference} scaled runs never reached 99% within {budget} steps; Kaplan–Meier \
         medians of steps to 99% per condition: unscaled {}, scaled {}.",
        median_range(main, |s| s.other_km.value),
        median_range(main, |s| s.reference_km.value),
    )
}

/// The range of one arm's per-condition median steps (`pick`), and in how many conditions
/// the median is beyond the budget.
fn median_range(main: &[&PairStats], pick: impl Fn(&PairStats) -> Option<f64>) -> String {
    let values: Vec<Option<f64>> = main.iter().map(|s| pick(s)).collect();
    let finite: Vec<f64> = values.iter().flatten().copied().collect();
    let beyond = values.iter().filter(|v| v.is_none()).count();
    let range = match (
        finite.iter().copied().reduce(f64::min),
        finite.iter().copied().reduce(f64::max),
    ) {
        (Some(lo), Some(hi)) if lo == hi => format!("{lo}"),
        (Some(lo), Some(hi)) => format!("{lo}–{hi}"),
        _ => "none".into(),
    };
    if beyond > 0 {
        format!(
            "{range}, beyond the budget in {beyond} {}",
            noun(beyond, "condition")
        )
    } else {
        range
    }
}

/// "Under which conditions": the direction per initialization, and with SGD when it ran.
fn conditions_line(data: &TrainingData, main: &[&PairStats], inits: &[&str]) -> String {
    let mut per_init = Vec::new();
    for init in inits {
        let of_init: Vec<&PairStats> = main
            .iter()
            .copied()
            .filter(|s| init_name(s.comparison.condition.init) == *init)
            .collect();
        per_init.push(format!(
            "{init} initialization: {}",
            Direction::of(&of_init).words()
        ));
    }
    let sgd = unscaled_against_scaled(data, Part::Sgd);
    let sgd_words = if sgd.is_empty() {
        String::new()
    } else {
        let condition = &sgd[0].comparison.condition;
        format!(
            " With SGD (momentum 0.9, {} initialization, d_k {}): {}.",
            init_name(condition.init),
            sgd.iter()
                .map(|s| s.comparison.condition.d_k.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            Direction::of(&sgd).words()
        )
    };
    format!(
        "**Under which conditions:** {}.{sgd_words}",
        per_init.join("; ")
    )
}

/// The caveat: how the learning rates were chosen, and the conditions whose rate is at an end
/// of the grid.
fn caveat_line(data: &TrainingData, main: &[&PairStats]) -> String {
    let edges: Vec<String> = main
        .iter()
        .filter(|s| s.reference_lr_at_edge || s.other_lr_at_edge)
        .map(|s| {
            format!(
                "{} init, d_k = {}",
                init_name(s.comparison.condition.init),
                s.comparison.condition.d_k
            )
        })
        .collect();
    let committed = data
        .tuned
        .iter()
        .all(|t| t.source != Some(super::rates::RateSource::Tuned));
    format!(
        "**Caveat:** each arm's learning rate was chosen on {} tuning seeds from the grid {:?}{}{}.",
        if committed {
            super::design::TUNING_SEEDS
        } else {
            data.sizes.tuning_seeds
        },
        if committed {
            super::design::ADAM_LRS.to_vec()
        } else {
            data.sizes.adam_lrs.clone()
        },
        if committed {
            " (by the full sweep of commit 5a13d16, committed in `rates.rs`; this run did not tune: \
             `sdpa report --tune` does)"
        } else {
            ""
        },
        if edges.is_empty() {
            String::new()
        } else {
            format!(
                ", at an end of the grid in {} ({})",
                edges.len(),
                edges.join("; ")
            )
        },
    )
}

/// The article's own words about training («fails completely», «extremely slow», the two
/// together), each split by whether the unscaled starting logits are saturated (the article's
/// premise); `None` when one of the three claims was not made.
fn article_words_line(
    data: &TrainingData,
    claims: &[Claim],
    main: &[&PairStats],
) -> Option<String> {
    let starts: Vec<Option<f64>> = main.iter().map(|s| unscaled_start_std(data, s)).collect();
    let cutoff = super::analyze::premise_std(data);
    let words = |id: &str| {
        claims
            .iter()
            .find(|c| c.id == id)
            .map(|c| saturation_split(c, &starts, cutoff))
    };
    let (fails, slow, either) = (
        words("fails-completely")?,
        words("extremely-slow")?,
        words("fails-or-extremely-slow")?,
    );
    let stds: Vec<String> = main
        .iter()
        .zip(&starts)
        .filter_map(|(s, std)| {
            let c = s.comparison.condition;
            std.map(|std| format!("{} d_k {} {std:.1}", init_name(c.init), c.d_k))
        })
        .collect();
    Some(format!(
        "**The article's words, in this exploratory run** (superseded by the confirmatory runs, \
         `training-confirm-2` and `training-confirm`, where they decide a sentence): «training fails completely» {fails}. «Extremely slow» (at least \
         {SLOW_FACTOR}× the steps to 99%) {slow}. The sentence as a whole, «fails completely or extremely \
         slow», {either}. (Decided only where the unscaled starting logits have std ≥ \
         {cutoff:.1}, the article's premise: at least as spread as its own example, unit init d_k \
         64, in this run; a rule fixed before the second confirmatory run; the median unscaled starting logit std per \
         condition: {}.)",
        stds.join(", ")
    ))
}

/// A claim's outcome, then the tally of its conditions where the unscaled starting logits are
/// saturated (`starts`: each main condition's median starting logit std, in the claim's order)
/// and where they are below; the outcome alone when its conditions are not the main part's.
fn saturation_split(claim: &Claim, starts: &[Option<f64>], cutoff: f64) -> String {
    if claim.conditions.len() != starts.len() {
        return claim.outcome_text();
    }
    let split = |want: bool| -> Vec<Outcome> {
        claim
            .conditions
            .iter()
            .zip(starts)
            .filter(|(_, std)| std.map(|std| std >= cutoff) == Some(want))
            .map(|(k, _)| k.outcome)
            .collect()
    };
    let part = |outcomes: Vec<Outcome>, where_: &str| {
        if outcomes.is_empty() {
            format!("no condition {where_}")
        } else {
            format!("{where_}: {}", Tally::of(&outcomes).show("conditions"))
        }
    };
    format!(
        "{} — {}; {}",
        claim.outcome_text(),
        part(
            split(true),
            &format!(
                "where the unscaled starting logits have std ≥ {cutoff:.2} (the article's premise)"
            )
        ),
        part(split(false), "where they are below")
    )
}

/// "Is it only the learning rate?": the unscaled arm against 1/√d_k over the learning-rate
/// curves (sensitivity, loss at the best rate, width), the equivalence at each arm's own rate,
/// and the intervention arm; `None` when the sweep did not run.
fn learning_rate_line(data: &TrainingData, claims: &[Claim]) -> Option<String> {
    if !data.sensitivity.iter().any(|s| s.arm == Arm::Unscaled) {
        return None;
    }
    let outcome = |id: &str| {
        claims
            .iter()
            .find(|c| c.id == id)
            .map_or("not measured".to_string(), |c| c.outcome_text())
    };
    Some(format!(
        "**Is it only the learning rate?** Over {} rates × {} tuning seeds (d_k {}), without √d_k the model is \
         «more sensitive to the learning rate» (Wortsman et al.'s measure on the final held-out loss; a \
         measure added after the runs were seen) {}; «ends at a higher final loss, each arm at its own best \
         rate» (added after the runs were seen) {}; «trains well over a narrower range \
         of rates» (steps to 99% within {}× the best) {}. Each arm at its own rate, «only a shift of the \
         learning rate» (its margin, a ratio within [1/1.25, 1.25], chosen after the runs were seen) {}. Under Adam (blind to a gradient's scale, ε aside) unscaled attention is 1/√d_k \
         with W_Q, W_K started d_k^¼ larger and stepped d_k^¼ faster than the other parameters; two arms \
         change one of the two. The relative step (started like 1/√d_k: W_Q, W_K × d_k^−¼, at its own tuned \
         rate, which sets the other parameters' step too, so this arm does not change the projections' step \
         alone: the claim prints the effective rates) «trains faster than unscaled» {} and «is still slower than 1/√d_k» {}; the larger start \
         alone (1/√d_k with W_Q, W_K × d_k^¼, at 1/√d_k's rate, untuned) «is slower than 1/√d_k at its \
         rate» {}.",
        data.sizes.adam_lrs.len(),
        data.sizes.tuning_seeds,
        data.sizes
            .sweep_dims
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        outcome("lr-sensitivity-higher-none"),
        outcome("best-loss-higher-none"),
        super::design::SENSITIVITY_FACTOR,
        outcome("lr-range-narrower-none"),
        outcome("unscaled-only-a-lr-shift"),
        outcome("small-init-rescues-unscaled"),
        outcome("small-init-slower-than-scaled"),
        outcome("unscaled-start-slower-than-scaled"),
    ))
}
