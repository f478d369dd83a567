//! Training runs under faults: killed mid-run and resumed, foreign files in the output folder,
//! checkpoints corrupted or caught half swapped, divergence.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{arg, code, sdpa, text};

/// A small, fast run of `steps` steps into `out`, recording every step and checkpointing every
/// 10.
pub(crate) fn train_args(out: &Path, steps: usize) -> Vec<String> {
    [
        "train",
        "--task",
        "match",
        "--k",
        "4",
        "--vocab",
        "16",
        "--batch-size",
        "16",
        "--log-every",
        "1",
        "--eval-every",
        "5",
        "--checkpoint-every",
        "10",
        "--no-early-stop",
        "--plain",
        "--seed",
        "5",
        "--steps",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([steps.to_string(), "--out".into(), arg(out)])
    .collect()
}

pub(crate) fn resume_args(dir: &Path, steps: usize) -> Vec<String> {
    [
        "train".to_string(),
        "--resume".into(),
        arg(dir),
        "--steps".into(),
        steps.to_string(),
        "--plain".into(),
    ]
    .to_vec()
}

pub(crate) fn run(args: &[String]) -> std::process::Output {
    sdpa(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// `metrics.csv` as (step, every column but the wall time), one entry per row.
pub(crate) fn metrics(dir: &Path) -> Vec<(u64, String)> {
    let text = std::fs::read_to_string(dir.join("metrics.csv")).expect("metrics.csv");
    text.lines()
        .skip(1)
        .map(|line| {
            let cells: Vec<&str> = line.split(',').collect();
            let step = cells[0].parse().expect("a step");
            (step, cells[..cells.len() - 1].join(","))
        })
        .collect()
}

/// The step of the saved checkpoint, if there is a complete one.
pub(crate) fn checkpoint_step(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("checkpoint/state.json")).ok()?;
    let state: serde_json::Value = serde_json::from_str(&text).ok()?;
    state["step"].as_u64()
}

#[test]
fn resuming_after_sigkill_at_any_moment_is_exact() {
    let steps = 300;
    let root = tempfile::tempdir().expect("tmp");
    let whole = root.path().join("whole");
    let out = run(&train_args(&whole, steps));
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    let want = metrics(&whole);
    assert_eq!(want.len(), steps);

    // Kill at several moments: right after a checkpoint, between two, and later on.
    for (attempt, rows_before_kill) in [12usize, 37, 95].into_iter().enumerate() {
        let dir = root.path().join(format!("killed-{attempt}"));
        let args = train_args(&dir, steps);
        let mut child = Command::new(env!("CARGO_BIN_EXE_sdpa"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let start = Instant::now();
        loop {
            let rows = std::fs::read_to_string(dir.join("metrics.csv"))
                .map(|t| t.lines().count().saturating_sub(1))
                .unwrap_or(0);
            if rows >= rows_before_kill || start.elapsed() > Duration::from_secs(120) {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        // It died mid-run: no summary, and fewer rows than the budget.
        assert!(
            !dir.join("summary.json").exists(),
            "attempt {attempt}: the run finished before the kill"
        );
        let rows =
            std::fs::read_to_string(dir.join("metrics.csv")).map_or(0, |t| t.lines().count() - 1);
        assert!(rows < steps, "attempt {attempt}: {rows} rows");
        let out = run(&resume_args(&dir, steps));
        assert_eq!(code(&out), Some(0), "attempt {attempt}: {}", text(&out));
        let got = metrics(&dir);
        let steps_seen: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            steps_seen,
            (0..steps as u64).collect::<Vec<_>>(),
            "attempt {attempt}: every step exactly once"
        );
        assert_eq!(
            got, want,
            "attempt {attempt}: bit-identical to the uninterrupted run"
        );
    }
}

#[test]
fn a_fresh_run_never_deletes_files_it_did_not_write() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("run");
    std::fs::create_dir_all(dir.join("checkpoint")).expect("mkdir");
    std::fs::write(dir.join("checkpoint/keep"), "x").expect("write");
    let out = run(&train_args(&dir, 3));
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains(&arg(&dir)), "{}", text(&out));
    // --overwrite replaces a run's own files, never others.
    let mut args = train_args(&dir, 3);
    args.push("--overwrite".into());
    let out = run(&args);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains("keep"), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(dir.join("checkpoint/keep")).unwrap(),
        "x"
    );

    // A folder holding only an earlier run is replaced with --overwrite.
    let earlier = root.path().join("earlier");
    assert_eq!(code(&run(&train_args(&earlier, 12))), Some(0));
    let out = run(&train_args(&earlier, 3));
    assert_eq!(
        code(&out),
        Some(2),
        "a fresh run into a run folder needs --overwrite"
    );
    let mut args = train_args(&earlier, 3);
    args.push("--overwrite".into());
    let out = run(&args);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert_eq!(metrics(&earlier).len(), 3);
}

#[test]
fn a_half_swapped_checkpoint_is_recovered() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("run");
    assert_eq!(code(&run(&train_args(&dir, 40))), Some(0));
    let want = {
        let whole = root.path().join("whole");
        assert_eq!(code(&run(&train_args(&whole, 60))), Some(0));
        metrics(&whole)
    };
    // A crash between the two renames of a swap: the new checkpoint sits complete in
    // checkpoint.tmp, the old one in checkpoint.old, and checkpoint/ is gone.
    let ckpt = dir.join("checkpoint");
    std::fs::rename(&ckpt, dir.join("checkpoint.old")).expect("rename");
    copy_dir(&dir.join("checkpoint.old"), &dir.join("checkpoint.tmp"));
    let out = run(&resume_args(&dir, 60));
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert!(text(&out).contains("recovered"), "{}", text(&out));
    assert!(!dir.join("checkpoint.tmp").exists() && !dir.join("checkpoint.old").exists());
    assert_eq!(metrics(&dir), want);

    // A crash while writing checkpoint.tmp: an incomplete one is removed with a message.
    std::fs::create_dir_all(dir.join("checkpoint.tmp")).expect("mkdir");
    std::fs::write(dir.join("checkpoint.tmp/model.bpk"), "partial").expect("write");
    let out = run(&resume_args(&dir, 70));
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert!(text(&out).contains("removed"), "{}", text(&out));
    assert_eq!(checkpoint_step(&dir), Some(70));
}

#[test]
fn corrupt_and_truncated_checkpoints_are_errors_not_panics() {
    let root = tempfile::tempdir().expect("tmp");
    for (name, file, bytes) in [
        ("truncated-state", "state.json", &b"{\"step\": 4"[..]),
        ("truncated-model", "model.bpk", &b"bpk"[..]),
        ("garbage-optim", "optim.bpk", &[0u8; 64][..]),
    ] {
        let dir = root.path().join(name);
        assert_eq!(code(&run(&train_args(&dir, 20))), Some(0));
        std::fs::write(dir.join("checkpoint").join(file), bytes).expect("corrupt");
        let out = run(&resume_args(&dir, 30));
        assert_eq!(code(&out), Some(1), "{name}: {}", text(&out));
        assert!(
            text(&out).contains(file),
            "{name}: the error names {file}: {}",
            text(&out)
        );
    }
}

#[test]
fn a_diverging_run_stops_with_exit_1_and_files_that_parse() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("run");
    let mut args = train_args(&dir, 200);
    args.extend(["--optimizer", "sgd", "--lr", "1e30"].map(String::from));
    let out = run(&args);
    assert_eq!(code(&out), Some(1), "{}", text(&out));
    let message = text(&out);
    assert!(message.contains("diverged at step"), "{message}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap())
            .expect("summary.json parses");
    let step = summary["diverged_at"].as_u64().expect("diverged_at");
    assert!(step < 200);
    assert!(message.contains(&format!("step {step}")), "{message}");
    // The checkpoint left behind is the last good one: it loads, and resuming reaches the same
    // divergence again (exit 1, not a parse error).
    if let Some(saved) = checkpoint_step(&dir) {
        assert!(saved <= step);
        let out = run(&resume_args(&dir, 200));
        assert_eq!(code(&out), Some(1), "{}", text(&out));
        assert!(
            text(&out).contains(&format!("diverged at step {step}")),
            "{}",
            text(&out)
        );
    }
}

#[test]
fn scales_and_learning_rates_beyond_f32_are_bad_usage() {
    let root = tempfile::tempdir().expect("tmp");
    for extra in [
        ["--scale", "1e300"],
        ["--lr", "1e300"],
        ["--scale", "1e-60"],
    ] {
        let dir = root.path().join(extra[1]);
        let mut args = train_args(&dir, 5);
        args.extend(extra.map(String::from));
        let out = run(&args);
        assert_eq!(code(&out), Some(2), "{extra:?}: {}", text(&out));
        assert!(
            !dir.exists(),
            "{extra:?}: nothing is written before the check"
        );
    }
}

/// Copies a run folder (its files and its checkpoint directories).
pub(crate) fn copy_dir_all(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir").flatten() {
        if entry.path().is_dir() {
            copy_dir_all(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir").flatten() {
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
    }
}
