//! A run in progress: its state, and the small steps it is made of (open, one optimizer step,
//! record, checkpoint, finish).

use std::fs::{self, File};
use std::path::PathBuf;
use std::time::Instant;

use burn::module::Module;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::prelude::*;
use burn_sdpa::util::read_back;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::checkpoint::{CheckpointState, load_checkpoint, save_checkpoint};
use super::config::TrainConfig;
use super::evaluate::evaluate;
use super::files::json;
use super::files::write_atomic;
use super::grad_norms::grad_squares;
use super::init::init_model;
use super::lock::{RunLock, take_dir};
use super::options::RunOptions;
use super::profile::{Phase, StepClock, StepProfile};
use super::rates::learning_rate;
use super::rows::rows_checksum;
use super::saved::{config_json, read_bounded};
use super::summary::{TrainResult, TrainSummary, Versions};
use crate::error::ModelError;
use crate::metrics::{LayerMetrics, StepMetrics, csv_header};
use crate::model::AttentionModel;
use crate::progress::Progress;
use crate::task::{TaskBatch, TaskConfig};

#[path = "record.rs"]
mod record;

/// The most of an earlier `summary.json` that is read (a summary is a few KiB).
const MAX_SUMMARY_BYTES: u64 = 4 << 20;

/// Everything a run carries from one step to the next.
pub(crate) struct Run<'a> {
    config: &'a TrainConfig,
    options: &'a RunOptions,
    /// The autodiff device the model trains on.
    device: Device,
    /// Its plain twin, for evaluation and metrics.
    inner: Device,
    model: AttentionModel,
    optim: ModuleOptimizer,
    /// The data RNG (one batch per step).
    rng: ChaCha8Rng,
    /// The step this process started from (0, or the resumed checkpoint's).
    start: usize,
    /// The next optimizer step.
    pub step: usize,
    /// Every recorded step, the resumed part included.
    history: Vec<StepMetrics>,
    steps_to_target: Option<usize>,
    /// Whether `steps_to_target` was set by the final evaluation of a finished run, which has no
    /// row of its own (see `CheckpointState::target_without_row`).
    target_without_row: bool,
    /// Wall time of the earlier processes of a resumed run.
    elapsed_before: f64,
    /// Attention diagnostics of the initial model.
    initial: Vec<LayerMetrics>,
    eval_set: Vec<TaskBatch>,
    metrics_path: PathBuf,
    /// `metrics.csv`, open for appending; `None` for a run kept in memory.
    csv: Option<File>,
    /// Where the loss or gradient stopped being finite (step, loss, gradient norm), for a run
    /// kept in memory (a run with files stops with an error instead).
    diverged: Option<(usize, f64, f64)>,
    progress: Progress,
    clock: Instant,
    /// Where this process's steps spent their time.
    profile: StepProfile,
    /// The steps per second an earlier process's summary recorded: a resume that has no step
    /// left to run keeps that figure rather than a rate of no steps.
    previous_rate: Option<f64>,
    /// The run directory's lock, held until the run is dropped; `None` for a run kept in memory.
    _lock: Option<RunLock>,
}

impl<'a> Run<'a> {
    /// Starts a fresh run or loads the saved one; everything that can fail is checked before the
    /// first write. With `persist` false the run writes nothing (no folder, no checkpoint) and
    /// is kept in memory.
    pub fn open(
        config: &'a TrainConfig,
        device: &Device,
        options: &'a RunOptions,
        persist: bool,
    ) -> Result<Self, ModelError> {
        let dir = &options.out_dir;
        let device = device.clone().autodiff();
        let inner = device.clone().without_autodiff();
        let metrics_path = dir.join("metrics.csv");
        let (lock, mut notes) = if persist {
            let (lock, notes) = take_dir(dir, options)?;
            (Some(lock), notes)
        } else {
            (None, Vec::new())
        };
        let resumed = if options.resume && persist {
            match load_checkpoint(config, dir, &device, &options.backend)? {
                Ok(r) => Some(r),
                Err(recovery) => {
                    notes.extend(recovery);
                    notes.push(format!(
                        "{} holds no checkpoint (the run stopped before its first checkpoint): starting at step 0",
                        dir.display()
                    ));
                    None
                }
            }
        } else {
            None
        };
        let target_without_row = resumed.as_ref().is_some_and(|r| r.state.target_without_row);
        let (model, optim, start, rng, history, steps_to_target, elapsed_before, initial) =
            match resumed {
                Some(r) => {
                    notes.extend(r.notes);
                    let rng = r.state.rng(&dir.join("checkpoint/state.json"))?;
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

        let csv = if persist {
            fs::create_dir_all(dir).map_err(|e| ModelError::cannot_create(dir, e))?;
            let config_path = dir.join("config.json");
            write_atomic(
                &config_path,
                config_json(config, &options.backend, &config_path)?,
            )?;
            let mut text = csv_header(config.model.n_layers);
            text.push('\n');
            for m in &history {
                text.push_str(&m.csv_row());
                text.push('\n');
            }
            write_atomic(&metrics_path, &text)?;
            Some(
                fs::OpenOptions::new()
                    .append(true)
                    .open(&metrics_path)
                    .map_err(|e| ModelError::io(&metrics_path, e))?,
            )
        } else {
            None
        };

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
        for note in notes {
            progress.println(&note);
        }
        Ok(Self {
            config,
            options,
            device,
            inner,
            model,
            optim,
            rng,
            start,
            step: start,
            history,
            steps_to_target,
            target_without_row,
            elapsed_before,
            initial,
            eval_set,
            metrics_path,
            csv,
            diverged: None,
            progress,
            clock: Instant::now(),
            profile: StepProfile::default(),
            previous_rate: (options.resume && persist)
                .then(|| previous_rate(&dir.join("summary.json")))
                .flatten(),
            _lock: lock,
        })
    }

    /// Whether the run is over: the budget is spent, or the target was reached and the run
    /// stops there.
    pub fn done(&self) -> bool {
        self.diverged.is_some()
            || self.step >= self.config.steps
            || (self.steps_to_target.is_some() && self.config.stop_at_target)
    }

    /// One step: a batch, forward and backward, the record when one is due, then (unless the
    /// target was just reached and the run stops there) the optimizer step and a checkpoint when
    /// one is due. It takes the run by value so that the optimizer owns the only reference to
    /// the parameters it updates.
    pub fn train_step(mut self) -> Result<Self, ModelError> {
        let config = self.config;
        let mut clock = StepClock::start();
        let batch = config
            .task
            .batch(&mut self.rng, config.batch_size, &self.device);
        clock.lap(Phase::Data);
        let record = self.step.is_multiple_of(config.log_every) || self.step + 1 == config.steps;
        let out = self.model.try_forward_batch(&batch, record)?;
        clock.lap(Phase::Forward);
        let grads = out.loss.backward();
        clock.lap(Phase::Backward);
        // The loss and the global gradient norm of every step, to stop at the first that is not
        // finite, and on a recorded step everything it records: one read-back.
        let mut parts = vec![
            out.loss.clone().without_autodiff(),
            grad_squares(&self.model, &grads),
        ];
        if record {
            parts.extend(self.record_parts(&out, &grads));
        }
        let values: Vec<f64> = read_back("the step's loss and records", Tensor::cat(parts, 0))?;
        let (loss, grad_norm) = (values[0], values[1].sqrt());
        let diverged = !(loss.is_finite() && grad_norm.is_finite());
        clock.lap(Phase::HostRead);
        if record {
            self.record(&out, &values)?;
        } else if diverged {
            // The diverged step's record, read back now (once per run).
            let mut parts = vec![
                out.loss.clone().without_autodiff(),
                grad_squares(&self.model, &grads),
            ];
            parts.extend(self.record_parts(&out, &grads));
            let values: Vec<f64> = read_back("the step's records", Tensor::cat(parts, 0))?;
            self.record(&out, &values)?;
        }
        clock.lap(Phase::Record);
        if diverged {
            if self.csv.is_none() {
                // Kept in memory: a diverged run is a result (see `finish`).
                self.diverged = Some((self.step, loss, grad_norm));
                return Ok(self);
            }
            return Err(self.diverge(loss, grad_norm));
        }
        if self.done() {
            clock.finish(&mut self.profile);
            return Ok(self);
        }
        let grads = GradientsParams::from_grads(grads, &self.model);
        let lr = learning_rate(config, &self.model);
        self.model = self.optim.step(lr, self.model, grads);
        self.step += 1;
        clock.lap(Phase::Optimizer);
        if let Some(every) = config.checkpoint_every
            && self.csv.is_some()
            && self.step.is_multiple_of(every)
            && self.step < config.steps
        {
            self.checkpoint()?;
        }
        // The step's tensors are freed inside its time.
        drop((out, batch));
        clock.lap(Phase::Checkpoint);
        clock.finish(&mut self.profile);
        Ok(self)
    }

    /// Wall time of the whole run so far, earlier processes included.
    fn elapsed(&self) -> f64 {
        self.elapsed_before + self.clock.elapsed().as_secs_f64()
    }

    /// What a checkpoint taken now holds beside the model and optimizer.
    fn state(&self) -> CheckpointState {
        let (rng_seed, rng_stream, rng_word_pos) = CheckpointState::rng_fields(&self.rng);
        let rows_through = self.history.last().map_or(0, |m| m.step + 1).max(self.step);
        CheckpointState {
            step: self.step,
            rng_seed,
            rng_stream,
            rng_word_pos,
            steps_to_target: self.steps_to_target,
            target_without_row: self.target_without_row,
            elapsed_s: self.elapsed(),
            initial_attention: self.initial.clone(),
            config: self.config.clone(),
            backend: Some(self.options.backend.clone()),
            // A run that stopped at its target has already recorded the row of this step.
            rows_through,
            rows_checksum: Some(rows_checksum(
                self.config.model.n_layers,
                self.history.iter().filter(|m| m.step < rows_through),
            )),
            model_checksum: None,
            optim_checksum: None,
            model_bytes: None,
            optim_bytes: None,
            state_checksum: None,
        }
    }

    /// Saves a checkpoint of the run as it is now.
    fn checkpoint(&self) -> Result<(), ModelError> {
        save_checkpoint(
            &self.options.out_dir,
            &self.model,
            &self.optim,
            &self.state(),
        )
    }

    /// The summary of the run as it stands.
    fn summary(&self, eval: (f64, f64), diverged_at: Option<usize>) -> TrainSummary {
        let config = self.config;
        let step = self.step;
        TrainSummary {
            config: config.clone(),
            backend: self.options.backend.clone(),
            seed: config.seed,
            versions: Versions::default(),
            steps_run: step,
            steps_to_target: self.steps_to_target,
            target_accuracy: config.target_accuracy,
            final_eval_accuracy: eval.1,
            final_eval_loss: eval.0,
            final_train_loss: self.history.last().map_or(f64::NAN, |m| m.loss),
            initial_attention: self.initial.clone(),
            time_s: self.elapsed(),
            steps_per_s: match self.previous_rate {
                Some(rate) if step == self.start => rate,
                _ => (step - self.start) as f64 / self.clock.elapsed().as_secs_f64().max(1e-9),
            },
            resumed_from: self.options.resume.then_some(self.start),
            diverged_at,
        }
    }

    /// Writes `summary.json`.
    fn write_summary(&self, summary: &TrainSummary) -> Result<(), ModelError> {
        let path = self.options.out_dir.join("summary.json");
        write_atomic(&path, json(summary, &path)?)
    }

    /// Stops a run whose loss or gradient is not finite: the summary says so and the last good
    /// checkpoint stays as it is.
    fn diverge(self, loss: f64, grad_norm: f64) -> ModelError {
        let summary = self.summary((f64::NAN, f64::NAN), Some(self.step));
        let checkpoint = self.options.out_dir.join("checkpoint/state.json");
        let last = fs::read_to_string(&checkpoint)
            .ok()
            .and_then(|text| serde_json::from_str::<CheckpointState>(&text).ok());
        let checkpoint = match last {
            Some(state) => format!(
                "the last good checkpoint (step {}) is in {}",
                state.step,
                self.options.out_dir.join("checkpoint").display()
            ),
            None => "and no checkpoint had been written".to_string(),
        };
        if let Err(e) = self.write_summary(&summary) {
            self.progress
                .println(&format!("could not write the summary: {e}"));
        }
        self.progress
            .finish(&format!("diverged at step {}", self.step));
        ModelError::Diverged {
            step: self.step,
            loss,
            grad_norm,
            checkpoint,
        }
    }

    /// The final held-out evaluation, the last checkpoint and `summary.json`.
    pub fn finish(mut self) -> Result<TrainResult, ModelError> {
        let config = self.config;
        let step = self.step;
        if let Some((at, _, _)) = self.diverged {
            let summary = self.summary((f64::NAN, f64::NAN), Some(at));
            self.progress.finish(&format!("diverged at step {at}"));
            return Ok(TrainResult {
                summary,
                metrics: self.history,
                model: self.model.valid(),
                profile: self.profile,
            });
        }
        let eval = match self.history.last() {
            // Stopped at the target: the last record already evaluated this very model.
            Some(m) if m.step == step && m.eval_loss.is_some() && m.eval_accuracy.is_some() => (
                m.eval_loss.unwrap_or(f64::NAN),
                m.eval_accuracy.unwrap_or(f64::NAN),
            ),
            _ => evaluate(&self.model, &self.eval_set)?,
        };
        if eval.1 >= config.target_accuracy && self.steps_to_target.is_none() {
            self.steps_to_target = Some(step);
            // Unless the run stopped at its target on a recorded step, this evaluation has no row.
            self.target_without_row = self.history.last().is_none_or(|m| m.step != step);
        }
        let summary = self.summary(eval, None);
        if self.csv.is_some() {
            self.checkpoint()?;
            self.write_summary(&summary)?;
        }
        self.progress.finish(&format!(
            "{step} steps, held-out accuracy {:.4}, {:.1} steps/s",
            eval.1, summary.steps_per_s
        ));
        Ok(TrainResult {
            summary,
            metrics: self.history,
            model: self.model.valid(),
            profile: self.profile,
        })
    }
}

/// The held-out batches, drawn once from a seed derived from the run's.
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

/// The steps per second that the summary at `path` records, if it is there and says.
fn previous_rate(path: &std::path::Path) -> Option<f64> {
    let text = read_bounded(path, MAX_SUMMARY_BYTES, "a run's summary").ok()?;
    let summary: serde_json::Value = serde_json::from_str(&text).ok()?;
    summary.get("steps_per_s")?.as_f64()
}
