//! Experiment 3 (`attention-saturation`): the article's "unscaled vs scaled" table, recomputed
//! correctly. The article's code takes ONE softmax across 500 unrelated q·k pairs (not a softmax
//! over the keys of each query), and its entropy column is −b·ln b of a single number b (the mean
//! max probability), not an entropy of a distribution. Here: n = m = 256 queries and keys, a
//! softmax over the keys of each query, through the library's module and diagnostics.

use std::time::Instant;

use burn::tensor::activation::softmax;
use burn_sdpa::{
    AttentionInput, ScalePolicy, ScaledDotProductAttentionConfig, attention_diagnostics,
};
use serde::Serialize;

use super::{Experiment, ExperimentOutput, Verdict, f, md_table, write_csv};
use crate::context::{LabContext, LabError, normal_tensor, to_vec};

/// The article's table: (d, max p unscaled, max p scaled, "entropy (scaled)", "uniform entropy").
pub const ARTICLE: [(usize, f64, f64, f64, f64); 4] = [
    (16, 0.7267, 0.0319, 0.110, 2.773),
    (64, 0.9990, 0.0350, 0.117, 4.159),
    (256, 0.9999, 0.0347, 0.117, 5.545),
    (1024, 0.9999, 0.0170, 0.069, 6.931),
];

/// The article's code, replicated: one softmax over 500 unrelated dot products.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicatedRow {
    /// d.
    pub d: usize,
    /// max of softmax over the 500 unscaled dot products.
    pub max_p_unscaled: f64,
    /// Same, scaled by 1/√d.
    pub max_p_scaled: f64,
    /// −b ln(b + 1e−10) for b = the scaled max p (what the article prints as entropy).
    pub article_entropy_formula: f64,
}

/// The corrected measurement for one (d, scaled) cell.
#[derive(Debug, Clone, Serialize)]
pub struct CorrectedRow {
    /// d.
    pub d: usize,
    /// Whether the scores are divided by √d.
    pub scaled: bool,
    /// Mean within-row std of the scores.
    pub logit_std: f64,
    /// Mean largest probability of a row.
    pub max_p: f64,
    /// Mean row entropy (nats).
    pub entropy: f64,
    /// ln m.
    pub ln_m: f64,
    /// Mean number of keys with p > 1e−3.
    pub keys_above_1e3: f64,
    /// Fraction of rows with max p > 0.99.
    pub saturated_fraction: f64,
}

/// The experiment.
pub struct AttentionSaturation;

impl Experiment for AttentionSaturation {
    fn name(&self) -> &'static str {
        "attention-saturation"
    }

    fn title(&self) -> &'static str {
        "Unscaled vs scaled attention, computed per query (correcting the article's table)"
    }

    fn run(&self, ctx: &LabContext) -> Result<ExperimentOutput, LabError> {
        let t0 = Instant::now();
        let device = &ctx.primary().device;
        let dims = [16usize, 64, 256, 1024];
        let (n, m) = (256, 256);
        let mut rng = ctx.rng(3);

        let replicated: Vec<ReplicatedRow> = dims
            .iter()
            .map(|&d| {
                let q = normal_tensor(&mut rng, [500, d], device);
                let k = normal_tensor(&mut rng, [500, d], device);
                // [500, d] -> [500]: 500 unrelated pairs, then ONE softmax across them (the bug).
                let dot = (q * k).sum_dim(1).reshape([500]);
                let a = to_vec(softmax(dot.clone(), 0).max())?[0];
                let b = to_vec(softmax(dot / (d as f64).sqrt(), 0).max())?[0];
                Ok(ReplicatedRow {
                    d,
                    max_p_unscaled: a,
                    max_p_scaled: b,
                    article_entropy_formula: -(b * (b + 1e-10).ln()),
                })
            })
            .collect::<Result<_, LabError>>()?;

        let mut corrected = Vec::new();
        for &d in &dims {
            let q = normal_tensor(&mut rng, [1, 1, n, d], device);
            let k = normal_tensor(&mut rng, [1, 1, m, d], device);
            for scaled in [false, true] {
                let attn = ScaledDotProductAttentionConfig::new()
                    .with_scale(if scaled {
                        ScalePolicy::InvSqrtDk
                    } else {
                        ScalePolicy::Unscaled
                    })
                    .try_init()?;
                let out = attn.try_forward(
                    AttentionInput::new(q.clone(), k.clone(), k.clone())
                        .need_weights()
                        .need_scores(),
                )?;
                let weights = out
                    .weights
                    .clone()
                    .ok_or_else(|| LabError::Other("no weights".into()))?;
                let diag = attention_diagnostics(weights.clone(), None, out.scores)?.mean();
                let keys = to_vec(weights.greater_elem(1e-3).float().sum_dim(3).mean())?[0];
                corrected.push(CorrectedRow {
                    d,
                    scaled,
                    logit_std: diag.logit_std.unwrap_or(f64::NAN),
                    max_p: diag.max_prob,
                    entropy: diag.entropy,
                    ln_m: (m as f64).ln(),
                    keys_above_1e3: keys,
                    saturated_fraction: diag.saturated_fraction,
                });
            }
        }

        let article_table = md_table(
            &[
                "d",
                "max p unscaled (article)",
                "replicated",
                "max p scaled (article)",
                "replicated",
                "\"entropy\" (article)",
                "−b ln b of replicated b",
                "\"uniform entropy\" ln d",
            ],
            &ARTICLE
                .iter()
                .zip(&replicated)
                .map(|(a, r)| {
                    vec![
                        a.0.to_string(),
                        f(a.1, 4),
                        f(r.max_p_unscaled, 4),
                        f(a.2, 4),
                        f(r.max_p_scaled, 4),
                        f(a.3, 3),
                        f(r.article_entropy_formula, 3),
                        f(a.4, 3),
                    ]
                })
                .collect::<Vec<_>>(),
        );
        let corrected_table = md_table(
            &[
                "d",
                "scaling",
                "logit std",
                "mean max p",
                "entropy",
                "ln m",
                "keys with p > 1e-3",
                "rows with max p > 0.99",
            ],
            &corrected
                .iter()
                .map(|r| {
                    vec![
                        r.d.to_string(),
                        if r.scaled {
                            "1/√d".into()
                        } else {
                            "none".into()
                        },
                        f(r.logit_std, 2),
                        f(r.max_p, 4),
                        f(r.entropy, 3),
                        f(r.ln_m, 3),
                        f(r.keys_above_1e3, 1),
                        format!("{:.0}%", 100.0 * r.saturated_fraction),
                    ]
                })
                .collect::<Vec<_>>(),
        );
        let un = |d: usize| corrected.iter().find(|r| r.d == d && !r.scaled);
        let sc = |d: usize| corrected.iter().find(|r| r.d == d && r.scaled);
        let markdown = format!(
            "**What the article computed.** `dot = (q * k).sum(-1)` has shape [500]: 500 dot products of \
             unrelated pairs. `dot.softmax(-1)` is then ONE distribution over those 500 numbers, so its \
             max p measures how extreme the largest of 500 draws is, not how peaked an attention row is. \
             Its scaled max p of 0.02–0.035 is just ≈ e^max/Σe over 500 entries, and the column it calls \
             entropy is −b·ln b of that single number (e.g. −0.0319·ln 0.0319 = 0.110), while the \"uniform \
             entropy\" is ln d instead of ln 500. Our replication of that code gives the same kind of \
             numbers:\n\n{article_table}\n\
             **The corrected measurement.** {n} queries and {m} keys with unit-variance components, a \
             softmax over the keys of each query, our module (scaled or not) and the library's \
             diagnostics:\n\n{corrected_table}\n\
             Scaled attention keeps the logit std at 1 for every d: rows keep most of their entropy \
             (≈ {} of ln m = {}) and spread over about {} keys. Unscaled, the logit std is √d: at d = 64 \
             the mean max p is {} and {:.0}% of rows are saturated; at d = 1024, {} and {:.0}%. The \
             article's qualitative claim (unscaled attention collapses toward one-hot as d grows) holds; \
             its numbers (0.9990 at d = 64, and \"0.02–0.035 is the healthy scaled max p\") do not measure it.\n",
            f(sc(64).map_or(f64::NAN, |r| r.entropy), 2),
            f((m as f64).ln(), 2),
            f(sc(64).map_or(f64::NAN, |r| r.keys_above_1e3), 0),
            f(un(64).map_or(f64::NAN, |r| r.max_p), 3),
            100.0 * un(64).map_or(f64::NAN, |r| r.saturated_fraction),
            f(un(1024).map_or(f64::NAN, |r| r.max_p), 3),
            100.0 * un(1024).map_or(f64::NAN, |r| r.saturated_fraction),
        );
        let csv = write_csv(
            ctx,
            "attention_saturation.csv",
            "d,scaled,logit_std,max_p,entropy,ln_m,keys_above_1e3,saturated_fraction",
            &corrected
                .iter()
                .map(|r| {
                    format!(
                        "{},{},{},{},{},{},{},{}",
                        r.d,
                        r.scaled,
                        r.logit_std,
                        r.max_p,
                        r.entropy,
                        r.ln_m,
                        r.keys_above_1e3,
                        r.saturated_fraction
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        Ok(ExperimentOutput {
            name: self.name().into(),
            title: self.title().into(),
            verdict: Verdict::Corrected,
            summary: format!(
                "per-query softmax, d = 64: max p {} unscaled vs {} scaled (the article's 0.9990 vs 0.0350 come from one softmax over 500 unrelated pairs)",
                f(un(64).map_or(f64::NAN, |r| r.max_p), 3),
                f(sc(64).map_or(f64::NAN, |r| r.max_p), 3)
            ),
            markdown,
            results: serde_json::json!({ "replicated_article_code": replicated, "corrected": corrected }),
            plots: vec![],
            csv: vec![csv],
            skipped: vec![],
            backends: vec![ctx.primary().name.clone()],
            seconds: t0.elapsed().as_secs_f64(),
        })
    }
}
