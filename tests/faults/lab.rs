//! The lab's folders under attack, third pass (issue 31): cells edited on disk or measured by other
//! code, two writers on one folder, links where the lab writes, tampered `run.json`, killed
//! renders, and folders the lab does not own — through the real `sdpa` binary.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::{arg, code, sdpa, text};

/// `sdpa exp dot-std --quick` into `dir` (a fraction of a second).
fn dot_std(dir: &Path) -> std::process::Output {
    sdpa(&["exp", "dot-std", "--quick", "--plain", "--out", &arg(dir)])
}

fn render_only(dir: &Path) -> std::process::Output {
    sdpa(&["report", "--render-only", &arg(dir)])
}

/// The saved cells of `experiment` in `dir`.
fn cells(dir: &Path, experiment: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("cells").join(experiment))
        .expect("cells")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    v
}

fn spawn(args: &[&str]) -> Child {
    crate::runs::spawn(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
}

/// `sdpa exp dot-std --quick` as shards 0/2 and 1/2, into `root/s0` and `root/s1`.
pub(crate) fn two_shards(root: &Path) -> Vec<PathBuf> {
    let shards: Vec<PathBuf> = (0..2).map(|i| root.join(format!("s{i}"))).collect();
    for (i, s) in shards.iter().enumerate() {
        let shard = format!("{i}/2");
        let o = sdpa(&[
            "exp",
            "dot-std",
            "--quick",
            "--plain",
            "--shard",
            &shard,
            "--out",
            &arg(s),
        ]);
        assert_eq!(code(&o), Some(0), "{}", text(&o));
    }
    shards
}

/// Waits until `path` holds text (a lock naming its holder), or a minute passes.
fn wait_for_text(path: &Path) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        if std::fs::read_to_string(path).is_ok_and(|t| t.contains("pid")) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("{} never named its holder", path.display());
}

/// Whether `bytes` are a whole PNG: the signature, and the IEND chunk at the end.
fn whole_png(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.ends_with(b"IEND\xaeB`\x82")
}

#[test]
fn an_edited_cell_is_measured_again_and_never_rendered() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("r");
    assert_eq!(code(&dot_std(&dir)), Some(0));
    let report = std::fs::read_to_string(dir.join("APPENDIX.md")).expect("appendix");
    assert!(
        report.contains("all 4 cells measured by this process"),
        "{report}"
    );
    // Edit one number inside a cell, keeping the JSON valid (a negative std, even).
    let cell = cells(&dir, "dot-std")[0].clone();
    let saved = std::fs::read_to_string(&cell).expect("cell");
    let v: serde_json::Value = serde_json::from_str(&saved).expect("json");
    let std = v["cell"]["result"]["pooled_std"].as_f64().expect("a std");
    let edited = saved.replace(&format!("\"pooled_std\":{std}"), "\"pooled_std\":-3.5");
    assert_ne!(edited, saved);
    assert!(serde_json::from_str::<serde_json::Value>(&edited).is_ok());
    std::fs::write(&cell, edited).expect("edit");
    // --render-only refuses it by name; a report measures it again, saying so.
    let out = render_only(&dir);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("damaged") && text(&out).contains("checksum"),
        "{}",
        text(&out)
    );
    let out = dot_std(&dir);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert!(text(&out).contains("measuring it again"), "{}", text(&out));
    let healed: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cell).expect("cell")).expect("json");
    assert!(
        healed["cell"]["result"]["pooled_std"]
            .as_f64()
            .expect("std")
            > 0.0
    );
    let report = std::fs::read_to_string(dir.join("APPENDIX.md")).expect("appendix");
    assert!(
        report.contains("1 of 4 cells measured by this process, 3 reused from saved cells (3 measured by the run of"),
        "{report}"
    );
    assert_eq!(code(&render_only(&dir)), Some(0));
}

#[test]
fn a_cell_from_other_code_is_never_reused() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("r");
    assert_eq!(code(&dot_std(&dir)), Some(0));
    // The same cell as another build of the lab would have saved it: another code fingerprint.
    let cell = cells(&dir, "dot-std")[0].clone();
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cell).expect("cell")).expect("json");
    let ours = v["cell"]["key"]["code"]
        .as_str()
        .expect("a fingerprint")
        .to_string();
    assert_eq!(ours.len(), 16, "{ours}");
    v["cell"]["key"]["code"] = serde_json::json!("0123456789abcdef");
    std::fs::remove_file(&cell).expect("rm");
    let other = cell.with_file_name(format!(
        "{}--0000000000000000.json",
        cell.file_name()
            .expect("name")
            .to_string_lossy()
            .split("--")
            .next()
            .expect("id")
    ));
    std::fs::write(&other, serde_json::to_string(&v).expect("json")).expect("write");
    let out = render_only(&dir);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("measured by other code") && text(&out).contains(&ours),
        "{}",
        text(&out)
    );
    // A run measures it again under this build's key.
    assert_eq!(code(&dot_std(&dir)), Some(0));
    assert_eq!(code(&render_only(&dir)), Some(0));
}

#[test]
fn one_writer_per_lab_folder() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("r");
    let out = arg(&dir);
    // A slow writer: the quick training experiment takes seconds.
    let mut first = spawn(&["exp", "training", "--quick", "--plain", "--out", &out]);
    wait_for_text(&dir.join("lab.lock"));
    let pid = first.id().to_string();
    for args in [
        vec!["exp", "dot-std", "--quick", "--plain", "--out", &out],
        vec!["report", "--quick", "--seed", "2", "--plain", "--out", &out],
        vec!["report", "--render-only", &out],
    ] {
        let second = sdpa(&args);
        assert_eq!(code(&second), Some(2), "{args:?}: {}", text(&second));
        assert!(
            text(&second).contains("in use by another lab run") && text(&second).contains(&pid),
            "{}",
            text(&second)
        );
    }
    assert!(first.wait().expect("wait").success());
    // Its report is whole: one experiment, its own seed.
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).expect("run.json"))
            .expect("json");
    assert_eq!(run["experiments"], serde_json::json!(["training"]));
    assert_eq!(code(&render_only(&dir)), Some(0));
}

/// Two lab runs started together on a new folder, and on an empty one (issue 65, item 5): one
/// writes it, the other exits 2 saying the folder is in use by another lab run, every time (it
/// used to exit 1 with "D/.sdpa-lab: No such file or directory", both writing the manifest).
#[test]
fn two_lab_runs_started_together_one_wins_the_other_is_told() {
    let root = tempfile::tempdir().expect("tmp");
    for attempt in 0..4 {
        let dir = root.path().join(format!("d{attempt}"));
        if attempt % 2 == 1 {
            std::fs::create_dir(&dir).expect("an empty folder");
        }
        let out = arg(&dir);
        let outputs =
            crate::twice_at_once(&["exp", "dot-std", "--quick", "--plain", "--out", &out]);
        crate::assert_one_wins(&outputs, "in use by another lab run", attempt);
        assert_eq!(code(&render_only(&dir)), Some(0), "attempt {attempt}");
    }
}

#[cfg(unix)]
#[test]
fn the_lab_never_writes_or_deletes_through_a_link() {
    use std::os::unix::fs::symlink;
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("r");
    assert_eq!(code(&dot_std(&dir)), Some(0));
    let victim = root.path().join("victim");
    std::fs::write(&victim, "the user's").expect("write");
    // A link at a plot's name, at the temporary names the lab writes through, and at run.json's.
    for name in [
        "dot_std.png",
        "REPORT.md.tmp",
        "dot_std.png.tmp",
        "results.json.tmp",
    ] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        symlink(&victim, &link).expect("symlink");
    }
    let out = render_only(&dir);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "the user's"
    );
    let png = std::fs::symlink_metadata(dir.join("dot_std.png")).expect("png");
    assert!(png.is_file(), "the link was replaced by the plot");
    assert!(whole_png(
        &std::fs::read(dir.join("dot_std.png")).expect("png")
    ));
    // A link where the lab keeps a cell folder: refused, and nothing in its target touched.
    let users = root.path().join("users-folder");
    std::fs::create_dir(&users).expect("mkdir");
    std::fs::write(users.join(".notes.tmp-1"), "keep").expect("write");
    std::fs::write(users.join("x.tmp"), "keep").expect("write");
    let cells_dir = dir.join("cells/dot-std");
    std::fs::remove_dir_all(&cells_dir).expect("rm");
    symlink(&users, &cells_dir).expect("symlink");
    let out = dot_std(&dir);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains("symbolic link"), "{}", text(&out));
    let mut left: Vec<String> = std::fs::read_dir(&users)
        .expect("ls")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, [".notes.tmp-1", "x.tmp"]);
    // The bench writes its files the same way. (A folder holding a link of a bench file's name
    // is not the benches' own: refused as it is, written with --overwrite, issue 51 item 4.)
    let bench = root.path().join("bench");
    std::fs::create_dir(&bench).expect("mkdir");
    symlink(&victim, bench.join("bench_flex.json")).expect("symlink");
    let run = |extra: &[&str]| {
        let out = arg(&bench);
        let mut args = vec![
            "bench",
            "--quick",
            "--backend",
            "flex",
            "--n",
            "16",
            "--skip-memory",
            "--out",
            &out,
        ];
        args.extend_from_slice(extra);
        sdpa(&args)
    };
    let out = run(&[]);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(
        std::fs::symlink_metadata(bench.join("bench_flex.json"))
            .expect("json")
            .file_type()
            .is_symlink()
    );
    let out = run(&["--overwrite"]);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "the user's"
    );
    assert!(
        std::fs::symlink_metadata(bench.join("bench_flex.json"))
            .expect("json")
            .is_file()
    );
}

#[test]
fn a_tampered_run_json_is_refused_by_name() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("r");
    assert_eq!(code(&dot_std(&dir)), Some(0));
    let path = dir.join("run.json");
    let good: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("run.json")).expect("json");
    for (field, value, expect) in [
        (
            "shard",
            serde_json::json!({"index": 5, "count": 3}),
            "`shard`",
        ),
        (
            "shard",
            serde_json::json!({"index": 0, "count": 0}),
            "`shard`",
        ),
        ("experiments", serde_json::json!([]), "`experiments`"),
        (
            "experiments",
            serde_json::json!(["dot-std", "dot-std"]),
            "`experiments`",
        ),
    ] {
        let mut v = good.clone();
        v[field] = value;
        std::fs::write(&path, serde_json::to_string(&v).expect("json")).expect("write");
        let out = render_only(&dir);
        assert_eq!(code(&out), Some(2), "{field}: {}", text(&out));
        assert!(
            text(&out).contains(expect) && text(&out).contains("run.json"),
            "{}",
            text(&out)
        );
    }
    let mut v = good.clone();
    v["plan"]["backends"] = serde_json::json!([]);
    std::fs::write(&path, serde_json::to_string(&v).expect("json")).expect("write");
    let out = render_only(&dir);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains("`plan.backends`"), "{}", text(&out));
    // A merge reads the shards' run.json the same way.
    let mut v = good.clone();
    v["shard"] = serde_json::json!({"index": 5, "count": 3});
    std::fs::write(&path, serde_json::to_string(&v).expect("json")).expect("write");
    let merged = root.path().join("merged");
    let out = sdpa(&["report", "--merge", &arg(&dir), "--out", &arg(&merged)]);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains("`shard`"), "{}", text(&out));
}

#[test]
fn a_killed_render_never_leaves_a_broken_plot() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("r");
    let out = arg(&dir);
    assert_eq!(
        code(&sdpa(&[
            "exp",
            "attention-map",
            "--quick",
            "--plain",
            "--out",
            &out
        ])),
        Some(0)
    );
    for k in 0..12u64 {
        let mut child = spawn(&["report", "--render-only", &out]);
        std::thread::sleep(Duration::from_millis(20 + 15 * k));
        let _ = child.kill();
        let _ = child.wait();
        for entry in std::fs::read_dir(&dir).expect("ls").flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".png") {
                let bytes = std::fs::read(entry.path()).expect("png");
                assert!(
                    whole_png(&bytes),
                    "kill {k}: {name} is broken ({} bytes)",
                    bytes.len()
                );
            }
        }
    }
    // The next run removes what the killed ones left.
    assert_eq!(code(&render_only(&dir)), Some(0));
    let left: Vec<String> = std::fs::read_dir(&dir)
        .expect("ls")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp") || n.contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn every_subcommand_keeps_to_the_labs_own_folders() {
    let root = tempfile::tempdir().expect("tmp");
    // --render-only into a user's folder: refused, nothing written.
    let user = root.path().join("user");
    std::fs::create_dir(&user).expect("mkdir");
    std::fs::write(user.join("REPORT.md"), "my notes").expect("write");
    std::fs::write(user.join("run.json"), "{}").expect("write");
    let out = render_only(&user);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains(".sdpa-lab"), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(user.join("REPORT.md")).expect("notes"),
        "my notes"
    );
    // --render-only with --out: refused (it renders in place).
    let dir = root.path().join("r");
    assert_eq!(code(&dot_std(&dir)), Some(0));
    let out = sdpa(&["report", "--render-only", &arg(&dir), "--out", &arg(&user)]);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    // --merge into one of its shards: refused, the shard untouched.
    let shards = two_shards(root.path());
    let before = std::fs::read_to_string(shards[0].join("run.json")).expect("run.json");
    let out = sdpa(&[
        "report",
        "--merge",
        &arg(&shards[0]),
        &arg(&shards[1]),
        "--out",
        &arg(&shards[0]),
    ]);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains("one of the shards"), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(shards[0].join("run.json")).expect("run.json"),
        before
    );
    let merged = root.path().join("merged");
    let out = sdpa(&[
        "report",
        "--merge",
        &arg(&shards[0]),
        &arg(&shards[1]),
        "--out",
        &arg(&merged),
    ]);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
}

/// Second pass of an attacker's review: a shard count read from disk sizes nothing, the lock
/// file must be the lab's own, a user's `notes.tmp` survives, and names beside --render-only are
/// refused.
#[cfg(unix)]
#[test]
fn what_the_lab_reads_back_is_checked_before_it_is_trusted() {
    let root = tempfile::tempdir().expect("tmp");
    let shards = two_shards(root.path());
    for s in &shards {
        let path = s.join("run.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("run.json")).expect("json");
        v["shard"]["count"] = serde_json::json!(u64::MAX);
        std::fs::write(&path, serde_json::to_string(&v).expect("json")).expect("write");
    }
    let out = sdpa(&[
        "report",
        "--merge",
        &arg(&shards[0]),
        &arg(&shards[1]),
        "--out",
        &arg(&root.path().join("m")),
    ]);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    // A lab.lock hard-linked to a user's file, or a FIFO there: refused, the file intact.
    let dir = root.path().join("r");
    assert_eq!(code(&dot_std(&dir)), Some(0));
    let user = root.path().join("user-file");
    std::fs::write(&user, "important").expect("write");
    std::fs::remove_file(dir.join("lab.lock")).expect("rm");
    std::fs::hard_link(&user, dir.join("lab.lock")).expect("link");
    let out = render_only(&dir);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&user).expect("user"), "important");
    std::fs::remove_file(dir.join("lab.lock")).expect("rm");
    let fifo = Command::new("mkfifo")
        .arg(dir.join("lab.lock"))
        .status()
        .expect("mkfifo");
    assert!(fifo.success());
    let started = Instant::now();
    let out = render_only(&dir);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(started.elapsed() < Duration::from_secs(30));
    std::fs::remove_file(dir.join("lab.lock")).expect("rm");
    // A user's notes.tmp is not a lab temporary.
    std::fs::write(dir.join("notes.tmp"), "mine").expect("write");
    assert_eq!(code(&render_only(&dir)), Some(0));
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.tmp")).expect("notes"),
        "mine"
    );
    // Experiment names beside --render-only would be ignored: refused.
    let out = sdpa(&["exp", "saturation", "--render-only", &arg(&dir)]);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
}
