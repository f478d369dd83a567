//! Training runs, fourth pass (issue 51): a resume keeps its backend, a run that cannot start
//! (a dtype or an attention path its device cannot serve) is refused before it writes or
//! removes anything, and a user's file in a checkpoint folder is refused before anything
//! changes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::training::{metrics, resume_args, run, train_args};
use crate::{arg, code, sdpa, text};

/// Every file under `dir` (its path below `dir`) and its bytes.
pub(crate) fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(folder) = todo.pop() {
        for entry in std::fs::read_dir(&folder).expect("read dir").flatten() {
            let path = entry.path();
            if entry.file_type().expect("type").is_dir() {
                todo.push(path);
            } else {
                let bytes = std::fs::read(&path).expect("read");
                files.insert(path.strip_prefix(dir).expect("below").to_path_buf(), bytes);
            }
        }
    }
    files
}

/// `args` with `extra` appended.
pub(crate) fn with(mut args: Vec<String>, extra: &[&str]) -> Vec<String> {
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[test]
fn a_resume_continues_on_the_runs_own_backend() {
    let root = tempfile::tempdir().expect("tmp");
    let whole = root.path().join("whole");
    let out = run(&with(train_args(&whole, 40), &["--backend", "ndarray"]));
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    // Trained on ndarray, resumed without --backend: it continues there, row for row.
    let nd = root.path().join("nd");
    let out = run(&with(train_args(&nd, 30), &["--backend", "ndarray"]));
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    let out = run(&resume_args(&nd, 40));
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert_eq!(metrics(&nd), metrics(&whole));
    let summary = std::fs::read_to_string(nd.join("summary.json")).expect("summary");
    assert!(summary.contains("\"backend\": \"ndarray\""), "{summary}");
    // Another backend is refused (exit 2) before anything changes, either way round.
    let before = snapshot(&nd);
    let out = run(&with(resume_args(&nd, 50), &["--backend", "flex"]));
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains("ndarray"), "{}", text(&out));
    assert_eq!(snapshot(&nd), before, "a refused resume changes nothing");
    let fl = root.path().join("flex");
    assert_eq!(code(&run(&train_args(&fl, 20))), Some(0));
    let before = snapshot(&fl);
    let out = run(&with(resume_args(&fl, 30), &["--backend", "ndarray"]));
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert_eq!(snapshot(&fl), before, "a refused resume changes nothing");
    // Repeating the run's own backend is no change.
    let out = run(&with(resume_args(&fl, 30), &["--backend", "flex"]));
    assert_eq!(code(&out), Some(0), "{}", text(&out));
}

#[test]
fn a_run_written_before_the_backend_was_recorded_still_resumes() {
    let root = tempfile::tempdir().expect("tmp");
    let whole = root.path().join("whole");
    assert_eq!(
        code(&run(&with(
            train_args(&whole, 30),
            &["--backend", "ndarray"]
        ))),
        Some(0)
    );
    let old = root.path().join("old");
    assert_eq!(
        code(&run(&with(train_args(&old, 20), &["--backend", "ndarray"]))),
        Some(0)
    );
    // As an earlier version wrote it: no backend in config.json nor in state.json (re-sealed).
    let config = std::fs::read_to_string(old.join("config.json")).expect("config");
    let stripped = config.replace("  \"backend\": \"ndarray\",\n", "");
    assert_ne!(stripped, config, "{config}");
    std::fs::write(old.join("config.json"), stripped).expect("write");
    let state_path = old.join("checkpoint/state.json");
    let state = std::fs::read_to_string(&state_path).expect("state");
    let stripped = state.replace("  \"backend\": \"ndarray\",\n", "");
    assert_ne!(stripped, state, "{state}");
    std::fs::write(&state_path, crate::reads::reseal(&stripped)).expect("write");
    // Its summary names the backend: the resume takes it, and says so.
    let out = run(&resume_args(&old, 30));
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert!(text(&out).contains("records no backend"), "{}", text(&out));
    assert_eq!(metrics(&old), metrics(&whole));
    let config = std::fs::read_to_string(old.join("config.json")).expect("config");
    assert!(
        config.contains("\"backend\": \"ndarray\""),
        "recorded now: {config}"
    );
}

#[test]
fn a_run_that_cannot_start_removes_and_writes_nothing() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("ow1");
    assert_eq!(code(&run(&train_args(&dir, 20))), Some(0));
    let before = snapshot(&dir);
    let overwrite = |extra: &[&str]| {
        let mut args = with(train_args(&dir, 100), &["--overwrite"]);
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    // A dtype the backend lacks, a path the backend cannot serve (the CubeCL kernel on a CPU
    // backend: in every build, with the `cube` feature or without it).
    for extra in [
        &["--backend", "ndarray", "--dtype", "bf16"][..],
        &["--implementation", "cube_kernel"][..],
        &["--implementation", "cube_kernel", "--backend", "ndarray"][..],
    ] {
        let out = run(&overwrite(extra));
        assert_eq!(code(&out), Some(2), "{extra:?}: {}", text(&out));
        assert!(text(&out).contains("cannot start"), "{}", text(&out));
        assert_eq!(snapshot(&dir), before, "{extra:?}: the earlier run is kept");
    }
    // A fresh run leaves no folder; a resume leaves the run as it was, config.json included.
    for extra in [
        &["--backend", "ndarray", "--dtype", "bf16"][..],
        &["--implementation", "cube_kernel"][..],
    ] {
        let fresh = root.path().join("fresh");
        let out = run(&with(train_args(&fresh, 20), extra));
        assert_eq!(code(&out), Some(2), "{extra:?}: {}", text(&out));
        assert!(!fresh.exists(), "{extra:?}: no folder is left behind");
    }
    let out = run(&with(
        resume_args(&dir, 30),
        &["--implementation", "cube_kernel"],
    ));
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert_eq!(snapshot(&dir), before, "a refused resume changes nothing");
    let out = run(&resume_args(&dir, 30));
    assert_eq!(
        code(&out),
        Some(0),
        "a plain resume still runs: {}",
        text(&out)
    );
    // train-bench: the same refusals, as bad usage.
    let bench = arg(&root.path().join("bench"));
    for extra in [
        &["--backend", "ndarray", "--dtype", "bf16"][..],
        &["--implementation", "cube_kernel"][..],
    ] {
        let mut args = vec![
            "train-bench",
            "--size",
            "small",
            "--steps",
            "1",
            "--rounds",
            "1",
            "--warmup",
            "1",
            "--out",
            &bench,
        ];
        args.extend(extra);
        let out = sdpa(&args);
        assert_eq!(code(&out), Some(2), "{args:?}: {}", text(&out));
    }
}

#[test]
fn a_users_file_in_a_checkpoint_folder_is_refused_before_anything_changes() {
    let root = tempfile::tempdir().expect("tmp");
    let source = root.path().join("source");
    assert_eq!(code(&run(&train_args(&source, 20))), Some(0));
    for folder in ["checkpoint", "checkpoint.old", "checkpoint.tmp"] {
        let dir = root.path().join(folder);
        crate::training::copy_dir_all(&source, &dir);
        std::fs::create_dir_all(dir.join(folder)).expect("mkdir");
        std::fs::write(dir.join(folder).join("notes.txt"), "hi\n").expect("write");
        let before = snapshot(&dir);
        for args in [
            resume_args(&dir, 150),
            with(train_args(&dir, 150), &["--overwrite"]),
        ] {
            let out = run(&args);
            assert_eq!(code(&out), Some(2), "{folder} {args:?}: {}", text(&out));
            assert!(text(&out).contains("notes.txt"), "{}", text(&out));
            assert_eq!(snapshot(&dir), before, "{folder}: nothing changes");
        }
    }
}
