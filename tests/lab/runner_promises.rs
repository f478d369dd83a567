//! The runner's promises: a killed report continues from its saved cells and ends equal to an
//! uninterrupted one; `--render-only` renders from the cells alone; three shards merge into the
//! unsharded run's numbers bit for bit; a merge names a missing or doubled cell; a cell saved
//! under another key is measured again; the lab writes only into its own folders.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use sdpa::lab::runner::{self, RunOutcome, Shard};
use sdpa::lab::{LabError, Report, all_experiments, find_experiment};

use super::{env, options, report};

/// Each experiment's claims and analysis as JSON text: everything but timings.
fn fingerprint(r: &Report) -> Vec<(String, String, String)> {
    r.experiments
        .iter()
        .map(|e| {
            (
                e.name.clone(),
                serde_json::to_string(&e.claims).expect("claims"),
                serde_json::to_string(&e.data).expect("data"),
            )
        })
        .collect()
}

/// Every saved cell under `dir/cells`: relative path → (result JSON, modification time).
fn cells(dir: &Path) -> BTreeMap<PathBuf, (serde_json::Value, SystemTime)> {
    let mut out = BTreeMap::new();
    let root = dir.join("cells");
    for exp in std::fs::read_dir(&root).expect("cells/") {
        let exp = exp.expect("entry").path();
        for f in std::fs::read_dir(&exp).expect("experiment folder") {
            let f = f.expect("entry").path();
            // A killed run's half-written temporary is not a saved cell (the next run removes it).
            if f.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with('.') || n.ends_with(".tmp")
            }) {
                continue;
            }
            let text = std::fs::read_to_string(&f).expect("cell");
            let v: serde_json::Value = serde_json::from_str(&text).expect("cell parses");
            let mtime = std::fs::metadata(&f)
                .and_then(|m| m.modified())
                .expect("mtime");
            // `{"checksum": …, "cell": {"key", "seconds", "result", "measured_by"}}`
            let result = v["cell"]["result"].clone();
            assert!(!result.is_null(), "{}: no result", f.display());
            out.insert(
                f.strip_prefix(&root).expect("under").to_path_buf(),
                (result, mtime),
            );
        }
    }
    out
}

#[test]
fn shards_merge_into_the_unsharded_run_bit_for_bit() {
    // training has a tuning stage that every shard needs: the hard case.
    let names = ["dot-std", "masks", "training"];
    let whole = tempfile::tempdir().expect("tmp");
    let a = report(&names, false, whole.path());
    let experiments: Vec<_> = names
        .iter()
        .map(|n| find_experiment(n).expect("exists"))
        .collect();
    let env = env(false);
    let shards: Vec<tempfile::TempDir> =
        (0..3).map(|_| tempfile::tempdir().expect("tmp")).collect();
    for (i, dir) in shards.iter().enumerate() {
        let shard = Shard { index: i, count: 3 };
        match runner::run(&experiments, &env, &options(&env, dir.path(), Some(shard)))
            .expect("shard")
        {
            RunOutcome::Shard { failures, .. } => assert!(failures.is_empty(), "{failures:?}"),
            RunOutcome::Report(_) => panic!("a shard renders nothing"),
        }
        assert!(!dir.path().join("REPORT.md").exists());
    }
    // Every cell of the whole run is in exactly one shard, with the same numbers.
    let whole_cells = cells(whole.path());
    let mut seen = BTreeMap::new();
    for dir in &shards {
        for (name, (result, _)) in cells(dir.path()) {
            assert!(
                seen.insert(name.clone(), result).is_none(),
                "{name:?} in two shards"
            );
        }
    }
    assert_eq!(seen.len(), whole_cells.len());
    for (name, (result, _)) in &whole_cells {
        assert_eq!(seen.get(name), Some(result), "{name:?}");
    }
    let merged = tempfile::tempdir().expect("tmp");
    let dirs: Vec<PathBuf> = shards.iter().map(|d| d.path().to_path_buf()).collect();
    let registry = all_experiments();
    let m = runner::merge(&registry, &dirs, merged.path()).expect("merge");
    assert_eq!(fingerprint(&m), fingerprint(&a));
    assert!(merged.path().join("REPORT.md").is_file());

    // A missing shard, a missing cell and a doubled cell are errors that name them.
    let err = runner::merge(&registry, &dirs[..2], &merged.path().join("x")).unwrap_err();
    assert!(err.to_string().contains("shard 2/3"), "{err}");
    let (name, _) = cells(&dirs[1]).into_iter().next().expect("a cell");
    let doubled = dirs[1].join("cells").join(&name);
    let copy = dirs[0].join("cells").join(&name);
    std::fs::create_dir_all(copy.parent().expect("parent")).expect("mkdir");
    std::fs::copy(&doubled, &copy).expect("copy");
    let err = runner::merge(&registry, &dirs, &merged.path().join("y")).unwrap_err();
    assert!(
        matches!(err, LabError::Usage(_)) && err.to_string().contains("more than one shard"),
        "{err}"
    );
    std::fs::remove_file(&copy).expect("rm");
    std::fs::remove_file(&doubled).expect("rm");
    let err = runner::merge(&registry, &dirs, &merged.path().join("z")).unwrap_err();
    assert!(err.to_string().contains("is missing"), "{err}");
}

#[test]
fn render_only_renders_from_the_saved_cells() {
    let dir = tempfile::tempdir().expect("tmp");
    let a = report(&["dot-std", "why-softmax"], false, dir.path());
    std::fs::remove_file(dir.path().join("REPORT.md")).expect("rm");
    std::fs::remove_file(dir.path().join("why_softmax.png")).expect("rm");
    let before = cells(dir.path());
    let b = runner::render_only(&all_experiments(), dir.path()).expect("render-only");
    assert_eq!(fingerprint(&a), fingerprint(&b));
    assert!(dir.path().join("REPORT.md").is_file() && dir.path().join("why_softmax.png").is_file());
    assert_eq!(
        cells(dir.path()),
        before,
        "nothing measured, no cell touched"
    );
    // A missing cell is an error naming it, not a report with a hole.
    let (name, _) = before.into_iter().next().expect("a cell");
    std::fs::remove_file(dir.path().join("cells").join(&name)).expect("rm");
    let err = runner::render_only(&all_experiments(), dir.path()).unwrap_err();
    assert!(err.to_string().contains("is missing"), "{err}");
}

#[test]
fn a_cell_saved_under_another_key_is_measured_again() {
    let dir = tempfile::tempdir().expect("tmp");
    let a = report(&["dot-std"], false, dir.path());
    let before = cells(dir.path());
    let (name, _) = before.iter().next().expect("a cell");
    let path = dir.path().join("cells").join(name);
    // Another lab version wrote it (same file name: the name's hash is of the expected key).
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    v["key"]["lab"] = "0.0.0-other".into();
    v["result"]["pooled_std"] = 123.0.into();
    std::fs::write(&path, v.to_string()).expect("write");
    std::thread::sleep(Duration::from_millis(20));
    let b = report(&["dot-std"], false, dir.path());
    assert_eq!(
        fingerprint(&a),
        fingerprint(&b),
        "the foreign result was not used"
    );
    let after = cells(dir.path());
    for (n, (result, mtime)) in &after {
        let (old_result, old_mtime) = &before[n];
        assert_eq!(result, old_result);
        assert_eq!(
            mtime != old_mtime,
            n == name,
            "{n:?}: only the foreign cell is measured again"
        );
    }
}

#[test]
fn the_lab_writes_only_into_its_own_folders() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("results.json"), "mine").expect("write");
    let experiments = vec![find_experiment("dot-std").expect("exists")];
    let env = env(false);
    let err = runner::run(&experiments, &env, &options(&env, dir.path(), None)).unwrap_err();
    assert!(
        matches!(err, LabError::Usage(_)) && err.to_string().contains("results.json"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("results.json")).expect("read"),
        "mine"
    );
}

/// `sdpa exp … --quick --out DIR`, through the binary.
fn sdpa_exp(out: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sdpa"));
    c.args([
        "exp",
        "dot-std",
        "saturation",
        "attention-saturation",
        "why-softmax",
        "--quick",
        "--plain",
        "--out",
    ])
    .arg(out)
    .env("XDG_RUNTIME_DIR", std::env::temp_dir())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    c
}

#[test]
fn a_report_killed_with_sigkill_continues_and_ends_as_an_uninterrupted_one() {
    let whole = tempfile::tempdir().expect("tmp");
    assert!(sdpa_exp(whole.path()).status().expect("runs").success());
    let killed = tempfile::tempdir().expect("tmp");
    let mut child = sdpa_exp(killed.path()).spawn().expect("spawn");
    // Kill it once some cells are saved, before the report is written.
    let t0 = Instant::now();
    let saved = |dir: &Path| -> usize {
        std::fs::read_dir(dir.join("cells"))
            .map(|es| {
                es.flatten()
                    .map(|e| std::fs::read_dir(e.path()).map_or(0, |f| f.count()))
                    .sum()
            })
            .unwrap_or(0)
    };
    while saved(killed.path()) < 5 && t0.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    assert!(
        !killed.path().join("results.json").exists(),
        "killed before the end"
    );
    let before = cells(killed.path());
    assert!(!before.is_empty());
    assert!(sdpa_exp(killed.path()).status().expect("runs").success());
    let after = cells(killed.path());
    for (name, (result, mtime)) in &before {
        assert_eq!(
            after[name],
            (result.clone(), *mtime),
            "{name:?} was measured again"
        );
    }
    let read = |dir: &Path| -> Vec<(String, String)> {
        let v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("results.json")).expect("results"),
        )
        .expect("json");
        v["experiments"]
            .as_array()
            .expect("experiments")
            .iter()
            .map(|e| (e["claims"].to_string(), e["data"].to_string()))
            .collect()
    };
    assert_eq!(read(killed.path()), read(whole.path()));
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        cells(whole.path()).keys().collect::<Vec<_>>()
    );
}
