//! Train the default self-attention model on the *match* task on the default CPU backend (flex).
//!
//! ```sh
//! cargo run --release --example train
//! ```
//!
//! How long on 2 cores: not measured as a whole (the default model trains at about 430 steps/s on 2
//! cores of an AMD EPYC Zen 5, `docs/bench/BENCH_train.md`, and stops early once it has learned the
//! task).
//!
//! Prints the held-out accuracy and where the metrics are. The same run from the command line is
//! `cargo run --release -- train`; see `sdpa train --help` for every option.

use std::time::{SystemTime, UNIX_EPOCH};

use sdpa::cli::train::{TrainArgs, run};

fn main() -> anyhow::Result<()> {
    sdpa::tune_allocator();
    // A fresh run directory each time, so that the example never refuses to start.
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let args = TrainArgs {
        out: Some(format!("runs/example-match-{stamp}").into()),
        ..TrainArgs::default()
    };
    let result = run(&args)?;
    let s = &result.summary;
    println!(
        "example done: held-out accuracy {:.2}% on {} in {:.1} s",
        100.0 * s.final_eval_accuracy,
        s.backend,
        s.time_s
    );
    Ok(())
}
