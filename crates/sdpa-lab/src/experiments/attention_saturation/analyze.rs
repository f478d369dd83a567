//! `attention-saturation`'s tables and claims.

use serde::Serialize;

use super::{
    ARTICLE, AttentionSaturationConfig as Config, AttentionSaturationResult as Result, DrawValues,
};
use crate::article;
use crate::claims::{Claim, Condition, Outcome, Source, inside, short, show, side};
use crate::experiment::{Analysis, BackendValues, Measured, Plan};
use crate::stats::{Estimate, exponent_ci, mean_ci};

/// The article's code, replicated over draws.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicatedRow {
    /// d.
    pub d: usize,
    /// Max p of one softmax over 500 unscaled dot products, per draw.
    pub unscaled: Vec<f64>,
    /// Same, scaled by 1/√d.
    pub scaled: Vec<f64>,
    /// −b ln(b + 1e−10) for b = the first draw's scaled max p (what the article prints as
    /// entropy).
    pub article_entropy_formula: f64,
}

/// The corrected measurement for one (d, m, scaling) over its draws.
#[derive(Debug, Clone, Serialize)]
pub struct CorrectedRow {
    /// d.
    pub d: usize,
    /// Keys per query.
    pub m: usize,
    /// Divided by √d.
    pub scaled: bool,
    /// Mean within-row std of the scores.
    pub logit_std: Estimate,
    /// Mean largest probability of a row.
    pub max_p: Estimate,
    /// Mean row entropy (nats).
    pub entropy: Estimate,
    /// ln m.
    pub ln_m: f64,
    /// Mean number of keys with p > 1e−3.
    pub keys_above_1e3: Estimate,
    /// Share of rows with max p > 0.99.
    pub saturated_fraction: Estimate,
    /// Max p of every draw.
    pub max_p_draws: Vec<f64>,
    /// Every draw's share of queries with max p above 0.99 (the CSV of draws holds them).
    pub saturated_draws: Vec<f64>,
    /// Every draw's logit std.
    pub logit_std_draws: Vec<f64>,
}

/// What `render` draws.
#[derive(Debug, Clone, Serialize)]
pub struct AttentionSaturationData {
    /// Queries per draw.
    pub n: usize,
    /// Draws per corrected cell.
    pub draws: usize,
    /// The m the claims are decided at.
    pub m_main: usize,
    /// The replicated code.
    pub replicated: Vec<ReplicatedRow>,
    /// The corrected measurement.
    pub corrected: Vec<CorrectedRow>,
}

fn row(d: usize, m: usize, scaled: bool, draws: &[DrawValues]) -> CorrectedRow {
    let ci = |pick: fn(&DrawValues) -> f64| mean_ci(&draws.iter().map(pick).collect::<Vec<_>>());
    CorrectedRow {
        d,
        m,
        scaled,
        logit_std: ci(|v| v.logit_std),
        max_p: ci(|v| v.max_p),
        entropy: ci(|v| v.entropy),
        ln_m: (m as f64).ln(),
        keys_above_1e3: ci(|v| v.keys_above_1e3),
        saturated_fraction: ci(|v| v.saturated_fraction),
        max_p_draws: draws.iter().map(|v| v.max_p).collect(),
        saturated_draws: draws.iter().map(|v| v.saturated_fraction).collect(),
        logit_std_draws: draws.iter().map(|v| v.logit_std).collect(),
    }
}

/// The first draw of every corrected cell on every other backend, beside the primary's.
fn cross_backend(
    plan: &Plan,
    cells: &[Measured<Config, Result>],
    corrected: &[CorrectedRow],
) -> Vec<BackendValues> {
    let mut per_backend = Vec::new();
    for c in cells {
        if let (Config::Cross { d, m, backend, .. }, Result::Cross { unscaled, scaled }) =
            (&c.config, &c.result)
        {
            for (is_scaled, other) in [(false, unscaled), (true, scaled)] {
                let primary = corrected
                    .iter()
                    .find(|r| r.d == *d && r.m == *m && r.scaled == is_scaled)
                    .and_then(|r| r.max_p_draws.first().copied());
                let quantity = format!(
                    "max p, d = {d}, m = {m}, {}",
                    if is_scaled { "scaled" } else { "unscaled" }
                );
                let entry = match per_backend
                    .iter_mut()
                    .find(|b: &&mut BackendValues| b.quantity == quantity)
                {
                    Some(e) => e,
                    None => {
                        per_backend.push(BackendValues {
                            quantity,
                            values: vec![(plan.primary().to_string(), primary.unwrap_or(f64::NAN))],
                            floor: 0.0,
                        });
                        per_backend.last_mut().expect("just pushed")
                    }
                };
                entry.values.push((backend.clone(), other.max_p));
            }
        }
    }
    per_backend
}

/// Tables and claims.
pub fn analyze(
    plan: &Plan,
    cells: &[Measured<Config, Result>],
) -> Analysis<AttentionSaturationData> {
    let mut replicated = Vec::new();
    let mut corrected = Vec::new();
    let (mut n, mut draws) = (0, 0);
    for c in cells {
        match (&c.config, &c.result) {
            (Config::Replicate { d, .. }, Result::Replicate { unscaled, scaled }) => {
                let b = scaled.first().copied().unwrap_or(f64::NAN);
                replicated.push(ReplicatedRow {
                    d: *d,
                    unscaled: unscaled.clone(),
                    scaled: scaled.clone(),
                    article_entropy_formula: -(b * (b + 1e-10).ln()),
                });
            }
            (
                Config::Corrected {
                    d,
                    m,
                    n: queries,
                    draws: k,
                    ..
                },
                Result::Corrected { unscaled, scaled },
            ) => {
                (n, draws) = (*queries, *k);
                corrected.push(row(*d, *m, false, unscaled));
                corrected.push(row(*d, *m, true, scaled));
            }
            _ => {}
        }
    }
    let per_backend = cross_backend(plan, cells, &corrected);
    let m_main = if corrected.iter().any(|r| r.m == super::ARTICLE_M) {
        super::ARTICLE_M
    } else {
        corrected.first().map_or(0, |r| r.m)
    };
    let claims = claims(&replicated, &corrected, m_main);
    Analysis {
        claims,
        data: AttentionSaturationData {
            n,
            draws,
            m_main,
            replicated,
            corrected,
        },
        per_backend,
        skipped: Vec::new(),
        headline: Vec::new(),
    }
}

/// The article's smallest "one-hot" value: its d = 64 entry, 0.9990.
pub const ONE_HOT_MAX_P: f64 = 0.999;

/// The corrected row of (d, scaling) at m.
fn cell(corrected: &[CorrectedRow], m: usize, d: usize, scaled: bool) -> Option<&CorrectedRow> {
    corrected
        .iter()
        .find(|r| r.d == d && r.m == m && r.scaled == scaled)
}

/// The article's claims about the unscaled and scaled max p.
fn article_claims(
    replicated: &[ReplicatedRow],
    corrected: &[CorrectedRow],
    m_main: usize,
) -> Vec<Claim> {
    let cell = |d: usize, scaled: bool| cell(corrected, m_main, d, scaled);
    let mut claims = Vec::new();
    // §6: "unscaled, max_p is 0.9999 everywhere": at every d the article printed ≥ 0.999 for.
    let one_hot: Vec<Condition> = [64, 256, 1024]
        .iter()
        .filter_map(|&d| cell(d, false))
        .map(|r| Condition {
            label: format!("d = {}", r.d),
            measured: format!(
                "mean max p {}, rows with max p > 0.99: {}",
                show(r.max_p),
                show(r.saturated_fraction)
            ),
            outcome: Outcome::of(side(r.max_p, ONE_HOT_MAX_P, false)),
        })
        .collect();
    claims.push(Claim::per_condition(
        "unscaled-is-one-hot",
        Source::Article(&article::UNSCALED_ONE_HOT),
        format!("unscaled attention is one-hot: mean max p ≥ {ONE_HOT_MAX_P} at d = 64, 256, 1024 (m = {m_main})"),
        format!("95% interval of the mean max p against {ONE_HOT_MAX_P}, per d"),
        one_hot,
    )
    .fails_if(format!(
        "the 95% interval of the mean max p below {ONE_HOT_MAX_P} at some d, above it at none"
    )));
    // Q1: the d = 64 row. Unscaled, the article's claim is the collapse (one-hot), decided by
    // the per-query mean; scaled, its 0.0350 is one draw of its code, so it is checked against
    // the spread of that code's draws (a mean of many rows would differ from one draw).
    // Disclosed: until commit b72de02 the scaled half was the per-query mean within ±0.005 of
    // 0.0350 (it failed at 0.027); changed after that run, on a reviewer's reading.
    let mut d64 = Vec::new();
    if let Some(r) = cell(64, false) {
        d64.push(Condition {
            label: "unscaled: 0.9990, one-hot".into(),
            measured: format!("per-query mean max p {}", show(r.max_p)),
            outcome: Outcome::of(inside(r.max_p, 0.9990 - 0.001, 0.9990 + 0.001)),
        });
    }
    if let Some(r) = replicated.iter().find(|r| r.d == 64) {
        let (lo, hi) = r
            .scaled
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        d64.push(Condition {
            label: "scaled: 0.0350, one draw".into(),
            measured: format!(
                "the article's code, {} draws: {}–{}{}",
                r.scaled.len(),
                short(lo),
                short(hi),
                cell(64, true)
                    .map(|c| format!("; per-query mean at m = {m_main}: {}", show(c.max_p)))
                    .unwrap_or_default()
            ),
            outcome: Outcome::of((!r.scaled.is_empty()).then_some(lo <= 0.0350 && 0.0350 <= hi)),
        });
    }
    claims.push(Claim::all_of(
        "d64-table",
        Source::Article(&article::DK64_TABLE),
        format!(
            "at d = 64 the max p is 0.9990 unscaled (one-hot; the per-query mean within ±0.001, m = {m_main}) and \
             0.0350 scaled (a draw its code gives)"
        ),
        "both parts, the sentence being one claim (fails when either part fails): unscaled: 90% interval of \
         the per-query mean max p inside [0.998, 1.0] (TOST); scaled: 0.0350 inside the range of the \
         replicated draws of the article's code",
        d64,
    )
    .fails_if(
        "the unscaled per-query mean's 95% interval outside [0.998, 1.0], or 0.0350 outside the \
         range of the article's code's draws",
    ));
    let scaled_band: Vec<Condition> = corrected
        .iter()
        .filter(|r| r.scaled && r.m == m_main)
        .map(|r| Condition {
            label: format!("d = {}", r.d),
            measured: format!("mean max p {}", show(r.max_p)),
            outcome: Outcome::of(inside(r.max_p, 0.02, 0.035)),
        })
        .collect();
    claims.push(Claim::per_condition(
        "scaled-max-p-band",
        Source::Article(&article::SCALED_MAX_P),
        format!("scaled, the mean max p is between 0.02 and 0.035 at every d (m = {m_main})"),
        "90% interval of the mean max p inside [0.02, 0.035] (TOST), per d",
        scaled_band,
    )
    .fails_if("the 95% interval of the mean max p entirely outside [0.02, 0.035] at some d, inside at none"));
    claims
}

/// The lab's claims: the scaled max p is flat in d, unscaled is peaked but not one-hot, and the
/// article's code explains its numbers.
fn lab_claims(
    replicated: &[ReplicatedRow],
    corrected: &[CorrectedRow],
    m_main: usize,
) -> Vec<Claim> {
    let d_max = corrected.iter().map(|r| r.d).max().unwrap_or(0);
    let cell = |d: usize, scaled: bool| cell(corrected, m_main, d, scaled);
    let mut claims = Vec::new();
    // Scaled: the per-query max p does not grow with d (the logit std stays 1).
    let (xs, ys): (Vec<f64>, Vec<f64>) = corrected
        .iter()
        .filter(|r| r.scaled && r.m == m_main)
        .flat_map(|r| r.max_p_draws.iter().map(move |p| (r.d as f64, *p)))
        .unzip();
    claims.push(Claim::in_range(
        "scaled-is-flat",
        Source::Lab,
        format!("with 1/√d, the per-query max p does not depend on d (m = {m_main})"),
        "fitted exponent of the scaled max p on d",
        exponent_ci(&xs, &ys),
        -0.1,
        0.1,
    ));
    // Scaled: the max p depends on m (the logits are N(0, 1) whatever d is, so the row's
    // largest weight is set by how many keys share the mass).
    let (ms, ps): (Vec<f64>, Vec<f64>) = corrected
        .iter()
        .filter(|r| r.scaled)
        .flat_map(|r| r.max_p_draws.iter().map(move |p| (r.m as f64, *p)))
        .unzip();
    let n_ms = {
        let mut m: Vec<usize> = corrected.iter().map(|r| r.m).collect();
        m.sort_unstable();
        m.dedup();
        m.len()
    };
    if n_ms > 1 {
        claims.push(Claim::below(
            "scaled-depends-on-m",
            Source::Lab,
            "with 1/√d, the per-query max p falls with the number of keys m (it depends on m, not on d)",
            "fitted exponent of the scaled max p on m, every d pooled",
            exponent_ci(&ms, &ps),
            0.0,
        ));
    }
    if let Some(r) = cell(d_max, false) {
        claims.push(Claim::below(
            "unscaled-peaked-not-one-hot",
            Source::Lab,
            format!(
                "unscaled attention at d = {d_max} is peaked but not one-hot: fewer than 90% of the rows have max p > 0.99 (m = {m_main})"
            ),
            "share of rows with max p > 0.99",
            r.saturated_fraction,
            0.9,
        ));
    }
    // Every article value inside the range of the replicated draws of its d.
    let range = |xs: &[f64]| {
        xs.iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            })
    };
    let inside_draws = |x: f64, draws: &[f64]| {
        let (lo, hi) = range(draws);
        lo <= x && x <= hi
    };
    let replicated_like_article = ARTICLE.iter().all(|a| {
        replicated
            .iter()
            .find(|r| r.d == a.0)
            .is_some_and(|r| inside_draws(a.1, &r.unscaled) && inside_draws(a.2, &r.scaled))
    });
    claims.push(Claim::decided(
        "article-code-explains-its-numbers",
        Source::Lab,
        "the article's numbers are single draws of its code (one row of 500 logits per d): its code gives numbers like them",
        "every article max p (unscaled and scaled) inside the range of the replicated draws of its d",
        replicated
            .iter()
            .map(|r| {
                let (u_lo, u_hi) = range(&r.unscaled);
                let (s_lo, s_hi) = range(&r.scaled);
                format!(
                    "d = {}: {}–{} / {}–{}",
                    r.d,
                    short(u_lo),
                    short(u_hi),
                    short(s_lo),
                    short(s_hi)
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        (!replicated.is_empty()).then_some(replicated_like_article),
    ));
    claims
}

/// The claims.
pub fn claims(
    replicated: &[ReplicatedRow],
    corrected: &[CorrectedRow],
    m_main: usize,
) -> Vec<Claim> {
    let mut claims = article_claims(replicated, corrected, m_main);
    claims.extend(lab_claims(replicated, corrected, m_main));
    claims
}
