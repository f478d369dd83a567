//! A full disk (issue 65, item 9): a run that cannot write its checkpoint or rows says which
//! file and the operating system's own words, not Burn's internal `Io("I/O error: …")`; and a
//! read-only folder (item 6). Needs a small tmpfs, which only root may mount: elsewhere the
//! tests say so and pass, unless `SDPA_TEST_MOUNT=1` (set by CI, which runs as root) makes a
//! mount that fails a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::training::{run, train_args};
use crate::{arg, code, text};

/// A tmpfs mounted for one test, unmounted when dropped (a failed assertion included).
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(arg(&self.0)).status();
    }
}

/// Mounts a tmpfs at `dir` with `options` (`size=24k`, `ro,size=64k`); `None` where this user
/// may not.
fn mount_tmpfs(dir: &Path, options: &str) -> Option<Mounted> {
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", options, "tmpfs", &arg(dir)])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        mounted || std::env::var_os("SDPA_TEST_MOUNT").is_none(),
        "SDPA_TEST_MOUNT is set but a tmpfs could not be mounted at {}",
        dir.display()
    );
    mounted.then(|| Mounted(dir.to_path_buf()))
}

#[test]
fn a_full_disk_is_named_as_a_person_reads_it() {
    let root = tempfile::tempdir().expect("tmp");
    let disk = root.path().join("disk");
    std::fs::create_dir_all(&disk).expect("mkdir");
    // Room for the config and the first rows, not for a checkpoint of the model.
    let Some(mounted) = mount_tmpfs(&disk, "size=24k") else {
        eprintln!("cannot mount a tmpfs here (not root): the full-disk check did not run");
        return;
    };
    let out = run(&train_args(&disk.join("run"), 30));
    drop(mounted);
    let shown = text(&out);
    assert_eq!(code(&out), Some(1), "{shown}");
    assert!(
        shown.contains("No space left on device") && shown.contains(&arg(&disk)),
        "the message names the file and the OS error: {shown}"
    );
    assert!(
        !shown.contains("Io(") && !shown.contains("I/O error: "),
        "Burn's internal wording: {shown}"
    );
    assert!(!shown.contains("panicked"), "{shown}");
}

/// A folder that cannot be written (a read-only file system) is the user's choice: exit 2 on
/// every subcommand that writes, naming the folder (issue 65, item 6: `train`, `report` and
/// `exp` answered 1, `bench` and `train-bench` 2).
#[test]
fn an_unwritable_out_is_bad_usage_on_every_subcommand() {
    let root = tempfile::tempdir().expect("tmp");
    let disk = root.path().join("ro");
    std::fs::create_dir_all(&disk).expect("mkdir");
    let Some(mounted) = mount_tmpfs(&disk, "ro,size=64k") else {
        eprintln!("cannot mount a read-only tmpfs here (not root): the check did not run");
        return;
    };
    let mut failures = Vec::new();
    for out in [disk.clone(), disk.join("new")] {
        let out = arg(&out);
        for args in [
            vec!["train", "--steps", "2", "--plain", "--out", &out],
            vec!["report", "--quick", "--plain", "--out", &out],
            vec!["exp", "dot-std", "--quick", "--plain", "--out", &out],
            vec![
                "bench",
                "--quick",
                "--n",
                "8",
                "--mode",
                "forward",
                "--skip-memory",
                "--out",
                &out,
            ],
            vec![
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
            ],
        ] {
            let result = crate::sdpa(&args);
            let shown = text(&result);
            if code(&result) != Some(2)
                || !shown.contains(&arg(&disk))
                || shown.contains("panicked")
            {
                failures.push(format!("{args:?}: exit {:?}: {shown}", code(&result)));
            }
        }
    }
    drop(mounted);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An --out that cannot be created (below /proc, where no folder can be made) is the user's
/// choice of folder: exit 2 on every subcommand that writes, naming it (it was exit 1, "No such
/// file or directory", for train, report and exp).
#[test]
fn an_out_that_cannot_be_created_is_bad_usage() {
    if !Path::new("/proc/self").exists() {
        eprintln!("no /proc here: the check did not run");
        return;
    }
    let out = "/proc/sdpa-cannot-be-created/run";
    let mut failures = Vec::new();
    for args in [
        vec!["train", "--steps", "2", "--plain", "--out", out],
        vec!["report", "--quick", "--plain", "--out", out],
        vec!["exp", "dot-std", "--quick", "--plain", "--out", out],
        vec![
            "bench",
            "--quick",
            "--n",
            "8",
            "--mode",
            "forward",
            "--skip-memory",
            "--out",
            out,
        ],
    ] {
        let result = crate::sdpa(&args);
        let shown = text(&result);
        if code(&result) != Some(2) || !shown.contains("/proc/sdpa-cannot-be-created") {
            failures.push(format!("{args:?}: exit {:?}: {shown}", code(&result)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
