//! The benches keep to their own folders and refuse bad arguments before running (issue 51,
//! items 4, 8, 9, 15 and 16): `bench` and `train-bench` write only into a new or empty folder or
//! one holding their manifest, replace only files it lists unless `--overwrite`, and answer
//! overflowing step counts, a dtype the backend lacks and `report --merge` with flags it would
//! ignore with exit 2.

use std::path::{Path, PathBuf};

use crate::{arg, code, sdpa, text};

const MANIFEST: &str = ".sdpa-bench";

/// The smallest bench run: one size, one mode, one path, no memory sweep (seconds).
fn bench(out: &Path, extra: &[&str]) -> std::process::Output {
    let out = arg(out);
    sdpa(&bench_args(&out, extra))
}

/// The arguments of [`bench`].
fn bench_args<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "bench",
        "--quick",
        "--plain",
        "--n",
        "8",
        "--mode",
        "forward",
        "--path",
        "naive",
        "--skip-memory",
        "--out",
        out,
    ];
    args.extend_from_slice(extra);
    args
}

/// The smallest train-bench run: the small model, one round of one step after one warm-up.
fn train_bench(out: &Path, extra: &[&str]) -> std::process::Output {
    let out = arg(out);
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
        &out,
    ];
    args.extend_from_slice(extra);
    sdpa(&args)
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_benches_write_only_into_their_own_folders() {
    let root = tempfile::tempdir().expect("tmp");
    // A user's folder holding files of the bench's names: refused, both kept, nothing added.
    let user = root.path().join("user");
    std::fs::create_dir(&user).expect("mkdir");
    for name in ["BENCH_flex.md", "bench_flex.json", "train_flex_small.json"] {
        std::fs::write(user.join(name), "mine").expect("write");
    }
    for out in [bench(&user, &[]), train_bench(&user, &[])] {
        assert_eq!(code(&out), Some(2), "{}", text(&out));
        assert!(text(&out).contains("--overwrite"), "{}", text(&out));
    }
    for name in ["BENCH_flex.md", "bench_flex.json", "train_flex_small.json"] {
        assert_eq!(read(user.join(name)), "mine");
    }
    assert_eq!(std::fs::read_dir(&user).expect("ls").count(), 3);
    // A folder holding only a user's note: not the benches' either.
    let notes = root.path().join("notes");
    std::fs::create_dir(&notes).expect("mkdir");
    std::fs::write(notes.join("notes.txt"), "mine").expect("write");
    let out = bench(&notes, &[]);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains("notes.txt"), "{}", text(&out));
    assert!(!notes.join(MANIFEST).exists());

    // A new folder: both benches write there, one manifest lists their files, a rerun replaces
    // them, a user's note beside them is kept.
    let own = root.path().join("own");
    let out = bench(&own, &[]);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    let out = train_bench(&own, &[]);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    let manifest = read(own.join(MANIFEST));
    for name in ["bench_flex.json", "BENCH_flex.md", "train_flex_small.json"] {
        assert!(own.join(name).is_file(), "{name}");
        assert!(manifest.lines().any(|l| l == name), "{name}: {manifest}");
    }
    std::fs::write(own.join("notes.txt"), "mine").expect("write");
    std::fs::write(own.join("bench_flex.json"), "stale").expect("write");
    let out = bench(&own, &[]);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert_ne!(read(own.join("bench_flex.json")), "stale");
    assert_eq!(read(own.join("notes.txt")), "mine");
    // A file of the bench's names that the manifest does not list (the bf16 run's): refused
    // and kept; --overwrite replaces it and lists it.
    std::fs::write(own.join("BENCH_flex_bf16.md"), "mine").expect("write");
    let out = bench(&own, &["--dtype", "bf16"]);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains("BENCH_flex_bf16.md"), "{}", text(&out));
    assert_eq!(read(own.join("BENCH_flex_bf16.md")), "mine");
    let out = bench(&own, &["--dtype", "bf16", "--overwrite"]);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert_ne!(read(own.join("BENCH_flex_bf16.md")), "mine");
    assert!(
        read(own.join(MANIFEST))
            .lines()
            .any(|l| l == "BENCH_flex_bf16.md")
    );
    // --overwrite into the user's folder: its files replaced, the folder now the benches'.
    let out = bench(&user, &["--overwrite"]);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert_ne!(read(user.join("bench_flex.json")), "mine");
    assert_eq!(read(user.join("train_flex_small.json")), "mine");
}

/// `--out` at a file, a link or a folder where a file goes: exit 2 with a clear message, nothing
/// replaced (item 16's bench part: it was exit 1 "File exists (os error 17)").
#[cfg(unix)]
#[test]
fn the_benches_refuse_an_out_that_is_not_a_folder() {
    let root = tempfile::tempdir().expect("tmp");
    let file = root.path().join("file");
    std::fs::write(&file, "mine").expect("write");
    for out in [bench(&file, &[]), train_bench(&file, &["--overwrite"])] {
        assert_eq!(code(&out), Some(2), "{}", text(&out));
        assert!(text(&out).contains("not a folder"), "{}", text(&out));
        assert!(!text(&out).contains("os error 17"), "{}", text(&out));
    }
    assert_eq!(read(file.clone()), "mine");
    let real = root.path().join("real");
    std::fs::create_dir(&real).expect("mkdir");
    let link = root.path().join("link");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let out = bench(&link, &[]);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert_eq!(std::fs::read_dir(&real).expect("ls").count(), 0);
    // A folder where the bench writes its JSON file: refused even with --overwrite.
    let odd = root.path().join("odd");
    std::fs::create_dir_all(odd.join("bench_flex.json")).expect("mkdir");
    let out = bench(&odd, &["--overwrite"]);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(odd.join("bench_flex.json").is_dir());
}

/// docs/bench, which several benches share, keeps one manifest: a full flex or ndarray bench
/// replaces only files it lists (or writes new ones), and a copy of the folder takes a run.
#[test]
fn docs_bench_keeps_one_manifest() {
    let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/bench");
    let manifest = read(docs.join(MANIFEST));
    let listed: Vec<&str> = manifest.lines().filter(|l| !l.starts_with('#')).collect();
    for backend in ["flex", "ndarray"] {
        let config = sdpa::lab::bench::BenchConfig::new(false);
        for name in sdpa::lab::bench::file_names(backend, &config) {
            assert!(
                !docs.join(&name).exists() || listed.contains(&name.as_str()),
                "{name} is in docs/bench but not in its manifest"
            );
        }
    }
    for name in &listed {
        assert!(docs.join(name).is_file(), "{name} is listed but absent");
    }
    // A copy of its files (not its subfolders) takes a flex bench.
    let copy = tempfile::tempdir().expect("tmp");
    for entry in std::fs::read_dir(&docs).expect("ls") {
        let entry = entry.expect("entry");
        if entry.file_type().expect("type").is_file() {
            std::fs::copy(entry.path(), copy.path().join(entry.file_name())).expect("copy");
        }
    }
    let out = bench(copy.path(), &[]);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    // Its hand-written wgpu page is not the bench's: never replaced without --overwrite.
    assert!(!listed.contains(&"BENCH_wgpu.md"));
}

/// Step counts whose total overflows: exit 2 naming the values, never a panic or a wrapped
/// count (item 8).
#[test]
fn train_bench_step_counts_that_overflow_are_bad_usage() {
    let root = tempfile::tempdir().expect("tmp");
    let max = u64::MAX.to_string();
    let half = (1u64 << 63).to_string();
    let cases: [&[&str]; 4] = [
        &["--steps", &max, "--rounds", "1", "--warmup", "1"],
        &["--steps", "1", "--rounds", "1", "--warmup", &max],
        &["--steps", &half, "--rounds", "2", "--warmup", "1"],
        &["--steps", "2", "--rounds", &max, "--warmup", "1"],
    ];
    for args in cases {
        let out_dir = root.path().join("out");
        let out = arg(&out_dir);
        let mut all = vec!["train-bench", "--size", "small", "--out", &out];
        all.extend_from_slice(args);
        let out = sdpa(&all);
        let printed = text(&out);
        assert_eq!(code(&out), Some(2), "{args:?}: {printed}");
        assert!(printed.contains("overflows"), "{args:?}: {printed}");
        let big = if args.contains(&max.as_str()) {
            &max
        } else {
            &half
        };
        assert!(printed.contains(big.as_str()), "{args:?}: {printed}");
        assert!(!printed.contains("= 0"), "{args:?}: {printed}");
        assert!(!out_dir.exists(), "{args:?}: the folder was made");
    }
}

/// bf16 on NdArray, which has no bf16 tensors: exit 2 naming both, before anything runs or is
/// written (item 9: it panicked inside burn-ndarray).
#[test]
fn bench_refuses_a_dtype_its_backend_lacks() {
    let root = tempfile::tempdir().expect("tmp");
    let out_dir = root.path().join("out");
    let out = arg(&out_dir);
    let out = sdpa(&[
        "bench",
        "--n",
        "1",
        "--dtype",
        "bf16",
        "--backend",
        "ndarray",
        "--mode",
        "forward",
        "--skip-memory",
        "--out",
        &out,
    ]);
    let printed = text(&out);
    assert_eq!(code(&out), Some(2), "{printed}");
    assert!(
        printed.contains("ndarray") && printed.contains("bf16"),
        "{printed}"
    );
    assert!(!printed.contains("panicked"), "{printed}");
    assert!(!out_dir.exists());
    // train-bench too, leaving no folder and no manifest behind (issue 65, item 7).
    let out = sdpa(&[
        "train-bench",
        "--backend",
        "ndarray",
        "--dtype",
        "bf16",
        "--size",
        "small",
        "--out",
        &arg(&out_dir),
    ]);
    let printed = text(&out);
    assert_eq!(code(&out), Some(2), "{printed}");
    assert!(printed.contains("ndarray"), "{printed}");
    assert!(
        !out_dir.exists(),
        "a refused train-bench leaves {}",
        out_dir.display()
    );
}

/// `report --merge` measures nothing: --seed, --backend and --quick would be ignored, so they
/// are refused (exit 2, nothing written), as --render-only refuses them (item 15).
#[test]
fn merge_refuses_the_flags_it_would_ignore() {
    let root = tempfile::tempdir().expect("tmp");
    let shards = crate::lab::two_shards(root.path());
    let (s0, s1) = (arg(&shards[0]), arg(&shards[1]));
    let flags: [&[&str]; 3] = [&["--seed", "7"], &["--backend", "ndarray"], &["--quick"]];
    for flag in flags {
        let merged = root.path().join("merged");
        let out = arg(&merged);
        let mut args = vec!["report", "--merge", &s0, &s1, "--out", &out];
        args.extend_from_slice(flag);
        let out = sdpa(&args);
        assert_eq!(code(&out), Some(2), "{flag:?}: {}", text(&out));
        assert!(text(&out).contains(flag[0]), "{flag:?}: {}", text(&out));
        assert!(!merged.exists(), "{flag:?}");
    }
    // Without them the same merge runs.
    let merged = arg(&root.path().join("merged"));
    let out = sdpa(&["report", "--merge", &s0, &s1, "--out", &merged]);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
}

/// `--batch`, `--heads`, `--d-k`, `--reps` and `--min-total-ms` reach the bench (its JSON file
/// records them, and every timed path ran `--reps` times); zero or negative values are bad
/// usage, refused before anything is written.
#[test]
fn bench_takes_the_sizes_and_the_timing_it_is_given() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("sized");
    let out = bench(
        &dir,
        &[
            "--batch",
            "2",
            "--heads",
            "3",
            "--d-k",
            "8",
            "--reps",
            "3",
            "--min-total-ms",
            "0",
        ],
    );
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    let json: serde_json::Value =
        serde_json::from_str(&read(dir.join("bench_flex.json"))).expect("json");
    let config = &json["config"];
    assert_eq!(
        [&config["b"], &config["h"], &config["d"], &config["reps"]],
        [2, 3, 8, 3]
    );
    let rows = json["rows"].as_array().expect("rows");
    assert!(!rows.is_empty());
    for row in rows {
        let times = row["times_ms"].as_array().expect("times");
        assert!(times.len() >= 3, "{row}");
    }
    for bad in [
        ["--batch", "0"],
        ["--heads", "0"],
        ["--d-k", "0"],
        ["--reps", "0"],
        ["--min-total-ms=-1", "--overwrite"],
        ["--min-total-ms", "NaN"],
    ] {
        let flag = bad[0].split('=').next().unwrap_or_default();
        let dir = root.path().join(format!("bad{}", bad.join("")));
        let out = bench(&dir, &bad);
        assert_eq!(code(&out), Some(2), "{bad:?}: {}", text(&out));
        assert!(text(&out).contains(flag), "{bad:?}: {}", text(&out));
        assert!(!dir.exists(), "{bad:?}: nothing is written");
    }
}

/// A bench that would measure nothing is refused before anything is written (issue 65, item
/// 3): a CubeCL path on a CPU backend, or only the baseline with only masked modes.
#[test]
fn a_bench_that_would_measure_nothing_exits_2() {
    let root = tempfile::tempdir().expect("tmp");
    for (name, extra, needle) in [
        (
            "cube-on-flex",
            vec!["--path", "cube_kernel"],
            "cube_kernel does not run on the flex backend",
        ),
        (
            "tensor-cores-on-flex",
            vec!["--path", "cube_tensor_cores"],
            "cube_tensor_cores does not run on the flex backend",
        ),
        (
            "baseline-masked",
            vec!["--path", "baseline", "--mode", "forward, causal"],
            "nothing would be measured",
        ),
    ] {
        let dir = root.path().join(name);
        // `bench` times naive in the forward mode: the paths and modes asked for here replace
        // them (a repeated flag adds; `baseline-masked` asks for the causal mode only).
        let out = {
            let out_arg = arg(&dir);
            let mut args = vec!["bench", "--quick", "--plain", "--n", "8", "--skip-memory"];
            if name != "baseline-masked" {
                args.extend(["--mode", "forward"]);
            }
            args.extend(extra.iter().copied());
            args.extend(["--out", &out_arg]);
            sdpa(&args)
        };
        assert_eq!(code(&out), Some(2), "{name}: {}", text(&out));
        assert!(text(&out).contains(needle), "{name}: {}", text(&out));
        assert!(!dir.exists(), "{name}: nothing is written");
    }
}

/// `--min-total-ms` is honoured with `--quick` (issue 65, item 4): more runs than the quick
/// bench's two, up to the full bench's 30, until the path has run that long.
#[test]
fn quick_honours_min_total_ms() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("timed");
    let out = bench(&dir, &["--min-total-ms", "200"]);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    let json: serde_json::Value =
        serde_json::from_str(&read(dir.join("bench_flex.json"))).expect("json");
    assert_eq!(json["config"]["max_reps"], 30, "{}", json["config"]);
    for row in json["rows"].as_array().expect("rows") {
        let times: Vec<f64> = row["times_ms"]
            .as_array()
            .expect("times")
            .iter()
            .filter_map(|t| t.as_f64())
            .collect();
        assert!(
            times.len() == 30 || times.iter().sum::<f64>() >= 200.0,
            "ran {} times for {:.3} ms in all: {row}",
            times.len(),
            times.iter().sum::<f64>()
        );
        assert!(times.len() > 2, "{row}");
    }
}

/// Two benches started together on a new folder (the attack of issue 65's fifth pass, again):
/// one writes it, the other is told the folder is in use (exit 2), never "No such file" (exit
/// 1) from a race on the manifest.
#[test]
fn two_benches_started_together_one_wins_the_other_is_told() {
    let root = tempfile::tempdir().expect("tmp");
    for attempt in 0..4 {
        let dir = root.path().join(format!("b{attempt}"));
        let out = arg(&dir);
        let outputs = crate::twice_at_once(&bench_args(&out, &[]));
        crate::assert_one_wins(&outputs, "in use by another bench run", attempt);
    }
}

/// `golden` with an implementation that serves none of the cases checked nothing: exit 2.
#[test]
fn golden_that_serves_no_case_is_bad_usage() {
    let out = sdpa(&[
        "golden",
        "tests/data/golden",
        "--backend",
        "flex",
        "--implementation",
        "cube_kernel",
    ]);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains("serves none of the"), "{}", text(&out));
}
