//! The one shape of every experiment, in four stages:
//!
//! 1. **plan**: the independent cells of a run (a configuration and its seed), sized by
//!    `--quick` or the full design — a pure function of the [`Plan`] (and, for a design with a
//!    tuning stage, of the earlier stage's results);
//! 2. **measure**: one cell → a serializable result (pure: the same cell gives the same result
//!    on the same backend), run by the runner, which caches every finished cell on disk;
//! 3. **analyze**: all cell results → tables and [`Claim`]s (pure, no I/O: the claims tests call
//!    it directly);
//! 4. **render**: the analysis → Markdown, CSV files and plots, from the saved numbers only.
//!
//! An experiment implements [`Stages`] with its own types; the runner sees it through the
//! type-erased [`Experiment`], whose cells travel as JSON (fresh and cached results go through
//! the very same text, so a resumed or merged run analyzes the same bits).

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::answers::{Answer, KeyNumber, Question};
use crate::claims::Claim;
use crate::context::{Env, LabError};
use crate::plot::{LinePlot, heatmap, line_plot};

/// What a report run was asked for: everything `plan` may depend on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Smaller sizes for a first look.
    pub quick: bool,
    /// The seed every random draw derives from.
    pub seed: u64,
    /// The backends, by name; the first is the primary one.
    pub backends: Vec<String>,
    /// Run the learning-rate sweeps (`sdpa report --tune`): the training experiments tune every
    /// arm's rate and show its learning-rate curves; without it they evaluate at the rates the
    /// full sweep chose, committed in their designs (an earlier `run.json` without the field
    /// reads as `false`).
    #[serde(default)]
    pub tune: bool,
    /// Also run the second confirmatory run (`training-confirm-2`: its tuning and test runs,
    /// about 480 runs); without it the report analyses that run's committed measurement.
    #[serde(default)]
    pub long: bool,
}

impl Plan {
    /// The primary backend's name.
    pub fn primary(&self) -> &str {
        self.backends.first().map_or("flex", |s| s.as_str())
    }
}

/// How a cell is scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Weight {
    /// Quick, or timed: run one after another.
    Light,
    /// Long and single-threaded most of the time (a training run): one per core.
    Heavy,
}

/// One cell of a plan.
#[derive(Debug, Clone)]
pub struct Cell<C> {
    /// Unique within the experiment, readable, made of `[a-z0-9._=-]` and `/`
    /// (e.g. `adam/unit/dk64/none/s12`).
    pub id: String,
    /// What determines its result.
    pub config: C,
    /// How it is scheduled.
    pub weight: Weight,
}

/// A measured cell.
#[derive(Debug, Clone)]
pub struct Measured<C, R> {
    /// Its id.
    pub id: String,
    /// Its configuration.
    pub config: C,
    /// Its result.
    pub result: R,
}

/// One quantity measured on more than one backend (same inputs), for the report's
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

/// What `analyze` gives: the claims, the experiment's own tables and numbers, and the
/// quantities measured on several backends.
#[derive(Debug, Clone)]
pub struct Analysis<D> {
    /// The claims, decided.
    pub claims: Vec<Claim>,
    /// Everything `render` draws from.
    pub data: D,
    /// Quantities measured on more than one backend.
    pub per_backend: Vec<BackendValues>,
    /// Parts that could not run, with the reason.
    pub skipped: Vec<String>,
    /// Lines for the report's abstract, computed from this run (most experiments add none).
    pub headline: Vec<String>,
}

impl<D> Analysis<D> {
    /// Claims and data, nothing across backends or skipped.
    pub fn new(claims: Vec<Claim>, data: D) -> Self {
        Self {
            claims,
            data,
            per_backend: Vec::new(),
            skipped: Vec::new(),
            headline: Vec::new(),
        }
    }

    /// With these lines for the report's abstract.
    pub fn with_headline(self, headline: Vec<String>) -> Self {
        Self { headline, ..self }
    }
}

/// An experiment's *analyze*: every cell → tables and claims (pure).
pub type AnalyzeFn<S> = fn(
    &Plan,
    &[Measured<<S as Stages>::Config, <S as Stages>::Result>],
) -> Analysis<<S as Stages>::Data>;

/// An experiment's *render*: the analysis → the Markdown section (without its heading and
/// claims table), plus the CSV files and plots it writes through the [`Canvas`].
pub type RenderFn<S> = fn(&<S as Stages>::Data, &mut Canvas) -> Result<String, LabError>;

/// An experiment in its four stages, with its own types. *Analyze* and *render* are the
/// experiment's own functions (its `analyze` and `render::render`), named by
/// [`Stages::ANALYZE`] and [`Stages::RENDER`].
pub trait Stages: Sync {
    /// What determines one cell's result.
    type Config: Serialize + DeserializeOwned + Clone + Send + Sync;
    /// One cell's result.
    type Result: Serialize + DeserializeOwned + Send;
    /// What `analyze` hands to `render` (and to `results.json`).
    type Data: Serialize;

    /// Every cell → tables and claims (pure).
    const ANALYZE: AnalyzeFn<Self>;
    /// The analysis → the Markdown section, CSV files and plots.
    const RENDER: RenderFn<Self>;

    /// The name used by `sdpa exp NAME` and in the report.
    fn name(&self) -> &'static str;
    /// What it shows, in one line.
    fn title(&self) -> &'static str;
    /// The version of `measure`: bump it when `measure` changes what a cell returns, so that
    /// results cached by another version are never reused.
    fn version(&self) -> u32 {
        1
    }
    /// How many planning stages the design has (2 when cells depend on a tuning stage).
    fn stages(&self) -> usize {
        1
    }
    /// The cells of stage `stage`, given every cell measured in the earlier stages.
    fn plan(
        &self,
        plan: &Plan,
        stage: usize,
        earlier: &[Measured<Self::Config, Self::Result>],
    ) -> Vec<Cell<Self::Config>>;
    /// Measures one cell.
    fn measure(&self, config: &Self::Config, env: &Env) -> Result<Self::Result, LabError>;
    /// A few words on a finished cell, for the progress line.
    fn describe(&self, _config: &Self::Config, _result: &Self::Result) -> String {
        String::new()
    }
}

/// A cell of a plan, its configuration as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedCell {
    /// Its id.
    pub id: String,
    /// The planning stage it belongs to.
    pub stage: usize,
    /// Its configuration.
    pub config: serde_json::Value,
    /// How it is scheduled.
    pub weight: Weight,
}

/// A measured cell, as stored: the result as the JSON text it was saved as.
#[derive(Debug, Clone)]
pub struct StoredCell {
    /// The cell.
    pub cell: PlannedCell,
    /// Its result, as saved.
    pub result: serde_json::Value,
    /// Seconds it took to measure.
    pub seconds: f64,
    /// The run that measured it (when it started, the commit, the pid).
    pub measured_by: String,
    /// Read back from an earlier run's saved cell (not measured by this process).
    pub reused: bool,
}

/// What a finished experiment hands to the report.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The claims.
    pub claims: Vec<Claim>,
    /// The Markdown section (without heading and claims table).
    pub markdown: String,
    /// The analysis data, for `results.json`.
    pub data: serde_json::Value,
    /// Quantities measured on more than one backend.
    pub per_backend: Vec<BackendValues>,
    /// Parts that could not run.
    pub skipped: Vec<String>,
    /// Lines for the report's abstract.
    pub headline: Vec<String>,
}

/// An experiment as the runner sees it (implemented for every [`Stages`]).
pub trait Experiment: Sync {
    /// Its name.
    fn name(&self) -> &'static str;
    /// Its title.
    fn title(&self) -> &'static str;
    /// Its measure version.
    fn version(&self) -> u32;
    /// Its number of planning stages.
    fn stages(&self) -> usize;
    /// The cells of `stage`, given the earlier stages' stored cells.
    fn plan_cells(
        &self,
        plan: &Plan,
        stage: usize,
        earlier: &[StoredCell],
    ) -> Result<Vec<PlannedCell>, LabError>;
    /// Measures one cell; its result as JSON.
    fn measure_cell(&self, cell: &PlannedCell, env: &Env) -> Result<serde_json::Value, LabError>;
    /// A few words on a finished cell.
    fn describe_cell(&self, cell: &StoredCell) -> String;
    /// Analyzes every stored cell and renders the section.
    fn finish(
        &self,
        plan: &Plan,
        cells: &[StoredCell],
        canvas: &mut Canvas,
    ) -> Result<Finished, LabError>;
}

fn decode<T: DeserializeOwned>(
    experiment: &str,
    id: &str,
    what: &'static str,
    value: &serde_json::Value,
) -> Result<T, LabError> {
    T::deserialize(value).map_err(|e| LabError::UnreadableCell {
        experiment: experiment.to_string(),
        id: id.to_string(),
        what,
        message: e.to_string(),
    })
}

fn encode<T: Serialize>(
    experiment: &str,
    id: &str,
    value: &T,
) -> Result<serde_json::Value, LabError> {
    // Through the text, as it is saved: a fresh result is analyzed from the same bits as a
    // cached one.
    let unsavable = |e: serde_json::Error| LabError::UnsavableCell {
        experiment: experiment.to_string(),
        id: id.to_string(),
        message: e.to_string(),
    };
    let text = serde_json::to_string(value).map_err(unsavable)?;
    serde_json::from_str(&text).map_err(unsavable)
}

/// The cells of an experiment, with its own types.
type Cells<S> = Vec<Measured<<S as Stages>::Config, <S as Stages>::Result>>;

fn typed<S: Stages>(s: &S, cells: &[StoredCell]) -> Result<Cells<S>, LabError> {
    cells
        .iter()
        .map(|c| {
            Ok(Measured {
                id: c.cell.id.clone(),
                config: decode(s.name(), &c.cell.id, "configuration", &c.cell.config)?,
                result: decode(s.name(), &c.cell.id, "result", &c.result)?,
            })
        })
        .collect()
}

impl<S: Stages> Experiment for S {
    fn name(&self) -> &'static str {
        Stages::name(self)
    }

    fn title(&self) -> &'static str {
        Stages::title(self)
    }

    fn version(&self) -> u32 {
        Stages::version(self)
    }

    fn stages(&self) -> usize {
        Stages::stages(self)
    }

    fn plan_cells(
        &self,
        plan: &Plan,
        stage: usize,
        earlier: &[StoredCell],
    ) -> Result<Vec<PlannedCell>, LabError> {
        let earlier = typed(self, earlier)?;
        self.plan(plan, stage, &earlier)
            .into_iter()
            .map(|c| {
                Ok(PlannedCell {
                    config: encode(Stages::name(self), &c.id, &c.config)?,
                    id: c.id,
                    stage,
                    weight: c.weight,
                })
            })
            .collect()
    }

    fn measure_cell(&self, cell: &PlannedCell, env: &Env) -> Result<serde_json::Value, LabError> {
        let config: S::Config =
            decode(Stages::name(self), &cell.id, "configuration", &cell.config)?;
        let result = self.measure(&config, env)?;
        encode(Stages::name(self), &cell.id, &result)
    }

    fn describe_cell(&self, cell: &StoredCell) -> String {
        match (
            S::Config::deserialize(&cell.cell.config),
            S::Result::deserialize(&cell.result),
        ) {
            (Ok(config), Ok(result)) => self.describe(&config, &result),
            _ => String::new(),
        }
    }

    fn finish(
        &self,
        plan: &Plan,
        cells: &[StoredCell],
        canvas: &mut Canvas,
    ) -> Result<Finished, LabError> {
        let measured = typed(self, cells)?;
        let analysis = (S::ANALYZE)(plan, &measured);
        let markdown = (S::RENDER)(&analysis.data, canvas)?;
        let data = serde_json::to_value(&analysis.data).map_err(|e| LabError::Serialize {
            what: format!("the analysis of {}", Stages::name(self)),
            message: e.to_string(),
        })?;
        Ok(Finished {
            claims: analysis.claims,
            markdown,
            data,
            per_backend: analysis.per_backend,
            skipped: analysis.skipped,
            headline: analysis.headline,
        })
    }
}

/// Where `render` writes its files: the report folder. It records every file it writes (the
/// report lists them, and the folder's manifest says they are the lab's).
#[derive(Debug)]
pub struct Canvas {
    dir: PathBuf,
    /// CSV files written, relative to the folder.
    pub csv: Vec<String>,
    /// PNG files written, relative to the folder.
    pub plots: Vec<String>,
    /// The experiment's answers to the report's questions.
    pub answers: Vec<Answer>,
    /// The numbers that decide the article's claims, for the first screen's table.
    pub key_numbers: Vec<KeyNumber>,
}

impl Canvas {
    /// A canvas on `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            csv: Vec::new(),
            plots: Vec::new(),
            answers: Vec::new(),
            key_numbers: Vec::new(),
        }
    }

    /// Records the experiment's answer to `question`: `short` for the first screen (`None` when
    /// it only adds to the question's screen), `screen` for the question's own screen.
    pub fn answer(&mut self, question: Question, short: Option<String>, screen: String) {
        self.answers.push(Answer {
            question,
            short,
            screen,
            confirmatory: false,
        });
    }

    /// [`Canvas::answer`] from a confirmatory run: the first screen quotes it instead of the
    /// exploratory runs' answers (their screens stay beside it).
    pub fn confirmatory_answer(
        &mut self,
        question: Question,
        short: Option<String>,
        screen: String,
    ) {
        self.answers.push(Answer {
            question,
            short,
            screen,
            confirmatory: true,
        });
    }

    /// Records the number that decides the claim `claim_id`, for the first screen's table.
    pub fn key_number(&mut self, claim_id: &str, number: impl Into<String>) {
        self.key_numbers.push(KeyNumber {
            claim_id: claim_id.into(),
            number: number.into(),
        });
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes a CSV file (a header line, then the rows) and returns its name.
    pub fn csv(&mut self, name: &str, header: &str, rows: &[String]) -> Result<String, LabError> {
        let path = self.dir.join(name);
        let mut text = String::from(header);
        text.push('\n');
        for r in rows {
            text.push_str(r);
            text.push('\n');
        }
        crate::files::write_atomic(&path, text.as_bytes())?;
        self.csv.push(name.to_string());
        Ok(name.to_string())
    }

    /// Draws a line plot and returns its Markdown image link.
    pub fn line_plot(&mut self, name: &str, plot: &LinePlot) -> Result<String, LabError> {
        line_plot(&self.dir.join(name), plot)?;
        self.plots.push(name.to_string());
        Ok(format!("![{name}]({name})"))
    }

    /// Draws a heatmap and returns its Markdown image link.
    pub fn heatmap(
        &mut self,
        name: &str,
        title: &str,
        matrix: &[Vec<f64>],
        x_label: &str,
        y_label: &str,
    ) -> Result<String, LabError> {
        heatmap(&self.dir.join(name), title, matrix, x_label, y_label)?;
        self.plots.push(name.to_string());
        Ok(format!("![{name}]({name})"))
    }
}
