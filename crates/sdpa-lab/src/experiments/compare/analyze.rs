//! `compare`'s table and claims (and its small render).

use serde::Serialize;

use super::{CompareConfig, CompareResult};
use crate::article;
use crate::claims::{Claim, Condition, Outcome, Source};
use crate::experiment::{Analysis, BackendValues, Measured};

/// What `render` draws.
#[derive(Debug, Clone, Serialize)]
pub struct CompareData {
    /// (backend, its comparison).
    pub rows: Vec<(String, CompareResult)>,
}

/// `0` for an exact zero (bit-identical), else `1.2e-7`.
pub(super) fn sci(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.1e}")
    }
}

/// Table and claims.
pub fn analyze(cells: &[Measured<CompareConfig, CompareResult>]) -> Analysis<CompareData> {
    let rows: Vec<(String, CompareResult)> = cells
        .iter()
        .map(|c| (c.config.backend.clone(), c.result.clone()))
        .collect();
    let per_backend = ["ours vs Burn attention", "ours vs hand-written"]
        .into_iter()
        .map(|quantity| BackendValues {
            quantity: format!("compare: max |{quantity}|"),
            values: rows
                .iter()
                .map(|(b, r)| {
                    let v = if quantity.contains("Burn") {
                        r.ours_vs_burn
                    } else {
                        r.ours_vs_naive
                    };
                    (b.clone(), v)
                })
                .collect(),
            // Errors of outputs whose size is of order 1 (unit-variance inputs): compared against
            // 1, not against each other.
            floor: 1.0,
        })
        .collect();
    Analysis {
        claims: claims(&rows),
        data: CompareData { rows },
        per_backend,
        skipped: Vec::new(),
        headline: Vec::new(),
    }
}

/// The claims, one condition per backend.
pub fn claims(rows: &[(String, CompareResult)]) -> Vec<Claim> {
    let per = |decide: &dyn Fn(&CompareResult) -> (bool, String)| -> Vec<Condition> {
        rows.iter()
            .map(|(b, r)| {
                let (ok, measured) = decide(r);
                Condition {
                    label: b.clone(),
                    measured,
                    outcome: Outcome::of(Some(ok)),
                }
            })
            .collect()
    };
    vec![
        Claim::per_condition(
            "implementations-agree",
            Source::Article(&article::IMPLEMENTATIONS_AGREE),
            "the hand-written attention and the built-in agree (per backend of this run)",
            "largest |difference| between ours, Burn's attention and the hand-written one ≤ 1e−5",
            per(&|r| {
                let worst = r
                    .ours_vs_burn
                    .max(r.ours_vs_naive)
                    .max(r.ours_vs_naive_unmasked);
                (worst <= 1e-5, format!("largest difference {}", sci(worst)))
            }),
        )
        .fails_if("a difference above 1e−5 on some backend"),
        Claim::per_condition(
            "causal-past-unchanged",
            Source::Article(&article::CAUSAL_PAST_UNCHANGED),
            "with a causal mask, changing later values leaves earlier outputs exactly unchanged",
            "largest change at positions 0–4 is exactly 0",
            per(&|r| {
                (
                    r.causal_early_change == 0.0,
                    format!("largest change {}", sci(r.causal_early_change)),
                )
            }),
        )
        .fails_if("any change at positions 0–4 on some backend"),
        Claim::per_condition(
            "causal-future-changes",
            Source::Lab,
            "the outputs that may see the changed values do change",
            "largest change at positions 5–7 > 1",
            per(&|r| {
                (
                    r.causal_late_change > 1.0,
                    format!("largest change {}", sci(r.causal_late_change)),
                )
            }),
        ),
    ]
}
