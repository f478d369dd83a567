//! The fourth question, "does training suffer?", answered from the main part: the primary
//! endpoint first (runs stuck, McNemar), then runs that stayed near chance, then how much later
//! the others got there, split by whether the unscaled starting logits are saturated.

use super::super::analyze::{PairStats, RunRow, TrainingData, of_part};
use super::super::design::{ALPHA, FAILED_ACCURACY, Part};

/// [`FAILED_ACCURACY`] in percent, for the text.
pub(super) const FAILED_PCT: f64 = FAILED_ACCURACY * 100.0;
use super::super::analyze::unscaled_start_std;
use crate::answers::Question;
use crate::experiment::Canvas;
use crate::measures::training::{Arm, init_name};
use crate::stats::wilson_interval;

/// Whether a run ended near chance: it never reached the target and its held-out accuracy at
/// the budget is below [`FAILED_ACCURACY`] (or it diverged).
fn near_chance(r: &RunRow) -> bool {
    super::super::analyze::failed(&r.outcome)
}

/// The main part's evaluation runs of `arm` in the conditions of `stats`.
fn runs<'a>(data: &'a TrainingData, stats: &[&PairStats], arm: Arm) -> Vec<&'a RunRow> {
    data.runs
        .iter()
        .filter(|r| r.arm == arm && stats.iter().any(|s| s.comparison.condition == r.condition))
        .collect()
}

/// `k of n (p% [lo, hi])` with a 95% Wilson interval.
fn share(k: usize, n: usize) -> String {
    let (lo, hi) = wilson_interval(k, n, 0.95);
    format!(
        "{k} of {n} ({})",
        crate::stats::percent(k as f64 / n.max(1) as f64, lo, hi)
    )
}

fn label(s: &PairStats) -> String {
    format!(
        "{} init, d_k {}",
        init_name(s.comparison.condition.init),
        s.comparison.condition.d_k
    )
}

/// A paired ratio of steps as `2.5× [1.8, 3.3]` (`≥` when over half the pairs are censored).
fn ratio(s: &PairStats) -> String {
    let e = s.ratio;
    let hi = if e.hi.is_finite() {
        format!("{:.1}", e.hi)
    } else {
        "∞".into()
    };
    // Where censored pairs leave the median only bounded below, it is a lower bound.
    let at_least = if s.ratio_upper_median > e.value {
        "≥ "
    } else {
        ""
    };
    format!("{at_least}{:.1}× [{:.1}, {hi}]", e.value, e.lo)
}

/// Writes the answer and the screen (nothing when the main part did not run).
pub fn answer(data: &TrainingData, canvas: &mut Canvas, figure: Option<&str>) {
    let cutoff = crate::experiments::training::analyze::premise_std(data);
    let main: Vec<&PairStats> = of_part(data, Part::Main)
        .filter(|s| s.comparison.reference == Arm::Scaled && s.comparison.other == Arm::Unscaled)
        .collect();
    if main.is_empty() {
        return;
    }
    let stuck = |arm| {
        let rs = runs(data, &main, arm);
        (rs.iter().filter(|r| near_chance(r)).count(), rs.len())
    };
    let ((u_k, u_n), (s_k, s_n)) = (stuck(Arm::Unscaled), stuck(Arm::Scaled));
    let never = |arm| {
        runs(data, &main, arm)
            .iter()
            .filter(|r| r.outcome.steps_to_target.is_none())
            .count()
    };
    let separated = main
        .iter()
        .filter(|s| s.mcnemar_p_holm < ALPHA && s.only_other_stuck > s.only_reference_stuck)
        .count();
    let saturated: Vec<&PairStats> = main
        .iter()
        .copied()
        .filter(|s| unscaled_start_std(data, s).is_some_and(|x| x >= cutoff))
        .collect();
    // The article's own example: d_k = 64 with unit-variance q, k (starting logit std 8).
    let example = saturated
        .iter()
        .find(|s| s.comparison.condition.d_k == 64)
        .or(saturated.first());
    let per_init: Vec<String> = {
        let mut inits: Vec<_> = main.iter().map(|s| s.comparison.condition.init).collect();
        inits.dedup();
        inits
            .iter()
            .map(|&init| {
                let of: Vec<&PairStats> = main
                    .iter()
                    .copied()
                    .filter(|s| s.comparison.condition.init == init)
                    .collect();
                let u = runs(data, &of, Arm::Unscaled);
                let stds: Vec<String> = of
                    .iter()
                    .filter_map(|s| unscaled_start_std(data, s))
                    .map(|x| format!("{x:.1}"))
                    .collect();
                format!(
                    "{} initialization (starting unscaled logit std {}): {} unscaled runs below {FAILED_PCT:.0}% accuracy",
                    init_name(init),
                    stds.join(", "),
                    share(u.iter().filter(|r| near_chance(r)).count(), u.len())
                )
            })
            .collect()
    };
    let lead = if separated == main.len() {
        "Yes"
    } else if separated > 0 {
        "In some conditions"
    } else if u_k > s_k {
        "Not clearly"
    } else {
        "No"
    };
    let short = format!(
        "{lead}: {} unscaled and {} scaled runs never reached 99%; the test declared first \
         separates the arms in {separated} of {} conditions.{}",
        share(never(Arm::Unscaled), u_n),
        share(never(Arm::Scaled), s_n),
        main.len(),
        example.map_or(String::new(), |s| format!(
            " Where logits start saturated ({}), the rest took {} the steps.",
            label(s),
            ratio(s)
        )),
    );
    let figure = figure.map_or(String::new(), |f| {
        format!(
            "{f}\n\n*The figure: unit init only (default init: the appendix); at most {} steps.*\n\n",
            data.sizes.budget
        )
    });
    let seeds = main.first().map_or(0, |s| s.pairs);
    let screen = format!(
        "**The exploratory run** (it came first, tuned the learning rates and shaped the analysis \
         above): the same model, task and pairs, {} seeds per condition, at most {} steps.\n\n{figure}**Effect.** Each dot is one seed: above the diagonal, training \
         without the scale was slower. The primary measure, declared before these runs, is whether \
         a run reaches 99% at all: {} unscaled and {} scaled runs never did, and the two differ in \
         {separated} of {} conditions (McNemar's test counts the pairs where only one of the two \
         runs got stuck; Holm's correction allows for testing several conditions at once). {} \
         unscaled runs ended below {FAILED_PCT:.0}% accuracy against {} scaled. By \
         initialization: {}. Where the unscaled logits start saturated (std ≥ {cutoff:.1}: the article example's median starting std in this run), \
         the median paired ratio of steps (a pair whose run never got there only bounds it; \
         family-wise 95% intervals over the conditions) was {}.\n\n\
         **Caveat.** These runs also shaped the analysis (the saturation split, the ±1.25× margin of its equivalence tests), \
         so they are exploratory; the learning rates were tuned on {} per arm, and the \
         {}-step budget cuts off runs that are only slow. The appendix (`training`, \
         `training-variants`) has every condition and a second model; the learning-rate curves \
         come with `report --tune`.",
        seeds,
        data.sizes.budget,
        share(never(Arm::Unscaled), u_n),
        share(never(Arm::Scaled), s_n),
        main.len(),
        share(u_k, u_n),
        share(s_k, s_n),
        per_init.join("; "),
        if saturated.is_empty() {
            "not measured here".to_string()
        } else {
            saturated
                .iter()
                .map(|s| format!("{} {}", label(s), ratio(s)))
                .collect::<Vec<_>>()
                .join(", ")
        },
        if data.sizes.tuning_seeds == 1 {
            "1 seed".to_string()
        } else {
            format!("{} seeds", data.sizes.tuning_seeds)
        },
        data.sizes.budget,
    );
    canvas.key_number(
        "fails-or-extremely-slow",
        format!(
            "near chance: {u_k} of {u_n} unscaled runs, {s_k} of {s_n} scaled{}",
            example.map_or(String::new(), |s| format!(
                "; {}: {} the steps",
                label(s),
                ratio(s)
            ))
        ),
    );
    canvas.answer(Question::Training, Some(short), screen);
}
