//! `masks`' claims and section.

use serde::Serialize;

use super::{MaskRow, MasksConfig, MasksResult};
use crate::article;
use crate::claims::{Claim, Condition, Outcome, Source};
use crate::experiment::{Analysis, Measured};

/// One supported (backend, dtype) cell.
#[derive(Debug, Clone, Serialize)]
pub struct DtypeCell {
    /// Backend.
    pub backend: String,
    /// dtype.
    pub dtype: String,
    /// Its measurement.
    pub result: MasksResult,
}

/// What `render` draws.
#[derive(Debug, Clone, Serialize)]
pub struct MasksData {
    /// Every supported cell.
    pub cells: Vec<DtypeCell>,
}

/// Claims and data.
pub fn analyze(cells: &[Measured<MasksConfig, MasksResult>]) -> Analysis<MasksData> {
    let mut skipped = Vec::new();
    let mut supported = Vec::new();
    for c in cells {
        if c.result.supported {
            supported.push(DtypeCell {
                backend: c.config.backend.clone(),
                dtype: c.config.dtype.clone(),
                result: c.result.clone(),
            });
        } else {
            skipped.push(format!(
                "{} on {}: the backend does not support this dtype",
                c.config.dtype, c.config.backend
            ));
        }
    }
    let data = MasksData { cells: supported };
    let mut analysis = Analysis::new(claims(&data), data);
    analysis.skipped = skipped;
    analysis
}

pub(super) fn find<'a>(
    c: &'a DtypeCell,
    fill: &str,
    n_masks: usize,
    fully: bool,
) -> Option<&'a MaskRow> {
    c.result
        .rows
        .iter()
        .find(|r| r.fill.starts_with(fill) && r.n_masks == n_masks && r.fully_masked == fully)
}

/// A claim with one condition per (backend, dtype) cell that `decide` answers.
fn per_cell(
    id: &str,
    source: Source,
    statement: &str,
    check: &str,
    data: &MasksData,
    decide: &dyn Fn(&DtypeCell) -> Option<(bool, String)>,
) -> Claim {
    let conditions = data
        .cells
        .iter()
        .filter_map(|c| {
            decide(c).map(|(ok, measured)| Condition {
                label: format!("{} {}", c.backend, c.dtype),
                measured,
                outcome: Outcome::of(Some(ok)),
            })
        })
        .collect();
    Claim::per_condition(id, source, statement, check, conditions)
}

/// The article's §3.3 claim that −∞ is safe, split into the causal case and fully masked rows.
fn minus_inf_claims(data: &MasksData) -> Vec<Claim> {
    vec![
        per_cell(
            "minus-inf-causal-safe",
            Source::Article(&article::MINUS_INF_SAFE),
            "the article's causal mask filled with −∞ is safe in a plain softmax: no NaN, rows sum to 1, nothing on masked keys",
            "triu(−∞, diagonal 1) on 8×8 scores: no NaN, |row sum − 1| within 8 machine epsilons of the dtype (rounding), masked weights exactly 0",
            data,
            &|c| {
                let (nan, sum, leak) = c.result.causal_minus_inf;
                let eps = match c.dtype.as_str() {
                    "f16" => 9.77e-4,
                    "bf16" => 7.81e-3,
                    _ => 1.19e-7,
                };
                Some((
                    !nan && sum <= 8.0 * eps && leak == 0.0,
                    format!("NaN: {nan}, |sum − 1| ≤ {sum:.1e}, masked ≤ {leak:.1e}"),
                ))
            },
        )
        .fails_if("a NaN, a row sum off by more than 8 machine epsilons, or weight on a masked key, in some cell"),
        per_cell(
            "minus-inf-fully-masked-row-is-nan",
            Source::Lab,
            "but a row that −∞ hides entirely (padding, a window) is NaN in a plain softmax: \"safe\" holds for causal masks only",
            "plain softmax of the fully masked row with −∞ is NaN",
            data,
            &|c| find(c, "-inf", 1, true).map(|r| (r.softmax == "NaN", r.softmax.clone())),
        ),
    ]
}

/// The article's Q3 claims about a −10⁹ fill.
fn minus_1e9_claims(data: &MasksData) -> Vec<Claim> {
    let is_inf = |s: &str| s == "-inf";
    vec![
        per_cell(
            "minus-1e9-example",
            Source::Article(&article::MINUS_1E9_WORKS),
            "softmax([5.0, −1e9]) = [1.0, 0.0]",
            "exactly [1, 0]",
            data,
            &|c| {
                let p = &c.result.q3_example;
                Some((p.len() == 2 && p[0] == 1.0 && p[1] == 0.0, format!("{p:?}")))
            },
        )
        .cannot_fail("IEEE 754 arithmetic of the dtype, the same on every run: only a bug could change it"),
        per_cell(
            "minus-1e9-overflows-f16",
            Source::Article(&article::MINUS_1E9_FP16),
            "in f16, −10⁹ does not fit and becomes −∞ (or NaN)",
            "the masked score of −1e9 in f16 reads −inf or NaN",
            data,
            &|c| {
                (c.dtype == "f16")
                    .then(|| find(c, "-1e9", 1, false))
                    .flatten()
                    .map(|r| {
                        (
                            is_inf(&r.masked_score) || r.masked_score.contains("NaN"),
                            r.masked_score.clone(),
                        )
                    })
            },
        )
        .cannot_fail("IEEE 754 arithmetic of the dtype, the same on every run: only a bug could change it"),
        per_cell(
            "minus-1e9-at-the-edge-of-f32",
            Source::Article(&article::MINUS_1E9_FP32_EDGE),
            "in f32, −10⁹ is at the edge: it or two of them added overflow, or the masked softmax goes wrong (f32's range ends at −3.4·10³⁸)",
            "holds when −1e9 or −1e9 + −1e9 is not finite in f32 or the 2-of-4 softmax with it is not correct",
            data,
            &|c| {
                (c.dtype == "f32")
                    .then(|| (find(c, "-1e9", 1, false), find(c, "-1e9", 2, false)))
                    .and_then(|(one, two)| {
                        let (one, two) = (one?, two?);
                        let finite =
                            !one.masked_score.contains("inf") && !two.masked_score.contains("inf");
                        let correct = one.softmax == "correct" && two.softmax == "correct";
                        Some((
                            !(finite && correct),
                            format!(
                                "−1e9 → {}, two added → {}, softmax {} / {}",
                                one.masked_score, two.masked_score, one.softmax, two.softmax
                            ),
                        ))
                    })
            },
        )
        .cannot_fail("IEEE 754 arithmetic of the dtype, the same on every run: only a bug could change it"),
        per_cell(
            "two-masks-overflow",
            Source::Article(&article::TWO_MASKS_OVERFLOW),
            "two −10⁹ masks added give −2×10⁹ and overflow further (in the dtypes where one mask alone is finite)",
            "the masked score of −1e9 + −1e9 reads −inf",
            data,
            &|c| {
                let one = find(c, "-1e9", 1, false)?;
                let two = find(c, "-1e9", 2, false)?;
                (!one.masked_score.contains("inf"))
                    .then(|| (is_inf(&two.masked_score), two.masked_score.clone()))
            },
        )
        .cannot_fail("IEEE 754 arithmetic of the dtype, the same on every run: only a bug could change it"),
    ]
}

/// What the lab adds: what does overflow, what a finite fill does, and the module.
fn lab_claims(data: &MasksData) -> Vec<Claim> {
    let is_inf = |s: &str| s == "-inf";
    vec![
        per_cell(
            "dtype-min-twice-overflows",
            Source::Lab,
            "what does overflow: two masks of the dtype's most negative value, added, become −∞",
            "the masked score of dtype min + dtype min reads −inf",
            data,
            &|c| {
                find(c, "dtype min", 2, false)
                    .map(|r| (is_inf(&r.masked_score), r.masked_score.clone()))
            },
        ),
        per_cell(
            "finite-fill-attends-hidden-keys",
            Source::Lab,
            "with a finite fill, a fully masked row of a plain softmax attends to the hidden keys",
            "plain softmax of the fully masked row with −1e4 (when finite in the dtype) is neither NaN nor zeros",
            data,
            &|c| {
                find(c, "-1e4", 1, true)
                    .filter(|r| !r.masked_score.contains("inf"))
                    .map(|r| (r.softmax.contains("attended"), r.softmax.clone()))
            },
        ),
        per_cell(
            "module-bool-mask-is-exact",
            Source::Lab,
            "the module's boolean mask gives zeros for a fully masked row and the correct weights otherwise",
            "every module-with-bool-mask case is \"zeros\" (fully masked) or \"correct\"",
            data,
            &|c| {
                let bad: Vec<&MaskRow> = c
                    .result
                    .rows
                    .iter()
                    .filter(|r| r.module_bool != if r.fully_masked { "zeros" } else { "correct" })
                    .collect();
                Some((
                    bad.is_empty(),
                    format!("{} of {} cases off", bad.len(), c.result.rows.len()),
                ))
            },
        ),
        per_cell(
            "module-never-nan",
            Source::Lab,
            "the module never gives NaN for a −∞ bias, even on a fully masked row",
            "no module-with-bias case whose masked score is −inf is NaN",
            data,
            &|c| {
                let cases: Vec<&MaskRow> = c
                    .result
                    .rows
                    .iter()
                    .filter(|r| r.masked_score == "-inf")
                    .collect();
                Some((
                    cases.iter().all(|r| r.module_bias != "NaN"),
                    format!("{} cases", cases.len()),
                ))
            },
        ),
    ]
}

/// The claims.
pub fn claims(data: &MasksData) -> Vec<Claim> {
    let mut claims = minus_inf_claims(data);
    claims.extend(minus_1e9_claims(data));
    claims.extend(lab_claims(data));
    claims
}
