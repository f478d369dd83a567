//! Exit codes: 0 success, 1 a failed run or check, 2 bad usage, for every subcommand.

use crate::{code, sdpa, text};

#[test]
fn bad_usage_exits_2_on_every_subcommand() {
    let out_dir = tempfile::tempdir().expect("tmp");
    let out = out_dir.path().display().to_string();
    for args in [
        vec!["train", "--backend", "cuda", "--steps", "1"],
        vec!["train", "--steps", "0"],
        vec!["bench", "--n", "0", "--out", &out],
        vec!["bench", "--mode", "sideways", "--out", &out],
        vec!["bench", "--backend", "cuda", "--out", &out],
        vec!["report", "--backend", "cuda", "--out", &out],
        vec!["exp", "no-such-experiment", "--out", &out],
        vec!["golden", "/no/such/folder"],
        vec!["golden", "tests/data/golden", "--implementation", "flash"],
        vec!["no-such-subcommand"],
    ] {
        let result = sdpa(&args);
        assert_eq!(code(&result), Some(2), "{args:?}: {}", text(&result));
    }
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
