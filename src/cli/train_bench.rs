//! `sdpa train-bench`: the model's training speed in steps per second with a per-step profile,
//! the Rust side of `benches/pytorch_model.py` (its PyTorch twin) and of
//! `benches/train_side_by_side.py` (both, in alternating rounds).

use std::path::PathBuf;

use clap::Args;
use sdpa_model::{Phase, StepProfile, TaskConfig, TrainConfig, train_in_memory};
use serde::Serialize;

use super::UsageError;
use crate::{BackendKind, Implementation, Precision};

/// The benchmark's model sizes: the default model, and the same width at seq_len 512 and 2048.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchSize {
    /// The default model (match, k 8, vocab 64: seq_len 16).
    Small,
    /// seq_len 512 (match, k 256, vocab 512), the default width (d_model 64, 2 heads of 32).
    Large,
    /// seq_len 2048 (match, k 1024, vocab 2048), the default width: a GPU's size (its naive
    /// attention holds 2 GiB of scores per copy at batch 64).
    Xlarge,
}

impl BenchSize {
    /// (k, vocab) of the match task.
    fn task(self) -> (usize, usize) {
        match self {
            BenchSize::Small => (8, 64),
            BenchSize::Large => (256, 512),
            BenchSize::Xlarge => (1024, 2048),
        }
    }

    /// (timed steps per round, warm-up steps) when not given.
    fn default_steps(self) -> (usize, usize) {
        match self {
            BenchSize::Small => (400, 20),
            BenchSize::Large => (20, 3),
            BenchSize::Xlarge => (10, 2),
        }
    }

    fn name(self) -> &'static str {
        match self {
            BenchSize::Small => "small",
            BenchSize::Large => "large",
            BenchSize::Xlarge => "xlarge",
        }
    }
}

/// Arguments of `sdpa train-bench`.
#[derive(Args, Debug, Clone)]
pub struct TrainBenchArgs {
    /// Model size: small (seq_len 16), large (seq_len 512) or xlarge (seq_len 2048); may be
    /// given more than once.
    #[arg(long = "size", value_enum, default_values_t = [BenchSize::Small, BenchSize::Large])]
    pub sizes: Vec<BenchSize>,
    /// Backend: ndarray, flex, wgpu, vulkan or cuda.
    #[arg(long, default_value = "flex")]
    pub backend: BackendKind,
    /// Attention path (default: auto).
    #[arg(long)]
    pub implementation: Option<Implementation>,
    /// The attention's compute dtype: f32 or bf16 (mixed precision, as `sdpa train --dtype`).
    #[arg(long, value_parser = super::train::parse_dtype, default_value = "f32")]
    pub dtype: Precision,
    /// Timed steps per round (default: 400 small, 20 large, 10 xlarge).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Rounds; steps/s is the median over them.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Untimed steps first, at least 1 (step 0 records and evaluates; default: 20 small, 3
    /// large, 2 xlarge).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Record metrics every 10 steps and evaluate every 50, as `sdpa train` does by default
    /// (otherwise nothing is recorded during the timed steps, like the PyTorch twin).
    #[arg(long)]
    pub logging: bool,
    /// Seed of the parameters and the data.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Folder for `train_<backend>_<size>.json`: a new or empty folder, or one the benches
    /// wrote (holding their manifest `.sdpa-bench`, which lists the files they may replace).
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Write into --out even when it holds files the benches did not write, replacing those of
    /// this bench's file names.
    #[arg(long)]
    pub overwrite: bool,
}

/// The file a size's result goes to: `train_<backend>_<size>.json` (`_bf16.json` in bf16; the
/// f32 files keep their names, which the side-by-side runner reads).
fn file_name(args: &TrainBenchArgs, size: BenchSize) -> String {
    let suffix = match args.dtype {
        Precision::Inputs => "",
        Precision::Bf16 => "_bf16",
    };
    format!("train_{}_{}{suffix}.json", args.backend.name(), size.name())
}

/// The `--dtype` name of a precision.
fn dtype_name(precision: Precision) -> &'static str {
    match precision {
        Precision::Inputs => "f32",
        Precision::Bf16 => "bf16",
    }
}

/// One size's result, as written to `train_<backend>_<size>.json`.
#[derive(Debug, Clone, Serialize)]
pub struct TrainBenchResult {
    /// `sdpa <version> (burn 0.22.1)`.
    pub framework: String,
    /// The backend.
    pub backend: String,
    /// The attention path asked for.
    pub implementation: String,
    /// The attention's compute dtype (`f32` or `bf16`).
    pub dtype: &'static str,
    /// The CPU's SIMD features the kernels may use (detected at run time).
    pub cpu_features: Vec<&'static str>,
    /// Threads of the CPU kernels' pool (`RAYON_NUM_THREADS` sets it).
    pub threads: usize,
    /// The size.
    pub size: BenchSize,
    /// Task size k.
    pub k: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Sequence length.
    pub seq_len: usize,
    /// Batch size.
    pub batch_size: usize,
    /// Whether metrics were recorded during the timed steps.
    pub logging: bool,
    /// Timed steps per round.
    pub steps_per_round: usize,
    /// Rounds.
    pub rounds: usize,
    /// Steps per second of each round.
    pub steps_per_s: Vec<f64>,
    /// Their median.
    pub median_steps_per_s: f64,
    /// Milliseconds per timed step in each phase.
    pub profile_ms_per_step: std::collections::BTreeMap<&'static str, f64>,
    /// Training loss of the last recorded step.
    pub final_loss: f64,
}

/// A size's timed steps per round, warm-up steps and total steps (warm-up + rounds · steps + 1):
/// a usage error when one is 0 or the total overflows.
fn step_counts(
    args: &TrainBenchArgs,
    size: BenchSize,
) -> Result<(usize, usize, usize), UsageError> {
    let (default_steps, default_warmup) = size.default_steps();
    let steps = args.steps.unwrap_or(default_steps);
    let warmup = args.warmup.unwrap_or(default_warmup);
    if steps == 0 || args.rounds == 0 || warmup == 0 {
        // Step 0 always records and evaluates: it is never timed.
        return Err(UsageError(format!(
            "--steps, --rounds and --warmup must be > 0, got {steps}, {} and {warmup}",
            args.rounds
        )));
    }
    // Checked: values near usize::MAX would wrap (or panic) otherwise.
    args.rounds
        .checked_mul(steps)
        .and_then(|timed| timed.checked_add(warmup))
        .and_then(|t| t.checked_add(1))
        .map(|total| (steps, warmup, total))
        .ok_or_else(|| {
            UsageError(format!(
                "--warmup {warmup} + --rounds {} × --steps {steps} + 1 overflows the step count: \
                 give smaller values",
                args.rounds
            ))
        })
}

/// The run configuration of one size (warm-up + rounds · steps + 1 steps), and its step counts.
fn size_config(
    args: &TrainBenchArgs,
    size: BenchSize,
) -> anyhow::Result<(TrainConfig, (usize, usize, usize))> {
    let (k, vocab) = size.task();
    let counts = step_counts(args, size)?;
    let total = counts.2;
    let mut config = TrainConfig::for_task(TaskConfig::new().with_k(k).with_vocab(vocab))
        .with_steps(total)
        .with_seed(args.seed)
        .with_stop_at_target(false);
    if !args.logging {
        config = config.with_log_every(total).with_eval_every(total);
    }
    if let Some(implementation) = args.implementation {
        config.model.attention.implementation = implementation;
    }
    config.model.attention.precision = args.dtype;
    config.validate().map_err(|e| UsageError(e.to_string()))?;
    Ok((config, counts))
}

/// Runs one size: a single in-memory run of warm-up + rounds · steps + 1 steps, whose timed
/// steps are split into rounds (the last step, which always records, is not timed).
pub fn bench_size(args: &TrainBenchArgs, size: BenchSize) -> anyhow::Result<TrainBenchResult> {
    let (k, vocab) = size.task();
    let (config, (steps, warmup, total)) = size_config(args, size)?;
    let device = super::open_device(args.backend)?;
    // A path or dtype the device cannot serve is bad usage (exit 2), found before any step.
    let result = train_in_memory(&config, &device, args.backend.name())
        .map_err(super::train::usage_or_failure)?;
    let profile: &StepProfile = &result.profile;
    anyhow::ensure!(
        profile.steps.len() >= warmup + args.rounds * steps,
        "the run stopped after {} of {total} steps",
        profile.steps.len()
    );
    let rates: Vec<f64> = (0..args.rounds)
        .map(|r| {
            let start = warmup + r * steps;
            let seconds: f64 = (start..start + steps)
                .map(|i| profile.step_seconds(i))
                .sum();
            steps as f64 / seconds
        })
        .collect();
    let timed = warmup..warmup + args.rounds * steps;
    let n_timed = timed.len() as f64;
    let profile_ms = Phase::ALL
        .iter()
        .map(|&p| (p.name(), 1e3 * profile.seconds(p, timed.clone()) / n_timed))
        .collect();
    Ok(TrainBenchResult {
        framework: format!("sdpa {} (burn 0.22.1)", env!("CARGO_PKG_VERSION")),
        backend: args.backend.name().into(),
        implementation: config.model.attention.implementation.to_string(),
        dtype: dtype_name(args.dtype),
        cpu_features: crate::cpu_kernel::cpu_features(),
        threads: crate::cpu_kernel::threads(),
        size,
        k,
        vocab,
        seq_len: 2 * k,
        batch_size: config.batch_size,
        logging: args.logging,
        steps_per_round: steps,
        rounds: args.rounds,
        median_steps_per_s: sdpa_lab::stats::median(&rates),
        steps_per_s: rates,
        profile_ms_per_step: profile_ms,
        final_loss: result.summary.final_train_loss,
    })
}

/// `sdpa train-bench`: every size asked for; prints a line each and writes the JSON files.
pub fn run(args: &TrainBenchArgs) -> anyhow::Result<bool> {
    // Before anything runs: the folder must be the benches' own (or empty), and every file this
    // run writes one they may replace.
    for &size in &args.sizes {
        step_counts(args, size)?;
    }
    // A backend that is not compiled in or finds no device (a GPU backend without its GPU), and
    // a dtype or path the device cannot serve, are refused before the folder is claimed: a
    // refused run leaves nothing behind.
    let device = super::open_device(args.backend)?;
    for &size in &args.sizes {
        let (config, _) = size_config(args, size)?;
        sdpa_model::check_start(&config, &device, args.backend.name())
            .map_err(super::train::usage_or_failure)?;
    }
    let names: Vec<String> = args.sizes.iter().map(|&s| file_name(args, s)).collect();
    let mut folder = sdpa_lab::bench::BenchFolder::claim(&args.out, &names, args.overwrite)
        .map_err(super::report::lab_error)?;
    for &size in &args.sizes {
        let r = bench_size(args, size)?;
        // Listed in the manifest, then written atomically without following a link.
        let text = serde_json::to_string_pretty(&r)? + "\n";
        let path = folder
            .write(&file_name(args, size), text.as_bytes())
            .map_err(super::report::lab_error)?;
        let profile = r
            .profile_ms_per_step
            .iter()
            .map(|(p, ms)| format!("{p} {ms:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        let rounds = r
            .steps_per_s
            .iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(", ");
        println!(
            "sdpa {} ({}) on {}: {:.1} steps/s (rounds {rounds}); ms/step: {profile} -> {}",
            size.name(),
            r.dtype,
            r.backend,
            r.median_steps_per_s,
            path.display()
        );
    }
    Ok(true)
}
