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

/// Starts `sdpa` twice at once with `args` and waits for both: two writers of one folder.
pub fn twice_at_once(args: &[&str]) -> [Output; 2] {
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_sdpa"))
            .args(args)
            .env("XDG_RUNTIME_DIR", std::env::temp_dir())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the sdpa binary starts")
    };
    let (a, b) = (spawn(), spawn());
    [
        a.wait_with_output().expect("wait"),
        b.wait_with_output().expect("wait"),
    ]
}

/// Of two writers started together ([`twice_at_once`]), one succeeded, and the other either
/// was refused with exit 2 saying `refusal`, or succeeded too (it started after the first had
/// ended): never another failure.
pub fn assert_one_wins(outputs: &[Output; 2], refusal: &str, attempt: usize) {
    let mut codes: Vec<Option<i32>> = outputs.iter().map(code).collect();
    codes.sort();
    assert!(
        codes == [Some(0), Some(2)] || codes == [Some(0), Some(0)],
        "attempt {attempt}: {codes:?}: {} | {}",
        text(&outputs[0]),
        text(&outputs[1])
    );
    for output in outputs.iter().filter(|o| code(o) == Some(2)) {
        assert!(
            text(output).contains(refusal),
            "attempt {attempt}: {}",
            text(output)
        );
    }
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
