//! The configuration of a training run, its validation, and the optimizer it builds.

use burn::grad_clipping::GradientClippingConfig;
use burn::optim::{AdamConfig, ModuleOptimizer, SgdConfig, momentum::MomentumConfig};
use burn::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::ModelError;
use crate::model::ModelConfig;
use crate::task::TaskConfig;

/// The optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// Adam (β = 0.9, 0.999; ε = 1e-5, Burn's default).
    #[default]
    Adam,
    /// Stochastic gradient descent, with momentum if `momentum` is set.
    Sgd,
}

/// Configuration of a training run.
#[derive(Config, Debug)]
pub struct TrainConfig {
    /// The task.
    pub task: TaskConfig,
    /// The model (its vocabulary, length and classes must fit the task).
    pub model: ModelConfig,
    /// The optimizer.
    #[config(default = "OptimizerKind::Adam")]
    pub optimizer: OptimizerKind,
    /// Learning rate. 3e-3 trains the default model on *match* in a few hundred Adam steps.
    #[config(default = 3e-3)]
    pub lr: f64,
    /// A factor on the learning rate of the attention's query and key projections (W_Q and W_K,
    /// weights and biases, in every block): 1 gives every parameter `lr`. Under Adam, unscaled
    /// attention with this factor at d_k^(−1/4) steps like 1/√d_k-scaled attention whose W_Q, W_K
    /// start d_k^(1/4) larger (the lab tests one of its intervention arms against it).
    #[config(default = 1.0)]
    pub qk_lr_factor: f64,
    /// SGD momentum (ignored by Adam); `None` is plain SGD.
    pub momentum: Option<f64>,
    /// Clip the global gradient norm to this value.
    pub grad_clip: Option<f64>,
    /// Optimizer steps (the budget).
    #[config(default = 2000)]
    pub steps: usize,
    /// Sequences per batch. 64 gives a smooth loss at millisecond steps.
    #[config(default = 64)]
    pub batch_size: usize,
    /// Seed of the parameters and of the data.
    #[config(default = 42)]
    pub seed: u64,
    /// Evaluate on the held-out batches every this many steps.
    #[config(default = 50)]
    pub eval_every: usize,
    /// Number of held-out batches (generated once from a seed derived from `seed`).
    #[config(default = 16)]
    pub eval_batches: usize,
    /// Record metrics every this many steps (1 = every step).
    #[config(default = 10)]
    pub log_every: usize,
    /// Held-out accuracy whose first crossing is reported as "steps to target".
    #[config(default = 0.99)]
    pub target_accuracy: f64,
    /// Stop once the held-out accuracy reaches the target.
    #[config(default = true)]
    pub stop_at_target: bool,
    /// Write a checkpoint every this many steps (and always at the end).
    pub checkpoint_every: Option<usize>,
}

impl TrainConfig {
    /// The default model on a task.
    pub fn for_task(task: TaskConfig) -> Self {
        let model = ModelConfig::for_task(&task);
        Self::new(task, model)
    }

    /// Checks every value; nothing is written before this passes.
    pub fn validate(&self) -> Result<(), ModelError> {
        self.task.validate()?;
        self.model.validate()?;
        if self.model.vocab_size < self.task.vocab
            || self.model.seq_len < self.task.seq_len()
            || self.model.n_classes != self.task.n_classes()
        {
            return Err(ModelError::invalid(
                "model",
                format!(
                    "vocab {} / seq_len {} / classes {}",
                    self.model.vocab_size, self.model.seq_len, self.model.n_classes
                ),
                &format!(
                    "the task needs vocab {} / seq_len {} / classes {}",
                    self.task.vocab,
                    self.task.seq_len(),
                    self.task.n_classes()
                ),
            ));
        }
        if !(self.lr.is_finite() && (self.lr as f32).is_finite() && (self.lr as f32) > 0.0) {
            return Err(ModelError::invalid(
                "lr",
                self.lr,
                "must be a finite number > 0 that f32 can hold (the parameters are f32)",
            ));
        }
        let qk_lr = self.lr * self.qk_lr_factor;
        if !(qk_lr.is_finite() && (qk_lr as f32).is_finite() && (qk_lr as f32) > 0.0) {
            return Err(ModelError::invalid(
                "qk_lr_factor",
                self.qk_lr_factor,
                "must be > 0, and lr × qk_lr_factor a finite number that f32 can hold",
            ));
        }
        if let Some(m) = self.momentum
            && !(m.is_finite() && (0.0..1.0).contains(&m))
        {
            return Err(ModelError::invalid("momentum", m, "must be in [0, 1)"));
        }
        if let Some(c) = self.grad_clip
            && !(c.is_finite() && c > 0.0)
        {
            return Err(ModelError::invalid(
                "grad_clip",
                c,
                "must be finite and > 0",
            ));
        }
        for (field, v) in [
            ("steps", self.steps),
            ("batch_size", self.batch_size),
            ("eval_every", self.eval_every),
            ("eval_batches", self.eval_batches),
            ("log_every", self.log_every),
        ] {
            if v == 0 {
                return Err(ModelError::invalid(field, 0, "must be > 0"));
            }
        }
        if self.checkpoint_every == Some(0) {
            return Err(ModelError::invalid("checkpoint_every", 0, "must be > 0"));
        }
        if !(0.0..=1.0).contains(&self.target_accuracy) {
            return Err(ModelError::invalid(
                "target_accuracy",
                self.target_accuracy,
                "must be in [0, 1]",
            ));
        }
        Ok(())
    }

    /// A fresh optimizer of the configured kind.
    pub(crate) fn optimizer(&self) -> ModuleOptimizer {
        let clip = self
            .grad_clip
            .map(|c| GradientClippingConfig::Norm(c as f32));
        match self.optimizer {
            OptimizerKind::Adam => AdamConfig::new().with_grad_clipping(clip).init(),
            OptimizerKind::Sgd => SgdConfig::new()
                .with_momentum(
                    self.momentum
                        .map(|m| MomentumConfig::new().with_momentum(m).with_dampening(0.0)),
                )
                .with_gradient_clipping(clip)
                .init(),
        }
    }
}

/// Names the first setting that differs between two configurations, ignoring `steps` (a
/// resumed run may extend its budget) and the attention path (it computes the same function).
/// The task's settings come first: the model's sizes follow them, and a changed `k` is named
/// as `task.k`, not as the model's class count it changes.
pub(crate) fn config_mismatch(
    saved: &TrainConfig,
    requested: &TrainConfig,
) -> Option<(String, String, String)> {
    let a = serde_json::to_value(saved).ok()?;
    let b = serde_json::to_value(requested).ok()?;
    fn walk(
        prefix: &str,
        a: &serde_json::Value,
        b: &serde_json::Value,
    ) -> Option<(String, String, String)> {
        match (a, b) {
            (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
                let mut keys: Vec<_> = x.iter().collect();
                keys.sort_by_key(|(k, _)| k.as_str() != "task");
                for (k, va) in keys {
                    // The budget may grow, and the attention path computes the same function.
                    if (prefix.is_empty() && k == "steps")
                        || (prefix == "model.attention" && k == "implementation")
                    {
                        continue;
                    }
                    let vb = y.get(k).unwrap_or(&serde_json::Value::Null);
                    let name = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    if let Some(d) = walk(&name, va, vb) {
                        return Some(d);
                    }
                }
                None
            }
            _ if a != b => Some((prefix.to_string(), a.to_string(), b.to_string())),
            _ => None,
        }
    }
    walk("", &a, &b)
}
