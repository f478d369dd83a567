//! What a resume reads, fourth pass (issue 51): a `state.json` re-sealed with rows it does not
//! cover, `metrics.csv` lines after the checkpoint's rows and non-finite numbers before them,
//! huge files, unknown fields, conflicting flags, a changed attention path, and messages that
//! name what the user typed.

use std::time::{Duration, Instant};

use crate::starts::{snapshot, with};
use crate::training::{copy_dir_all, metrics, resume_args, run, train_args};
use crate::{arg, code, text};

/// 64-bit FNV-1a, as the checkpoint's checksums are written.
fn fnv(bytes: &[u8]) -> String {
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// A `state.json` text with its own checksum recomputed (what a careful forger does).
pub(crate) fn reseal(text: &str) -> String {
    let start = text.find("\"state_checksum\": ").expect("a checksum field");
    let end = start + text[start..].find('\n').expect("line end");
    let comma = if text[..end].ends_with(',') { "," } else { "" };
    let bare = format!(
        "{}\"state_checksum\": null{comma}{}",
        &text[..start],
        &text[end..]
    );
    let sum = fnv(bare.as_bytes());
    bare.replacen(
        "\"state_checksum\": null",
        &format!("\"state_checksum\": \"{sum}\""),
        1,
    )
}

#[test]
fn a_resealed_state_whose_rows_do_not_match_its_step_is_refused() {
    let root = tempfile::tempdir().expect("tmp");
    let source = root.path().join("source");
    assert_eq!(code(&run(&train_args(&source, 30))), Some(0));
    // Re-sealing an unchanged state keeps it valid: the forgery below is caught by its content.
    let dir = root.path().join("resealed");
    copy_dir_all(&source, &dir);
    let path = dir.join("checkpoint/state.json");
    let state = std::fs::read_to_string(&path).expect("state");
    std::fs::write(&path, reseal(&state)).expect("write");
    assert_eq!(code(&run(&resume_args(&dir, 40))), Some(0));
    for rows_through in ["0", "12", "29"] {
        let dir = root.path().join(format!("rows-{rows_through}"));
        copy_dir_all(&source, &dir);
        let path = dir.join("checkpoint/state.json");
        let state = std::fs::read_to_string(&path).expect("state");
        let edited = state.replace(
            "\"rows_through\": 30",
            &format!("\"rows_through\": {rows_through}"),
        );
        assert_ne!(edited, state);
        std::fs::write(&path, reseal(&edited)).expect("write");
        let before = snapshot(&dir);
        let out = run(&resume_args(&dir, 40));
        assert_eq!(code(&out), Some(1), "{rows_through}: {}", text(&out));
        assert!(text(&out).contains("rows_through"), "{}", text(&out));
        assert_eq!(snapshot(&dir), before, "{rows_through}: nothing changes");
    }
}

#[test]
fn metrics_lines_after_the_checkpoints_rows_are_left_out_and_numbers_before_it_checked() {
    let root = tempfile::tempdir().expect("tmp");
    let whole = root.path().join("whole");
    assert_eq!(code(&run(&train_args(&whole, 40))), Some(0));
    let source = root.path().join("source");
    assert_eq!(code(&run(&train_args(&source, 30))), Some(0));
    let good = std::fs::read_to_string(source.join("metrics.csv")).expect("csv");
    // After the checkpoint's rows (all 30 of them): garbage the resumed run recomputes.
    for (name, tail) in [
        ("nul", vec![0u8; 300]),
        ("xyz", b"xyz".to_vec()),
        ("long", vec![b'7'; 3 << 20]),
    ] {
        let dir = root.path().join(name);
        copy_dir_all(&source, &dir);
        let mut bytes = good.clone().into_bytes();
        bytes.extend(tail);
        bytes.push(b'\n');
        std::fs::write(dir.join("metrics.csv"), bytes).expect("write");
        let out = run(&resume_args(&dir, 40));
        assert_eq!(code(&out), Some(0), "{name}: {}", text(&out));
        assert_eq!(metrics(&dir), metrics(&whole), "{name}");
    }
    // Before it: a NaN gradient norm, an infinite entropy, and a 5 MB line, each refused, the
    // line named and quoted short.
    let lines: Vec<String> = good.lines().map(String::from).collect();
    let edit = |row: usize, column: usize, value: &str| {
        let mut out = lines.clone();
        let mut cells: Vec<String> = out[row].split(',').map(String::from).collect();
        cells[column] = value.into();
        out[row] = cells.join(",");
        out.join("\n") + "\n"
    };
    let long = {
        let mut out = lines.clone();
        out[12] = "x".repeat(5 << 20);
        out.join("\n") + "\n"
    };
    for (name, bytes, needle) in [
        ("nan-grad", edit(4, 3, "NaN"), "grad_norm"),
        ("inf-entropy", edit(8, 9, "inf"), "entropy"),
        ("long-line", long, "line 13"),
    ] {
        let dir = root.path().join(name);
        copy_dir_all(&source, &dir);
        std::fs::write(dir.join("metrics.csv"), &bytes).expect("write");
        let out = run(&resume_args(&dir, 40));
        assert_eq!(
            code(&out),
            Some(1),
            "{name}: {}",
            &text(&out)[..2000.min(text(&out).len())]
        );
        assert!(text(&out).contains(needle), "{name}: {}", text(&out));
        assert!(text(&out).len() < 4000, "{name}: a short message");
        assert_eq!(
            std::fs::read_to_string(dir.join("metrics.csv")).expect("csv"),
            bytes,
            "{name}: left as it was"
        );
    }
}

#[test]
fn huge_checkpoint_files_are_refused_from_their_size() {
    let root = tempfile::tempdir().expect("tmp");
    let source = root.path().join("source");
    assert_eq!(code(&run(&train_args(&source, 20))), Some(0));
    for file in [
        "checkpoint/optim.bpk",
        "checkpoint/model.bpk",
        "config.json",
    ] {
        let dir = root.path().join(file.replace('/', "-"));
        copy_dir_all(&source, &dir);
        // Sparse: 3 GB that take no disk, and would take seconds to read.
        let handle = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join(file))
            .expect("open");
        handle.set_len(3 << 30).expect("grow");
        drop(handle);
        let start = Instant::now();
        let out = run(&resume_args(&dir, 30));
        assert_eq!(code(&out), Some(1), "{file}: {}", text(&out));
        assert!(text(&out).contains("bytes"), "{file}: {}", text(&out));
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{file}: refused from its size, not read: {:?}",
            start.elapsed()
        );
    }
}

#[test]
fn a_changed_attention_path_says_the_rows_may_differ() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("run");
    assert_eq!(code(&run(&train_args(&dir, 20))), Some(0));
    let out = run(&with(resume_args(&dir, 30), &["--implementation", "naive"]));
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("may differ") && text(&out).contains("naive"),
        "{}",
        text(&out)
    );
    // The path is the run's now: resuming on it again changes nothing, and says nothing.
    let out = run(&with(resume_args(&dir, 40), &["--implementation", "naive"]));
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert!(!text(&out).contains("may differ"), "{}", text(&out));
}

#[test]
fn momentum_with_adam_is_refused() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("momentum");
    let out = run(&with(train_args(&dir, 5), &["--momentum", "0.9"]));
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains("momentum"), "{}", text(&out));
    assert!(!dir.exists());
    let out = run(&with(
        train_args(&dir, 5),
        &["--momentum", "0.9", "--optimizer", "sgd"],
    ));
    assert_eq!(code(&out), Some(0), "SGD takes it: {}", text(&out));
}

#[test]
fn an_unknown_field_in_config_json_is_refused() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("run");
    assert_eq!(code(&run(&train_args(&dir, 5))), Some(0));
    let config = std::fs::read_to_string(dir.join("config.json")).expect("config");
    for (name, edited) in [
        (
            "top",
            config.replacen("{\n", "{\n  \"zzz_unknown\": 1,\n", 1),
        ),
        (
            "nested",
            config.replacen("\"task\": {\n", "\"task\": {\n    \"zzz_unknown\": 1,\n", 1),
        ),
    ] {
        assert_ne!(edited, config, "{name}");
        std::fs::write(dir.join("config.json"), &edited).expect("write");
        let before = snapshot(&dir);
        let out = run(&resume_args(&dir, 10));
        assert_eq!(code(&out), Some(1), "{name}: {}", text(&out));
        assert!(text(&out).contains("zzz_unknown"), "{name}: {}", text(&out));
        assert_eq!(snapshot(&dir), before, "{name}");
    }
}

#[test]
fn a_changed_k_is_named_as_k() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("run");
    assert_eq!(code(&run(&train_args(&dir, 10))), Some(0));
    let before = snapshot(&dir);
    let out = run(&with(resume_args(&dir, 30), &["--k", "5"]));
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains("task.k"), "{}", text(&out));
    assert_eq!(snapshot(&dir), before);
}

#[test]
fn a_resume_with_nothing_to_do_keeps_the_recorded_speed() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("run");
    assert_eq!(code(&run(&train_args(&dir, 20))), Some(0));
    let rate = |d: &std::path::Path| {
        let s = std::fs::read_to_string(d.join("summary.json")).expect("summary");
        let v: serde_json::Value = serde_json::from_str(&s).expect("json");
        v["steps_per_s"].as_f64().expect("a number")
    };
    let was = rate(&dir);
    assert!(was > 0.0);
    let out = run(&resume_args(&dir, 20));
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert_eq!(rate(&dir), was);
}

#[test]
fn a_fifo_on_resume_is_named_as_one() {
    let root = tempfile::tempdir().expect("tmp");
    let dir = root.path().join("run");
    assert_eq!(code(&run(&train_args(&dir, 10))), Some(0));
    std::fs::remove_file(dir.join("metrics.csv")).expect("rm");
    let made = std::process::Command::new("mkfifo")
        .arg(dir.join("metrics.csv"))
        .status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("skipped: no mkfifo");
        return;
    }
    let out = run(&resume_args(&dir, 30));
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(!text(&out).contains("refusing to remove"), "{}", text(&out));
    assert!(text(&out).contains("FIFO"), "{}", text(&out));
}

#[test]
fn an_out_link_to_nothing_is_bad_usage() {
    let root = tempfile::tempdir().expect("tmp");
    let link = root.path().join("dangling");
    let target = root.path().join("nowhere");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let out = run(&train_args(&link, 5));
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains("does not exist"), "{}", text(&out));
    assert!(!target.exists(), "nothing is created at its target");
}

#[test]
fn a_folder_name_holding_a_newline_is_printed_escaped() {
    let root = tempfile::tempdir().expect("tmp");
    let odd = root.path().join("two\nlines");
    let out = run(&train_args(&odd, 3));
    assert_eq!(code(&out), Some(0), "{}", text(&out));
    assert!(text(&out).contains("two\\nlines"), "{}", text(&out));
    assert!(!text(&out).contains("two\nlines"), "{}", text(&out));
    // Its errors too: a second fresh run there is refused, the name escaped.
    let out = run(&train_args(&odd, 3));
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    assert!(text(&out).contains("two\\nlines"), "{}", text(&out));
    assert!(!text(&out).contains("two\nlines"), "{}", text(&out));
    assert!(odd.join("metrics.csv").exists(), "{}", arg(&odd));
}
