//! Experiment 2 (`saturation`): softmax of standard normal logits times s over n elements: the
//! larger s, the closer to one-hot (the article's second table).

use std::time::Instant;

use burn::tensor::activation::softmax;
use serde::Serialize;

use super::{Experiment, ExperimentOutput, Verdict, f, md_table, out_path, write_csv};
use crate::context::{LabContext, LabError, normal_tensor, to_vec};
use crate::plot::{LinePlot, Series, line_plot};

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
    /// Mean largest probability.
    pub max_p: f64,
    /// Mean entropy (nats), computed like the article: −Σ p ln(p + 1e−10).
    pub entropy: f64,
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
            let max_p = to_vec(p.clone().max_dim(1).mean())?[0];
            let entropy = to_vec((-(p.clone() * (p + 1e-10).log())).sum_dim(1).mean())?[0];
            let article = ARTICLE.iter().find(|a| a.0 == n && a.1 == s);
            out.push(SaturationRow {
                n,
                scale: s,
                max_p,
                entropy,
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
        let ok = compared.iter().all(|r| {
            (r.max_p - r.article_max_p.unwrap_or(f64::NAN)).abs() <= 0.03
                && (r.entropy - r.article_entropy.unwrap_or(f64::NAN)).abs() <= 0.08
        });
        let worst_p = compared
            .iter()
            .map(|r| (r.max_p - r.article_max_p.unwrap_or(0.0)).abs())
            .fold(0.0, f64::max);
        let worst_h = compared
            .iter()
            .map(|r| (r.entropy - r.article_entropy.unwrap_or(0.0)).abs())
            .fold(0.0, f64::max);
        let table = md_table(
            &[
                "n",
                "logit std s",
                "max p ours",
                "article",
                "entropy ours",
                "article",
                "ln n",
            ],
            &compared
                .iter()
                .map(|r| {
                    vec![
                        r.n.to_string(),
                        f(r.scale, 1),
                        f(r.max_p, 4),
                        f(r.article_max_p.unwrap_or(f64::NAN), 4),
                        f(r.entropy, 3),
                        f(r.article_entropy.unwrap_or(f64::NAN), 3),
                        f(r.ln_n, 3),
                    ]
                })
                .collect::<Vec<_>>(),
        );
        let markdown = format!(
            "2000 rows of n standard normal logits times s, softmax per row (Burn's `softmax`).\n\n{table}\n\
             Largest differences from the article: max p {}, entropy {} (tolerances 0.03 and 0.08): **{}**. \
             At s = 16 the entropy is a few percent of ln n: each row is nearly one-hot. Unscaled \
             attention logits have s = √d_k (8 for d_k = 64, 11.3 for 128), between the article's 4 and \
             16 columns.\n",
            f(worst_p, 4),
            f(worst_h, 3),
            if ok { "reproduced" } else { "differs" }
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
        Ok(ExperimentOutput {
            name: self.name().into(),
            title: self.title().into(),
            verdict: if ok {
                Verdict::Reproduced
            } else {
                Verdict::Differs
            },
            summary: format!(
                "all 12 cells within max p ±{} and entropy ±{} of the article",
                f(worst_p, 3),
                f(worst_h, 3)
            ),
            markdown,
            results: serde_json::json!({ "rows": rows }),
            plots: vec![plot.into()],
            csv: vec![csv],
            skipped: vec![],
            backends: vec![ctx.primary().name.clone()],
            seconds: t0.elapsed().as_secs_f64(),
        })
    }
}
