//! `training`'s claims on the learning-rate question (issue 30 §3): the sweep's arms against
//! 1/√d_k seed by seed, the equivalence at each arm's own rate, and the intervention arm.

use super::analyze::TrainingData;
use super::claims::{equivalence_claim, select, slower_claim, slower_claim_noted};
use super::design::{ALPHA, Part, SENSITIVITY_FACTOR};
use crate::claims::{Claim, Condition, Outcome, Source, short, show_p};
use crate::measures::training::{Arm, init_name};

/// The learning-rate question of issue 30: is the unscaled arm (or 1/d_k, or QK-norm) just on
/// another learning rate? Its range of good rates against 1/√d_k's, seed by seed; and, at each
/// arm's own chosen rate, whether the paired evaluation runs are as fast (only a shift).
pub(super) fn sweep_claims(data: &TrainingData) -> Vec<Claim> {
    use super::sweep::SeedMeasure;
    use Arm::*;
    let mut claims = Vec::new();
    for (measure, id, what, check) in [
        (
            SeedMeasure::LrSensitivity,
            "lr-sensitivity-higher",
            "is more sensitive to the learning rate than 1/√d_k (Wortsman et al. 2023's learning-rate \
             sensitivity: the mean over the grid of the final held-out loss above the best rate's, each \
             rate's loss capped at the loss at initialization)"
                .to_string(),
            "per tuning seed and d_k of the sweep, the learning-rate sensitivity of its final held-out losses \
             over the 7 rates (no threshold involved); exact two-sided sign test on the paired values (same \
             seed, same d_k), Holm over every arm and initialization of this measure, α = 0.05: holds when \
             higher, fails when lower"
                .to_string(),
        ),
        (
            SeedMeasure::Width,
            "lr-range-narrower",
            format!(
                "trains well over a narrower range of learning rates than 1/√d_k (\"well\": steps to 99% within \
                 {SENSITIVITY_FACTOR}× the seed's best rate)"
            ),
            format!(
                "per tuning seed and d_k of the sweep, the number of grid steps of the contiguous range of rates \
                 around that seed's best whose steps to 99% are within {SENSITIVITY_FACTOR}× of it (grid steps, \
                 not decades: the grid alternates ×3 and ×3.33, and a range moved along it keeps its width; a \
                 seed that never reached 99% at any rate has no width and its pair is counted apart); exact \
                 two-sided sign test on the paired widths, Holm over every arm and initialization of this \
                 measure, α = 0.05: holds when narrower, fails when wider"
            ),
        ),
        (
            SeedMeasure::LossAtBest,
            "best-loss-higher",
            "reaches a higher final held-out loss than 1/√d_k, each at its own best rate (the curve's best \
             median final loss)"
                .to_string(),
            "per tuning seed and d_k of the sweep, the final held-out loss at the arm's best rate against \
             1/√d_k's at its own (both rates selected on the same seeds' medians); exact two-sided sign test, \
             Holm over every arm and initialization of this measure, α = 0.05: holds when higher, fails when \
             lower"
                .to_string(),
        ),
    ] {
        for arm in [Unscaled, InvDk, QkNorm] {
            let rows: Vec<&super::sweep::Sensitivity> = data
                .sensitivity
                .iter()
                .filter(|s| s.arm == arm && s.measure == measure)
                .collect();
            if rows.is_empty() {
                continue;
            }
            claims.push(Claim::per_condition(
                &format!("{id}-{}", arm.slug()),
                Source::Lab,
                format!("{} {what}", arm.label()),
                check.clone(),
                rows.iter()
                    .map(|s| {
                        let never = if measure == SeedMeasure::Width {
                            format!(
                                "; never at 99% at any rate (left out): {} {}, 1/√d_k {}",
                                arm.label(),
                                s.never_arm,
                                s.never_reference
                            )
                        } else {
                            String::new()
                        };
                        Condition {
                            label: format!("{} init", init_name(s.init)),
                            measured: format!(
                                "median {} vs 1/√d_k {}; worse in {}, better in {}, tied in {} of {} pairs, \
                                 p = {} (Holm: {}){never}",
                                short(s.median),
                                short(s.reference_median),
                                s.worse,
                                s.better,
                                s.pairs - s.worse - s.better,
                                s.pairs,
                                show_p(s.p),
                                show_p(s.p_holm)
                            ),
                            outcome: if s.p_holm >= ALPHA {
                                Outcome::Undecided
                            } else {
                                Outcome::of(Some(s.worse > s.better))
                            },
                        }
                    })
                    .collect(),
            ));
        }
    }
    claims.push(equivalence_claim(
        "unscaled-only-a-lr-shift",
        "each arm at its own learning rate (chosen on the curve's tuning seeds), training without √d_k is as \
         fast as with it: the difference is only a shift of the learning rate (steps to 99% are read every \
         10 steps, so where 1/√d_k needs few steps only ties are within the margin; the final-loss claims \
         above answer the same question without that limit)"
            .into(),
        &select(data, Part::Main, Scaled, Unscaled),
    ));
    claims.push(equivalence_claim(
        "inv-dk-only-a-lr-shift",
        "each at its own learning rate, 1/d_k (µP's attention scale) trains as fast as 1/√d_k"
            .into(),
        &select(data, Part::Temperature, Scaled, InvDk),
    ));
    claims
}

/// The intervention: unscaled attention whose logits start as the scaled arm's (W_Q, W_K ×
/// d_k^(−1/4)). As fast as 1/√d_k: the start explains the delay; slower: the unscaled dynamics.
/// And 1/√d_k attention from the unscaled arm's start (W_Q, W_K × d_k^(1/4)), at 1/√d_k's rate:
/// slower than 1/√d_k, the start alone costs steps.
pub(super) fn intervention_claims(data: &TrainingData) -> Vec<Claim> {
    use Arm::*;
    let against_scaled = select(data, Part::Intervention, Scaled, UnscaledSmallInit);
    vec![
        slower_claim_noted(
            "small-init-rescues-unscaled",
            "unscaled attention whose W_Q, W_K start × d_k^−¼ (its logits start exactly as 1/√d_k's) trains \
             faster than unscaled attention from the usual initialization: the saturated start is part of \
             the delay (under Adam, unscaled attention is 1/√d_k with W_Q, W_K both initialized and stepped \
             d_k^¼ larger; this arm keeps the larger step and undoes the larger start; each arm at its own \
             tuned rate, printed, so where the rates differ the start is not the only difference)"
                .into(),
            &select(data, Part::Intervention, Unscaled, UnscaledSmallInit),
            false,
            &|s| format!("; rates {} vs {}", s.lr_other, s.lr_reference),
        ),
        slower_claim_noted(
            "small-init-slower-than-scaled",
            "started like 1/√d_k, unscaled attention still trains slower than 1/√d_k, each at its own rate. \
             Read with Adam's invariance to a gradient's scale (ε aside): this arm is 1/√d_k with W_Q and W_K \
             stepped d_k^¼ faster than the other parameters, and one global rate sets both (each condition \
             prints the effective rates), so the arm changes neither group's step alone: it shows what a \
             single rate does to unscaled attention's two groups of parameters, not the gradient's size. An \
             arm at 1/√d_k's own rate, which would change W_Q, W_K's step alone, is not run"                .into(),
            &against_scaled,
            true,
            &|s| {
                let qk = s.lr_other * (s.comparison.condition.d_k as f64).powf(0.25);
                format!(
                    "; effective rates against 1/√d_k's {}: W_Q, W_K {} (rate × d_k^¼), every other \
                     parameter {}",
                    s.lr_reference,
                    short(qk),
                    s.lr_other
                )
            },
        ),
        equivalence_claim(
            "small-init-as-fast-as-scaled",
            "started like 1/√d_k, unscaled attention trains as fast as 1/√d_k".into(),
            &against_scaled,
        ),
        slower_claim(
            "unscaled-start-slower-than-scaled",
            "from the unscaled arm's start but with 1/√d_k's gradients, training is slower than 1/√d_k at \
             1/√d_k's own tuned rate: the start alone costs steps (1/√d_k attention whose W_Q, W_K start × \
             d_k^¼, same seed and draws, so its logits start exactly as the unscaled arm's; untuned: it \
             takes 1/√d_k's rate, so that the start is the one difference)"
                .into(),
            &select(data, Part::Intervention, Scaled, ScaledLargeInit),
            true,
        ),
    ]
}
