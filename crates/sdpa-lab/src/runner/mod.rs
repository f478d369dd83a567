//! The runner owns everything around an experiment's stages: the output folder, the cell cache,
//! progress, parallelism (one heavy cell per core) and timing.
//!
//! - [`run`]: plans every experiment, reads back each cell already saved under
//!   `DIR/cells/` with the same key, measures the others (saving each the moment it finishes),
//!   then analyzes and renders `REPORT.md`, `results.json`, CSV files and plots. Killed at any
//!   moment and started again with the same arguments, it continues where it stopped.
//! - with a [`Shard`] `I/N`, it measures only the cells whose index in their experiment's stage is
//!   I mod N and renders nothing; cells of an earlier stage that a later stage's plan needs (a
//!   tuning stage) are measured in full, into `DIR/support/`, which a merge never reads.
//! - [`render_only`]: analyzes and renders again from `DIR/cells/` alone, in seconds.
//! - [`merge`]: gathers the shards' `cells/`, checks that every planned cell is there exactly
//!   once (naming any that is missing or doubled), and renders the report.

pub mod cache;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use sdpa_model::{Progress, ProgressMode};

use crate::context::{Env, LabError};
use crate::experiment::{Canvas, Experiment, Plan, PlannedCell, StoredCell, Weight};
use crate::files;
use crate::parallel::map_parallel;
use crate::record::RunRecord;
pub use crate::record::Shard;
use crate::report::{ExperimentReport, Failure, Report, write_report};
use cache::CellKey;

/// How a run goes.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The plan.
    pub plan: Plan,
    /// The output folder.
    pub out: PathBuf,
    /// Only this shard's cells (nothing is rendered).
    pub shard: Option<Shard>,
    /// Progress display.
    pub progress: ProgressMode,
    /// Backends asked for but not usable, with the reason (the report says so).
    pub skipped_backends: Vec<String>,
}

/// What a run did.
#[derive(Debug)]
pub enum RunOutcome {
    /// The report, written.
    Report(Box<Report>),
    /// A shard's cells, saved (measured, read back).
    Shard {
        /// Cells this shard owns.
        cells: usize,
        /// Of which measured by this process.
        measured: usize,
        /// Experiments that failed, with the error.
        failures: Vec<Failure>,
    },
}

/// Where the stored cells of a stage come from.
trait CellSource {
    /// The stored cells of `planned` (None for a cell this source leaves out).
    fn fetch(
        &mut self,
        experiment: &dyn Experiment,
        planned: &[PlannedCell],
        last_stage: bool,
    ) -> Result<Vec<Option<StoredCell>>, LabError>;
}

/// Plans `experiment` stage by stage, taking each stage's cells from `source`; returns every
/// cell it got.
fn gather(
    experiment: &dyn Experiment,
    plan: &Plan,
    source: &mut dyn CellSource,
) -> Result<Vec<StoredCell>, LabError> {
    let mut cells: Vec<StoredCell> = Vec::new();
    for stage in 0..experiment.stages() {
        let planned = experiment.plan_cells(plan, stage, &cells)?;
        let last = stage + 1 == experiment.stages();
        cells.extend(
            source
                .fetch(experiment, &planned, last)?
                .into_iter()
                .flatten(),
        );
    }
    Ok(cells)
}

/// Measures what is not cached, into `cells/` (and `support/` for a shard's borrowed cells).
struct Measuring<'a> {
    env: &'a Env,
    dir: &'a Path,
    shard: Option<Shard>,
    progress: ProgressMode,
    measured: usize,
}

impl Measuring<'_> {
    fn measure_all(
        &mut self,
        experiment: &dyn Experiment,
        jobs: Vec<(usize, PathBuf, PlannedCell)>,
    ) -> Result<Vec<(usize, StoredCell)>, LabError> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let stage = jobs[0].2.stage;
        let progress = Progress::new(
            self.progress,
            &format!(
                "{} [stage {}/{}]",
                experiment.name(),
                stage + 1,
                experiment.stages()
            ),
            0,
            jobs.len() as u64,
        );
        let env = self.env;
        let one = |job: &(usize, PathBuf, PlannedCell)| -> Result<(usize, StoredCell), LabError> {
            let (position, root, cell) = job;
            let started = Instant::now();
            let result = experiment
                .measure_cell(cell, env)
                .map_err(|e| LabError::CellFailed {
                    experiment: experiment.name().to_string(),
                    id: cell.id.clone(),
                    error: Box::new(e),
                })?;
            let key = CellKey::of(experiment, cell);
            let stored = cache::save(root, &key, cell, result, started.elapsed().as_secs_f64())?;
            Ok((*position, stored))
        };
        let done = |finished: usize, (_, stored): &(usize, StoredCell)| {
            progress.update(
                finished as u64,
                &format!("{} {}", stored.cell.id, experiment.describe_cell(stored)),
            );
        };
        let (heavy, light): (Vec<_>, Vec<_>) = jobs
            .into_iter()
            .partition(|(_, _, c)| c.weight == Weight::Heavy);
        let mut out = Vec::new();
        for job in &light {
            let r = one(job)?;
            done(out.len() + 1, &r);
            out.push(r);
        }
        let offset = out.len();
        out.extend(map_parallel(&heavy, one, |finished, r| {
            done(offset + finished, r)
        })?);
        progress.finish(&format!(
            "{}: {} cells measured",
            experiment.name(),
            out.len()
        ));
        self.measured += out.len();
        Ok(out)
    }
}

impl CellSource for Measuring<'_> {
    fn fetch(
        &mut self,
        experiment: &dyn Experiment,
        planned: &[PlannedCell],
        last_stage: bool,
    ) -> Result<Vec<Option<StoredCell>>, LabError> {
        let mut got: Vec<Option<StoredCell>> = vec![None; planned.len()];
        let mut jobs = Vec::new();
        for (position, cell) in planned.iter().enumerate() {
            let owned = self.shard.is_none_or(|s| s.owns(position));
            if !owned && last_stage {
                continue;
            }
            let root = self.dir.join(if owned { "cells" } else { "support" });
            let key = CellKey::of(experiment, cell);
            match cache::load(&root, &key, cell)? {
                cache::Loaded::Cell(stored) => got[position] = Some(stored),
                cache::Loaded::Missing => jobs.push((position, root, cell.clone())),
                cache::Loaded::Damaged(why) => {
                    eprintln!(
                        "note: cell {}/{} is damaged ({why}): measuring it again",
                        experiment.name(),
                        cell.id
                    );
                    jobs.push((position, root, cell.clone()));
                }
            }
        }
        for (position, stored) in self.measure_all(experiment, jobs)? {
            got[position] = Some(stored);
        }
        Ok(got)
    }
}

/// Reads cells from folders that hold a finished run's (or shards') `cells/`, copying them into
/// `into` when merging.
struct Reading<'a> {
    sources: &'a [PathBuf],
    into: Option<&'a Path>,
}

impl CellSource for Reading<'_> {
    fn fetch(
        &mut self,
        experiment: &dyn Experiment,
        planned: &[PlannedCell],
        _last_stage: bool,
    ) -> Result<Vec<Option<StoredCell>>, LabError> {
        let mut got = Vec::with_capacity(planned.len());
        for cell in planned {
            let key = CellKey::of(experiment, cell);
            let name = format!("{}/{}", experiment.name(), cell.id);
            let mut found: Vec<(&PathBuf, StoredCell)> = Vec::new();
            let mut other_code = None;
            for dir in self.sources {
                match cache::load(&dir.join("cells"), &key, cell)? {
                    cache::Loaded::Cell(stored) => found.push((dir, stored)),
                    cache::Loaded::Missing => {
                        other_code = other_code.or(cache::other_key(&dir.join("cells"), &key));
                    }
                    cache::Loaded::Damaged(why) => {
                        return Err(LabError::Usage(format!(
                            "cell {name} is damaged ({why}): run the report again with the same \
                             arguments (not --render-only) to measure it again"
                        )));
                    }
                }
            }
            match found.len() {
                0 => {
                    let why = other_code.map_or_else(
                        || "is missing from".to_string(),
                        |differs| format!("was measured under another key ({differs}) in"),
                    );
                    return Err(LabError::Usage(format!(
                        "cell {name} {why} {}: run the report (or that shard) again with the same \
                         arguments to measure it",
                        self.sources
                            .iter()
                            .map(|d| d.join("cells").display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                1 => {}
                _ => {
                    return Err(LabError::Usage(format!(
                        "cell {name} is in more than one shard: {}",
                        found
                            .iter()
                            .map(|(d, _)| d.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
            }
            let (dir, stored) = found.remove(0);
            if let Some(into) = self.into {
                // The saved bytes themselves: the merged folder reads exactly what was measured.
                let from = cache::path(&dir.join("cells"), &key);
                let to = cache::path(&into.join("cells"), &key);
                files::own_dir(&into.join("cells"))?;
                if let Some(parent) = to.parent() {
                    files::own_dir(parent)?;
                }
                let bytes = fs::read(&from).map_err(|e| LabError::io(&from, e))?;
                files::write_atomic(&to, &bytes)?;
            }
            got.push(Some(stored));
        }
        Ok(got)
    }
}

/// Analyzes and renders every experiment from `source` into `out` and writes the report.
fn report_from(
    experiments: &[&dyn Experiment],
    record: &RunRecord,
    out: &Path,
    source: &mut dyn CellSource,
    started: Instant,
) -> Result<Report, LabError> {
    let mut reports = Vec::new();
    let mut failures = Vec::new();
    for experiment in experiments {
        let result = gather(*experiment, &record.plan, source).and_then(|cells| {
            let mut canvas = Canvas::new(out);
            let finished = experiment.finish(&record.plan, &cells, &mut canvas)?;
            Ok(ExperimentReport::new(*experiment, &cells, finished, canvas))
        });
        match result {
            Ok(r) => reports.push(r),
            Err(e @ LabError::Usage(_)) => return Err(e),
            Err(e) => failures.push(Failure {
                name: experiment.name().into(),
                error: e.to_string(),
            }),
        }
    }
    let report = Report::new(record, reports, failures, started.elapsed().as_secs_f64());
    write_report(out, &report)?;
    Ok(report)
}

/// Runs `experiments` (or one shard of them) into `options.out`.
pub fn run(
    experiments: &[&dyn Experiment],
    env: &Env,
    options: &RunOptions,
) -> Result<RunOutcome, LabError> {
    let started = Instant::now();
    let out = &options.out;
    let _lock = files::claim_and_lock(out)?;
    clean(out)?;
    let record = RunRecord {
        plan: options.plan.clone(),
        experiments: experiments.iter().map(|e| e.name().to_string()).collect(),
        shard: options.shard,
        lab: env!("CARGO_PKG_VERSION").into(),
        skipped_backends: options.skipped_backends.clone(),
    };
    record.write(out)?;
    let mut source = Measuring {
        env,
        dir: out,
        shard: options.shard,
        progress: options.progress,
        measured: 0,
    };
    if let Some(shard) = options.shard {
        let mut cells = 0;
        let mut failures = Vec::new();
        for experiment in experiments {
            match gather(*experiment, &record.plan, &mut source) {
                Ok(got) => {
                    let last = experiment.stages() - 1;
                    cells += got.iter().filter(|c| c.cell.stage == last).count();
                }
                Err(e) => failures.push(Failure {
                    name: experiment.name().into(),
                    error: e.to_string(),
                }),
            }
        }
        let _ = shard;
        return Ok(RunOutcome::Shard {
            cells,
            measured: source.measured,
            failures,
        });
    }
    report_from(experiments, &record, out, &mut source, started)
        .map(|r| RunOutcome::Report(Box::new(r)))
}

/// Under the lab's lock: checks that the lab's subfolders of `out` are its own (no link is
/// followed) and removes the temporary files a killed run left there and at the top.
fn clean(out: &Path) -> Result<(), LabError> {
    files::remove_temporaries(out)?;
    for sub in ["cells", "support"] {
        let dir = out.join(sub);
        if fs::symlink_metadata(&dir).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
            continue;
        }
        files::own_dir(&dir)?;
        let entries = fs::read_dir(&dir).map_err(|e| LabError::io(&dir, e))?;
        for e in entries {
            let e = e.map_err(|e| LabError::io(&dir, e))?;
            files::own_dir(&e.path())?;
            files::remove_temporaries(&e.path())?;
        }
    }
    Ok(())
}

/// Renders `dir`'s report again from its saved cells, measuring nothing.
pub fn render_only(registry: &[&dyn Experiment], dir: &Path) -> Result<Report, LabError> {
    let started = Instant::now();
    files::require_own(dir)?;
    let _lock = files::lock(dir)?;
    clean(dir)?;
    let record = RunRecord::read(dir)?;
    if let Some(shard) = record.shard {
        return Err(LabError::Usage(format!(
            "{} holds shard {shard} of a run: merge the shards with --merge",
            dir.display()
        )));
    }
    let experiments = select(registry, &record.experiments)?;
    let sources = [dir.to_path_buf()];
    let mut source = Reading {
        sources: &sources,
        into: None,
    };
    report_from(&experiments, &record, dir, &mut source, started)
}

/// Merges the shards in `shards` into `out` and renders the report.
pub fn merge(
    registry: &[&dyn Experiment],
    shards: &[PathBuf],
    out: &Path,
) -> Result<Report, LabError> {
    let started = Instant::now();
    for d in shards {
        files::require_own(d)?;
        // A shard still being written would be read half done.
        sdpa_model::train::check_unlocked(d, files::LOCK, "lab run")
            .map_err(|e| LabError::Usage(e.to_string()))?;
    }
    let records: Vec<RunRecord> = shards
        .iter()
        .map(|d| RunRecord::read(d))
        .collect::<Result<_, _>>()?;
    let Some(first) = records.first() else {
        return Err(LabError::Usage("--merge needs the shards' folders".into()));
    };
    let count = first.shard.map_or(0, |s| s.count);
    // Nothing is sized by a count read from disk: the indices given are gathered, and the first
    // one missing below the count is named.
    let mut seen = std::collections::BTreeSet::new();
    for (dir, r) in shards.iter().zip(&records) {
        let Some(shard) = r.shard else {
            return Err(LabError::Usage(format!(
                "{} is not a shard's folder (its run.json has no shard)",
                dir.display()
            )));
        };
        if r.plan != first.plan || r.experiments != first.experiments || shard.count != count {
            return Err(LabError::Usage(format!(
                "{} was run with other arguments than {} (plan, experiments or shard count differ)",
                dir.display(),
                shards[0].display()
            )));
        }
        if !seen.insert(shard.index) {
            return Err(LabError::Usage(format!(
                "shard {shard} is given twice ({})",
                dir.display()
            )));
        }
    }
    if let Some(missing) = (0..=shards.len()).find(|i| *i < count && !seen.contains(i)) {
        return Err(LabError::Usage(format!(
            "shard {missing}/{count} is missing from --merge"
        )));
    }
    // The merged folder is a new one: never a shard's (its cells would be read and overwritten).
    let same = |a: &Path, b: &Path| match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    if let Some(shard) = shards.iter().find(|d| same(d, out)) {
        return Err(LabError::Usage(format!(
            "--out {} is one of the shards being merged ({}): merge into a new folder",
            out.display(),
            shard.display()
        )));
    }
    let _lock = files::claim_and_lock(out)?;
    clean(out)?;
    let record = RunRecord {
        shard: None,
        ..first.clone()
    };
    record.write(out)?;
    let experiments = select(registry, &record.experiments)?;
    let mut source = Reading {
        sources: shards,
        into: Some(out),
    };
    report_from(&experiments, &record, out, &mut source, started)
}

/// The experiments of `registry` named in `names`, in that order.
pub fn select<'a>(
    registry: &[&'a dyn Experiment],
    names: &[String],
) -> Result<Vec<&'a dyn Experiment>, LabError> {
    names
        .iter()
        .map(|n| {
            registry
                .iter()
                .find(|e| e.name() == n)
                .copied()
                .ok_or_else(|| LabError::Usage(format!("unknown experiment `{n}`")))
        })
        .collect()
}
