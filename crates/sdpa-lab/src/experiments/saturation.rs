//! Experiment 2 (`saturation`): softmax of standard normal logits times s over n elements: the
//! larger s, the closer to one-hot (the article's second table).

use std::time::Instant;

use burn::tensor::activation::softmax;
use serde::Serialize;

use super::{Experiment, ExperimentOutput, f, md_table, out_path, write_csv};
use crate::claims::{Claim, Source, short};
use crate::context::{LabContext, LabError, normal_tensor, to_vec};
use crate::plot::{LinePlot, Series, line_plot};
use crate::stats::{Estimate, bonferroni_z, mean_ci, t_critical_95};

/// The article's table: (n, scale, max p, entropy).
pub const ARTICLE: [(usize, f64, f64, f64); 12] = [
    (4, 1.0, 0.5208, 1.110),
    (4, 4.0, 0.8313, 0.421),
    (4, 16.0, 0.9567, 0.105),
    (16, 1.0, 0.2481, 2.356),
    (16, 4.0, 0.7029, 0.848),
    (16, 16.0, 0.9263, 0.187),
    (64, 1.0, 0.1069, 3.686),
    (64, 4.0, 0.5887, 1.317),
    (64, 16.0, 0.8936, 0.273),
    (256, 1.0, 0.0436, 5.050),
    (256, 4.0, 0.5114, 1.778),
    (256, 16.0, 0.8766, 0.326),
];

/// One (n, scale) cell.
#[derive(Debug, Clone, Serialize)]
pub struct SaturationRow {
    /// Elements per softmax.
    pub n: usize,
    /// Logit scale s.
    pub scale: f64,
    /// Mean largest probability, with its 95% t-interval over the rows.
    pub max_p: f64,
    /// Its interval.
    pub max_p_ci: Estimate,
    /// Mean entropy (nats), computed like the article: −Σ p ln(p + 1e−10).
    pub entropy: f64,
    /// Its interval.
    pub entropy_ci: Estimate,
    /// ln n, the entropy of the uniform distribution.
    pub ln_n: f64,
    /// The article's max p, if it has this cell.
    pub article_max_p: Option<f64>,
    /// The article's entropy, if it has this cell.
    pub article_entropy: Option<f64>,
}

/// Measures mean max p and entropy for every n and scale on the primary backend.
pub fn measure(
    ns: &[usize],
    scales: &[f64],
    rows_per: usize,
    ctx: &LabContext,
) -> Result<Vec<SaturationRow>, LabError> {
    let device = &ctx.primary().device;
    let mut out = Vec::new();
    for &n in ns {
        for &s in scales {
            let mut rng = ctx.rng(2_000 + n as u64);
            // The article reseeds per cell and scales the same draw: so do we.
            let z = normal_tensor(&mut rng, [rows_per, n], device);
            let p = softmax(z * s, 1);
            // One value per row: the rows are the independent draws of the interval.
            let max_p_ci = mean_ci(&to_vec(p.clone().max_dim(1))?);
            let entropy_ci = mean_ci(&to_vec((-(p.clone() * (p + 1e-10).log())).sum_dim(1))?);
            let (max_p, entropy) = (max_p_ci.value, entropy_ci.value);
            let article = ARTICLE.iter().find(|a| a.0 == n && a.1 == s);
            out.push(SaturationRow {
                n,
                scale: s,
                max_p,
                max_p_ci,
                entropy,
                entropy_ci,
                ln_n: (n as f64).ln(),
                article_max_p: article.map(|a| a.2),
                article_entropy: article.map(|a| a.3),
            });
        }
    }
    Ok(out)
}

/// The experiment.
pub struct Saturation;

impl Experiment for Saturation {
    fn name(&self) -> &'static str {
        "saturation"
    }

    fn title(&self) -> &'static str {
        "Softmax saturation: large logits make attention one-hot"
    }

    fn run(&self, ctx: &LabContext) -> Result<ExperimentOutput, LabError> {
        let t0 = Instant::now();
        let ns = [4, 16, 64, 256];
        let scales: Vec<f64> = if ctx.quick {
            vec![1.0, 4.0, 16.0]
        } else {
            vec![0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
        };
        let rows = measure(&ns, &scales, 2000, ctx)?;
        let compared: Vec<&SaturationRow> =
            rows.iter().filter(|r| r.article_max_p.is_some()).collect();
        let table = md_table(
            &[
                "n",
                "logit std s",
                "max p ours [95% CI]",
                "article",
                "entropy ours [95% CI]",
                "article",
                "ln n",
            ],
            &compared
                .iter()
                .map(|r| {
                    vec![
                        r.n.to_string(),
                        f(r.scale, 1),
                        r.max_p_ci.show(4),
                        f(r.article_max_p.unwrap_or(f64::NAN), 4),
                        r.entropy_ci.show(3),
                        f(r.article_entropy.unwrap_or(f64::NAN), 3),
                        f(r.ln_n, 3),
                    ]
                })
                .collect::<Vec<_>>(),
        );
        let markdown = format!(
            "2000 rows of n standard normal logits times s, softmax per row (Burn's `softmax`); each cell \
             reseeds, like the article. Means with 95% t-intervals over the 2000 rows. Unscaled attention \
             logits have s = √d_k (8 for d_k = 64, 11.3 for 128).\n\n{table}",
        );
        let csv = write_csv(
            ctx,
            "saturation.csv",
            "n,scale,max_p,entropy,ln_n,article_max_p,article_entropy",
            &rows
                .iter()
                .map(|r| {
                    format!(
                        "{},{},{},{},{},{},{}",
                        r.n,
                        r.scale,
                        r.max_p,
                        r.entropy,
                        r.ln_n,
                        r.article_max_p.map(|x| x.to_string()).unwrap_or_default(),
                        r.article_entropy.map(|x| x.to_string()).unwrap_or_default()
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        let mut series = Vec::new();
        for &n in &ns {
            series.push(Series::line(
                format!("n = {n}"),
                rows.iter()
                    .filter(|r| r.n == n)
                    .map(|r| (r.scale, r.entropy))
                    .collect(),
            ));
        }
        for &n in &ns {
            series.push(Series::reference(
                format!("ln {n} (uniform)"),
                scales.iter().map(|&s| (s, (n as f64).ln())).collect(),
            ));
        }
        let plot = "saturation_entropy.png";
        line_plot(
            &out_path(ctx, plot),
            &LinePlot {
                title: "Softmax entropy vs logit scale".into(),
                x_label: "logit standard deviation s".into(),
                y_label: "mean entropy (nats)".into(),
                log_x: true,
                log_y: false,
                series,
            },
        )?;
        let claims = claims(&rows);
        Ok(ExperimentOutput::new(
            self,
            ctx,
            claims,
            markdown,
            serde_json::json!({ "rows": rows }),
            t0,
        )
        .files(vec![plot.into()], vec![csv]))
    }
}

/// The claims of `saturation`, decided by its rows.
///
/// The article's cells come from its own draw of 2000 rows: ours and its differ by the noise of
/// two independent draws, √2·SE (SE from our rows). The cells agree when every |ours − article|
/// is within z·√2·SE, z the family-wise 95% critical value over the cells (Bonferroni).
pub fn claims(rows: &[SaturationRow]) -> Vec<Claim> {
    let compared: Vec<&SaturationRow> = rows.iter().filter(|r| r.article_max_p.is_some()).collect();
    // The largest |difference| in units of the two-draw standard error √2·SE.
    let worst = |value: fn(&SaturationRow) -> (Estimate, Option<f64>)| {
        compared
            .iter()
            .map(|r| {
                let (e, article) = value(r);
                let se = (e.hi - e.value) / t_critical_95(e.n - 1);
                (e.value - article.unwrap_or(f64::NAN)).abs() / (std::f64::consts::SQRT_2 * se)
            })
            .fold(0.0, f64::max)
    };
    let (p_units, h_units) = (
        worst(|r| (r.max_p_ci, r.article_max_p)),
        worst(|r| (r.entropy_ci, r.article_entropy)),
    );
    let critical = bonferroni_z(compared.len());
    let sharpening = |n: usize| {
        let cells: Vec<&SaturationRow> = rows.iter().filter(|r| r.n == n).collect();
        cells
            .windows(2)
            .all(|w| w[1].entropy_ci.hi < w[0].entropy_ci.lo)
    };
    let ns: Vec<usize> = {
        let mut ns: Vec<usize> = rows.iter().map(|r| r.n).collect();
        ns.dedup();
        ns
    };
    vec![
        Claim::decided(
            "article-max-p",
            Source::Article("§3.2 table"),
            format!("the article's {} max p values", compared.len()),
            format!(
                "every |ours − article| ≤ {} · √2·SE (two draws of 2000 rows, family-wise 95%)",
                short(critical)
            ),
            format!("largest |ours − article| = {} · √2·SE", short(p_units)),
            Some(p_units <= critical),
        ),
        Claim::decided(
            "article-entropy",
            Source::Article("§3.2 table"),
            format!("the article's {} entropies", compared.len()),
            format!(
                "every |ours − article| ≤ {} · √2·SE (two draws of 2000 rows, family-wise 95%)",
                short(critical)
            ),
            format!("largest |ours − article| = {} · √2·SE", short(h_units)),
            Some(h_units <= critical),
        ),
        Claim::decided(
            "larger-logits-saturate",
            Source::Article("§3.2"),
            "the larger the logits, the closer softmax is to one-hot (lower entropy), for every n",
            "entropy intervals strictly decreasing in s, for each n",
            format!("n = {ns:?}"),
            Some(ns.iter().all(|&n| sharpening(n))),
        ),
    ]
}
