//! The experiments, one file each. Every experiment turns a [`LabContext`] into an
//! [`ExperimentOutput`]: its numbers (JSON), a Markdown section with the article's figures beside
//! ours and a verdict, and the CSV and PNG files it wrote.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::context::{LabContext, LabError};

pub mod attention_map;
pub mod attention_saturation;
pub mod compare;
pub mod complexity;
pub mod dot_std;
pub mod gradients;
pub mod logit_control;
pub mod masks;
pub mod saturation;
pub mod training;
pub mod why_softmax;

pub use crate::claims::Verdict;
use crate::claims::{Claim, claims_table, summary};
pub use crate::markdown::{md_cell, md_table};

/// One measured quantity on every backend that measured it (same inputs), for the report's
/// cross-backend table.
#[derive(Debug, Clone, Serialize)]
pub struct BackendValues {
    /// What was measured, e.g. `‖J‖ unscaled, d = 64`.
    pub quantity: String,
    /// (backend, value).
    pub values: Vec<(String, f64)>,
    /// Values below this size count as equal: the disagreement is |a − b| / max(|a|, |b|, floor).
    /// Tiny for measured quantities; the size of the compared outputs for quantities that are
    /// themselves errors (two errors of 0 and 2·10⁻⁷ on outputs of size 1 agree to 2·10⁻⁷).
    pub floor: f64,
}

impl BackendValues {
    /// The largest |a − b| / max(|a|, |b|, floor) between two backends' values.
    pub fn largest_disagreement(&self) -> f64 {
        let mut worst = 0.0f64;
        for (i, (_, a)) in self.values.iter().enumerate() {
            for (_, b) in &self.values[i + 1..] {
                let scale = a.abs().max(b.abs()).max(self.floor).max(1e-30);
                worst = worst.max((a - b).abs() / scale);
            }
        }
        worst
    }
}

/// What an experiment produced.
#[derive(Debug, Clone, Serialize)]
pub struct ExperimentOutput {
    /// The `exp` name.
    pub name: String,
    /// A title for the report.
    pub title: String,
    /// The verdict, from the claims.
    pub verdict: Verdict,
    /// The conclusions, each with the check that decides it and its outcome.
    pub claims: Vec<Claim>,
    /// One sentence from the claims.
    pub summary: String,
    /// The report section (tables, the claims table), without its heading.
    pub markdown: String,
    /// Every number, for `results.json`.
    pub results: serde_json::Value,
    /// PNG files written (relative to the output folder).
    pub plots: Vec<String>,
    /// CSV files written (relative to the output folder).
    pub csv: Vec<String>,
    /// Parts that could not run, with the reason.
    pub skipped: Vec<String>,
    /// Backends used.
    pub backends: Vec<String>,
    /// Quantities measured on more than one backend.
    pub per_backend: Vec<BackendValues>,
    /// Wall time (seconds).
    pub seconds: f64,
}

impl ExperimentOutput {
    /// The output of `experiment`: its verdict and summary follow from `claims`, whose table is
    /// appended to `markdown`. Ran on the primary backend of `ctx` unless told otherwise.
    pub fn new(
        experiment: &dyn Experiment,
        ctx: &LabContext,
        claims: Vec<Claim>,
        markdown: String,
        results: serde_json::Value,
        started: Instant,
    ) -> Self {
        Self {
            name: experiment.name().into(),
            title: experiment.title().into(),
            verdict: Verdict::from_claims(&claims),
            summary: summary(&claims),
            markdown: format!("{markdown}\n**Claims.**\n\n{}", claims_table(&claims)),
            claims,
            results,
            plots: Vec::new(),
            csv: Vec::new(),
            skipped: Vec::new(),
            backends: vec![ctx.primary().name.clone()],
            per_backend: Vec::new(),
            seconds: started.elapsed().as_secs_f64(),
        }
    }

    /// The files written.
    pub fn files(mut self, plots: Vec<String>, csv: Vec<String>) -> Self {
        self.plots = plots;
        self.csv = csv;
        self
    }

    /// Ran on every backend of the context, with these cross-backend quantities.
    pub fn on_every_backend(mut self, ctx: &LabContext, per_backend: Vec<BackendValues>) -> Self {
        self.backends = ctx.backends.iter().map(|b| b.name.clone()).collect();
        self.per_backend = per_backend;
        self
    }

    /// Parts that could not run.
    pub fn skipped(mut self, skipped: Vec<String>) -> Self {
        self.skipped = skipped;
        self
    }
}

/// One experiment of the lab.
pub trait Experiment: Sync {
    /// The name used by `sdpa exp NAME`.
    fn name(&self) -> &'static str;
    /// What it shows, in one line.
    fn title(&self) -> &'static str;
    /// Runs it.
    fn run(&self, ctx: &LabContext) -> Result<ExperimentOutput, LabError>;
}

/// Every experiment, in report order.
pub fn all_experiments() -> Vec<Box<dyn Experiment>> {
    vec![
        Box::new(dot_std::DotStd),
        Box::new(saturation::Saturation),
        Box::new(attention_saturation::AttentionSaturation),
        Box::new(gradients::Gradients),
        Box::new(training::Training),
        Box::new(logit_control::LogitControl),
        Box::new(compare::Compare),
        Box::new(attention_map::AttentionMap),
        Box::new(masks::Masks),
        Box::new(why_softmax::WhySoftmax),
        Box::new(complexity::Complexity),
    ]
}

/// The experiment with this name.
pub fn find_experiment(name: &str) -> Option<Box<dyn Experiment>> {
    all_experiments().into_iter().find(|e| e.name() == name)
}

/// Writes a CSV file under the output folder and returns its relative name.
pub fn write_csv(
    ctx: &LabContext,
    name: &str,
    header: &str,
    rows: &[String],
) -> Result<String, LabError> {
    let path = ctx.out_dir.join(name);
    let mut text = String::from(header);
    text.push('\n');
    for r in rows {
        text.push_str(r);
        text.push('\n');
    }
    std::fs::write(&path, text).map_err(|e| LabError::io(&path, e))?;
    Ok(name.to_string())
}

/// The path of an output file.
pub fn out_path(ctx: &LabContext, name: &str) -> std::path::PathBuf {
    ctx.out_dir.join(name)
}

/// Formats a float with `digits` decimals.
pub fn f(x: f64, digits: usize) -> String {
    if x.is_nan() {
        "NaN".into()
    } else {
        format!("{x:.digits$}")
    }
}

/// Whether a path exists (for tests).
pub fn exists(ctx: &LabContext, name: &str) -> bool {
    Path::new(&ctx.out_dir.join(name)).is_file()
}
