//! # sdpa-model
//!
//! A small trainable self-attention model built on [`burn_sdpa::MultiHeadSdpa`], two
//! synthetic tasks that only content-based attention solves, and a training loop that records
//! what the experiments need at every step (loss, accuracy, gradient norms of the query, key and
//! value projections, attention entropy and saturation), with exact checkpoint/resume.
//!
//! ```no_run
//! use burn::prelude::*;
//! use sdpa_model::{RunOptions, TaskConfig, TrainConfig, train};
//!
//! let config = TrainConfig::for_task(TaskConfig::new());
//! let options = RunOptions::new("runs/match", "flex");
//! let result = train(&config, &Device::flex(), &options).unwrap();
//! println!("held-out accuracy {}", result.summary.final_eval_accuracy);
//! ```

pub mod error;
pub mod json_float;
pub mod learner;
pub mod metrics;
pub mod model;
pub mod progress;
pub mod task;
pub mod train;

pub use error::ModelError;
pub use metrics::{LayerMetrics, StepMetrics};
pub use model::{AttentionModel, ModelConfig, QkInit};
pub use progress::{Progress, ProgressMode, printable};
pub use task::{TaskBatch, TaskConfig, TaskKind};
pub use train::{
    OptimizerKind, Phase, RunOptions, StepProfile, TrainConfig, TrainResult, TrainSummary,
    available_memory, check_fits, check_run_dir, check_start, evaluate, init_model, train,
    train_in_memory,
};
