//! The training loop: records per-step internals, evaluates on held-out batches, checkpoints
//! and resumes exactly.
//!
//! A run directory holds `config.json`, `metrics.csv`, `summary.json` and
//! `checkpoint/{model.bpk, optim.bpk, state.json}` (Burn's burnpack format for the model and the
//! optimizer).

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use burn::grad_clipping::GradientClippingConfig;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{
    AdamConfig, GradientsParams, ModuleOptimizer, SgdConfig, momentum::MomentumConfig,
};
use burn::prelude::*;
use burn::tensor::Gradients;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::ModelError;
use crate::metrics::{LayerMetrics, StepMetrics, csv_header};
use crate::model::{AttentionModel, ModelConfig};
use crate::progress::{Progress, ProgressMode};
use crate::task::{TaskBatch, TaskConfig};

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
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(ModelError::invalid("lr", self.lr, "must be finite and > 0"));
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

    fn optimizer(&self) -> ModuleOptimizer {
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
    pub target_accuracy: f64,
    /// Held-out accuracy at the end.
    pub final_eval_accuracy: f64,
    /// Held-out loss at the end.
    pub final_eval_loss: f64,
    /// Training loss of the last recorded step.
    pub final_train_loss: f64,
    /// Attention diagnostics of the initial model (step 0), per layer.
    pub initial_attention: Vec<LayerMetrics>,
    /// Wall time of the whole run, resumed parts included (seconds).
    pub time_s: f64,
    /// Optimizer steps per second in this process.
    pub steps_per_s: f64,
    /// The step this process resumed from.
    pub resumed_from: Option<usize>,
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
}

/// What a checkpoint holds beside the model and optimizer files.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CheckpointState {
    step: usize,
    rng_seed: [u8; 32],
    rng_stream: u64,
    rng_word_pos: String,
    steps_to_target: Option<usize>,
    elapsed_s: f64,
    initial_attention: Vec<LayerMetrics>,
    config: TrainConfig,
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

/// Sums the squared gradients of all parameters.
struct GradSquares<'a> {
    grads: &'a Gradients,
    sums: Vec<Tensor<1>>,
}

impl ModuleVisitor for GradSquares<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = param.grad(self.grads) {
            self.sums.push(g.square().sum());
        }
    }
}

fn squared_norm(t: Option<Tensor<2>>, device: &Device) -> Tensor<1> {
    t.map(|g| g.square().sum())
        .unwrap_or_else(|| Tensor::zeros([1], device))
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

fn held_out(
    task: &TaskConfig,
    seed: u64,
    n: usize,
    batch: usize,
    device: &Device,
) -> Vec<TaskBatch> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_0e7a_1c0d_e5ed);
    (0..n)
        .map(|_| task.batch(&mut rng, batch, device))
        .collect()
}

/// Held-out (loss, accuracy) of a model.
pub fn evaluate(model: &AttentionModel, batches: &[TaskBatch]) -> (f64, f64) {
    let model = model.valid();
    let mut parts = Vec::new();
    for b in batches {
        let r = model.forward_batch(b, false);
        parts.push(Tensor::cat(vec![r.loss.clone(), r.accuracy()], 0));
    }
    let n = parts.len().max(1) as f64;
    let sums: Vec<f64> = Tensor::stack::<2>(parts, 0)
        .sum_dim(0)
        .into_data()
        .convert::<f64>()
        .try_into_vec::<f64>()
        .unwrap_or_default();
    (
        sums.first().copied().unwrap_or(f64::NAN) / n,
        sums.get(1).copied().unwrap_or(f64::NAN) / n,
    )
}

fn write_atomic(path: &Path, text: &str) -> Result<(), ModelError> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, text).map_err(|e| ModelError::io(&tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| ModelError::io(path, e))
}

fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// Names the first setting that differs between two configurations, ignoring `steps` (a
/// resumed run may extend its budget).
fn config_mismatch(
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
                for (k, va) in x {
                    if prefix.is_empty() && k == "steps" {
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

/// A run resumed from disk: everything is loaded and checked before anything is written.
struct Resumed {
    model: AttentionModel,
    optim: ModuleOptimizer,
    state: CheckpointState,
    metrics: Vec<StepMetrics>,
}

fn load_checkpoint(
    config: &TrainConfig,
    dir: &Path,
    device: &Device,
) -> Result<Resumed, ModelError> {
    let ckpt = dir.join("checkpoint");
    let state_path = ckpt.join("state.json");
    let text = fs::read_to_string(&state_path)
        .map_err(|e| ModelError::checkpoint(&state_path, format!("cannot read: {e}")))?;
    let state: CheckpointState = serde_json::from_str(&text).map_err(|e| {
        ModelError::checkpoint(
            &state_path,
            format!("truncated or not a checkpoint state: {e}"),
        )
    })?;
    if let Some((field, saved, requested)) = config_mismatch(&state.config, config) {
        return Err(ModelError::Mismatch {
            path: state_path,
            field,
            saved,
            requested,
        });
    }
    if state.step > config.steps {
        return Err(ModelError::Mismatch {
            path: state_path,
            field: "steps".into(),
            saved: format!("{} (already taken)", state.step),
            requested: config.steps.to_string(),
        });
    }
    let model_path = ckpt.join("model.bpk");
    if !model_path.is_file() {
        return Err(ModelError::checkpoint(&model_path, "missing"));
    }
    let model = config
        .model
        .try_init(device)?
        .try_load_file(&model_path)
        .map_err(|e| {
            ModelError::checkpoint(&model_path, format!("truncated or unreadable: {e:?}"))
        })?;
    let optim_path = ckpt.join("optim.bpk");
    if !optim_path.is_file() {
        return Err(ModelError::checkpoint(&optim_path, "missing"));
    }
    let optim = config.optimizer().load(&optim_path).map_err(|e| {
        ModelError::checkpoint(&optim_path, format!("truncated or unreadable: {e:?}"))
    })?;
    let metrics_path = dir.join("metrics.csv");
    let n_layers = config.model.n_layers;
    let metrics = match fs::read_to_string(&metrics_path) {
        Ok(text) => text
            .lines()
            .skip(1)
            .filter_map(|l| StepMetrics::from_csv_row(l, n_layers))
            // Rows written after the checkpoint are recomputed by the resumed run.
            .filter(|m| m.step <= state.step)
            .collect(),
        Err(e) => {
            return Err(ModelError::checkpoint(
                &metrics_path,
                format!("cannot read: {e}"),
            ));
        }
    };
    Ok(Resumed {
        model,
        optim,
        state,
        metrics,
    })
}

fn save_checkpoint(
    dir: &Path,
    model: &AttentionModel,
    optim: &ModuleOptimizer,
    state: &CheckpointState,
) -> Result<(), ModelError> {
    let tmp = dir.join("checkpoint.tmp");
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
    let model_path = tmp.join("model.bpk");
    model
        .clone()
        .save_file(&model_path)
        .map_err(|e| ModelError::checkpoint(&model_path, format!("cannot write: {e:?}")))?;
    let optim_path = tmp.join("optim.bpk");
    optim
        .save(&optim_path)
        .map_err(|e| ModelError::checkpoint(&optim_path, format!("cannot write: {e:?}")))?;
    write_atomic(&tmp.join("state.json"), &json(state))?;
    let ckpt = dir.join("checkpoint");
    let _ = fs::remove_dir_all(&ckpt);
    fs::rename(&tmp, &ckpt).map_err(|e| ModelError::io(&ckpt, e))
}

fn rng_state(rng: &ChaCha8Rng) -> ([u8; 32], u64, String) {
    (
        rng.get_seed(),
        rng.get_stream(),
        rng.get_word_pos().to_string(),
    )
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
    let dir = &options.out_dir;
    let device = device.clone().autodiff();
    let inner = device.clone().without_autodiff();
    let metrics_path = dir.join("metrics.csv");

    // Everything that can fail is checked before the first write.
    let resumed = if options.resume {
        Some(load_checkpoint(config, dir, &device)?)
    } else {
        if metrics_path.exists() {
            return Err(ModelError::RunExists(dir.clone()));
        }
        None
    };
    let (
        mut model,
        mut optim,
        start,
        mut rng,
        mut history,
        mut steps_to_target,
        elapsed0,
        mut initial,
    ) = match resumed {
        Some(r) => {
            let mut rng = ChaCha8Rng::from_seed(r.state.rng_seed);
            rng.set_stream(r.state.rng_stream);
            let pos: u128 = r.state.rng_word_pos.parse().map_err(|_| {
                ModelError::checkpoint(&dir.join("checkpoint/state.json"), "bad rng_word_pos")
            })?;
            rng.set_word_pos(pos);
            (
                r.model,
                r.optim,
                r.state.step,
                rng,
                r.metrics,
                r.state.steps_to_target,
                r.state.elapsed_s,
                r.state.initial_attention,
            )
        }
        None => (
            init_model(&config.model, config.seed, &device)?,
            config.optimizer(),
            0,
            ChaCha8Rng::seed_from_u64(config.seed),
            Vec::new(),
            None,
            0.0,
            Vec::new(),
        ),
    };

    fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    write_atomic(&dir.join("config.json"), &json(config))?;
    {
        let mut text = csv_header(config.model.n_layers);
        text.push('\n');
        for m in &history {
            text.push_str(&m.csv_row());
            text.push('\n');
        }
        write_atomic(&metrics_path, &text)?;
    }
    let mut csv = fs::OpenOptions::new()
        .append(true)
        .open(&metrics_path)
        .map_err(|e| ModelError::io(&metrics_path, e))?;

    let eval_set = held_out(
        &config.task,
        config.seed,
        config.eval_batches,
        config.batch_size,
        &inner,
    );
    let progress = Progress::new(
        options.progress,
        &format!("train {}", config.task.kind),
        start as u64,
        config.steps as u64,
    );
    let clock = Instant::now();
    let mut step = start;
    let mut last_loss = history.last().map_or(f64::NAN, |m| m.loss);

    let state_at = |step: usize,
                    rng: &ChaCha8Rng,
                    stt: Option<usize>,
                    initial: &[LayerMetrics],
                    elapsed: f64| {
        let (rng_seed, rng_stream, rng_word_pos) = rng_state(rng);
        CheckpointState {
            step,
            rng_seed,
            rng_stream,
            rng_word_pos,
            steps_to_target: stt,
            elapsed_s: elapsed,
            initial_attention: initial.to_vec(),
            config: config.clone(),
        }
    };

    while step < config.steps {
        let batch = config.task.batch(&mut rng, config.batch_size, &device);
        let record = step % config.log_every == 0 || step + 1 == config.steps;
        let out = model.forward_batch(&batch, record);
        let accuracy = out.accuracy();
        let grads = out.loss.backward();

        if record {
            let mut squares = GradSquares {
                grads: &grads,
                sums: Vec::new(),
            };
            model.visit(&mut squares);
            let mut parts = vec![
                out.loss.clone().without_autodiff(),
                accuracy.without_autodiff(),
                Tensor::cat(squares.sums, 0).sum(),
            ];
            let sq = |f: &dyn Fn(&crate::model::Block) -> Option<Tensor<2>>| {
                model
                    .blocks
                    .iter()
                    .map(|b| squared_norm(f(b), &inner))
                    .reduce(|a, b| a + b)
                    .unwrap_or_else(|| Tensor::zeros([1], &inner))
            };
            parts.push(sq(&|b| b.attention.query.weight.grad(&grads)));
            parts.push(sq(&|b| b.attention.key.weight.grad(&grads)));
            parts.push(sq(&|b| b.attention.value.weight.grad(&grads)));
            let v: Vec<f64> = Tensor::cat(parts, 0)
                .into_data()
                .convert::<f64>()
                .try_into_vec::<f64>()
                .unwrap_or_default();
            let get = |i: usize| v.get(i).copied().unwrap_or(f64::NAN);
            let layers: Vec<LayerMetrics> = out
                .attention
                .iter()
                .map(|a| {
                    let d = a.diagnostics().mean();
                    LayerMetrics {
                        entropy: d.entropy,
                        normalized_entropy: d.normalized_entropy,
                        max_prob: d.max_prob,
                        saturated_fraction: d.saturated_fraction,
                        logit_std: d.logit_std.unwrap_or(f64::NAN),
                    }
                })
                .collect();
            if step == 0 {
                initial = layers.clone();
            }
            let eval = (step % config.eval_every == 0).then(|| evaluate(&model, &eval_set));
            let m = StepMetrics {
                step,
                loss: get(0),
                accuracy: get(1),
                grad_norm: get(2).sqrt(),
                grad_norm_query: get(3).sqrt(),
                grad_norm_key: get(4).sqrt(),
                grad_norm_value: get(5).sqrt(),
                eval_loss: eval.map(|e| e.0),
                eval_accuracy: eval.map(|e| e.1),
                layers,
                elapsed_s: elapsed0 + clock.elapsed().as_secs_f64(),
            };
            last_loss = m.loss;
            writeln!(csv, "{}", m.csv_row()).map_err(|e| ModelError::io(&metrics_path, e))?;
            let rate = (step + 1 - start) as f64 / clock.elapsed().as_secs_f64().max(1e-9);
            progress.update(
                step as u64,
                &format!(
                    "loss {:.4} acc {:.3} {:.1} steps/s",
                    m.loss, m.accuracy, rate
                ),
            );
            if let Some((l, a)) = eval {
                progress.println(&format!(
                    "step {step:>6}: held-out loss {l:.4}, accuracy {a:.4}"
                ));
                if a >= config.target_accuracy && steps_to_target.is_none() {
                    steps_to_target = Some(step);
                }
            }
            history.push(m);
        }
        if steps_to_target.is_some() && config.stop_at_target {
            break;
        }
        let grads = GradientsParams::from_grads(grads, &model);
        model = optim.step(config.lr, model, grads);
        step += 1;
        if let Some(every) = config.checkpoint_every
            && step % every == 0
            && step < config.steps
        {
            let st = state_at(
                step,
                &rng,
                steps_to_target,
                &initial,
                elapsed0 + clock.elapsed().as_secs_f64(),
            );
            save_checkpoint(dir, &model, &optim, &st)?;
        }
    }

    // Final held-out evaluation of the model as it ends.
    let (eval_loss, eval_acc) = match history.last() {
        // Stopped at the target: the last record already evaluated this very model.
        Some(m) if m.step == step && m.eval_accuracy.is_some() => (
            m.eval_loss.unwrap_or(f64::NAN),
            m.eval_accuracy.unwrap_or(f64::NAN),
        ),
        _ => evaluate(&model, &eval_set),
    };
    if eval_acc >= config.target_accuracy && steps_to_target.is_none() {
        steps_to_target = Some(step);
    }
    let elapsed = elapsed0 + clock.elapsed().as_secs_f64();
    let st = state_at(step, &rng, steps_to_target, &initial, elapsed);
    save_checkpoint(dir, &model, &optim, &st)?;
    let summary = TrainSummary {
        config: config.clone(),
        backend: options.backend.clone(),
        seed: config.seed,
        versions: Versions::default(),
        steps_run: step,
        steps_to_target,
        target_accuracy: config.target_accuracy,
        final_eval_accuracy: eval_acc,
        final_eval_loss: eval_loss,
        final_train_loss: last_loss,
        initial_attention: initial,
        time_s: elapsed,
        steps_per_s: (step - start) as f64 / clock.elapsed().as_secs_f64().max(1e-9),
        resumed_from: options.resume.then_some(start),
    };
    write_atomic(&dir.join("summary.json"), &json(&summary))?;
    progress.finish(&format!(
        "{step} steps, held-out accuracy {eval_acc:.4}, {:.1} steps/s",
        summary.steps_per_s
    ));
    Ok(TrainResult {
        summary,
        metrics: history,
        model: model.valid(),
    })
}
