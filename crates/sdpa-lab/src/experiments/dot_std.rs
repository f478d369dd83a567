//! Experiment 1 (`dot-std`): the standard deviation of q·k grows like √d, and dividing by √d
//! brings it back to 1 (the article's §3.1 derivation and its first table).

use std::time::Instant;

use serde::Serialize;

use super::{Experiment, ExperimentOutput, f, md_table, out_path, write_csv};
use crate::claims::{Claim, Source, short};
use crate::context::{LabContext, LabError, normal_tensor, to_vec};
use crate::plot::{LinePlot, Series, line_plot};
use crate::stats::{bonferroni_z, exponent_ci, mean, mean_ci, std};

/// The article's measured std of q·k for d = 16, 64, 256, 1024.
pub const ARTICLE_STD: [f64; 4] = [4.001, 8.114, 16.144, 33.293];
/// The article's std after dividing by √d.
pub const ARTICLE_SCALED: [f64; 4] = [1.000, 1.014, 1.009, 1.040];

/// Sizes of the experiment.
#[derive(Debug, Clone, Serialize)]
pub struct DotStdConfig {
    /// Dimensions.
    pub dims: Vec<usize>,
    /// Pairs per dimension (the article: 2000).
    pub pairs: usize,
    /// Independent repetitions, to show the sampling spread of the std itself.
    pub repeats: usize,
}

impl DotStdConfig {
    /// The article's sizes (quick: fewer repetitions).
    pub fn new(quick: bool) -> Self {
        Self {
            dims: vec![16, 64, 256, 1024],
            pairs: 2000,
            repeats: if quick { 5 } else { 30 },
        }
    }
}

/// One dimension's result.
#[derive(Debug, Clone, Serialize)]
pub struct DotStdRow {
    /// d.
    pub d: usize,
    /// √d.
    pub sqrt_d: f64,
    /// std of all the dot products of every repetition (repeats × pairs of them).
    pub std: f64,
    /// std / √d.
    pub scaled_std: f64,
    /// std / √d of the first repetition alone (one draw of `pairs`, like the article's).
    pub single_draw_scaled: f64,
    /// Smallest and largest std / √d of a single repetition.
    pub single_draw_range: (f64, f64),
    /// Mean of std / √d over the repetitions.
    pub scaled_mean: f64,
    /// Spread (std) of std / √d over the repetitions.
    pub scaled_spread: f64,
    /// std / √d of every single draw (`repeats` of them).
    pub draws_scaled: Vec<f64>,
    /// The article's std.
    pub article_std: f64,
    /// The article's scaled std.
    pub article_scaled: f64,
}

/// Runs the measurement on a device.
pub fn measure(config: &DotStdConfig, ctx: &LabContext) -> Result<Vec<DotStdRow>, LabError> {
    let device = &ctx.primary().device;
    let mut rng = ctx.rng(1);
    config
        .dims
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            let mut all = Vec::new();
            let stds: Vec<f64> = (0..config.repeats.max(1))
                .map(|_| {
                    let q = normal_tensor(&mut rng, [config.pairs, d], device);
                    let k = normal_tensor(&mut rng, [config.pairs, d], device);
                    // [pairs, d] -> [pairs, 1]: one dot product per pair
                    let dots = to_vec((q * k).sum_dim(1))?;
                    let s = std(&dots);
                    all.extend(dots);
                    Ok(s)
                })
                .collect::<Result<_, LabError>>()?;
            let sqrt_d = (d as f64).sqrt();
            let scaled: Vec<f64> = stds.iter().map(|s| s / sqrt_d).collect();
            let pooled = std(&all);
            Ok(DotStdRow {
                d,
                sqrt_d,
                std: pooled,
                scaled_std: pooled / sqrt_d,
                single_draw_scaled: scaled[0],
                single_draw_range: (
                    scaled.iter().cloned().fold(f64::INFINITY, f64::min),
                    scaled.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                ),
                scaled_mean: mean(&scaled),
                scaled_spread: std(&scaled),
                draws_scaled: scaled.clone(),
                article_std: ARTICLE_STD.get(i).copied().unwrap_or(f64::NAN),
                article_scaled: ARTICLE_SCALED.get(i).copied().unwrap_or(f64::NAN),
            })
        })
        .collect()
}

/// The experiment.
pub struct DotStd;

impl Experiment for DotStd {
    fn name(&self) -> &'static str {
        "dot-std"
    }

    fn title(&self) -> &'static str {
        "Why divide by √d_k: the std of q·k grows like √d"
    }

    fn run(&self, ctx: &LabContext) -> Result<ExperimentOutput, LabError> {
        let t0 = Instant::now();
        let config = DotStdConfig::new(ctx.quick);
        let rows = measure(&config, ctx)?;
        let table = md_table(
            &[
                "d",
                "√d",
                "std(q·k) ours (pooled)",
                "article",
                "std/√d ours: mean [95% CI] over draws",
                "article",
                "one draw of 2000: first / range over draws",
            ],
            &rows
                .iter()
                .map(|r| {
                    vec![
                        r.d.to_string(),
                        f(r.sqrt_d, 3),
                        f(r.std, 3),
                        f(r.article_std, 3),
                        mean_ci(&r.draws_scaled).show(3),
                        f(r.article_scaled, 3),
                        format!(
                            "{} / {}–{}",
                            f(r.single_draw_scaled, 3),
                            f(r.single_draw_range.0, 3),
                            f(r.single_draw_range.1, 3)
                        ),
                    ]
                })
                .collect::<Vec<_>>(),
        );
        let markdown = format!(
            "{} independent draws of {} pairs of standard normal vectors per d (the pooled column uses all \
             of them; the last column shows single draws of the article's size). Var[q·k] = Σ Var[q_i]Var[k_i] \
             = d, so std = √d.\n\n{table}",
            config.repeats, config.pairs,
        );
        let csv = write_csv(
            ctx,
            "dot_std.csv",
            "d,sqrt_d,std,scaled_std,scaled_mean,scaled_spread,article_std,article_scaled",
            &rows
                .iter()
                .map(|r| {
                    format!(
                        "{},{},{},{},{},{},{},{}",
                        r.d,
                        r.sqrt_d,
                        r.std,
                        r.scaled_std,
                        r.scaled_mean,
                        r.scaled_spread,
                        r.article_std,
                        r.article_scaled
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        let plot = "dot_std.png";
        line_plot(
            &out_path(ctx, plot),
            &LinePlot {
                title: "std of q·k vs dimension".into(),
                x_label: "d".into(),
                y_label: "std".into(),
                log_x: true,
                log_y: true,
                series: vec![
                    Series::reference("√d", rows.iter().map(|r| (r.d as f64, r.sqrt_d)).collect()),
                    Series::line(
                        "std(q·k), ours",
                        rows.iter().map(|r| (r.d as f64, r.std)).collect(),
                    ),
                    Series::line(
                        "std(q·k), article",
                        rows.iter().map(|r| (r.d as f64, r.article_std)).collect(),
                    ),
                    Series::line(
                        "std(q·k)/√d, ours",
                        rows.iter().map(|r| (r.d as f64, r.scaled_std)).collect(),
                    ),
                ],
            },
        )?;
        let claims = claims(&config, &rows);
        Ok(ExperimentOutput::new(
            self,
            ctx,
            claims,
            markdown,
            serde_json::json!({ "config": config, "rows": rows }),
            t0,
        )
        .files(vec![plot.into()], vec![csv]))
    }
}

/// The claims of `dot-std`, decided by its rows.
pub fn claims(config: &DotStdConfig, rows: &[DotStdRow]) -> Vec<Claim> {
    // Every draw's std against d, on log-log axes.
    let (xs, ys): (Vec<f64>, Vec<f64>) = rows
        .iter()
        .flat_map(|r| {
            r.draws_scaled
                .iter()
                .map(move |s| (r.d as f64, s * r.sqrt_d))
        })
        .unzip();
    let exponent = exponent_ci(&xs, &ys);
    // The d whose scaled std is farthest from 1.
    let worst = rows
        .iter()
        .map(|r| mean_ci(&r.draws_scaled))
        .max_by(|a, b| (a.value - 1.0).abs().total_cmp(&(b.value - 1.0).abs()));
    // Is the article's table one draw of `pairs`? Its distance from 1 against the spread of our
    // single draws, at a family-wise 95% level over the d values (Bonferroni).
    let article_z = rows
        .iter()
        .map(|r| (r.article_scaled - 1.0).abs() / r.scaled_spread)
        .fold(0.0, f64::max);
    let critical = bonferroni_z(rows.len());
    let _ = config;
    let mut claims = vec![Claim::in_range(
        "std-grows-as-sqrt-d",
        Source::Article("§3.1"),
        "the std of q·k grows like √d",
        "fitted exponent of std(q·k) on d (t-interval)",
        exponent,
        0.45,
        0.55,
    )];
    if let Some(worst) = worst {
        claims.push(Claim::in_range(
            "scaled-std-is-one",
            Source::Article("§3.1"),
            "dividing by √d brings the std back to 1, for every d",
            "std/√d at the d farthest from 1, mean over draws (t-interval)",
            worst,
            0.95,
            1.05,
        ));
    }
    claims.push(Claim::decided(
        "article-table-is-one-draw",
        Source::Lab,
        format!("the article's std/√d values are what one draw of {} pairs gives", config.pairs),
        format!(
            "largest |article − 1| within {} sd of our single draws (family-wise 95% over {} d, Bonferroni)",
            short(critical),
            rows.len()
        ),
        format!("largest |article − 1| = {} single-draw sd", short(article_z)),
        Some(article_z <= critical),
    ));
    claims
}
