//! The report: `results.json` (every experiment's claims and analysis) and `REPORT.md` (the
//! ledger of the article's claims, the experiments' verdicts, the cross-backend table and one
//! section per experiment).

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::claims::{
    Claim, Outcome, Source, Tally, Verdict, article_summary, claims_table, lab_summary, short,
};
use crate::context::LabError;
use crate::experiment::{BackendValues, Canvas, Experiment, Finished, StoredCell};
use crate::files::write_atomic;
use crate::markdown::md_cell;
use crate::record::RunRecord;

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
            per_backend: finished.per_backend,
            skipped: finished.skipped,
            cells: cells.len(),
            measure_seconds: cells.iter().map(|c| c.seconds).sum(),
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

/// Writes `results.json` and `REPORT.md` into `dir`.
pub fn write_report(dir: &Path, report: &Report) -> Result<(), LabError> {
    let json = serde_json::to_string_pretty(report).map_err(|e| LabError::Serialize {
        what: "the report".into(),
        message: e.to_string(),
    })?;
    write_atomic(&dir.join("results.json"), json.as_bytes())?;
    write_atomic(&dir.join("REPORT.md"), markdown(report).as_bytes())
}

/// The ledger of the article's claims: every one, with its words, section, check and outcome.
fn ledger(s: &mut String, r: &Report) {
    let _ = writeln!(s, "## The article's claims\n");
    let _ = writeln!(
        s,
        "Each row quotes the article (its section, its words, a translation), says how the lab decides it \
         and what came out. Claims the lab adds are in each experiment's own table, never here.\n"
    );
    let _ = writeln!(
        s,
        "| section | the article says | translation | decided by | outcome | experiment (verdict) |\n|---|---|---|---|---|---|"
    );
    for e in &r.experiments {
        for c in &e.claims {
            if let Source::Article(q) = &c.source {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | [{}](#{}) ({}) |",
                    q.section,
                    md_cell(q.zh),
                    md_cell(q.en),
                    md_cell(&c.check),
                    md_cell(&ledger_outcome(c)),
                    e.name,
                    e.name,
                    e.verdict.label()
                );
            }
        }
    }
}

/// A ledger row's outcome: the label and tally, and for a claim whose conditions disagree, the
/// conditions where it fails (so that a reader sees where, without opening the experiment).
fn ledger_outcome(c: &Claim) -> String {
    match c.tally() {
        Some(t) if t.fails > 0 && t.fails < t.total() => {
            let unit = if c.conjunction { "part" } else { "condition" };
            // Semicolons: a condition's label may hold commas.
            let fails = labels(c, Outcome::Fails).join("; ");
            format!("{}; the failing {unit}s: {fails}", c.outcome_text())
        }
        _ => c.outcome_text(),
    }
}

fn experiments_table(s: &mut String, r: &Report) {
    let _ = writeln!(s, "\n## Experiments\n");
    let _ = writeln!(
        s,
        "An experiment's verdict is on **the article's claims alone**: **reproduced** (every claim of the article \
         holds), **conditional** (none fails outright, some holds only under some conditions), **partly \
         supported** (some hold or hold under some conditions, some fail), **not supported** (they fail, none holds), **undecided** (none \
         fails, some could not be decided), **no article claim** (the experiment tests only the lab's own). The \
         lab's own hypotheses (its corrections and added measurements) are counted in their own column and never \
         change the verdict. A claim checked under several conditions holds when it holds in every condition, \
         fails when it fails in at least one and holds in none, is conditional when it holds in some and fails \
         in others, and is undecided otherwise.\n"
    );
    let _ = writeln!(
        s,
        "| # | experiment | verdict on the article | the article's claims | the lab's own hypotheses | cells | measure time (s) |\n|---|---|---|---|---|---|---|"
    );
    for (i, e) in r.experiments.iter().enumerate() {
        let _ = writeln!(
            s,
            "| {} | [{}](#{}) | {} | {} | {} | {} | {:.1} |",
            i + 1,
            e.name,
            e.name,
            e.verdict.label(),
            md_cell(&e.summary),
            md_cell(&e.lab),
            e.cells,
            e.measure_seconds
        );
    }
    for fail in &r.failures {
        let _ = writeln!(
            s,
            "| – | {} | **failed** | {} | – | – | – |",
            fail.name,
            md_cell(&fail.error)
        );
    }
}

fn cross_backend(s: &mut String, r: &Report) {
    let cross: Vec<(&str, &BackendValues)> = r
        .experiments
        .iter()
        .flat_map(|e| e.per_backend.iter().map(move |b| (e.name.as_str(), b)))
        .filter(|(_, b)| b.values.len() > 1)
        .collect();
    if cross.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n## Across backends\n");
    let _ = writeln!(
        s,
        "The same inputs on every backend; the largest relative disagreement |a − b| / max(|a|, |b|) of \
         each quantity measured on more than one.\n\n| experiment | quantity | values | largest disagreement |\n|---|---|---|---|"
    );
    for (name, b) in cross {
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {:.1e} |",
            md_cell(&b.quantity),
            b.values
                .iter()
                .map(|(k, v)| format!("{k} {}", short(*v)))
                .collect::<Vec<_>>()
                .join(", "),
            b.largest_disagreement()
        );
    }
}

/// One experiment's section.
fn section(s: &mut String, e: &ExperimentReport) {
    let _ = writeln!(
        s,
        "\n<a id=\"{}\"></a>\n## {}: {}\n",
        e.name, e.name, e.title
    );
    let _ = writeln!(
        s,
        "**Verdict on the article: {}.** {}. **The lab's own hypotheses:** {}.\n",
        e.verdict.label(),
        e.summary,
        e.lab
    );
    let _ = writeln!(s, "{}", e.markdown);
    let _ = writeln!(s, "\n**Claims.**\n\n{}", claims_table(&e.claims));
    for c in e
        .claims
        .iter()
        .filter(|c| c.outcome == Outcome::Conditional)
    {
        let _ = writeln!(
            s,
            "- *{}* holds under: {}; fails under: {}.",
            c.id,
            list(c, Outcome::Holds),
            list(c, Outcome::Fails)
        );
    }
    for p in &e.plots {
        if !e.markdown.contains(p.as_str()) {
            let _ = writeln!(s, "\n![{p}]({p})");
        }
    }
    if !e.skipped.is_empty() {
        let _ = writeln!(s, "\nSkipped (with the reason):\n");
        for k in &e.skipped {
            let _ = writeln!(s, "- {k}");
        }
    }
    let _ = writeln!(
        s,
        "\n_{} cells, {:.1} s of measurement; files: {}._",
        e.cells,
        e.measure_seconds,
        e.csv
            .iter()
            .chain(&e.plots)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// The Markdown report.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Attention, derived and measured\n");
    abstract_lines(&mut s, r);
    let _ = writeln!(
        s,
        "Every experiment of the article *10 · Attention 的数学推导*, reproduced with the `burn-sdpa` module \
         on Burn 0.22.1. Every conclusion below is a claim with the check that decides it; its outcome is \
         computed from this run's numbers with thresholds fixed in the code before the run (where one was \
         chosen after runs were seen, the report says so beside it), and an \
         experiment's verdict follows from its claims.\n"
    );
    let plan = &r.run.plan;
    let cells: usize = r.experiments.iter().map(|e| e.cells).sum();
    let reused = reused_from(
        r.experiments
            .iter()
            .flat_map(|e| e.reused_from.iter())
            .flat_map(|(run, n)| std::iter::repeat_n(run, *n)),
    );
    let n_reused: usize = reused.iter().map(|(_, n)| n).sum();
    let provenance = if n_reused == 0 {
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
    let _ = writeln!(
        s,
        "Backends: {} (primary: {}) · seed {} · {} sizes · commit `{}` · {provenance} · {:.0} s of measurement \
         summed over the cells (heavy cells run one per core) · this process {:.1} s. All numbers are in \
         `results.json`, every measured cell in `cells/`, CSV files beside this report; `sdpa report \
         --render-only {{this folder}}` renders it again from the saved cells.\n",
        plan.backends.join(", "),
        plan.primary(),
        plan.seed,
        if plan.quick { "quick" } else { "full" },
        r.git_commit,
        r.experiments.iter().map(|e| e.measure_seconds).sum::<f64>(),
        r.seconds
    );
    if plan.quick {
        let _ = writeln!(
            s,
            "**Quick sizes**: fewer draws and seeds than the full design, with the same claims; a claim these \
             sizes cannot decide says *undecided*, and no verdict here should be quoted as the lab's answer.\n"
        );
    }
    if !r.run.skipped_backends.is_empty() {
        let _ = writeln!(
            s,
            "Backends skipped: {}.\n",
            r.run.skipped_backends.join("; ")
        );
    }
    ledger(&mut s, r);
    experiments_table(&mut s, r);
    cross_backend(&mut s, r);
    for e in &r.experiments {
        section(&mut s, e);
    }
    s
}

/// The most lines the abstract holds.
const ABSTRACT_LINES: usize = 10;

/// The abstract: the experiments' headline lines (each computed from this run), then the tally
/// of the article's claims; at most [`ABSTRACT_LINES`] lines.
fn abstract_lines(s: &mut String, r: &Report) {
    let article: Vec<Outcome> = r
        .experiments
        .iter()
        .flat_map(|e| &e.claims)
        .filter(|c| c.source.is_article())
        .map(|c| c.outcome)
        .collect();
    let mut lines: Vec<String> = r
        .experiments
        .iter()
        .flat_map(|e| e.headline.iter().cloned())
        .take(ABSTRACT_LINES - 1)
        .collect();
    // The article's sentences behind the ledger's rows: a sentence checked in parts (its quote
    // ending in the part's name in brackets) or on several columns has a row per check.
    let mut sentences: Vec<&str> = r
        .experiments
        .iter()
        .flat_map(|e| &e.claims)
        .filter_map(|c| match &c.source {
            Source::Article(q) => Some(q.zh.split('（').next().unwrap_or(q.zh)),
            Source::Lab => None,
        })
        .collect();
    sentences.sort_unstable();
    sentences.dedup();
    if !article.is_empty() {
        let t = Tally::of(&article);
        let verb =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let rows = if sentences.len() == t.total() {
            format!("of {} tested", t.total())
        } else {
            format!(
                "of {} ledger rows ({} sentences of the article: a sentence checked in parts or on \
                 several columns has a row per check)",
                t.total(),
                sentences.len()
            )
        };
        lines.push(format!(
            "**The article's claims, one by one** (the ledger below): {rows}, {}, {}, {} and {} by this \
             run.",
            verb(t.holds, "holds", "hold"),
            verb(t.fails, "fails", "fail"),
            verb(
                t.conditional,
                "holds only under some conditions",
                "hold only under some conditions"
            ),
            verb(t.undecided, "is undecided", "are undecided"),
        ));
    }
    if lines.is_empty() {
        return;
    }
    for line in lines {
        let _ = writeln!(s, "- {line}");
    }
    let _ = writeln!(s);
}

/// The labels of a claim's conditions with this outcome.
fn labels(c: &Claim, outcome: Outcome) -> Vec<&str> {
    c.conditions
        .iter()
        .filter(|k| k.outcome == outcome)
        .map(|k| k.label.as_str())
        .collect()
}

fn list(c: &Claim, outcome: Outcome) -> String {
    let labels = labels(c, outcome);
    if labels.is_empty() {
        "—".into()
    } else {
        labels.join(", ")
    }
}
