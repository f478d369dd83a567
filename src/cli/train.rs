//! `sdpa train`: train the self-attention model on a synthetic task.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use clap::Args;
use sdpa_model::{
    ModelError, OptimizerKind, ProgressMode, QkInit, RunOptions, TaskConfig, TaskKind, TrainConfig,
    TrainResult,
};

use super::UsageError;
use crate::{BackendKind, Implementation, Precision, QkNorm, ScalePolicy};

/// `--scale inv-sqrt-dk | none | <float>`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleArg(pub ScalePolicy);

impl FromStr for ScaleArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "inv-sqrt-dk" => Ok(ScaleArg(ScalePolicy::InvSqrtDk)),
            "none" => Ok(ScaleArg(ScalePolicy::Unscaled)),
            other => match other.parse::<f64>() {
                Ok(x) if (x as f32).is_finite() && (x as f32) > 0.0 => {
                    Ok(ScaleArg(ScalePolicy::Fixed(x)))
                }
                Ok(x) => Err(format!(
                    "a fixed scale must be a finite number > 0 that f32 can hold, got {x}"
                )),
                Err(_) => Err(format!(
                    "expected inv-sqrt-dk, none or a number, got `{other}`"
                )),
            },
        }
    }
}

/// Arguments of `sdpa train`. Options left out take the defaults of [`TrainConfig`], or, with
/// `--resume`, the values saved in the run.
#[derive(Args, Debug, Clone, Default)]
pub struct TrainArgs {
    /// Task: match or recall.
    #[arg(long, value_parser = parse_task)]
    pub task: Option<TaskKind>,
    /// Backend: ndarray, flex, wgpu, vulkan or cuda (default: flex; with --resume, the run's
    /// own, which is the only one a resume accepts).
    #[arg(long)]
    pub backend: Option<BackendKind>,
    /// Scale of the scores: inv-sqrt-dk, none, or a positive number.
    #[arg(long)]
    pub scale: Option<ScaleArg>,
    /// Query/key size per head (independent of --d-model).
    #[arg(long)]
    pub d_k: Option<usize>,
    /// Value size per head (default: d_k).
    #[arg(long)]
    pub d_v: Option<usize>,
    /// Model width.
    #[arg(long)]
    pub d_model: Option<usize>,
    /// Attention heads.
    #[arg(long)]
    pub heads: Option<usize>,
    /// Attention blocks.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Query/key initialization: default or unit.
    #[arg(long, value_parser = parse_init)]
    pub init: Option<QkInit>,
    /// Logit soft-cap c of the attention (scores become c·tanh(s/c)); a positive number.
    #[arg(long, value_parser = parse_softcap)]
    pub softcap: Option<f64>,
    /// QK-norm of the attention heads: none, layer or rms.
    #[arg(long, value_parser = parse_qk_norm)]
    pub qk_norm: Option<QkNorm>,
    /// Attention path (to compare their training speed on the whole model).
    #[arg(long, help = super::implementation_help("Attention path, to compare their training speed on the whole model"))]
    pub implementation: Option<Implementation>,
    /// The attention's compute dtype: f32, or bf16 (mixed precision: f32 parameters,
    /// activations and optimizer; query, key and value cast to bf16 for the attention, whose
    /// fused kernels keep the softmax and every sum in f32).
    #[arg(long, value_parser = parse_dtype)]
    pub dtype: Option<Precision>,
    /// Optimizer: adam or sgd.
    #[arg(long, value_parser = parse_optimizer)]
    pub optimizer: Option<OptimizerKind>,
    /// Learning rate.
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// SGD momentum.
    #[arg(long)]
    pub momentum: Option<f64>,
    /// Clip the global gradient norm.
    #[arg(long)]
    pub grad_clip: Option<f64>,
    /// Optimizer steps (the budget).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Batch size.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Task size k.
    #[arg(long)]
    pub k: Option<usize>,
    /// Vocabulary size.
    #[arg(long)]
    pub vocab: Option<usize>,
    /// Seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Record metrics every N steps.
    #[arg(long)]
    pub log_every: Option<usize>,
    /// Evaluate every N steps.
    #[arg(long)]
    pub eval_every: Option<usize>,
    /// Checkpoint every N steps (always at the end).
    #[arg(long)]
    pub checkpoint_every: Option<usize>,
    /// Keep training after reaching the target accuracy.
    #[arg(long)]
    pub no_early_stop: bool,
    /// Run directory (default `runs/TASK-SEED`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue the run saved in DIR.
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    pub resume: Option<PathBuf>,
    /// Start afresh in an --out folder that holds an earlier run, replacing that run's files
    /// (any other file there still refuses the run).
    #[arg(long, conflicts_with = "resume")]
    pub overwrite: bool,
    /// Plain progress lines instead of a bar.
    #[arg(long)]
    pub plain: bool,
}

fn parse_task(s: &str) -> Result<TaskKind, String> {
    s.parse().map_err(|e: sdpa_model::ModelError| e.to_string())
}

fn parse_init(s: &str) -> Result<QkInit, String> {
    match s {
        "default" => Ok(QkInit::Default),
        "unit" => Ok(QkInit::Unit),
        other => Err(format!("expected default or unit, got `{other}`")),
    }
}

fn parse_softcap(s: &str) -> Result<f64, String> {
    let c: f64 = s
        .parse()
        .map_err(|_| format!("expected a positive number, got `{s}`"))?;
    crate::util::validate_softcap(c).map_err(|e| e.to_string())?;
    Ok(c)
}

/// `--dtype`: f32 (the inputs' own dtype: the model is f32) or bf16.
pub(crate) fn parse_dtype(s: &str) -> Result<Precision, String> {
    match s {
        "f32" => Ok(Precision::Inputs),
        "bf16" => Ok(Precision::Bf16),
        other => Err(format!("expected f32 or bf16, got `{other}`")),
    }
}

fn parse_qk_norm(s: &str) -> Result<QkNorm, String> {
    match s {
        "none" => Ok(QkNorm::None),
        "layer" => Ok(QkNorm::LayerNorm),
        "rms" => Ok(QkNorm::RmsNorm),
        other => Err(format!("expected none, layer or rms, got `{other}`")),
    }
}

fn parse_optimizer(s: &str) -> Result<OptimizerKind, String> {
    match s {
        "adam" => Ok(OptimizerKind::Adam),
        "sgd" => Ok(OptimizerKind::Sgd),
        other => Err(format!("expected adam or sgd, got `{other}`")),
    }
}

impl TrainArgs {
    /// The configuration these arguments ask for, on top of `base` (the defaults, or the
    /// saved configuration of a resumed run). Checked before anything is written.
    pub fn config(&self, base: Option<TrainConfig>) -> Result<TrainConfig, UsageError> {
        let mut c = match base {
            Some(c) => c,
            None => {
                let mut task = TaskConfig::new().with_kind(self.task.unwrap_or_default());
                if let Some(k) = self.k {
                    task.k = k;
                }
                if let Some(v) = self.vocab {
                    task.vocab = v;
                }
                let mut c = TrainConfig::for_task(task);
                if c.task.kind == TaskKind::Recall {
                    c.model.n_layers = 2;
                }
                c
            }
        };
        let resumed = self.resume.is_some();
        if let Some(t) = self.task {
            c.task.kind = t;
        }
        if resumed {
            if let Some(k) = self.k {
                c.task.k = k;
            }
            if let Some(v) = self.vocab {
                c.task.vocab = v;
            }
        }
        // Task-derived model sizes follow the task.
        c.model.vocab_size = c.task.vocab;
        c.model.seq_len = c.task.seq_len();
        c.model.n_classes = c.task.n_classes();
        if let Some(ScaleArg(s)) = self.scale {
            c.model.attention.scale = s;
        }
        if self.d_v.is_some() {
            c.model.d_v = self.d_v;
        }
        if self.d_k.is_some() {
            c.model.d_k = self.d_k;
        }
        macro_rules! set {
            ($field:expr, $opt:expr) => {
                if let Some(v) = $opt {
                    $field = v;
                }
            };
        }
        set!(c.model.d_model, self.d_model);
        set!(c.model.n_heads, self.heads);
        set!(c.model.n_layers, self.layers);
        set!(c.model.qk_init, self.init);
        set!(c.model.qk_norm, self.qk_norm);
        if self.softcap.is_some() {
            c.model.attention.softcap = self.softcap;
        }
        set!(c.model.attention.implementation, self.implementation);
        set!(c.model.attention.precision, self.dtype);
        set!(c.optimizer, self.optimizer);
        set!(c.lr, self.lr);
        set!(c.steps, self.steps);
        set!(c.batch_size, self.batch_size);
        set!(c.seed, self.seed);
        set!(c.log_every, self.log_every);
        set!(c.eval_every, self.eval_every);
        if self.momentum.is_some() {
            c.momentum = self.momentum;
        }
        if self.grad_clip.is_some() {
            c.grad_clip = self.grad_clip;
        }
        if self.checkpoint_every.is_some() {
            c.checkpoint_every = self.checkpoint_every;
        }
        if self.no_early_stop {
            c.stop_at_target = false;
        }
        if let Some(m) = self.momentum
            && c.optimizer != OptimizerKind::Sgd
        {
            return Err(UsageError(format!(
                "--momentum {m} is SGD's, and this run's optimizer is {}: pass --optimizer sgd \
                 with it, or leave it out",
                match c.optimizer {
                    OptimizerKind::Adam => "adam",
                    OptimizerKind::Sgd => "sgd",
                }
            )));
        }
        c.validate().map_err(|e| UsageError(e.to_string()))?;
        Ok(c)
    }

    /// The run directory.
    pub fn out_dir(&self, config: &TrainConfig) -> PathBuf {
        match (&self.resume, &self.out) {
            (Some(dir), _) | (None, Some(dir)) => dir.clone(),
            (None, None) => PathBuf::from(format!("runs/{}-{}", config.task.kind, config.seed)),
        }
    }
}

/// A wrong --out or --resume folder (one that cannot be written too), a resume that asks for
/// another run than the saved one (or
/// whose checkpoint, config and rows are not one run's), a run that cannot start on its device, or sizes that cannot fit, are bad usage (exit 2); every
/// other error is a failed run (exit 1). The message's control characters are escaped (a folder
/// named with a newline stays on one line).
pub(crate) fn usage_or_failure(e: ModelError) -> anyhow::Error {
    let message = sdpa_model::printable(&e.to_string());
    if e.is_unwritable() {
        return anyhow::Error::new(UsageError(message));
    }
    match e {
        ModelError::RunExists { .. }
        | ModelError::ForeignFile(_)
        | ModelError::NotAFile(_)
        | ModelError::Locked { .. }
        | ModelError::Mismatch { .. }
        | ModelError::ForeignRun { .. }
        | ModelError::Link(_)
        | ModelError::CannotStart { .. }
        | ModelError::TooLarge { .. } => anyhow::Error::new(UsageError(message)),
        _ => anyhow::anyhow!(message),
    }
}

/// A path as messages print it: its control characters escaped.
fn shown(path: &Path) -> String {
    sdpa_model::printable(&path.display().to_string())
}

/// The saved configuration of the run in `dir` and the backend its resume runs on: the one it
/// records; `--backend` may only repeat it. A run written before `config.json` recorded the
/// backend resumes on `--backend`, else on the backend its checkpoint or `summary.json` names,
/// else on flex (the default then), and says so.
fn resumed_run(
    args: &TrainArgs,
    dir: &Path,
) -> anyhow::Result<(TrainConfig, BackendKind, Option<String>)> {
    if !dir.is_dir() {
        return Err(UsageError(format!(
            "cannot resume: {} is not a folder holding a run",
            shown(dir)
        ))
        .into());
    }
    // Links, odd entries, a user's file in a checkpoint folder and a live holder are refused
    // before anything is read.
    sdpa_model::check_run_dir(dir).map_err(usage_or_failure)?;
    if std::fs::symlink_metadata(dir.join("config.json")).is_err() {
        return Err(UsageError(format!(
            "cannot resume: {} holds no run to resume (no config.json): start it afresh with --out",
            shown(dir)
        ))
        .into());
    }
    let saved = sdpa_model::train::read_saved_run(dir)
        .map_err(|e| usage_or_failure(e).context("cannot resume"))?;
    let Some(name) = saved.backend else {
        let (backend, whence) = match args.backend {
            Some(b) => (b, "--backend"),
            None => match recorded_backend(dir) {
                Some((b, file)) => (b, file),
                None => (
                    BackendKind::Flex,
                    "the default of the version that wrote it",
                ),
            },
        };
        let note = format!(
            "{}/config.json records no backend (written by an earlier version): resuming on \
             {backend} ({whence}), recorded from now on",
            shown(dir)
        );
        return Ok((saved.config, backend, Some(note)));
    };
    let recorded: BackendKind = name.parse().map_err(|_| {
        anyhow::anyhow!(
            "cannot resume: {}/config.json records the backend `{}`, which this version does not know",
            shown(dir),
            sdpa_model::printable(&name)
        )
    })?;
    match args.backend {
        Some(asked) if asked != recorded => Err(UsageError(format!(
            "cannot resume {} on {asked}: the run trains on {recorded} (its config.json says \
             so), and another backend would change its rows; leave --backend out to continue \
             on {recorded}, or start a new run with --out",
            shown(dir)
        ))
        .into()),
        _ => Ok((saved.config, recorded, None)),
    }
}

/// The backend that the checkpoint's `state.json` or the `summary.json` of a run written before
/// `config.json` recorded it names, if one does, and the file that names it.
fn recorded_backend(dir: &Path) -> Option<(BackendKind, &'static str)> {
    let named = |file: &str| -> Option<BackendKind> {
        let path = dir.join(file);
        let meta = std::fs::symlink_metadata(&path).ok()?;
        if !meta.is_file() || meta.len() > sdpa_model::train::MAX_CONFIG_BYTES * 4 {
            return None;
        }
        let text = std::fs::read_to_string(&path).ok()?;
        let value: serde_json::Value = serde_json::from_str(&text).ok()?;
        value.get("backend")?.as_str()?.parse().ok()
    };
    named("checkpoint/state.json")
        .map(|b| (b, "its checkpoint's state.json"))
        .or_else(|| named("summary.json").map(|b| (b, "its summary.json")))
}

/// Refuses an `--out` that cannot hold a run folder: a file, a path below a file, or a link to
/// nothing.
fn check_out(out: &Path) -> Result<(), UsageError> {
    if out.exists() && !out.is_dir() {
        return Err(UsageError(format!(
            "--out {} is a file, not a folder: choose a folder for the run",
            shown(out)
        )));
    }
    if std::fs::metadata(out).is_err_and(|e| e.kind() == std::io::ErrorKind::NotADirectory) {
        // The file is one of the folders above it: name that one.
        let file = out
            .ancestors()
            .skip(1)
            .find(|a| a.exists() && !a.is_dir())
            .unwrap_or(out);
        return Err(UsageError(format!(
            "--out {}: {} is a file, not a folder, so no run folder can be made below it: \
             choose another --out",
            shown(out),
            shown(file)
        )));
    }
    if let Ok(target) = std::fs::read_link(out)
        && !out.exists()
    {
        return Err(UsageError(format!(
            "--out {} is a symbolic link to {}, which does not exist: create that folder, or \
             choose another --out",
            shown(out),
            shown(&target)
        )));
    }
    Ok(())
}

/// Trains, printing where the results are.
pub fn run(args: &TrainArgs) -> anyhow::Result<TrainResult> {
    let (base, backend, note) = match &args.resume {
        Some(dir) => {
            let (config, backend, note) = resumed_run(args, dir)?;
            (Some(config), backend, note)
        }
        None => (None, args.backend.unwrap_or_default(), None),
    };
    if let Some(out) = &args.out {
        check_out(out)?;
    }
    let config = args.config(base)?;
    // The memory check before the device is opened or anything is written.
    config
        .check_memory()
        .map_err(|e| UsageError(e.to_string()))?;
    let device = super::open_device(backend)?;
    let out_dir = args.out_dir(&config);
    let options = RunOptions {
        out_dir: out_dir.clone(),
        resume: args.resume.is_some(),
        backend: backend.to_string(),
        progress: if args.plain {
            ProgressMode::Lines
        } else {
            ProgressMode::Auto
        },
        overwrite: args.overwrite,
    };
    if let Some(note) = note {
        println!("{note}");
    }
    let result = sdpa_model::train(&config, &device, &options).map_err(usage_or_failure)?;
    let s = &result.summary;
    println!(
        "held-out accuracy {:.4} after {} steps ({}), {:.1} steps/s on {}",
        s.final_eval_accuracy,
        s.steps_run,
        match s.steps_to_target {
            Some(t) => format!(
                "{:.0}% first reached at step {t}",
                s.target_accuracy * 100.0
            ),
            None => format!("{:.0}% not reached", s.target_accuracy * 100.0),
        },
        s.steps_per_s,
        s.backend
    );
    println!(
        "metrics: {}  summary: {}",
        shown(&out_dir.join("metrics.csv")),
        shown(&out_dir.join("summary.json"))
    );
    Ok(result)
}
