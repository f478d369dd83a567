//! The training loop: records per-step internals, evaluates on held-out batches, checkpoints
//! and resumes exactly.
//!
//! A run directory holds `config.json` (the configuration and the backend), `metrics.csv`,
//! `summary.json` and `checkpoint/{model.bpk, optim.bpk, state.json}` (Burn's burnpack format
//! for the model and the optimizer).
//!
//! | file | what it holds |
//! |---|---|
//! | `config.rs` | [`TrainConfig`], [`OptimizerKind`] and their validation |
//! | `options.rs` | where and how a run writes ([`RunOptions`]) |
//! | `summary.rs` | what a run gives back ([`TrainSummary`], [`Versions`], [`TrainResult`]) |
//! | `init.rs` | the model built from a seed ([`init_model`]) |
//! | `evaluate.rs` | held-out loss and accuracy ([`evaluate`]) |
//! | `checkpoint.rs` | what a checkpoint holds, saving and loading it |
//! | `rows.rs` | the rows of `metrics.csv` a resume keeps, read and checked |
//! | `saved.rs` | a run's saved configuration (`config.json`: settings and backend) |
//! | `files.rs` | the files a run writes, crash-safe writes, the checkpoint swap and its recovery |
//! | `lock.rs` | one writer per run directory (`run.lock`), and taking a directory for a run |
//! | `memory.rs` | the memory a configuration needs, checked against the machine's |
//! | `start.rs` | the configuration checked against the device before anything is written |
//! | `profile.rs` | where a step's time goes ([`StepProfile`]) |
//! | `run.rs` | a run in progress and its steps (open, step, record, checkpoint, finish) |
//! | `mod.rs` | [`train`] and [`train_in_memory`] |

mod checkpoint;
mod config;
mod evaluate;
mod files;
mod grad_norms;
mod init;
mod lock;
mod memory;
mod options;
mod profile;
mod rates;
mod rows;
mod run;
mod saved;
mod start;
mod summary;

use std::path::PathBuf;

use burn::prelude::*;

pub use config::{OptimizerKind, TrainConfig};
pub use evaluate::evaluate;
pub use files::{temp_name, write_atomic};
pub use init::init_model;
pub use lock::{DirLock, check_run_dir, check_unlocked};
pub use memory::{available_memory, check_fits};
pub use options::RunOptions;
pub use profile::{Phase, StepProfile};
pub use saved::{MAX_CONFIG_BYTES, SavedRun, read_saved_run};
pub use start::check_start;
pub use summary::{TrainResult, TrainSummary, Versions};

use crate::error::ModelError;
use crate::progress::ProgressMode;
use run::Run;

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
    if options.resume {
        saved::check_resume(config, options)?;
    }
    check_start(config, device, &options.backend)?;
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
    check_start(config, device, backend)?;
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
