//! Training runs, third pass (issue 31): a lock that holds when its file is deleted, lock files
//! that are not what the lab wrote, and resumes that change only what may change.

use std::path::Path;

use crate::runs::{spawn, wait_for_rows};
use crate::training::{metrics, resume_args, run, train_args};
use crate::{code, text};

#[test]
fn deleting_the_lock_file_does_not_let_a_second_writer_in() {
    let root = tempfile::tempdir().expect("tmp");
    let steps = 400;
    let whole = root.path().join("whole");
    assert_eq!(code(&run(&train_args(&whole, steps))), Some(0));
    let dir = root.path().join("run");
    let mut first = spawn(&train_args(&dir, steps));
    wait_for_rows(&dir, 25);
    std::fs::remove_file(dir.join("run.lock")).expect("rm run.lock");
    let mut again = train_args(&dir, steps);
    again.push("--overwrite".into());
    let second = run(&again);
    assert_eq!(code(&second), Some(2), "{}", text(&second));
    assert!(text(&second).contains("in use"), "{}", text(&second));
    // The first run is untouched: it finishes, with the uninterrupted run's numbers.
    assert!(first.wait().expect("wait").success());
    assert_eq!(metrics(&dir), metrics(&whole));
}

#[test]
fn lock_files_the_lab_did_not_write_are_read_safely() {
    let root = tempfile::tempdir().expect("tmp");
    // Not UTF-8, naming nobody: nothing holds it, so a run takes it.
    let dir = root.path().join("bytes");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::write(dir.join("run.lock"), [0xff, 0xfe, 0x00, 0x80]).expect("write");
    let out = run(&train_args(&dir, 5));
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    // Another host's lock (with an escape sequence in its name): refused, the name printed
    // escaped, and the user is never told to delete a lock a live run may hold.
    let dir = root.path().join("other-host");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::write(dir.join("run.lock"), "pid 77\nhost \u{1b}[31mfar\nend\n").expect("write");
    let out = run(&train_args(&dir, 5));
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    let said = text(&out);
    assert!(!said.contains('\u{1b}'), "{said:?}");
    assert!(
        said.contains("\\u{1b}[31mfar") && said.contains("pid 77"),
        "{said}"
    );
    assert!(!said.contains("delete"), "{said}");
    assert!(said.contains("may still be running"), "{said}");
}

#[test]
fn a_resume_may_change_the_path_and_the_budget_but_nothing_else() {
    let root = tempfile::tempdir().expect("tmp");
    let with_log_every = |dir: &Path, steps: usize| {
        let mut args = train_args(dir, steps);
        let at = args.iter().position(|a| a == "--log-every").expect("flag");
        args[at + 1] = "5".into();
        args
    };
    // Extended on resume, with a last step that is not a logged one: the rows of an
    // uninterrupted run of the new budget.
    let whole = root.path().join("whole");
    assert_eq!(code(&run(&with_log_every(&whole, 40))), Some(0));
    let dir = root.path().join("run");
    assert_eq!(code(&run(&with_log_every(&dir, 23))), Some(0));
    assert!(metrics(&dir).iter().any(|(step, _)| *step == 22));
    let mut resume = resume_args(&dir, 40);
    // The attention path is a choice of speed: it may change on resume.
    resume.extend(["--implementation".into(), "naive".into()]);
    let out = run(&resume);
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    let steps = |d: &Path| metrics(d).iter().map(|(s, _)| *s).collect::<Vec<_>>();
    assert_eq!(steps(&dir), steps(&whole));
    // Another model is not a resume: refused as bad usage (exit 2), naming the setting.
    let mut other = resume_args(&dir, 60);
    other.extend(["--lr".into(), "0.5".into()]);
    let out = run(&other);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains("lr"), "{}", text(&out));
}
