//! `saturation`'s rows and claims.

use serde::Serialize;

use super::{ARTICLE, SaturationConfig, SaturationResult};
use crate::article;
use crate::claims::{Claim, Condition, Outcome, Source, short};
use crate::experiment::{Analysis, Measured};
use crate::stats::{Estimate, bonferroni_z, t_critical_95};

/// One (n, s) cell.
#[derive(Debug, Clone, Serialize)]
pub struct SaturationRow {
    /// Elements per softmax.
    pub n: usize,
    /// Logit scale.
    pub scale: f64,
    /// Mean max p over rows.
    pub max_p: Estimate,
    /// Mean entropy over rows.
    pub entropy: Estimate,
    /// ln n.
    pub ln_n: f64,
    /// The article's max p, if it has this cell.
    pub article_max_p: Option<f64>,
    /// The article's entropy.
    pub article_entropy: Option<f64>,
    /// Each batch's mean max p and mean entropy (`saturation_draws.csv`).
    pub batches: Vec<(f64, f64)>,
}

/// What `render` draws.
#[derive(Debug, Clone, Serialize)]
pub struct SaturationData {
    /// Rows per cell.
    pub rows_per_cell: usize,
    /// Every cell.
    pub rows: Vec<SaturationRow>,
}

/// Normalized entropy at or below which a softmax is "clearly saturated": halfway between
/// uniform (1) and one-hot (0), fixed before any run.
pub const SATURATED_NORMALIZED_ENTROPY: f64 = 0.5;

/// Rows and claims.
pub fn analyze(cells: &[Measured<SaturationConfig, SaturationResult>]) -> Analysis<SaturationData> {
    let rows: Vec<SaturationRow> = cells
        .iter()
        .map(|c| {
            let a = ARTICLE
                .iter()
                .find(|a| a.0 == c.config.n && a.1 == c.config.scale);
            SaturationRow {
                n: c.config.n,
                scale: c.config.scale,
                max_p: c.result.max_p,
                entropy: c.result.entropy,
                ln_n: (c.config.n as f64).ln(),
                article_max_p: a.map(|a| a.2),
                article_entropy: a.map(|a| a.3),
                batches: c
                    .result
                    .max_p_batches
                    .iter()
                    .copied()
                    .zip(c.result.entropy_batches.iter().copied())
                    .collect(),
            }
        })
        .collect();
    Analysis::new(
        claims(&rows),
        SaturationData {
            rows_per_cell: cells.first().map_or(0, |c| c.config.rows),
            rows,
        },
    )
}

/// §3.1: unscaled logits at d_k = 64 have s = 8: "clearly saturated", at every n.
fn at_logit_std_eight(rows: &[SaturationRow]) -> Vec<Condition> {
    rows.iter()
        .filter(|r| r.scale == 8.0)
        .map(|r| {
            let normalized = Estimate {
                value: r.entropy.value / r.ln_n,
                lo: r.entropy.lo / r.ln_n,
                hi: r.entropy.hi / r.ln_n,
                n: r.entropy.n,
                ci90: None,
            };
            Condition {
                label: format!("n = {}", r.n),
                measured: format!(
                    "entropy / ln n = {}, max p = {}",
                    crate::claims::show(normalized),
                    short(r.max_p.value)
                ),
                outcome: Outcome::of(crate::claims::side(
                    normalized,
                    SATURATED_NORMALIZED_ENTROPY,
                    true,
                )),
            }
        })
        .collect()
}

/// The claims.
///
/// The article's cells come from its own draw of 2000 rows: ours and its differ by the noise of
/// two independent draws, √2·SE (SE from our rows). The cells agree when every |ours − article|
/// is within z·√2·SE, z the family-wise 95% critical value over the cells (Bonferroni).
pub fn claims(rows: &[SaturationRow]) -> Vec<Claim> {
    let compared: Vec<&SaturationRow> = rows.iter().filter(|r| r.article_max_p.is_some()).collect();
    let worst = |value: fn(&SaturationRow) -> (Estimate, Option<f64>)| {
        compared
            .iter()
            .map(|r| {
                let (e, article) = value(r);
                let se = (e.hi - e.value) / t_critical_95(e.n.saturating_sub(1));
                (e.value - article.unwrap_or(f64::NAN)).abs() / (std::f64::consts::SQRT_2 * se)
            })
            .fold(0.0, f64::max)
    };
    let (p_units, h_units) = (
        worst(|r| (r.max_p, r.article_max_p)),
        worst(|r| (r.entropy, r.article_entropy)),
    );
    let critical = bonferroni_z(compared.len());
    let table_check = format!(
        "every |ours − article| ≤ {} · √2·SE (two draws of 2000 rows, family-wise 95%)",
        short(critical)
    );
    let ns: Vec<usize> = {
        let mut ns: Vec<usize> = rows.iter().map(|r| r.n).collect();
        ns.dedup();
        ns
    };
    let sharpening = |n: usize| {
        let cells: Vec<&SaturationRow> = rows.iter().filter(|r| r.n == n).collect();
        cells.windows(2).all(|w| w[1].entropy.hi < w[0].entropy.lo)
    };
    let at_eight = at_logit_std_eight(rows);
    vec![
        Claim::decided(
            "article-max-p",
            Source::Article(&article::SATURATION_TABLE),
            format!("the article's {} max p values", compared.len()),
            format!("max p column: {table_check}"),
            format!("largest |ours − article| = {} · √2·SE", short(p_units)),
            (!compared.is_empty()).then_some(p_units <= critical),
        )
        .fails_if(format!(
            "one of the article's values more than {} · √2·SE from ours",
            short(critical)
        )),
        Claim::decided(
            "article-entropy",
            Source::Article(&article::SATURATION_TABLE),
            format!("the article's {} entropies", compared.len()),
            format!("entropy column: {table_check}"),
            format!("largest |ours − article| = {} · √2·SE", short(h_units)),
            (!compared.is_empty()).then_some(h_units <= critical),
        )
        .fails_if(format!(
            "one of the article's values more than {} · √2·SE from ours",
            short(critical)
        )),
        Claim::decided(
            "larger-logits-saturate",
            Source::Article(&article::LARGE_LOGITS_ONE_HOT),
            "the larger the logits, the closer softmax is to one-hot (lower entropy), for every n",
            "entropy intervals strictly decreasing in s, for each n",
            format!("n = {ns:?}"),
            Some(ns.iter().all(|&n| sharpening(n))),
        )
        .fails_if("at some n, a larger logit scale whose entropy interval is not entirely below the smaller one's"),
        Claim::per_condition(
            "logit-std-8-clearly-saturated",
            Source::Article(&article::DK64_CLEARLY_SATURATED),
            format!(
                "at logit std 8 (unscaled, d_k = 64) softmax is clearly saturated: mean entropy at most \
                 {SATURATED_NORMALIZED_ENTROPY} of the uniform ln n (threshold fixed in advance)"
            ),
            "95% interval of entropy / ln n below 0.5, at each n",
            at_eight,
        )
        .fails_if("the 95% interval of entropy / ln n at or above 0.5 at some n, below it at none"),
    ]
}
