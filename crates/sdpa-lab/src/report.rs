//! Runs experiments and writes `REPORT.md` and `results.json`.

use std::fmt::Write as _;
use std::time::Instant;

use sdpa_model::Progress;
use serde::Serialize;

use crate::context::{LabContext, LabError};
use crate::experiments::{Experiment, ExperimentOutput};

/// An experiment that failed to run (reported, never dropped).
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// Its name.
    pub name: String,
    /// The error.
    pub error: String,
}

/// What a report run produced.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Backends used (the first is the primary one).
    pub backends: Vec<String>,
    /// The seed.
    pub seed: u64,
    /// Whether `--quick` sizes were used.
    pub quick: bool,
    /// Library versions.
    pub versions: serde_json::Value,
    /// The git commit of the sources, when known.
    pub git_commit: String,
    /// Seconds since the Unix epoch at the start.
    pub started_unix_s: u64,
    /// Total wall time (s).
    pub seconds: f64,
    /// The experiments that ran.
    pub experiments: Vec<ExperimentOutput>,
    /// The experiments that failed.
    pub failures: Vec<Failure>,
    /// Backends asked for but not usable here, with the reason.
    pub skipped_backends: Vec<String>,
}

fn git_commit() -> String {
    // The sources' commit, wherever the report is run from.
    std::process::Command::new("git")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Runs the experiments in order, with a progress bar over them, and writes the report.
pub fn run_report(
    ctx: &LabContext,
    experiments: &[Box<dyn Experiment>],
) -> Result<Report, LabError> {
    std::fs::create_dir_all(&ctx.out_dir).map_err(|e| LabError::io(&ctx.out_dir, e))?;
    let t0 = Instant::now();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let progress = Progress::new(ctx.progress, "report", 0, experiments.len() as u64);
    let mut outputs = Vec::new();
    let mut failures = Vec::new();
    for (i, e) in experiments.iter().enumerate() {
        progress.update(i as u64, &format!("running {}", e.name()));
        let t = Instant::now();
        match e.run(ctx) {
            Ok(out) => {
                progress.println(&format!(
                    "{:<22} {:<30} {:>6.1} s  {}",
                    e.name(),
                    out.verdict.label(),
                    t.elapsed().as_secs_f64(),
                    out.summary
                ));
                outputs.push(out);
            }
            Err(err) => {
                progress.println(&format!("{:<22} FAILED: {err}", e.name()));
                failures.push(Failure {
                    name: e.name().into(),
                    error: err.to_string(),
                });
            }
        }
    }
    progress.update(experiments.len() as u64, "done");
    progress.finish(&format!(
        "{} experiments in {:.1} s",
        experiments.len(),
        t0.elapsed().as_secs_f64()
    ));
    let report = Report {
        backends: ctx.backends.iter().map(|b| b.name.clone()).collect(),
        seed: ctx.seed,
        quick: ctx.quick,
        versions: serde_json::json!({
            "burn": "0.22.1",
            "sdpa-lab": env!("CARGO_PKG_VERSION"),
            "rustc": option_env!("RUSTC_VERSION").unwrap_or("see rust-toolchain"),
        }),
        git_commit: git_commit(),
        started_unix_s: started,
        seconds: t0.elapsed().as_secs_f64(),
        experiments: outputs,
        failures,
        skipped_backends: ctx.skipped_backends.clone(),
    };
    let json_path = ctx.out_dir.join("results.json");
    let json = serde_json::to_string_pretty(&report)
        .map_err(|e| LabError::Other(format!("cannot serialize the report: {e}")))?;
    std::fs::write(&json_path, json).map_err(|e| LabError::io(&json_path, e))?;
    let md_path = ctx.out_dir.join("REPORT.md");
    std::fs::write(&md_path, markdown(&report)).map_err(|e| LabError::io(&md_path, e))?;
    Ok(report)
}

/// The Markdown report.
pub fn markdown(r: &Report) -> String {
    use crate::claims::Source;
    use crate::experiments::md_cell;
    let mut s = String::new();
    let _ = writeln!(s, "# Attention, derived and measured\n");
    let _ = writeln!(
        s,
        "Every experiment of the article *10 · Attention 的数学推导*, reproduced with the `burn-sdpa` module \
         on Burn 0.22.1. Every conclusion below is a claim with the check that decides it; its outcome is \
         computed from this run's numbers, and an experiment's verdict follows from its claims.\n"
    );
    let _ = writeln!(
        s,
        "Backends: {} (primary: {}) · seed {} · {} sizes · commit `{}` · total {:.1} s. All numbers are in \
         `results.json`, per-experiment CSV files beside this report.\n",
        r.backends.join(", "),
        r.backends.first().map(|s| s.as_str()).unwrap_or("?"),
        r.seed,
        if r.quick { "quick" } else { "full" },
        r.git_commit,
        r.seconds
    );
    if !r.skipped_backends.is_empty() {
        let _ = writeln!(s, "Backends skipped: {}.\n", r.skipped_backends.join("; "));
    }
    let _ = writeln!(s, "## The article's claims\n");
    let _ = writeln!(
        s,
        "| section | the article says | outcome | experiment (verdict) |\n|---|---|---|---|"
    );
    for e in &r.experiments {
        for c in &e.claims {
            if let Source::Article(section) = c.source {
                let _ = writeln!(
                    s,
                    "| {section} | {} | **{}** | [{}](#{}) ({}) |",
                    md_cell(&c.statement),
                    c.outcome.label(),
                    e.name,
                    e.name,
                    e.verdict.label()
                );
            }
        }
    }
    let _ = writeln!(s, "\n## Experiments\n");
    let _ = writeln!(
        s,
        "| # | experiment | verdict | claims | time (s) |\n|---|---|---|---|---|"
    );
    for (i, e) in r.experiments.iter().enumerate() {
        let _ = writeln!(
            s,
            "| {} | [{}](#{}) | {} | {} | {:.1} |",
            i + 1,
            e.name,
            e.name,
            e.verdict.label(),
            md_cell(&e.summary),
            e.seconds
        );
    }
    for fail in &r.failures {
        let _ = writeln!(
            s,
            "| – | {} | **failed** | {} | – |",
            fail.name,
            md_cell(&fail.error)
        );
    }
    let cross: Vec<(&str, &crate::experiments::BackendValues)> = r
        .experiments
        .iter()
        .flat_map(|e| e.per_backend.iter().map(move |b| (e.name.as_str(), b)))
        .filter(|(_, b)| b.values.len() > 1)
        .collect();
    if !cross.is_empty() {
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
                    .map(|(k, v)| format!("{k} {}", crate::claims::short(*v)))
                    .collect::<Vec<_>>()
                    .join(", "),
                b.largest_disagreement()
            );
        }
    }
    for e in &r.experiments {
        let _ = writeln!(
            s,
            "\n<a id=\"{}\"></a>\n## {}: {}\n",
            e.name, e.name, e.title
        );
        let _ = writeln!(s, "**Verdict: {}.** {}\n", e.verdict.label(), e.summary);
        let _ = writeln!(s, "{}", e.markdown);
        for p in &e.plots {
            if !e.markdown.contains(p.as_str()) {
                let _ = writeln!(s, "![{p}]({p})\n");
            }
        }
        if !e.skipped.is_empty() {
            let _ = writeln!(s, "Skipped (with the reason):\n");
            for k in &e.skipped {
                let _ = writeln!(s, "- {k}");
            }
            let _ = writeln!(s);
        }
        let _ = writeln!(
            s,
            "_Backends: {}; {:.1} s; files: {}._",
            e.backends.join(", "),
            e.seconds,
            e.csv
                .iter()
                .chain(&e.plots)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    s
}
