//! Fault injection: what a user who lost a day of work would try. Training runs killed and
//! resumed, checkpoints corrupted, truncated and half swapped, runs that diverge, malformed
//! golden cases, bad inputs to the module and bad command lines, through the real `sdpa` binary
//! or the public API.

mod benches;
mod cli;
mod foreign;
mod full_disk;
mod golden;
mod golden_cases;
mod lab;
mod module;
mod reads;
mod resume;
mod rope;
mod runs;
mod sizes;
mod starts;
mod training;

use std::path::Path;
use std::process::{Command, Output};

/// Runs the `sdpa` binary built for these tests.
pub fn sdpa(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sdpa"))
        .args(args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .expect("the sdpa binary runs")
}

/// The exit code (a panic is 101; a signal has none).
pub fn code(output: &Output) -> Option<i32> {
    output.status.code()
}

/// Stdout and stderr, for messages.
pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A path as a command-line argument.
pub fn arg(path: &Path) -> String {
    path.display().to_string()
}
