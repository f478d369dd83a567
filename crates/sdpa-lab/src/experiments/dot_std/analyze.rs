//! `dot-std`'s rows and claims, from its cells.

use serde::Serialize;

use super::{ARTICLE_SCALED, ARTICLE_STD, DotStdConfig, DotStdResult};
use crate::article;
use crate::claims::{Claim, Source, short};
use crate::experiment::{Analysis, Measured};
use crate::stats::{Estimate, bonferroni_z, exponent_ci, mean_ci, std};

/// One dimension.
#[derive(Debug, Clone, Serialize)]
pub struct DotStdRow {
    /// d.
    pub d: usize,
    /// √d.
    pub sqrt_d: f64,
    /// std of every dot product of every draw.
    pub pooled_std: f64,
    /// std / √d, mean over draws with its interval.
    pub scaled: Estimate,
    /// std / √d of the first draw alone (one draw of the article's size).
    pub first_draw_scaled: f64,
    /// Smallest and largest std / √d of a single draw.
    pub single_draw_range: (f64, f64),
    /// The spread (std) of std / √d over draws.
    pub scaled_spread: f64,
    /// The article's std, if it has this d.
    pub article_std: Option<f64>,
    /// The article's std / √d.
    pub article_scaled: Option<f64>,
}

/// What `render` draws.
#[derive(Debug, Clone, Serialize)]
pub struct DotStdData {
    /// Pairs per draw.
    pub pairs: usize,
    /// Draws per d.
    pub repeats: usize,
    /// One row per d.
    pub rows: Vec<DotStdRow>,
}

/// Rows and claims.
pub fn analyze(cells: &[Measured<DotStdConfig, DotStdResult>]) -> Analysis<DotStdData> {
    let rows: Vec<DotStdRow> = cells
        .iter()
        .map(|c| {
            let s = &c.result.draws_scaled;
            let i = super::DIMS.iter().position(|&d| d == c.config.d);
            DotStdRow {
                d: c.config.d,
                sqrt_d: (c.config.d as f64).sqrt(),
                pooled_std: c.result.pooled_std,
                scaled: mean_ci(s),
                first_draw_scaled: s.first().copied().unwrap_or(f64::NAN),
                single_draw_range: (
                    s.iter().cloned().fold(f64::INFINITY, f64::min),
                    s.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                ),
                scaled_spread: std(s),
                article_std: i.map(|i| ARTICLE_STD[i]),
                article_scaled: i.map(|i| ARTICLE_SCALED[i]),
            }
        })
        .collect();
    let claims = claims(cells, &rows);
    Analysis::new(
        claims,
        DotStdData {
            pairs: cells.first().map_or(0, |c| c.config.pairs),
            repeats: cells.first().map_or(0, |c| c.config.repeats),
            rows,
        },
    )
}

/// The claims, decided by the draws.
fn claims(cells: &[Measured<DotStdConfig, DotStdResult>], rows: &[DotStdRow]) -> Vec<Claim> {
    // Every draw's std against d, on log-log axes.
    let (xs, ys): (Vec<f64>, Vec<f64>) = cells
        .iter()
        .flat_map(|c| {
            let sqrt_d = (c.config.d as f64).sqrt();
            c.result
                .draws_scaled
                .iter()
                .map(move |s| (c.config.d as f64, s * sqrt_d))
        })
        .unzip();
    let mut claims = vec![Claim::in_range(
        "std-grows-as-sqrt-d",
        Source::Article(&article::DOT_STD_IS_SQRT_D),
        "the std of q·k grows like √d: its fitted exponent on d is ½ (equivalence band ±0.05, fixed in advance)",
        "fitted exponent of std(q·k) on d",
        exponent_ci(&xs, &ys),
        0.45,
        0.55,
    )];
    // The d whose scaled std is farthest from 1.
    if let Some(worst) = rows
        .iter()
        .map(|r| r.scaled)
        .max_by(|a, b| (a.value - 1.0).abs().total_cmp(&(b.value - 1.0).abs()))
    {
        claims.push(Claim::in_range(
            "scaled-std-near-one",
            Source::Article(&article::SCALED_STD_NEAR_ONE),
            "after dividing by √d the std is 1 for every d (band ±0.05)",
            "std/√d at the d farthest from 1, mean over draws",
            worst,
            0.95,
            1.05,
        ));
    }
    // Is the article's table one draw of `pairs`? Its distance from 1 against the spread of our
    // single draws, at a family-wise 95% level over the d values (Bonferroni).
    let compared: Vec<&DotStdRow> = rows.iter().filter(|r| r.article_scaled.is_some()).collect();
    let article_z = compared
        .iter()
        .map(|r| (r.article_scaled.unwrap_or(f64::NAN) - 1.0).abs() / r.scaled_spread)
        .fold(0.0, f64::max);
    let critical = bonferroni_z(compared.len());
    let pairs = cells.first().map_or(0, |c| c.config.pairs);
    claims.push(Claim::decided(
        "article-table-is-one-draw",
        Source::Lab,
        format!("the article's std/√d values are what one draw of {pairs} pairs gives"),
        format!(
            "largest |article − 1| within {} sd of our single draws (family-wise 95% over {} d, Bonferroni)",
            short(critical),
            compared.len()
        ),
        format!("largest |article − 1| = {} single-draw sd", short(article_z)),
        (article_z.is_finite() && !compared.is_empty()).then_some(article_z <= critical),
    ));
    claims
}
