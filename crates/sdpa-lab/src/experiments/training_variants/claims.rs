//! `training-variants`' claims: one per measure, each decided in every variant by the paired
//! sign test, Holm over the variants (all the lab's: the article trains nothing, and its Q1
//! sentence is decided in `training`).

use super::analyze::{Measure, Paired, VariantsData};
use super::design::ALPHA;
use crate::claims::{Claim, Condition, Outcome, Source, show_p};

impl Measure {
    /// The claim's id.
    pub fn claim_id(self) -> &'static str {
        match self {
            Measure::Steps => "slower-beyond-the-small-model",
            Measure::EarlyEntropy => "sharp-before-learning",
            Measure::FinalMaxLogit => "larger-logits-after-training",
        }
    }

    /// What the claim says.
    fn statement(self) -> &'static str {
        match self {
            Measure::Steps => {
                "without √d_k the model reaches 99% held-out accuracy later, in each variant of the model \
                 (Burn's default init, d_k = 64, Adam, each arm at its own tuned rate; the base model \
                 repeats `training`'s main comparison on new seeds: a replication, not more evidence)"
            }
            Measure::EarlyEntropy => {
                "without √d_k the attention stays sharper until the model learns: lower entropy from the \
                 first update until either run of the pair reaches 0.5 held-out accuracy. It starts \
                 sharper (at step 0 the unscaled logits are √d_k = 8× the scaled ones), so this reads the \
                 start and what training does to it together; an arm with the scaled arm's start and the \
                 unscaled gradients (as `training`'s intervention) would be needed to see a collapse that \
                 training causes, and is not run here (time)"
            }
            Measure::FinalMaxLogit => {
                "without √d_k the largest attention logit the budget ends with is larger (the logit growth \
                 QK-norm was introduced against). Each arm trains at its own tuned rate, and the arm that \
                 learns first has more steps after learning, in which cross-entropy keeps growing the \
                 logits: this compares where the runs end, not the scale alone"
            }
        }
    }

    /// How it is decided.
    fn check(self) -> &'static str {
        match self {
            Measure::Steps => {
                "exact sign test on the paired steps to 99% (a run that never got there ranked last; both \
                 never: a tie), Holm over the variants, α = 0.05"
            }
            Measure::EarlyEntropy => {
                "exact sign test on the paired mean normalized entropy over the recorded steps from step \
                 10 up to the first step where either run of the pair has held-out accuracy ≥ 0.5 (the \
                 same steps in both arms; a pair where one run learned by step 10 has no such step and is \
                 dropped: the fastest pairs, a selection), Holm over the variants, α = 0.05"
            }
            Measure::FinalMaxLogit => {
                "exact sign test on the paired largest logit of the last evaluation's training batch (a \
                 diverged run dropped), Holm over the variants, α = 0.05"
            }
        }
    }

    /// Whether the claim expects the unscaled value to be the larger.
    fn unscaled_larger(self) -> bool {
        !matches!(self, Measure::EarlyEntropy)
    }

    /// The words for "the unscaled value is larger" and "… smaller".
    fn words(self) -> (&'static str, &'static str) {
        match self {
            Measure::Steps => ("later", "sooner"),
            Measure::EarlyEntropy => ("higher", "lower"),
            Measure::FinalMaxLogit => ("larger", "smaller"),
        }
    }

    /// A value as the report prints it.
    fn show(self, x: f64) -> String {
        match self {
            Measure::Steps if !x.is_finite() => "never".into(),
            Measure::Steps => format!("{x}"),
            _ => format!("{x:.3}"),
        }
    }
}

/// Holds when the Holm-adjusted sign test is significant in the claimed direction (`larger`:
/// the unscaled value is the larger), fails when significant the other way.
pub fn direction(p: &Paired, larger: bool) -> Outcome {
    if p.p_holm >= ALPHA {
        Outcome::Undecided
    } else {
        Outcome::of(Some((p.larger > p.smaller) == larger))
    }
}

fn measured(p: &Paired) -> String {
    let (more, less) = p.measure.words();
    let dropped = if p.excluded > 0 {
        format!(" ({} without a value dropped)", p.excluded)
    } else {
        String::new()
    };
    format!(
        "{} {more} / {} {less} / {} tied of {} pairs{dropped}, sign test p = {} (Holm over the \
         variants: {}); median none {} vs 1/√d_k {}",
        p.larger,
        p.smaller,
        p.ties,
        p.larger + p.smaller + p.ties,
        show_p(p.p),
        show_p(p.p_holm),
        p.measure.show(p.median_unscaled),
        p.measure.show(p.median_scaled),
    )
}

/// The claims: one per measure, each over the variants.
pub fn claims(data: &VariantsData) -> Vec<Claim> {
    [
        Measure::Steps,
        Measure::EarlyEntropy,
        Measure::FinalMaxLogit,
    ]
    .into_iter()
    .map(|measure| {
        let conditions = data
            .paired
            .iter()
            .filter(|p| p.measure == measure)
            .map(|p| Condition {
                label: p.variant.label().into(),
                measured: measured(p),
                outcome: direction(p, measure.unscaled_larger()),
            })
            .collect();
        Claim::per_condition(
            measure.claim_id(),
            Source::Lab,
            measure.statement(),
            measure.check(),
            conditions,
        )
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiments::training_variants::design::Variant;

    #[test]
    fn a_claim_holds_fails_or_waits_on_the_adjusted_test() {
        let mut p = Paired {
            variant: Variant::Base,
            measure: Measure::Steps,
            larger: 12,
            smaller: 0,
            ties: 0,
            excluded: 0,
            p: 0.0005,
            p_holm: 0.002,
            median_unscaled: 100.0,
            median_scaled: 50.0,
        };
        assert_eq!(direction(&p, true), Outcome::Holds);
        assert_eq!(direction(&p, false), Outcome::Fails);
        p.p_holm = 0.06;
        assert_eq!(direction(&p, true), Outcome::Undecided);
        assert_eq!(Measure::Steps.show(f64::INFINITY), "never");
    }
}
