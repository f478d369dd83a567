//! The lab's training runs: one model and task for every training cell, trained in memory
//! (nothing is written: the cell's result is what the runner saves), with the arms the lab
//! compares — how the attention logits are scaled or controlled.

use burn::prelude::*;
use burn_sdpa::{QkNorm, ScalePolicy};
use sdpa_model::{
    LayerMetrics, ModelConfig, OptimizerKind, QkInit, TaskConfig, TrainConfig, train_in_memory,
};
use serde::{Deserialize, Serialize};

use crate::context::LabError;

/// How one training arm treats the attention logits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Arm {
    /// 1/√d_k (the article; Vaswani et al.).
    Scaled,
    /// Nothing.
    Unscaled,
    /// 1/d_k (µP's attention scale).
    InvDk,
    /// A learned temperature exp(θ) on unscaled scores, θ starting at 0: can the model learn
    /// the scale itself?
    Learned,
    /// `c · tanh(s / c)` on unscaled scores (Gemma 2's soft-cap, without the scale).
    SoftCap(f64),
    /// RMSNorm of every query and key head (learned gain), unscaled.
    QkNorm,
    /// RMSNorm of every query and key head, then 1/√d_k (ViT-22B, OLMo 2).
    QkNormScaled,
    /// The intervention arm: unscaled, with W_Q and W_K initialized × d_k^(−1/4), so that its
    /// logits start exactly as the 1/√d_k arm's (same seed, same draws) while training follows
    /// the unscaled gradients. It separates "saturated at the start" from "harder to optimize".
    UnscaledSmallInit,
    /// The other intervention arm: 1/√d_k attention whose W_Q and W_K start × d_k^(1/4), so that
    /// its logits start exactly as the unscaled arm's (same seed, same draws) while training
    /// follows 1/√d_k's gradients, at 1/√d_k's tuned rate: the start is the one difference. Under
    /// Adam (blind to a gradient's scale but for its ε) this is unscaled attention with W_Q, W_K
    /// stepped at the rate × d_k^(−1/4) (tested).
    ScaledLargeInit,
}

impl Arm {
    /// A short label for tables and plots.
    pub fn label(&self) -> String {
        match self {
            Arm::Scaled => "1/√d_k".into(),
            Arm::Unscaled => "none".into(),
            Arm::InvDk => "1/d_k".into(),
            Arm::Learned => "learned".into(),
            Arm::SoftCap(c) => format!("cap {c}"),
            Arm::QkNorm => "QK-norm".into(),
            Arm::QkNormScaled => "QK-norm + 1/√d_k".into(),
            Arm::UnscaledSmallInit => "none, W_Q,W_K × d_k^−¼".into(),
            Arm::ScaledLargeInit => "1/√d_k, W_Q,W_K × d_k^¼".into(),
        }
    }

    /// A file- and id-safe label.
    pub fn slug(&self) -> String {
        match self {
            Arm::Scaled => "scaled".into(),
            Arm::Unscaled => "none".into(),
            Arm::InvDk => "inv-dk".into(),
            Arm::Learned => "learned".into(),
            Arm::SoftCap(c) => format!("cap{c}"),
            Arm::QkNorm => "qknorm".into(),
            Arm::QkNormScaled => "qknorm-scaled".into(),
            Arm::UnscaledSmallInit => "none-small-init".into(),
            Arm::ScaledLargeInit => "scaled-large-init".into(),
        }
    }

    /// The scale policy at d_k.
    pub fn scale(&self, d_k: usize) -> ScalePolicy {
        match self {
            Arm::Scaled | Arm::QkNormScaled | Arm::ScaledLargeInit => ScalePolicy::InvSqrtDk,
            Arm::InvDk => ScalePolicy::Fixed(1.0 / d_k as f64),
            _ => ScalePolicy::Unscaled,
        }
    }

    /// The factor on the initial W_Q and W_K at d_k.
    pub fn qk_init_gain(&self, d_k: usize) -> f64 {
        match self {
            Arm::UnscaledSmallInit => (d_k as f64).powf(-0.25),
            Arm::ScaledLargeInit => (d_k as f64).powf(0.25),
            _ => 1.0,
        }
    }

    /// The arm whose tuned learning rate this arm trains at: itself, but for
    /// [`Arm::ScaledLargeInit`], which takes 1/√d_k's so that only its start differs from it.
    pub fn rate_arm(&self) -> Arm {
        match self {
            Arm::ScaledLargeInit => Arm::Scaled,
            a => *a,
        }
    }
}

/// The name of an initialization.
pub fn init_name(init: QkInit) -> &'static str {
    match init {
        QkInit::Default => "default",
        QkInit::Unit => "unit",
    }
}

/// The name of an optimizer.
pub fn optimizer_name(o: OptimizerKind) -> &'static str {
    match o {
        OptimizerKind::Adam => "adam",
        OptimizerKind::Sgd => "sgd",
    }
}

/// Everything that determines one training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingSpec {
    /// Query/key size of the head.
    pub d_k: usize,
    /// The arm.
    pub arm: Arm,
    /// Initialization of the query and key projections.
    pub init: QkInit,
    /// Optimizer (SGD with momentum 0.9).
    pub optimizer: OptimizerKind,
    /// Learning rate.
    pub lr: f64,
    /// Seed of the parameters and the data: two arms with one seed start from the same
    /// parameters (but for their own, constant-initialized ones) and see the same batches.
    pub seed: u64,
    /// Step budget.
    pub budget: usize,
    /// Stop at the target (evaluation runs: what they measure is the steps to it), or train the
    /// whole budget (the learning-rate sweep: its curves also read the held-out loss at the
    /// budget).
    pub stop_at_target: bool,
    /// Backend.
    pub backend: String,
}

/// The model every lab training run trains, with the reason beside each size.
pub fn model_config(task: &TaskConfig, spec: &TrainingSpec) -> ModelConfig {
    let mut m = ModelConfig::for_task(task);
    // 64 wide is enough for k = 8; one head, because the cost of a step at d_k = 1024 grows with
    // heads × d_k and one head solves match: a step then costs ~40 ms at d_k = 1024 on one core,
    // which is what lets 20 paired seeds per cell fit in the report's budget.
    m.d_model = 64;
    m.n_heads = 1;
    m.d_k = Some(spec.d_k);
    // The value path stays d_model / n_heads wide whatever d_k: the sweep changes the scores only.
    m.d_v = Some(64);
    m.layer_norm = true;
    m.qk_init = spec.init;
    m.qk_init_gain = spec.arm.qk_init_gain(spec.d_k);
    m.attention.scale = spec.arm.scale(spec.d_k);
    m.attention.softcap = match spec.arm {
        Arm::SoftCap(c) => Some(c),
        _ => None,
    };
    m.qk_norm = match spec.arm {
        Arm::QkNorm | Arm::QkNormScaled => QkNorm::RmsNorm,
        _ => QkNorm::None,
    };
    m.learned_temperature = (spec.arm == Arm::Learned).then_some(1.0);
    m
}

/// The training configuration of a spec: *match* (k = 8, vocabulary 64), batches of 64, a
/// held-out evaluation every 10 steps on 2 batches (2048 predictions: the 99% target is read to
/// ±0.4%), stopping at 99% held-out accuracy when the spec says so.
pub fn train_config(spec: &TrainingSpec) -> TrainConfig {
    let task = TaskConfig::new();
    let mut c = TrainConfig::new(task.clone(), model_config(&task, spec));
    c.optimizer = spec.optimizer;
    c.lr = spec.lr;
    c.momentum = (spec.optimizer == OptimizerKind::Sgd).then_some(0.9);
    c.steps = spec.budget;
    c.seed = spec.seed;
    c.batch_size = 64;
    c.eval_every = EVAL_EVERY;
    c.eval_batches = 2;
    c.log_every = EVAL_EVERY;
    c.target_accuracy = TARGET;
    c.stop_at_target = spec.stop_at_target;
    c
}

/// Held-out accuracy that counts as "trained".
pub const TARGET: f64 = 0.99;
/// Steps between held-out evaluations (the resolution of "steps to the target").
pub const EVAL_EVERY: usize = 10;

/// One point of a run's held-out curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    /// Step.
    pub step: usize,
    /// Held-out accuracy.
    #[serde(with = "sdpa_model::json_float")]
    pub accuracy: f64,
    /// Training loss of the step's batch.
    #[serde(with = "sdpa_model::json_float")]
    pub loss: f64,
    /// Held-out loss.
    #[serde(with = "sdpa_model::json_float")]
    pub eval_loss: f64,
    /// The attention's normalized entropy on the step's training batch (entropy / ln of the
    /// visible keys, mean over rows and heads; the mean over layers for a deeper model), read
    /// from the training forward's row statistics. NaN in cells measured before it was kept.
    #[serde(with = "sdpa_model::json_float", default = "not_kept")]
    pub entropy: f64,
    /// The largest scaled attention logit any row sees on the step's batch (the largest over
    /// layers). NaN in cells measured before it was kept.
    #[serde(with = "sdpa_model::json_float", default = "not_kept")]
    pub max_logit: f64,
}

/// A curve value that an older cell does not hold.
fn not_kept() -> f64 {
    f64::NAN
}

/// What one training run gives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingOutcome {
    /// First evaluation step at or above the target; `None`: censored at the budget (or at
    /// divergence).
    pub steps_to_target: Option<usize>,
    /// Steps taken.
    pub steps_run: usize,
    /// Held-out accuracy at the end (NaN for a run that diverged).
    #[serde(with = "sdpa_model::json_float")]
    pub final_accuracy: f64,
    /// Held-out loss at the end (NaN for a run that diverged).
    #[serde(with = "sdpa_model::json_float")]
    pub final_loss: f64,
    /// The step whose loss or gradient was not finite, if any (the run stopped there).
    pub diverged_at: Option<usize>,
    /// Attention diagnostics of the initial model (logit std, max p, saturated rows, q/k std).
    pub initial: LayerMetrics,
    /// The same at the last recorded step.
    pub last: LayerMetrics,
    /// Held-out accuracy and training loss at every evaluation.
    pub curve: Vec<CurvePoint>,
    /// The learned temperature's factor at the end, for the learned arm.
    #[serde(default)]
    pub final_temperature: Option<f64>,
}

impl TrainingOutcome {
    /// One line for the progress display: when it reached the target, or where it stopped.
    pub fn summary(&self) -> String {
        match self.steps_to_target {
            Some(s) => format!("99% at step {s}"),
            None => format!(
                "not at 99% after {} steps ({:.3})",
                self.steps_run, self.final_accuracy
            ),
        }
    }
}

/// Trains `spec` in memory on `device`.
pub fn run(spec: &TrainingSpec, device: &Device) -> Result<TrainingOutcome, LabError> {
    run_config(&train_config(spec), &spec.backend, device)
}

/// The attention's normalized entropy (mean over layers) and largest logit (largest over
/// layers) of one recorded step; NaN when it recorded no layer.
fn attention_curve(layers: &[LayerMetrics]) -> (f64, f64) {
    if layers.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let entropy = layers.iter().map(|l| l.normalized_entropy).sum::<f64>() / layers.len() as f64;
    let max_logit = layers
        .iter()
        .map(|l| l.max_logit)
        .fold(f64::NEG_INFINITY, f64::max);
    (entropy, max_logit)
}

/// Trains `config` in memory on `device` (`backend` names it): what [`run`] does for a lab
/// spec, for a configuration an experiment built itself (another task or model size).
pub fn run_config(
    config: &TrainConfig,
    backend: &str,
    device: &Device,
) -> Result<TrainingOutcome, LabError> {
    let result = train_in_memory(config, device, backend)?;
    let layer = |m: Option<&sdpa_model::StepMetrics>| {
        m.and_then(|m| m.layers.first().copied())
            .unwrap_or_default()
    };
    let curve = result
        .metrics
        .iter()
        .filter_map(|m| {
            m.eval_accuracy.map(|accuracy| {
                let (entropy, max_logit) = attention_curve(&m.layers);
                CurvePoint {
                    step: m.step,
                    accuracy,
                    loss: m.loss,
                    eval_loss: m.eval_loss.unwrap_or(f64::NAN),
                    entropy,
                    max_logit,
                }
            })
        })
        .collect();
    let final_temperature = match result
        .model
        .blocks
        .first()
        .and_then(|b| b.attention.temperature())
    {
        Some(t) => Some(crate::context::scalar(t)?),
        None => None,
    };
    Ok(TrainingOutcome {
        steps_to_target: result.summary.steps_to_target,
        steps_run: result.summary.steps_run,
        final_accuracy: result.summary.final_eval_accuracy,
        final_loss: result.summary.final_eval_loss,
        diverged_at: result.summary.diverged_at,
        initial: layer(result.metrics.first()),
        last: layer(result.metrics.last()),
        curve,
        final_temperature,
    })
}
