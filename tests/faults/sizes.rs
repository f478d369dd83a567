//! Sizes that cannot fit are refused before anything is allocated or written (exit 2, the
//! estimate and the machine's memory in the message), integer sizes never wrap, and a smoke run
//! of the benchmark checks that everything runs, not speed.

use crate::{arg, code, sdpa, text};

#[test]
fn sizes_that_cannot_fit_are_refused_before_anything_is_written() {
    let root = tempfile::tempdir().expect("tmp");
    for (name, extra) in [
        ("d-k", vec!["--d-k", "10000000"]),
        ("batch", vec!["--batch-size", "1000000000"]),
        ("layers", vec!["--layers", "1000000"]),
        ("vocab", vec!["--vocab", "10000000000"]),
        ("k-max", vec!["--k", "9223372036854775809"]),
        (
            "k-2^63",
            vec![
                "--k",
                "9223372036854775808",
                "--vocab",
                "18446744073709551615",
            ],
        ),
        (
            "k-wrap",
            vec![
                "--task",
                "recall",
                "--k",
                "9223372036854775807",
                "--vocab",
                "18446744073709551615",
            ],
        ),
        (
            "d-model",
            vec!["--d-model", "18446744073709551614", "--heads", "2"],
        ),
    ] {
        let dir = root.path().join(name);
        let mut args = vec!["train", "--steps", "2", "--plain", "--out"];
        let out_dir = arg(&dir);
        args.push(&out_dir);
        args.extend(extra);
        let out = sdpa(&args);
        assert_eq!(code(&out), Some(2), "{name}: {}", text(&out));
        assert!(!dir.exists(), "{name}: nothing is written before the check");
        assert_eq!(
            text(&out).matches("error").count(),
            1,
            "{name}: one message: {}",
            text(&out)
        );
    }
    // The memory message says how much is needed and how much there is.
    let out = sdpa(&[
        "train",
        "--steps",
        "2",
        "--d-k",
        "10000000",
        "--out",
        &arg(&root.path().join("x")),
    ]);
    let message = text(&out);
    if !message.contains("invalid") {
        assert!(
            message.contains("GiB") && message.contains("available"),
            "{message}"
        );
    }
}

#[test]
fn bench_sizes_that_cannot_fit_are_refused() {
    let root = tempfile::tempdir().expect("tmp");
    for (name, extra) in [
        ("n", vec!["--n", "1000000000"]),
        ("n-max", vec!["--n", "18446744073709551615"]),
        ("memory-n", vec!["--memory-n", "4000000000"]),
        (
            "training-memory-n",
            vec!["--training-memory-n", "4000000000"],
        ),
        // The new size flags feed the same guard.
        ("batch", vec!["--batch", "1000000000", "--n", "4096"]),
        ("heads", vec!["--heads", "1000000000", "--n", "4096"]),
        ("d-k", vec!["--d-k", "18446744073709551615"]),
    ] {
        let dir = root.path().join(name);
        let out_dir = arg(&dir);
        let mut args = vec!["bench", "--out", &out_dir];
        args.extend(extra);
        let out = sdpa(&args);
        assert_eq!(code(&out), Some(2), "{name}: {}", text(&out));
        assert!(!dir.exists(), "{name}: nothing is written before the check");
    }
}

#[test]
fn a_quick_bench_is_a_smoke_run_that_exits_0() {
    let root = tempfile::tempdir().expect("tmp");
    let out = sdpa(&["bench", "--quick", "--plain", "--out", &arg(root.path())]);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
}
