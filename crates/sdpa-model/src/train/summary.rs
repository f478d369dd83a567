//! What a run gives back: its summary ([`TrainSummary`], written to `summary.json`, with the
//! library [`Versions`]) and the result of [`train`](super::train) ([`TrainResult`]).

use serde::{Deserialize, Serialize};

use super::config::TrainConfig;
use super::profile::StepProfile;
use crate::metrics::{LayerMetrics, StepMetrics};
use crate::model::AttentionModel;

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
