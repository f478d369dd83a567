//! The claims of `logit-control`, decided by its numbers: interval comparisons and fitted
//! exponents at initialization, equivalence tests of the steps to 99% in training.

use super::{
    CAPS, Config, Control, ControlCell, EQUIVALENCE_STEPS, InitRow, InitValues, TRAIN_CAP,
};
use crate::claims::{Claim, Source, inside, interval_below, show};
use crate::stats::{Estimate, exponent_ci};

/// The fitted exponent of a measure on d_k over every draw of one control.
fn exponent(rows: &[InitRow], control: Control, pick: fn(&InitValues) -> f64) -> Estimate {
    let (xs, ys): (Vec<f64>, Vec<f64>) = rows
        .iter()
        .filter(|r| r.control == control)
        .flat_map(|r| r.draws.iter().map(move |v| (r.d_k as f64, pick(v))))
        .unzip();
    exponent_ci(&xs, &ys)
}

/// The claims of `logit-control`, decided by its numbers.
pub fn claims(config: &Config, rows: &[InitRow], cells: &[ControlCell]) -> Vec<Claim> {
    let d_max = config.dims.iter().copied().max().unwrap_or(0);
    let at = |control: Control| rows.iter().find(|r| r.d_k == d_max && r.control == control);
    let strong = Control::SoftCap(CAPS[0]);
    let mut claims = Vec::new();
    if let (Some(cap), Some(none), Some(scaled)) =
        (at(strong), at(Control::Unscaled), at(Control::Scaled))
    {
        claims.push(Claim::decided(
            "cap-prevents-saturation",
            Source::Lab,
            format!(
                "without scaling, a soft-cap of {} keeps attention from saturating at d_k = {d_max}",
                CAPS[0]
            ),
            "mean max p: capped interval entirely below the uncapped one",
            format!("cap {}, none {}", show(cap.max_p), show(none.max_p)),
            interval_below(cap.max_p, none.max_p),
        ));
        claims.push(Claim::decided(
            "cap-does-not-restore-gradient-share",
            Source::Lab,
            format!(
                "but the cap does not give the logit gradient back to as many keys as 1/√d_k does (d_k = {d_max})"
            ),
            "share of keys with gradient: capped interval entirely below the 1/√d_k one",
            format!("cap {}, 1/√d_k {}", show(cap.share_keys), show(scaled.share_keys)),
            interval_below(cap.share_keys, scaled.share_keys),
        ));
    }
    claims.push(Claim::in_range(
        "qk-norm-alone-grows-like-unscaled",
        Source::Lab,
        "QK-norm without 1/√d_k does not control the logits at initialization: their std still grows like √d_k",
        "fitted exponent of the logit std on d_k, QK-norm unscaled",
        exponent(rows, Control::QkNorm, |v| v.logit_std),
        0.45,
        0.55,
    ));
    claims.push(Claim::in_range(
        "qk-norm-scaled-keeps-jacobian",
        Source::Lab,
        "QK-norm with 1/√d_k keeps the softmax Jacobian independent of d_k, like 1/√d_k alone",
        "fitted exponent of ‖J‖_F on d_k, QK-norm + 1/√d_k",
        exponent(rows, Control::QkNormScaled, |v| v.jacobian_norm),
        -0.1,
        0.1,
    ));
    claims.push(Claim::below(
        "cap-jacobian-vanishes",
        Source::Lab,
        format!(
            "with a soft-cap of {} and no scaling the softmax Jacobian still shrinks as d_k grows",
            CAPS[0]
        ),
        &format!("fitted exponent of ‖J‖_F on d_k, cap {}", CAPS[0]),
        exponent(rows, strong, |v| v.jacobian_norm),
        0.0,
    ));
    // Training: each control against 1/√d_k at the largest d_k it was trained at.
    let cell = |control: Control| {
        cells
            .iter()
            .filter(|c| c.control == control)
            .max_by_key(|c| c.d_k)
    };
    for (id, control, statement) in [
        (
            "cap-trains-like-scaled",
            Control::SoftCap(TRAIN_CAP),
            format!("a soft-cap of {TRAIN_CAP} without scaling trains match as fast as 1/√d_k"),
        ),
        (
            "qk-norm-trains-like-scaled",
            Control::QkNorm,
            "QK-norm without scaling trains match as fast as 1/√d_k (its gain can learn the scale)"
                .to_string(),
        ),
        (
            "qk-norm-scaled-trains-like-scaled",
            Control::QkNormScaled,
            "QK-norm with 1/√d_k trains match as fast as 1/√d_k alone".to_string(),
        ),
    ] {
        if let Some(c) = cell(control) {
            let (d, d_train) = (c.steps_minus_scaled, c.d_k);
            // An equivalence test: the whole interval of the difference inside ±margin holds,
            // entirely outside fails, anything else is undecided (too few seeds to tell).
            let holds = inside(d, -EQUIVALENCE_STEPS, EQUIVALENCE_STEPS);
            claims.push(Claim::decided(
                id,
                Source::Lab,
                format!("{statement} (d_k = {d_train})"),
                format!(
                    "mean steps to 99% minus 1/√d_k's (Welch 95%) inside ±{EQUIVALENCE_STEPS} steps (a run that never gets there counts the budget)"
                ),
                format!(
                    "difference {}; {} reached 99% in {} of seeds",
                    show(d),
                    control.label(),
                    show(c.success)
                ),
                holds,
            ));
        }
    }
    if let (Some(norm), Some(none)) = (cell(Control::QkNorm), cell(Control::Unscaled))
        && norm.d_k == none.d_k
    {
        let d_train = norm.d_k;
        claims.push(Claim::decided(
            "qk-norm-rescues-unscaled",
            Source::Lab,
            format!("QK-norm reaches 99% sooner than no control at all (d_k = {d_train})"),
            "mean steps to 99%: QK-norm interval entirely below the uncontrolled one",
            format!(
                "QK-norm {}, none {}",
                show(norm.capped_steps),
                show(none.capped_steps)
            ),
            interval_below(norm.capped_steps, none.capped_steps),
        ));
    }
    claims
}
