//! The report: `REPORT.md` for the reader (the four questions answered on its first screen,
//! then one screen per question), `APPENDIX.md` for the bookkeeping (the ledger of the article's
//! claims, the experiments' verdicts, the cross-backend table and one section per experiment),
//! and `results.json` (every experiment's claims and analysis).

mod appendix;
mod front;

use std::path::Path;

use serde::Serialize;

use crate::answers::{Answer, KeyNumber};
use crate::claims::{Claim, Verdict, article_summary, lab_summary};
use crate::context::LabError;
use crate::experiment::{BackendValues, Canvas, Experiment, Finished, StoredCell};
use crate::files::write_atomic;
use crate::record::RunRecord;

pub use front::{FIRST_SCREEN_WORDS, first_screen};

/// An experiment that failed to run (reported, never dropped).
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// Its name.
    pub name: String,
    /// The error.
    pub error: String,
}

/// One experiment's part of the report.
#[derive(Debug, Clone, Serialize)]
pub struct ExperimentReport {
    /// The `exp` name.
    pub name: String,
    /// A title for the report.
    pub title: String,
    /// The verdict on the article, from the article's claims alone.
    pub verdict: Verdict,
    /// The claims.
    pub claims: Vec<Claim>,
    /// One sentence from the article's claims.
    pub summary: String,
    /// One sentence from the lab's own hypotheses (apart from the verdict).
    pub lab: String,
    /// Lines for the report's abstract.
    pub headline: Vec<String>,
    /// The section (tables, plots; the claims table is added when rendering).
    pub markdown: String,
    /// The analysis, for `results.json`.
    pub data: serde_json::Value,
    /// PNG files written.
    pub plots: Vec<String>,
    /// CSV files written.
    pub csv: Vec<String>,
    /// Its answers to the report's questions.
    pub answers: Vec<Answer>,
    /// The numbers that decide the article's claims, for the first screen's table.
    pub key_numbers: Vec<KeyNumber>,
    /// Quantities measured on more than one backend.
    pub per_backend: Vec<BackendValues>,
    /// Parts that could not run.
    pub skipped: Vec<String>,
    /// Cells analyzed.
    pub cells: usize,
    /// Seconds the cells took to measure (summed over cells, whichever process measured them).
    pub measure_seconds: f64,
    /// Cells read back from earlier runs' saved cells rather than measured by this process, per
    /// measuring run (when it started, its commit, its pid), in the order first met.
    pub reused_from: Vec<(String, usize)>,
}

impl ExperimentReport {
    /// The report part of a finished experiment.
    pub fn new(
        experiment: &dyn Experiment,
        cells: &[StoredCell],
        finished: Finished,
        canvas: Canvas,
    ) -> Self {
        Self {
            name: experiment.name().into(),
            title: experiment.title().into(),
            verdict: Verdict::from_claims(&finished.claims),
            summary: article_summary(&finished.claims),
            lab: lab_summary(&finished.claims),
            headline: finished.headline,
            claims: finished.claims,
            markdown: finished.markdown,
            data: finished.data,
            plots: canvas.plots,
            csv: canvas.csv,
            answers: canvas.answers,
            key_numbers: canvas.key_numbers,
            per_backend: finished.per_backend,
            skipped: finished.skipped,
            cells: cells.len(),
            // An empty sum of f64 is -0.0: printed as 0.0.
            measure_seconds: cells.iter().map(|c| c.seconds).sum::<f64>().max(0.0),
            reused_from: reused_from(cells.iter().filter(|c| c.reused).map(|c| &c.measured_by)),
        }
    }
}

/// What a report run produced.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// What was asked for.
    pub run: RunRecord,
    /// Library versions.
    pub versions: serde_json::Value,
    /// The git commit of the sources, when known.
    pub git_commit: String,
    /// Seconds this process spent (measuring what was not cached, analyzing, rendering).
    pub seconds: f64,
    /// The experiments.
    pub experiments: Vec<ExperimentReport>,
    /// The experiments that failed.
    pub failures: Vec<Failure>,
}

/// Counts per run, in the order first met.
fn reused_from<'a>(runs: impl Iterator<Item = &'a String>) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for run in runs {
        match out.iter_mut().find(|(r, _)| r == run) {
            Some((_, n)) => *n += 1,
            None => out.push((run.clone(), 1)),
        }
    }
    out
}

/// The sources' git commit (12 hex digits), `-dirty` when tracked files differ from it,
/// `unknown` outside a git checkout.
pub fn git_commit() -> String {
    // The sources' commit, wherever the report is run from, marked `-dirty` when tracked files
    // differ from it (the report was then made by code that is in no commit).
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(commit) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(changes) if !changes.is_empty() => format!("{commit}-dirty"),
            _ => commit,
        },
        None => "unknown".into(),
    }
}

impl Report {
    /// A report of these experiments.
    pub fn new(
        run: &RunRecord,
        experiments: Vec<ExperimentReport>,
        failures: Vec<Failure>,
        seconds: f64,
    ) -> Self {
        Self {
            run: run.clone(),
            versions: serde_json::json!({
                "burn": "0.22.1",
                "sdpa-lab": env!("CARGO_PKG_VERSION"),
            }),
            git_commit: git_commit(),
            seconds,
            experiments,
            failures,
        }
    }

    /// The experiment named `name`.
    pub fn experiment(&self, name: &str) -> Option<&ExperimentReport> {
        self.experiments.iter().find(|e| e.name == name)
    }
}

/// Writes `results.json`, `REPORT.md` and `APPENDIX.md` into `dir`.
pub fn write_report(dir: &Path, report: &Report) -> Result<(), LabError> {
    let json = serde_json::to_string_pretty(report).map_err(|e| LabError::Serialize {
        what: "the report".into(),
        message: e.to_string(),
    })?;
    write_atomic(&dir.join("results.json"), json.as_bytes())?;
    write_atomic(&dir.join(APPENDIX), appendix::markdown(report).as_bytes())?;
    write_atomic(&dir.join("REPORT.md"), front::markdown(report).as_bytes())
}

/// The appendix's file name.
pub const APPENDIX: &str = "APPENDIX.md";

/// The line that says where the numbers come from: backends, seed, sizes, commit, which cells
/// this process measured, the time.
fn provenance(r: &Report) -> String {
    let plan = &r.run.plan;
    let cells: usize = r.experiments.iter().map(|e| e.cells).sum();
    let reused = reused_from(
        r.experiments
            .iter()
            .flat_map(|e| e.reused_from.iter())
            .flat_map(|(run, n)| std::iter::repeat_n(run, *n)),
    );
    let n_reused: usize = reused.iter().map(|(_, n)| n).sum();
    let measured = if n_reused == 0 {
        format!("all {cells} cells measured by this process")
    } else {
        format!(
            "{} of {cells} cells measured by this process, {n_reused} reused from saved cells ({})",
            cells - n_reused,
            reused
                .iter()
                .map(|(run, n)| format!("{n} measured by the run of {run}"))
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    format!(
        "Backends: {} (primary: {}) · seed {} · {} sizes · commit `{}` · {measured} · {:.0} s of \
         measurement summed over the cells (heavy cells run one per core) · this process {:.1} s. \
         `results.json` and `cells/` hold every number where the run wrote them (`docs/report` \
         commits neither: they are large; the CSV files beside this report are committed); `sdpa \
         report --render-only DIR` renders the report again from the cells saved in DIR.",
        plan.backends.join(", "),
        plan.primary(),
        plan.seed,
        if plan.quick { "quick" } else { "full" },
        r.git_commit,
        r.experiments.iter().map(|e| e.measure_seconds).sum::<f64>(),
        r.seconds
    )
}
