//! The `sdpa` command line: a thin layer that parses arguments, calls the library and turns
//! errors into exit codes (0 success, 1 a failed check or run, 2 bad usage).

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Every heap allocation is counted (on top of the system allocator), so that the lab's
/// `complexity` experiment measures the memory a computation holds, not the resident size.
#[global_allocator]
static ALLOCATOR: sdpa::lab::memory::CountingAllocator = sdpa::lab::memory::CountingAllocator;
use sdpa::cli::{self, UsageError};

#[derive(Parser, Debug)]
#[command(
    name = "sdpa",
    version,
    about = "Reference scaled dot-product attention for Burn"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Replay every golden case file (*.json) of DIR forward and backward and compare.
    Golden(cli::golden::GoldenArgs),
    /// Train the self-attention model on a synthetic task.
    Train(Box<cli::train::TrainArgs>),
    /// Run every experiment of the article and write REPORT.md, results.json, CSVs and plots.
    Report(cli::report::LabArgs),
    /// Run one experiment (`sdpa exp --list` lists them).
    Exp(cli::report::ExpArgs),
    /// Time every attention path, forward and forward+backward, and sweep inference memory.
    Bench(cli::bench::BenchArgs),
    /// Time the model's training steps (steps/s and where a step goes), the Rust side of
    /// benches/pytorch_model.py.
    TrainBench(cli::train_bench::TrainBenchArgs),
}

fn main() -> ExitCode {
    // Burn's `Device::default()` picks CUDA first when it is compiled in, and burn-optim loads a
    // saved optimizer state there before moving it to each parameter's device at the next step:
    // on a machine without CUDA a resume would panic. Every command of this binary names its
    // backend and never computes on the default device, so the default is pointed at a CPU
    // backend, unless the user set BURN_DEVICE.
    if std::env::var_os("BURN_DEVICE").is_none() {
        let cpu = if cfg!(feature = "flex") {
            Some("flex")
        } else if cfg!(feature = "ndarray") {
            Some("ndarray")
        } else {
            None
        };
        if let Some(cpu) = cpu {
            // SAFETY: the first statement of `main`, before this process starts any thread, so
            // no other thread can read or write the environment at the same time.
            unsafe { std::env::set_var("BURN_DEVICE", cpu) };
        }
    }
    sdpa::tune_allocator();
    // `--version` names the backends compiled in and each GPU backend's kernel compiler (a
    // GPU result says which compiler produced it: benches/gpu_sitting.sh records this).
    let summary: &'static str = Box::leak(sdpa::BackendKind::build_summary().into_boxed_str());
    let matches = Cli::command().long_version(summary).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        Command::Golden(args) => cli::golden::run(&args),
        Command::Train(args) => cli::train::run(&args).map(|_| true),
        Command::Report(args) => cli::report::report(&args),
        Command::Exp(args) => cli::report::exp(&args),
        Command::Bench(args) => cli::bench::bench(&args),
        Command::TrainBench(args) => cli::train_bench::run(&args),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
