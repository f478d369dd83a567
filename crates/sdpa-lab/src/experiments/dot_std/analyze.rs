//! `dot-std`'s rows and claims, from its cells.

use serde::Serialize;

use super::{ARTICLE_SCALED, ARTICLE_STD, DotStdConfig, DotStdResult};
use crate::article;
use crate::claims::{Claim, Source, short};
use crate::experiment::{Analysis, Measured};
use crate::stats::{Estimate, exponent_ci, mean, mean_ci, std, t_quantile};

/// One dimension.
#[derive(Debug, Clone, Serialize)]
pub struct DotStdRow {
    /// d.
    pub d: usize,
    /// √d.
    pub sqrt_d: f64,
    /// std of every dot product of every draw.
    pub pooled_std: f64,
    /// A draw's std of q·k: mean over draws with its 95% interval.
    pub std_mean: Estimate,
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
    /// Every draw's std / √d (the exponent's fit reads them; `dot_std_draws.csv`).
    pub draws_scaled: Vec<f64>,
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
    /// The fitted exponent of std(q·k) on d over every draw, with its 95% interval.
    pub exponent: Estimate,
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
                std_mean: {
                    let sqrt_d = (c.config.d as f64).sqrt();
                    let e = mean_ci(s);
                    Estimate {
                        value: e.value * sqrt_d,
                        lo: e.lo * sqrt_d,
                        hi: e.hi * sqrt_d,
                        n: e.n,
                        ci90: e.ci90.map(|(a, b)| (a * sqrt_d, b * sqrt_d)),
                    }
                },
                scaled: mean_ci(s),
                first_draw_scaled: s.first().copied().unwrap_or(f64::NAN),
                single_draw_range: (
                    s.iter().cloned().fold(f64::INFINITY, f64::min),
                    s.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                ),
                scaled_spread: std(s),
                article_std: i.map(|i| ARTICLE_STD[i]),
                draws_scaled: s.clone(),
                article_scaled: i.map(|i| ARTICLE_SCALED[i]),
            }
        })
        .collect();
    let exponent = exponent(cells);
    let claims = claims(cells, &rows, exponent);
    Analysis::new(
        claims,
        DotStdData {
            pairs: cells.first().map_or(0, |c| c.config.pairs),
            repeats: cells.first().map_or(0, |c| c.config.repeats),
            rows,
            exponent,
        },
    )
}

/// The fitted exponent of every draw's std against d, on log-log axes.
fn exponent(cells: &[Measured<DotStdConfig, DotStdResult>]) -> Estimate {
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
    exponent_ci(&xs, &ys)
}

/// The claims, decided by the draws.
fn claims(
    cells: &[Measured<DotStdConfig, DotStdResult>],
    rows: &[DotStdRow],
    exponent: Estimate,
) -> Vec<Claim> {
    let mut claims = vec![Claim::in_range(
        "std-grows-as-sqrt-d",
        Source::Article(&article::DOT_STD_IS_SQRT_D),
        "the std of q·k grows like √d: its fitted exponent on d is ½ (equivalence band ±0.05, fixed in advance)",
        "fitted exponent of std(q·k) on d",
        exponent,
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
    // Is the article's table consistent with one draw of `pairs`? Each article value against
    // the prediction interval of one new draw from our draws (mean ± t · sd · √(1 + 1/n), the sd
    // estimated from n draws), at a family-wise 95% level over the d values (Bonferroni).
    let compared: Vec<(f64, &Measured<DotStdConfig, DotStdResult>)> = cells
        .iter()
        .filter_map(|c| {
            let i = super::DIMS.iter().position(|&d| d == c.config.d)?;
            Some((ARTICLE_SCALED[i], c))
        })
        .collect();
    let draws = cells.first().map_or(0, |c| c.result.draws_scaled.len());
    let critical = if draws >= 2 {
        t_quantile(1.0 - 0.025 / compared.len().max(1) as f64, draws - 1)
    } else {
        f64::NAN
    };
    let article_t = compared
        .iter()
        .map(|(article, c)| {
            let s = &c.result.draws_scaled;
            let n = s.len() as f64;
            (article - mean(s)).abs() / (std(s) * (1.0 + 1.0 / n).sqrt())
        })
        .fold(0.0, f64::max);
    let pairs = cells.first().map_or(0, |c| c.config.pairs);
    claims.push(Claim::decided(
        "article-table-is-one-draw",
        Source::Lab,
        format!(
            "the article's std/√d values are consistent with one draw of {pairs} pairs (not rejecting this \
             does not show that they are one draw)"
        ),
        format!(
            "every article value inside the prediction interval of one new draw, mean ± {} · sd · √(1 + 1/{draws}) \
             (t with {} degrees of freedom, family-wise 95% over {} d, Bonferroni)",
            short(critical),
            draws.saturating_sub(1),
            compared.len()
        ),
        format!("largest |article − mean| = {} prediction sd", short(article_t)),
        (article_t.is_finite() && critical.is_finite() && !compared.is_empty())
            .then_some(article_t <= critical),
    ));
    claims
}
