//! `logit-control`'s rows and claims.

use serde::Serialize;

use super::{CAPS, InitValues, LogitControlConfig, LogitControlResult};
use crate::claims::{Claim, Source, interval_below, show};
use crate::experiment::{Analysis, Measured};
use crate::measures::training::Arm;
use crate::stats::{Estimate, exponent_ci, mean_ci};

/// One (d_k, control) over its draws.
#[derive(Debug, Clone, Serialize)]
pub struct InitRow {
    /// d_k.
    pub d_k: usize,
    /// The control.
    pub control: Arm,
    /// Every draw.
    pub draws: Vec<InitValues>,
    /// Logit std.
    pub logit_std: Estimate,
    /// Max p.
    pub max_p: Estimate,
    /// Normalized entropy.
    pub entropy: Estimate,
    /// ‖J‖_F per row.
    pub jacobian_norm: Estimate,
    /// Share of keys with gradient.
    pub share_keys: Estimate,
    /// RMS ∂L/∂Q.
    pub rms_dq: Estimate,
}

/// What `render` draws.
#[derive(Debug, Clone, Serialize)]
pub struct LogitControlData {
    /// Queries = keys.
    pub n: usize,
    /// Draws per cell.
    pub draws: usize,
    /// The controls, in order.
    pub controls: Vec<Arm>,
    /// Every row.
    pub rows: Vec<InitRow>,
}

/// Rows and claims.
pub fn analyze(
    cells: &[Measured<LogitControlConfig, LogitControlResult>],
) -> Analysis<LogitControlData> {
    let mut rows = Vec::new();
    for c in cells {
        for (control, draws) in c.config.controls.iter().zip(&c.result.draws) {
            let ci =
                |pick: fn(&InitValues) -> f64| mean_ci(&draws.iter().map(pick).collect::<Vec<_>>());
            rows.push(InitRow {
                d_k: c.config.d_k,
                control: *control,
                logit_std: ci(|v| v.logit_std),
                max_p: ci(|v| v.max_p),
                entropy: ci(|v| v.entropy),
                jacobian_norm: ci(|v| v.jacobian_norm),
                share_keys: ci(|v| v.share_keys),
                rms_dq: ci(|v| v.rms_dq),
                draws: draws.clone(),
            });
        }
    }
    let first = cells.first().map(|c| &c.config);
    let data = LogitControlData {
        n: first.map_or(0, |c| c.n),
        draws: first.map_or(0, |c| c.draws),
        controls: first.map_or(Vec::new(), |c| c.controls.clone()),
        rows,
    };
    Analysis::new(claims(&data.rows), data)
}

/// The fitted exponent of a measure on d_k over every draw of one control.
fn exponent(rows: &[InitRow], control: Arm, pick: fn(&InitValues) -> f64) -> Estimate {
    let (xs, ys): (Vec<f64>, Vec<f64>) = rows
        .iter()
        .filter(|r| r.control == control)
        .flat_map(|r| r.draws.iter().map(move |v| (r.d_k as f64, pick(v))))
        .unzip();
    exponent_ci(&xs, &ys)
}

/// The claims (all the lab's: the article never meets these controls).
pub fn claims(rows: &[InitRow]) -> Vec<Claim> {
    let d_max = rows.iter().map(|r| r.d_k).max().unwrap_or(0);
    let at = |control: Arm| rows.iter().find(|r| r.d_k == d_max && r.control == control);
    let strong = Arm::SoftCap(CAPS[0]);
    let mut claims = Vec::new();
    if let (Some(cap), Some(none), Some(scaled)) = (at(strong), at(Arm::Unscaled), at(Arm::Scaled))
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
        exponent(rows, Arm::QkNorm, |v| v.logit_std),
        0.45,
        0.55,
    ));
    claims.push(Claim::in_range(
        "qk-norm-scaled-keeps-jacobian",
        Source::Lab,
        "QK-norm with 1/√d_k keeps the softmax Jacobian independent of d_k, like 1/√d_k alone",
        "fitted exponent of ‖J‖_F on d_k, QK-norm + 1/√d_k",
        exponent(rows, Arm::QkNormScaled, |v| v.jacobian_norm),
        -0.1,
        0.1,
    ));
    claims.push(Claim::below(
        "cap-jacobian-shrinks",
        Source::Lab,
        format!(
            "with a soft-cap of {} and no scaling the softmax Jacobian still shrinks as d_k grows",
            CAPS[0]
        ),
        &format!("fitted exponent of ‖J‖_F on d_k, cap {}", CAPS[0]),
        exponent(rows, strong, |v| v.jacobian_norm),
        0.0,
    ));
    claims
}
