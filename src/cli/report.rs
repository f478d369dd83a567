//! `sdpa report` and `sdpa exp`: run the lab's experiments.

use std::path::PathBuf;

use clap::Args;
use sdpa_lab::runner::{self, RunOptions, RunOutcome, Shard};
use sdpa_lab::{
    Env, Experiment, LabBackend, LabError, Plan, Report, all_experiments, find_experiment,
};
use sdpa_model::ProgressMode;

use super::UsageError;
use crate::BackendKind;

/// Options shared by `report` and `exp`.
#[derive(Args, Debug, Clone)]
pub struct LabArgs {
    /// Backend(s): ndarray, flex, wgpu, vulkan, cuda or all (compiled-in ones); may be given
    /// more than once. The first is the primary backend; `gradients`, `compare` and `masks` run on all of them.
    #[arg(long = "backend", default_value = "flex")]
    pub backends: Vec<String>,
    /// Output folder (an empty folder, or one the lab wrote: a run there continues from its
    /// saved cells).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Smaller sizes for a first look (under 2 minutes).
    #[arg(long)]
    pub quick: bool,
    /// Also run the learning-rate sweeps (training: 1 400 runs, training-variants: 160; about
    /// 40 minutes more on 2 cores): the training runs then use the rates the sweeps choose, and
    /// the report adds the learning-rate curves and sensitivity claims. Without it they use the
    /// rates the sweeps chose before, committed in the code.
    #[arg(long)]
    pub tune: bool,
    /// Also run the second confirmatory run (training-confirm-2: 240 tuning and up to 240 test
    /// runs, about 70 minutes on 2 cores). Without it the report analyses the runs of that
    /// experiment committed in the repository (crates/sdpa-lab/assets/confirm2/runs.csv).
    #[arg(long)]
    pub long: bool,
    /// Seed of every random draw.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Plain progress lines instead of a bar.
    #[arg(long)]
    pub plain: bool,
    /// Run only shard I of N (I from 0): the cells whose index is I mod N; render nothing (merge
    /// the shards' folders with --merge).
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// Render REPORT.md, results.json and the plots again from DIR's saved cells (measures
    /// nothing; renders in DIR, whose run.json says what was run: --out, --quick, --tune, --seed
    /// and --backend do not apply).
    #[arg(
        long,
        value_name = "DIR",
        conflicts_with_all = ["shard", "merge", "out", "quick", "tune", "long", "seed", "backends"]
    )]
    pub render_only: Option<PathBuf>,
    /// Merge the folders of every shard of a run into --out and render the report (measures
    /// nothing: the shards' run.json says what was run, so --quick, --tune, --seed and --backend
    /// do not apply).
    #[arg(
        long,
        value_name = "DIR",
        num_args = 1..,
        conflicts_with_all = ["shard", "quick", "tune", "long", "seed", "backends"]
    )]
    pub merge: Vec<PathBuf>,
}

/// Arguments of `sdpa exp`.
#[derive(Args, Debug, Clone)]
pub struct ExpArgs {
    /// The experiments to run (see --list).
    #[arg(required_unless_present_any = ["list", "render_only"])]
    pub names: Vec<String>,
    /// List the experiments.
    #[arg(long)]
    pub list: bool,
    /// Shared options.
    #[command(flatten)]
    pub lab: LabArgs,
}

impl LabArgs {
    /// Opens the backends: the environment and the plan's backend names, plus those skipped.
    pub(super) fn env(&self) -> anyhow::Result<(Env, Vec<String>)> {
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
        let mut skipped = Vec::new();
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
                    skipped.push(format!("{}: {e}", k.name()));
                }
                Err(e) => return Err(UsageError(e.to_string()).into()),
            }
        }
        if backends.is_empty() {
            return Err(UsageError(format!("no usable backend ({})", skipped.join("; "))).into());
        }
        Ok((Env { backends }, skipped))
    }

    pub(super) fn progress(&self) -> ProgressMode {
        if self.plain {
            ProgressMode::Lines
        } else {
            ProgressMode::Auto
        }
    }
}

/// A lab error as the command line answers it: a usage error (exit 2) or a failed run (exit 1).
pub(super) fn lab_error(e: LabError) -> anyhow::Error {
    match e {
        LabError::Usage(m) => UsageError(m).into(),
        // A folder the user cannot write is the user's choice: bad usage, as for every
        // subcommand.
        LabError::Model(m) if m.is_unwritable() => UsageError(m.to_string()).into(),
        other => other.into(),
    }
}

fn print_report(out: &std::path::Path, report: &Report) -> bool {
    println!(
        "report: {}  appendix: {}  numbers: {}",
        out.join("REPORT.md").display(),
        out.join("APPENDIX.md").display(),
        out.join("results.json").display()
    );
    for e in &report.experiments {
        println!("{:<22} {:<18} {}", e.name, e.verdict.label(), e.summary);
    }
    for f in &report.failures {
        eprintln!("experiment {} failed: {}", f.name, f.error);
    }
    report.failures.is_empty()
}

fn run(
    lab: &LabArgs,
    experiments: Vec<&'static dyn Experiment>,
    default_out: PathBuf,
) -> anyhow::Result<bool> {
    let registry = all_experiments();
    if let Some(dir) = &lab.render_only {
        let report = runner::render_only(&registry, dir).map_err(lab_error)?;
        return Ok(print_report(dir, &report));
    }
    let out = lab.out.clone().unwrap_or(default_out);
    if !lab.merge.is_empty() {
        let report = runner::merge(&registry, &lab.merge, &out).map_err(lab_error)?;
        return Ok(print_report(&out, &report));
    }
    let shard: Option<Shard> = match &lab.shard {
        Some(s) => Some(s.parse().map_err(UsageError)?),
        None => None,
    };
    let (env, skipped_backends) = lab.env()?;
    let options = RunOptions {
        plan: Plan {
            quick: lab.quick,
            seed: lab.seed,
            tune: lab.tune,
            long: lab.long,
            backends: env.backends.iter().map(|b| b.name.clone()).collect(),
        },
        out: out.clone(),
        shard,
        progress: lab.progress(),
        skipped_backends,
    };
    match runner::run(&experiments, &env, &options).map_err(lab_error)? {
        RunOutcome::Report(report) => Ok(print_report(&out, &report)),
        RunOutcome::Shard {
            cells,
            measured,
            failures,
        } => {
            println!(
                "shard {}: {cells} cells in {} ({measured} measured now); merge every shard with \
                 `sdpa report --merge DIR_0 … DIR_N-1 --out DIR`",
                shard.map_or(String::new(), |s| s.to_string()),
                out.join("cells").display()
            );
            for f in &failures {
                eprintln!("experiment {} failed: {}", f.name, f.error);
            }
            Ok(failures.is_empty())
        }
    }
}

/// `sdpa report`: every experiment.
pub fn report(lab: &LabArgs) -> anyhow::Result<bool> {
    run(lab, all_experiments(), PathBuf::from("report"))
}

/// `sdpa exp NAME...` or `sdpa exp --list`.
pub fn exp(args: &ExpArgs) -> anyhow::Result<bool> {
    if args.list {
        for e in all_experiments() {
            println!("{:<22} {}", e.name(), e.title());
        }
        return Ok(true);
    }
    if args.lab.render_only.is_some() && !args.names.is_empty() {
        return Err(UsageError(format!(
            "--render-only renders what the folder's run.json names; drop the experiment names ({})",
            args.names.join(" ")
        ))
        .into());
    }
    let mut experiments = Vec::new();
    for name in &args.names {
        experiments.push(find_experiment(name).ok_or_else(|| {
            UsageError(format!(
                "unknown experiment `{name}`; one of: {}",
                all_experiments()
                    .iter()
                    .map(|e| e.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?);
    }
    let default_out = PathBuf::from(format!("exp-{}", args.names.join("+")));
    run(&args.lab, experiments, default_out)
}
