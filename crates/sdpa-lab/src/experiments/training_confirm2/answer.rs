//! The fourth question's answer from the second confirmatory run: the first screen's sentence
//! and the question's screen (setup, effect, caveat), the key number of the verdict table.

use super::analyze::{Confirm2Data, premise_words};
use super::design::{RateScheme, SLOW_FACTOR};
use super::hypotheses::Decided;
use crate::answers::Question;
use crate::claims::Outcome;
use crate::claims::short_p;
use crate::experiment::Canvas;

fn end(x: Option<f64>) -> String {
    x.map_or("∞".into(), |v| format!("{v:.1}"))
}

/// "4.6× [4.1, 6.0]", the Kaplan–Meier median ratio with its 97.5% interval.
pub fn ratio_words(d: &Decided) -> String {
    format!(
        "{}× [{}, {}]",
        end(d.ratio.km.value),
        end(d.ratio.km.lo),
        end(d.ratio.km.hi)
    )
}

/// "≥ 4.2× [3.9, ∞]": the order-statistics median of the ratio bounds (97.5%).
fn bounded_words(d: &Decided) -> String {
    let (v, lo, hi) = d.bounded_ratio;
    let x = |v: f64| {
        if v.is_finite() {
            format!("{v:.1}")
        } else {
            "∞".into()
        }
    };
    format!("{}× [{}, {}]", x(v), x(lo), x(hi))
}

/// "12 of 60 stuck near chance, 5 more never at 99%".
fn stuck_words(d: &Decided) -> String {
    format!(
        "{} of {} stuck near chance, {} more never at 99%",
        d.near_chance.count, d.near_chance.n, d.never_not_stuck
    )
}

/// What would have made each half fail, for the reader.
const FAILS_IF: &str = "«fails completely» would have failed had fewer than half the unscaled \
     runs (97.5% interval below ½) ended stuck near chance; «extremely slow» had the median \
     slowdown's 97.5% interval ended below 4×";

/// The conditions whose chosen rate is at the grid's edge (a better rate may lie beyond it).
fn edge_words(data: &Confirm2Data) -> String {
    let at_edge: Vec<String> = data
        .chosen
        .iter()
        .filter(|c| c.at_edge)
        .map(|c| {
            format!(
                "{} init d_k {} (rates: 1/√d_k {}, unscaled {}, shared {})",
                crate::measures::training::init_name(c.init),
                c.d_k,
                c.own_scaled,
                c.own_unscaled,
                c.shared
            )
        })
        .collect();
    if at_edge.is_empty() {
        String::new()
    } else {
        format!(
            " A rate chosen at the end of the tuning grid (1e-4 … 3e-2), where a rate beyond it \
             might have done better: {}.",
            at_edge.join("; ")
        )
    }
}

/// "a 94%", the simulated power at `seeds` per condition (the design's computation).
fn power_words(seeds: usize) -> String {
    super::power::power_curve()
        .ok()
        .and_then(|c| c.into_iter().find(|(n, _)| *n == seeds))
        .map_or(
            "an uncomputed (these are not the design's sizes)".into(),
            |(_, p)| format!("a {:.0}%", 100.0 * p),
        )
}

fn lead(o: Option<Outcome>) -> &'static str {
    match o {
        Some(Outcome::Holds) => "Yes",
        Some(Outcome::Fails) => "No",
        Some(_) => "Undecided",
        None => "It depends on the learning rates",
    }
}

/// Writes the answer (nothing when the run has no analysis).
pub fn answer(data: &Confirm2Data, canvas: &mut Canvas, figure: &str) {
    let (Some(own), Some(shared)) = (
        data.scheme(RateScheme::Own),
        data.scheme(RateScheme::Shared),
    ) else {
        return;
    };
    let (o, s) = (&own.pooled, &shared.pooled);
    let verdict = super::hypotheses::across_schemes(o.outcomes[2], s.outcomes[2]);
    let premise = premise_words(&data.sizes);
    canvas.key_number(
        "confirm2-sentence",
        format!(
            "own rates: slowdown {} ({}), {} ({}); shared rate: slowdown {} ({}), {} ({})",
            ratio_words(o),
            o.outcomes[1].label(),
            stuck_words(o),
            o.outcomes[0].label(),
            ratio_words(s),
            s.outcomes[1].label(),
            stuck_words(s),
            s.outcomes[0].label()
        ),
    );
    let scaled_never = |d: &Decided| d.scaled_never;
    canvas.confirmatory_answer(
        Question::Training,
        Some(format!(
            "{}: from logits as spread as the article's example, unscaled runs needed a median {} \
             the steps to 99% (97.5% interval; shared rate: {}); {} of {} stuck near chance (scaled: {} \
             never reached 99%).",
            lead(verdict),
            ratio_words(o),
            ratio_words(s),
            o.near_chance.count,
            o.near_chance.n,
            scaled_never(o),
        )),
        format!(
            "**Setup.** A one-layer attention model learns a matching task (chance is 1/8 of the \
             answers right; the target is 99% on held-out data) with and without the 1/√d_k, from \
             the same starting weights and batches (a *pair* of runs per seed). \
             **The second confirmatory run** (its design committed in `{}` before any of its \
             runs, `experiments/training_confirm2/design.rs`; measured at `{}`): the conditions where the unscaled logits \
             start at least as spread as in the article's own example ({premise}), {} fresh seeds \
             each, a {}-step budget. Learning rates: each arm's own best rate, tuned for this \
             budget on seeds of its own, **and** one rate shared by both arms (the one the arm it \
             suits worse loses least at); the verdict counts only where both agree. The article's \
             sentence «fails completely or extremely slow» holds when either half holds, each \
             half tested at 2.5% so the two together keep 5%. The number of seeds gives {} \
             chance (*power*) of the sentence holding under each arm's own rate if the effect is \
             as large as in the first confirmatory run (simulated from its pairs, with runs cut off \
             by the budget); the verdict needs both schemes, so its power is at most that.\n\n{figure}\n\n\
             **Effect.** Each arm at its own rate: {}; the median paired slowdown (unscaled steps \
             over scaled steps, runs that never got there counted as «at least», Kaplan–Meier) \
             is {} (97.5% interval): «extremely slow» (at least {SLOW_FACTOR}×): {}; «fails \
             completely» (most runs stuck near chance): {}. One shared rate: {}; slowdown {}: \
             «extremely slow»: {}; «fails completely»: {}. More runs short of 99% without the \
             scale: {} against {} pairs (own rates, p {}).\n\n\
             **What would have made it fail.** {FAILS_IF}. Every finite end of the slowdown's \
             interval is the ratio of a pair whose two runs both finished, never a bound set by the \
             budget. Read without Kaplan–Meier's assumption that when a run is cut off says \
             nothing of its ratio (every pair at its bounds, order statistics): {} with each arm's \
             own rate, {} at the shared rate.\n\n\
             **Caveat.** One small model on one task, Adam, four conditions pooled. A run stuck \
             near chance counts in the slowdown as «at least the budget over its scaled twin's \
             steps» (a cut-off pair), and last in the sign test; it is also the «fails completely» \
             half.{}",
            super::runs::DESIGNED_IN,
            super::runs::MEASURED_AT,
            data.sizes.seeds,
            data.sizes.budget,
            power_words(data.sizes.seeds),
            stuck_words(o),
            ratio_words(o),
            o.outcomes[1].label(),
            o.outcomes[0].label(),
            stuck_words(s),
            ratio_words(s),
            s.outcomes[1].label(),
            s.outcomes[0].label(),
            o.stuck.yes,
            o.stuck.no,
            short_p(o.stuck.p),
            bounded_words(o),
            bounded_words(s),
            edge_words(data),
        ),
    );
}
