//! `sdpa report` and `sdpa exp`: run the lab's experiments.

use std::path::PathBuf;

use clap::Args;
use sdpa_lab::{Experiment, LabBackend, LabContext, all_experiments, find_experiment, run_report};
use sdpa_model::ProgressMode;

use super::UsageError;
use crate::BackendKind;

/// Options shared by `report` and `exp`.
#[derive(Args, Debug, Clone)]
pub struct LabArgs {
    /// Backend(s): ndarray, flex, wgpu or all (compiled-in ones); may be given more than once.
    /// The first is the primary backend; `gradients`, `compare` and `masks` run on all of them.
    #[arg(long = "backend", default_value = "flex")]
    pub backends: Vec<String>,
    /// Output folder.
    #[arg(long, default_value = "report")]
    pub out: PathBuf,
    /// Smaller sizes for a first look (under 2 minutes).
    #[arg(long)]
    pub quick: bool,
    /// Seed of every random draw.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Plain progress lines instead of a bar.
    #[arg(long)]
    pub plain: bool,
}

/// Arguments of `sdpa exp`.
#[derive(Args, Debug, Clone)]
pub struct ExpArgs {
    /// The experiment to run (see --list).
    #[arg(required_unless_present = "list")]
    pub name: Option<String>,
    /// List the experiments.
    #[arg(long)]
    pub list: bool,
    /// Shared options.
    #[command(flatten)]
    pub lab: LabArgs,
}

impl LabArgs {
    /// Opens the backends and builds the context.
    pub fn context(&self) -> anyhow::Result<LabContext> {
        let mut kinds: Vec<BackendKind> = Vec::new();
        for name in &self.backends {
            if name == "all" {
                // Flex first: it stays the primary backend.
                let mut compiled = BackendKind::compiled();
                compiled.sort_by_key(|k| *k != BackendKind::Flex);
                kinds.extend(compiled);
            } else {
                kinds.push(
                    name.parse()
                        .map_err(|e: crate::BackendError| UsageError(e.to_string()))?,
                );
            }
        }
        let mut backends = Vec::new();
        let mut skipped_backends = Vec::new();
        for k in kinds {
            if backends.iter().any(|b: &LabBackend| b.name == k.name()) {
                continue;
            }
            match k.device() {
                Ok(device) => backends.push(LabBackend {
                    name: k.name().into(),
                    device,
                }),
                // Compiled in but no adapter here: skipped with a note, not the end of the report.
                Err(e @ crate::BackendError::NoDevice { .. }) => {
                    eprintln!("note: skipping {}: {e}", k.name());
                    skipped_backends.push(format!("{}: {e}", k.name()));
                }
                Err(e) => return Err(UsageError(e.to_string()).into()),
            }
        }
        if backends.is_empty() {
            return Err(UsageError(format!(
                "no usable backend ({})",
                skipped_backends.join("; ")
            ))
            .into());
        }
        Ok(LabContext {
            backends,
            skipped_backends,
            seed: self.seed,
            quick: self.quick,
            out_dir: self.out.clone(),
            progress: if self.plain {
                ProgressMode::Lines
            } else {
                ProgressMode::Auto
            },
        })
    }
}

fn run(lab: &LabArgs, experiments: Vec<Box<dyn Experiment>>) -> anyhow::Result<bool> {
    let ctx = lab.context()?;
    let report = run_report(&ctx, &experiments)?;
    println!(
        "report: {}  numbers: {}",
        ctx.out_dir.join("REPORT.md").display(),
        ctx.out_dir.join("results.json").display()
    );
    for f in &report.failures {
        eprintln!("experiment {} failed: {}", f.name, f.error);
    }
    Ok(report.failures.is_empty())
}

/// `sdpa report`: every experiment.
pub fn report(lab: &LabArgs) -> anyhow::Result<bool> {
    run(lab, all_experiments())
}

/// `sdpa exp NAME` or `sdpa exp --list`.
pub fn exp(args: &ExpArgs) -> anyhow::Result<bool> {
    if args.list {
        for e in all_experiments() {
            println!("{:<22} {}", e.name(), e.title());
        }
        return Ok(true);
    }
    let name = args.name.clone().unwrap_or_default();
    let e = find_experiment(&name).ok_or_else(|| {
        UsageError(format!(
            "unknown experiment `{name}`; one of: {}",
            all_experiments()
                .iter()
                .map(|e| e.name())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    run(&args.lab, vec![e])
}

/// Arguments of `sdpa bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Backend(s): ndarray, flex, wgpu or all; may be given more than once.
    #[arg(long = "backend", default_value = "flex")]
    pub backends: Vec<String>,
    /// Output folder.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Tiny sizes (a smoke run, seconds).
    #[arg(long)]
    pub quick: bool,
    /// Plain progress lines instead of a bar.
    #[arg(long)]
    pub plain: bool,
    /// Time only these n = m (may be given more than once; default: the whole sweep), e.g. to
    /// re-measure the cells a rule change touched.
    #[arg(long = "n")]
    pub ns: Vec<usize>,
    /// Skip the memory sweeps (inference and training), unless sizes are given below.
    #[arg(long)]
    pub skip_memory: bool,
    /// Sizes of the inference memory sweep (b = 1; may be given more than once).
    #[arg(long = "memory-n")]
    pub memory_ns: Vec<usize>,
    /// Sizes of the training (forward + backward) memory sweep (b = 1; may be given more than
    /// once).
    #[arg(long = "training-memory-n")]
    pub training_memory_ns: Vec<usize>,
    /// Time only these modes: forward, forward+backward, "forward, padded",
    /// "forward+backward, padded" (may be given more than once; default: all four).
    #[arg(long = "mode")]
    pub modes: Vec<String>,
}

/// `sdpa bench`: times every path on every backend asked for.
pub fn bench(args: &BenchArgs) -> anyhow::Result<bool> {
    let lab = LabArgs {
        backends: args.backends.clone(),
        out: args.out.clone(),
        quick: args.quick,
        seed: 42,
        plain: args.plain,
    };
    let ctx = lab.context()?;
    let mut config = sdpa_lab::bench::BenchConfig::new(args.quick);
    for (flag, sizes) in [
        ("--n", &args.ns),
        ("--memory-n", &args.memory_ns),
        ("--training-memory-n", &args.training_memory_ns),
    ] {
        if let Some(bad) = sizes.iter().find(|&&n| n == 0) {
            return Err(UsageError(format!("{flag} must be > 0, got {bad}")).into());
        }
    }
    if !args.ns.is_empty() {
        config.ns = args.ns.clone();
    }
    if args.skip_memory {
        config.memory_ns.clear();
        config.training_memory_ns.clear();
    }
    if !args.memory_ns.is_empty() {
        config.memory_ns = args.memory_ns.clone();
    }
    if !args.training_memory_ns.is_empty() {
        config.training_memory_ns = args.training_memory_ns.clone();
    }
    for mode in &args.modes {
        let known = sdpa_lab::bench::Mode::ALL.map(|m| m.name());
        if !known.contains(&mode.as_str()) {
            return Err(
                UsageError(format!("--mode must be one of {known:?}, got `{mode}`")).into(),
            );
        }
    }
    if !args.modes.is_empty() {
        config.modes = args.modes.clone();
    }
    let mut ok = true;
    for backend in &ctx.backends {
        let report = sdpa_lab::bench::run_bench(backend, &config, &ctx)?;
        println!("{}", sdpa_lab::bench::markdown(&report));
        for f in sdpa_lab::bench::write(&report, &ctx)? {
            println!("wrote {f}");
        }
        // The target (Auto at most 10% slower than the fastest other path) is checked on the
        // paired estimate; a ratio of medians above it is reported too.
        for ((mode, n, medians), (_, _, paired)) in
            report.auto_ratio.iter().zip(&report.auto_ratio_paired)
        {
            if *paired > 1.10 || *medians > 1.10 {
                println!(
                    "note: {}: auto / fastest other path = {medians:.2} (medians), {paired:.2} \
                     (paired runs) ({mode}, n = {n})",
                    report.backend
                );
            }
            if *paired > 1.10 {
                ok = false;
            }
        }
    }
    Ok(ok)
}
