//! The experiments, one file each. Every experiment turns a [`LabContext`] into an
//! [`ExperimentOutput`]: its numbers (JSON), a Markdown section with the article's figures beside
//! ours and a verdict, and the CSV and PNG files it wrote.

use std::path::Path;

use serde::Serialize;

use crate::context::{LabContext, LabError};

pub mod attention_map;
pub mod attention_saturation;
pub mod compare;
pub mod complexity;
pub mod dot_std;
pub mod gradients;
pub mod masks;
pub mod saturation;
pub mod training;
pub mod why_softmax;

/// How our measurement relates to the article.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    /// Our numbers agree with the article's within the stated tolerance.
    Reproduced,
    /// Our numbers differ from the article's (the section says how and why).
    Differs,
    /// The article's computation is wrong; the section shows the corrected measurement.
    Corrected,
    /// The article gives no figures to compare with; the section states what we measured.
    Measured,
}

impl Verdict {
    /// As written in the report.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Reproduced => "reproduced",
            Verdict::Differs => "differs",
            Verdict::Corrected => "corrected",
            Verdict::Measured => "measured (no article figures)",
        }
    }
}

/// What an experiment produced.
#[derive(Debug, Clone, Serialize)]
pub struct ExperimentOutput {
    /// The `exp` name.
    pub name: String,
    /// A title for the report.
    pub title: String,
    /// The verdict.
    pub verdict: Verdict,
    /// One sentence with the key numbers.
    pub summary: String,
    /// The report section (tables and explanations), without its heading.
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
    /// Wall time (seconds).
    pub seconds: f64,
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

/// Escapes the characters that would break a Markdown table cell.
pub fn md_cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// A Markdown table (cells are escaped).
pub fn md_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let esc = |cells: &[String]| {
        cells
            .iter()
            .map(|c| md_cell(c))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let headers: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    let mut s = format!(
        "| {} |\n|{}|\n",
        esc(&headers),
        vec!["---"; headers.len()].join("|")
    );
    for r in rows {
        s.push_str(&format!("| {} |\n", esc(r)));
    }
    s
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
