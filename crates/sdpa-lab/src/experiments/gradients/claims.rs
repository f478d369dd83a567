//! The claims of `gradients`, decided by its rows: fitted exponents on d, interval comparisons and
//! the agreement of autodiff and of the backends.

use super::{DrawValues, GradientRow};
use crate::claims::{Claim, Source, interval_below, short, show};
use crate::experiments::BackendValues;
use crate::stats::{Estimate, exponent_ci};

/// The fitted exponent of a quantity on d over every draw of one backend and scaling.
fn exponent(
    rows: &[GradientRow],
    backend: &str,
    scaled: bool,
    pick: fn(&DrawValues) -> f64,
) -> Estimate {
    let (xs, ys): (Vec<f64>, Vec<f64>) = rows
        .iter()
        .filter(|r| r.backend == backend && r.scaled == scaled)
        .flat_map(|r| r.draws.iter().map(move |v| (r.d as f64, pick(v))))
        .unzip();
    exponent_ci(&xs, &ys)
}

/// The claims of `gradients`, decided on the primary backend (and, for the agreement claims, on
/// every backend).
pub fn claims(primary: &str, rows: &[GradientRow], per_backend: &[BackendValues]) -> Vec<Claim> {
    let unscaled = |pick| exponent(rows, primary, false, pick);
    let scaled = |pick| exponent(rows, primary, true, pick);
    let d_max = rows.iter().map(|r| r.d).max().unwrap_or(0);
    let at = |s: bool| {
        rows.iter()
            .find(|r| r.backend == primary && r.d == d_max && r.scaled == s)
    };
    let mut claims = vec![
        Claim::below(
            "jacobian-vanishes",
            Source::Article("§4"),
            "without √d scaling the softmax Jacobian diag(p) − ppᵀ vanishes as d grows",
            "fitted exponent of ‖J‖_F on d, unscaled",
            unscaled(|v| v.jacobian_norm),
            0.0,
        ),
        Claim::below(
            "score-gradient-vanishes",
            Source::Article("§4"),
            "without √d scaling the gradient reaching the scores vanishes as d grows",
            "fitted exponent of RMS ∂L/∂s on d, unscaled",
            unscaled(|v| v.rms_ds),
            0.0,
        ),
        Claim::below(
            "query-gradient-vanishes",
            Source::Article("§4"),
            "without √d scaling the gradient reaching Q (and K) vanishes as d grows",
            "fitted exponent of RMS ∂L/∂Q on d, unscaled",
            unscaled(|v| v.rms_dq),
            0.0,
        ),
        Claim::above(
            "query-gradient-grows",
            Source::Lab,
            "without scaling, ∂L/∂Q does not vanish: the smaller score gradients meet a scale of 1 instead of 1/√d, and it grows with d",
            "fitted exponent of RMS ∂L/∂Q on d, unscaled",
            unscaled(|v| v.rms_dq),
            0.0,
        ),
        Claim::in_range(
            "scaled-jacobian-flat",
            Source::Lab,
            "with 1/√d the Jacobian does not vanish: its norm does not depend on d",
            "fitted exponent of ‖J‖_F on d, scaled",
            scaled(|v| v.jacobian_norm),
            -0.1,
            0.1,
        ),
    ];
    if let (Some(u), Some(s)) = (at(false), at(true)) {
        claims.push(Claim::decided(
            "gradient-concentrates",
            Source::Lab,
            format!("without scaling the score gradient collapses onto few keys (d = {d_max})"),
            "share of keys with |∂L/∂s| > 1e−3 of the row's largest: unscaled interval entirely below the scaled one",
            format!("unscaled {}, scaled {}", show(u.share_keys), show(s.share_keys)),
            interval_below(u.share_keys, s.share_keys),
        ));
    }
    let worst_autodiff = rows
        .iter()
        .map(|r| r.jacobian_autodiff_max_diff)
        .fold(0.0, f64::max);
    claims.push(Claim::decided(
        "autodiff-equals-analytic",
        Source::Lab,
        "Burn's autodiff gives the analytic softmax Jacobian, on every backend",
        "largest per-row |autodiff − analytic| of ‖J‖_F ≤ 1e−4",
        format!("largest difference {}", short(worst_autodiff)),
        Some(worst_autodiff <= 1e-4),
    ));
    let backends: std::collections::BTreeSet<&str> =
        rows.iter().map(|r| r.backend.as_str()).collect();
    if backends.len() > 1 {
        let worst = per_backend
            .iter()
            .map(BackendValues::largest_disagreement)
            .fold(0.0, f64::max);
        claims.push(Claim::decided(
            "backends-agree",
            Source::Lab,
            format!(
                "every backend measures the same gradients ({})",
                backends.into_iter().collect::<Vec<_>>().join(", ")
            ),
            "largest relative disagreement of ‖J‖, RMS ∂L/∂Q and RMS ∂L/∂s on the same draw ≤ 1e−3",
            format!("largest relative disagreement {}", short(worst)),
            Some(worst <= 1e-3),
        ));
    }
    claims
}
