//! The training loop: records per-step internals, evaluates on held-out batches, checkpoints
//! and resumes exactly.
//!
//! A run directory holds `config.json`, `metrics.csv`, `summary.json` and
//! `checkpoint/{model.bpk, optim.bpk, state.json}` (Burn's burnpack format for the model and the
//! optimizer).
//!
//! | file | what it holds |
//! |---|---|
//! | `config.rs` | [`TrainConfig`], [`OptimizerKind`] and their validation |
//! | `checkpoint.rs` | what a checkpoint holds, saving and loading it |
//! | `files.rs` | the files a run writes, crash-safe writes, the checkpoint swap and its recovery |
//! | `lock.rs` | one writer per run directory (`run.lock`), and taking a directory for a run |
//! | `memory.rs` | the memory a configuration needs, checked against the machine's |
//! | `profile.rs` | where a step's time goes ([`StepProfile`]) |
//! | `run.rs` | a run in progress and its steps (open, step, record, checkpoint, finish) |
//! | `mod.rs` | [`train`], the run's options and results, [`init_model`], [`evaluate`] |

mod checkpoint;
mod config;
mod files;
mod grad_norms;
mod lock;
mod memory;
mod profile;
mod rates;
mod run;

use std::path::PathBuf;
use std::sync::Mutex;

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn_sdpa::read_back;
use serde::{Deserialize, Serialize};

pub use config::{OptimizerKind, TrainConfig};
pub use files::{temp_name, write_atomic};
pub use lock::{DirLock, check_run_dir, check_unlocked};
pub use memory::{available_memory, check_fits};
pub use profile::{Phase, StepProfile};

use crate::error::ModelError;
use crate::metrics::{LayerMetrics, StepMetrics};
use crate::model::{AttentionModel, ModelConfig};
use crate::progress::ProgressMode;
use crate::task::TaskBatch;
use run::Run;

/// Where and how a run writes.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The run directory.
    pub out_dir: PathBuf,
    /// Continue the run saved in `out_dir`.
    pub resume: bool,
    /// Backend name, recorded in the summary.
    pub backend: String,
    /// How progress is shown.
    pub progress: ProgressMode,
    /// For a fresh run into a directory that holds an earlier run: replace that run's files
    /// (any other file there still refuses the run).
    pub overwrite: bool,
}

impl RunOptions {
    /// A fresh run into `out_dir` on `backend`, with automatic progress display.
    pub fn new(out_dir: impl Into<PathBuf>, backend: impl Into<String>) -> Self {
        Self {
            out_dir: out_dir.into(),
            resume: false,
            backend: backend.into(),
            progress: ProgressMode::Auto,
            overwrite: false,
        }
    }
}

/// Library versions, recorded beside results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Versions {
    /// Burn.
    pub burn: String,
    /// This crate.
    pub sdpa_model: String,
}

impl Default for Versions {
    fn default() -> Self {
        Self {
            burn: "0.22.1".into(),
            sdpa_model: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

/// What a run achieved; written to `summary.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainSummary {
    /// The configuration.
    pub config: TrainConfig,
    /// The backend.
    pub backend: String,
    /// The seed.
    pub seed: u64,
    /// Library versions.
    pub versions: Versions,
    /// Optimizer steps taken.
    pub steps_run: usize,
    /// First evaluation step whose held-out accuracy reached the target.
    pub steps_to_target: Option<usize>,
    /// The target.
    #[serde(with = "crate::json_float")]
    pub target_accuracy: f64,
    /// Held-out accuracy at the end.
    #[serde(with = "crate::json_float")]
    pub final_eval_accuracy: f64,
    /// Held-out loss at the end.
    #[serde(with = "crate::json_float")]
    pub final_eval_loss: f64,
    /// Training loss of the last recorded step.
    #[serde(with = "crate::json_float")]
    pub final_train_loss: f64,
    /// Attention diagnostics of the initial model (step 0), per layer.
    pub initial_attention: Vec<LayerMetrics>,
    /// Wall time of the whole run, resumed parts included (seconds).
    #[serde(with = "crate::json_float")]
    pub time_s: f64,
    /// Optimizer steps per second in this process.
    #[serde(with = "crate::json_float")]
    pub steps_per_s: f64,
    /// The step this process resumed from.
    pub resumed_from: Option<usize>,
    /// The step whose loss or gradient was not finite, when the run stopped there.
    #[serde(default)]
    pub diverged_at: Option<usize>,
}

/// The summary plus every recorded step.
#[derive(Debug, Clone)]
pub struct TrainResult {
    /// The summary.
    pub summary: TrainSummary,
    /// Every recorded step (the resumed part included).
    pub metrics: Vec<StepMetrics>,
    /// The trained model (not autodiff: ready for inference).
    pub model: AttentionModel,
    /// Where this process's steps spent their time.
    pub profile: StepProfile,
}

/// Parameter initialization draws from the backend's process-global RNG; this lock keeps two
/// runs in one process (e.g. parallel tests) from interleaving their draws.
static INIT_LOCK: Mutex<()> = Mutex::new(());

/// Forces every lazily initialized parameter to draw its values now.
struct Materialize;

impl ModuleVisitor for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let _ = param.val();
    }
}

/// Builds the model from a seed, drawing all its parameters at once under a process-wide lock
/// (the backend RNG is global, so two runs in one process must not interleave their draws).
pub fn init_model(
    config: &ModelConfig,
    seed: u64,
    device: &Device,
) -> Result<AttentionModel, ModelError> {
    let _guard = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    device.seed(seed);
    let model = config.try_init(device)?;
    model.visit(&mut Materialize);
    Ok(model)
}

/// Held-out (loss, accuracy) of a model, averaged over the batches.
pub fn evaluate(model: &AttentionModel, batches: &[TaskBatch]) -> Result<(f64, f64), ModelError> {
    if batches.is_empty() {
        return Err(ModelError::invalid(
            "batches",
            0,
            "evaluate needs at least one batch",
        ));
    }
    let model = model.valid();
    let mut parts = Vec::new();
    for b in batches {
        let r = model.forward_batch(b, false);
        parts.push(Tensor::cat(vec![r.loss.clone(), r.accuracy()], 0));
    }
    let n = parts.len().max(1) as f64;
    // [batches, 2] -> [1, 2]: summed loss and accuracy, read back in one transfer.
    let sums: Vec<f64> = read_back("the held-out loss", Tensor::stack::<2>(parts, 0).sum_dim(0))?;
    Ok((sums[0] / n, sums[1] / n))
}

/// Trains a model on a task and writes the run directory.
///
/// The device may be plain or autodiff; training uses its autodiff twin. With
/// `options.resume`, the run saved in `options.out_dir` continues from its last checkpoint and
/// ends with the same metrics as an uninterrupted run (the data RNG, the parameters and the
/// optimizer state are all restored; dropout randomness is not, and the default is no dropout).
pub fn train(
    config: &TrainConfig,
    device: &Device,
    options: &RunOptions,
) -> Result<TrainResult, ModelError> {
    config.validate()?;
    config.check_memory()?;
    let mut run = Run::open(config, device, options, true)?;
    while !run.done() {
        run = run.train_step()?;
    }
    run.finish()
}

/// Trains a model on a task without writing anything: the run is kept in memory (no folder, no
/// checkpoint, no `metrics.csv`; the recorded steps are in the result). A run whose loss or
/// gradient stops being finite is a result here, not an error: it stops at that step and its
/// summary has `diverged_at` set.
///
/// ```no_run
/// use burn::prelude::*;
/// use sdpa_model::{TaskConfig, TrainConfig, train_in_memory};
///
/// let config = TrainConfig::for_task(TaskConfig::new()).with_steps(100);
/// let result = train_in_memory(&config, &Device::flex(), "flex").unwrap();
/// println!("{:?}", result.summary.steps_to_target);
/// ```
pub fn train_in_memory(
    config: &TrainConfig,
    device: &Device,
    backend: &str,
) -> Result<TrainResult, ModelError> {
    config.validate()?;
    config.check_memory()?;
    let options = RunOptions {
        out_dir: PathBuf::new(),
        resume: false,
        backend: backend.to_string(),
        progress: ProgressMode::Quiet,
        overwrite: false,
    };
    let mut run = Run::open(config, device, &options, false)?;
    while !run.done() {
        run = run.train_step()?;
    }
    run.finish()
}
