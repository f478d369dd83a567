//! Exit codes: 0 success, 1 a failed run or check, 2 bad usage, for every subcommand.

use crate::{code, sdpa, text};

#[test]
fn bad_usage_exits_2_on_every_subcommand() {
    let out_dir = tempfile::tempdir().expect("tmp");
    let out = out_dir.path().display().to_string();
    for args in [
        vec!["train", "--backend", "rocm", "--steps", "1"],
        vec!["train", "--steps", "0"],
        vec!["bench", "--n", "0", "--out", &out],
        vec!["bench", "--mode", "sideways", "--out", &out],
        vec!["bench", "--backend", "rocm", "--out", &out],
        vec!["report", "--backend", "rocm", "--out", &out],
        vec!["exp", "no-such-experiment", "--out", &out],
        vec!["golden", "/no/such/folder"],
        vec!["golden", "tests/data/golden", "--implementation", "flash"],
        vec!["no-such-subcommand"],
    ] {
        let result = sdpa(&args);
        assert_eq!(code(&result), Some(2), "{args:?}: {}", text(&result));
    }
}

/// `--backend cuda` on every subcommand, on a machine without a CUDA GPU (CI): without the
/// `cuda` feature, exit 2 naming the feature; with it, exit 2 with the runtime's own reason (the
/// driver library that is missing, or the driver's error); never a panic (101), and nothing
/// written.
#[test]
fn cuda_without_the_feature_or_a_gpu_exits_2_with_the_reason() {
    if cfg!(feature = "cuda") && sdpa::BackendKind::Cuda.device().is_ok() {
        eprintln!("a CUDA GPU is usable here: nothing to refuse");
        return;
    }
    let out_dir = tempfile::tempdir().expect("tmp");
    let out = out_dir.path().join("out").display().to_string();
    for args in [
        vec!["train", "--backend", "cuda", "--steps", "1", "--out", &out],
        vec!["golden", "tests/data/golden", "--backend", "cuda"],
        vec!["bench", "--backend", "cuda", "--quick", "--out", &out],
        vec!["report", "--backend", "cuda", "--quick", "--out", &out],
        vec![
            "exp",
            "attention-map",
            "--backend",
            "cuda",
            "--quick",
            "--out",
            &out,
        ],
        vec![
            "train-bench",
            "--backend",
            "cuda",
            "--size",
            "small",
            "--out",
            &out,
        ],
    ] {
        let result = sdpa(&args);
        let shown = text(&result);
        assert_eq!(code(&result), Some(2), "{args:?}: {shown}");
        assert!(!shown.contains("panicked at"), "{args:?}: {shown}");
        if cfg!(feature = "cuda") {
            // The runtime's reason follows the colon: not empty.
            let reason = shown
                .split("the cuda backend found no usable device: ")
                .nth(1)
                .unwrap_or_else(|| panic!("{args:?}: {shown}"));
            assert!(reason.trim().len() > 10, "{args:?}: {shown}");
        } else {
            assert!(
                shown.contains("the cuda backend is not compiled in")
                    && shown.contains("--features cuda"),
                "{args:?}: {shown}"
            );
        }
        assert!(!out_dir.path().join("out").exists(), "{args:?} wrote {out}");
    }
}

/// A resume on a CPU backend never opens CUDA, even when the `cuda` feature is compiled in
/// (CI runs this with the GPU binary's build): burn-optim loads a saved optimizer state on Burn's
/// default device, CUDA first when compiled in, which panicked on a machine without a GPU.
#[test]
fn a_resume_on_the_cpu_never_opens_cuda_even_when_compiled_in() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("run");
    let out = crate::training::run(&crate::training::train_args(&dir, 20));
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    let out = crate::training::run(&crate::training::resume_args(&dir, 30));
    let shown = text(&out);
    assert_eq!(code(&out), Some(0), "{shown}");
    assert!(
        !shown.contains("panicked") && !shown.contains("cuda"),
        "{shown}"
    );
    assert_eq!(crate::training::metrics(&dir).len(), 30);
}

#[test]
fn a_passing_check_exits_0() {
    let out = sdpa(&["golden", "tests/data/golden", "--backend", "flex"]);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert!(text(&out).contains("12 passed, 0 failed"), "{}", text(&out));
}

#[test]
fn the_lab_never_overwrites_or_deletes_a_users_files() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("mine");
    std::fs::create_dir_all(dir.join("runs/attention-map")).expect("mkdir");
    std::fs::write(dir.join("REPORT.md"), "my notes").expect("write");
    std::fs::write(dir.join("runs/attention-map/keep"), "mine").expect("write");
    let out_dir = dir.display().to_string();
    for args in [
        vec![
            "exp",
            "attention-map",
            "--quick",
            "--plain",
            "--out",
            &out_dir,
        ],
        vec!["report", "--quick", "--plain", "--out", &out_dir],
    ] {
        let out = sdpa(&args);
        assert_eq!(code(&out), Some(2), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains("REPORT.md") || text(&out).contains("runs"),
            "{}",
            text(&out)
        );
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("REPORT.md")).unwrap(),
        "my notes"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("runs/attention-map/keep")).unwrap(),
        "mine"
    );
    assert!(!dir.join("results.json").exists());
}
