//! The golden runner isolates every case: a malformed one is that case's FAIL line, the run
//! always ends with `N passed, M failed`, and exits 1 when any failed.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::{arg, code, sdpa, text};

fn plain_case() -> Value {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("tests/data/golden/plain.json")).expect("case");
    serde_json::from_str(&text).expect("json")
}

fn write(dir: &Path, name: &str, case: &Value) {
    std::fs::write(dir.join(name), serde_json::to_string(case).unwrap()).expect("write");
}

#[test]
fn malformed_cases_fail_alone_and_the_run_always_sums_up() {
    let dir = tempfile::tempdir().expect("tmp");
    write(dir.path(), "a_plain.json", &plain_case());
    // grad_out whose shape differs from the context's (it used to panic inside Burn's Mul).
    let mut bad_grad = plain_case();
    bad_grad["grad_out"] = json!({"shape": [2, 3, 5, 1], "data": vec![0.0; 30]});
    write(dir.path(), "b_grad_out.json", &bad_grad);
    // A shape whose number of values overflows, with no data (it used to pass the length check
    // in release builds and panic).
    let mut overflow = plain_case();
    overflow["query"] = json!({"shape": [65536, 65536, 65536, 65536], "data": []});
    write(dir.path(), "c_overflow.json", &overflow);
    // A small file describing n = m = 60 000 (it used to abort the process on allocation).
    let mut huge = plain_case();
    let long = |d: usize| json!({"shape": [1, 1, 60000, d], "data": vec![0.5; 60000 * d]});
    huge["query"] = long(1);
    huge["key"] = long(1);
    huge["value"] = long(1);
    write(dir.path(), "d_huge.json", &huge);
    // Not JSON at all.
    std::fs::write(dir.path().join("e_garbage.json"), "{\"name\": ").expect("write");

    let out = sdpa(&["golden", &arg(dir.path()), "--backend", "flex"]);
    let printed = text(&out);
    assert_eq!(code(&out), Some(1), "{printed}");
    assert!(printed.contains("1 passed, 4 failed"), "{printed}");
    for needle in ["grad_out", "overflows", "too large", "e_garbage"] {
        assert!(
            printed.contains(needle),
            "no FAIL line names {needle}: {printed}"
        );
    }
    assert_eq!(printed.matches("FAIL").count(), 4, "{printed}");
}

#[test]
fn a_folder_without_cases_is_bad_usage() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = sdpa(&["golden", &arg(dir.path())]);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
    let out = sdpa(&["golden", &arg(&dir.path().join("missing"))]);
    assert_eq!(code(&out), Some(2), "{}", text(&out));
}

#[test]
fn every_entry_gets_a_line_and_names_are_escaped() {
    let dir = tempfile::tempdir().expect("tmp");
    write(dir.path(), "a_plain.json", &plain_case());
    std::os::unix::fs::symlink(
        dir.path().join("nowhere"),
        dir.path().join("b_dangling.json"),
    )
    .expect("symlink");
    std::os::unix::fs::symlink(
        dir.path().join("c_loop.json"),
        dir.path().join("c_loop.json"),
    )
    .expect("symlink");
    std::fs::create_dir(dir.path().join("d_folder.json")).expect("mkdir");
    let fifo = dir.path().join("e_fifo.json");
    let made = Command::new("mkfifo").arg(&fifo).status();
    let with_fifo = made.is_ok_and(|s| s.success());
    // A name that would print a forged success line of its own.
    write(
        dir.path(),
        "f_forged\nok   forged.json\n9 passed, 0 failed\n.json",
        &json!({"not": "a case"}),
    );
    // A case whose own name holds a newline.
    let mut named = plain_case();
    named["name"] = json!("g_named\nok   forged\n9 passed, 0 failed");
    write(dir.path(), "g_named.json", &named);
    let out = sdpa(&["golden", &arg(dir.path()), "--backend", "flex"]);
    let printed = text(&out);
    assert_eq!(code(&out), Some(1), "{printed}");
    let failed = if with_fifo { 5 } else { 4 };
    assert!(
        printed.contains(&format!("2 passed, {failed} failed")),
        "{printed}"
    );
    assert_eq!(printed.matches("FAIL").count(), failed, "{printed}");
    for needle in [
        "b_dangling",
        "c_loop",
        "d_folder",
        "f_forged\\n",
        "g_named\\n",
    ] {
        assert!(
            printed.contains(needle),
            "no line names {needle}: {printed}"
        );
    }
    if with_fifo {
        assert!(printed.contains("e_fifo"), "{printed}");
    }
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("ok")).count(),
        2,
        "{printed}"
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()) && l.contains("passed,"))
            .count(),
        1,
        "{printed}"
    );
}

#[test]
fn a_case_whose_text_holds_a_newline_prints_one_line() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut forged = plain_case();
    forged["causal"] = json!("x\nok   forged\n9 passed, 0 failed");
    write(dir.path(), "forged.json", &forged);
    let out = sdpa(&["golden", &arg(dir.path()), "--backend", "flex"]);
    let printed = text(&out);
    assert_eq!(code(&out), Some(1), "{printed}");
    assert!(printed.lines().all(|l| !l.starts_with("ok")), "{printed}");
    assert!(printed.contains("0 passed, 1 failed"), "{printed}");
}

fn case_from(folder: &str, name: &str) -> Value {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let text =
        std::fs::read_to_string(root.join("tests/data").join(folder).join(name)).expect("case");
    serde_json::from_str(&text).expect("json")
}

/// Valid inputs the format allows pass (or are refused with a typed error) the same way on every
/// path, and a tolerance that cannot fail is said on the case's line: `--strict` fails the case
/// (issue 31), without it the case is checked on the rest (issue 51, item 11).
#[test]
fn the_golden_runner_takes_every_valid_input_and_flags_a_tolerance_that_cannot_fail() {
    let dir = tempfile::tempdir().expect("tmp");
    // Segment ids beyond ±2³¹ mean what small ones mean (only equality counts).
    let mut far = case_from("golden-extensions2", "segments_packed.json");
    let shift = |rows: &Value, by: i64| -> Value {
        json!(
            rows.as_array()
                .expect("rows")
                .iter()
                .map(|r| r
                    .as_array()
                    .expect("a row")
                    .iter()
                    .map(|x| x.as_i64().expect("an id") * by + (1i64 << 40))
                    .collect::<Vec<i64>>())
                .collect::<Vec<_>>()
        )
    };
    let segments = far["segments"].clone();
    far["segments"]["query"] = shift(&segments["query"], 3);
    far["segments"]["key"] = shift(&segments["key"], 3);
    write(dir.path(), "a_far_segments.json", &far);
    let mut negative = case_from("golden-extensions2", "segments_packed.json");
    negative["segments"]["query"] = shift(&segments["query"], -(1i64 << 41));
    negative["segments"]["key"] = shift(&segments["key"], -(1i64 << 41));
    write(dir.path(), "b_negative_segments.json", &negative);
    // An ALiBi slope that is finite in f64 but not in f32: refused by the library, by name.
    let mut slope = case_from("golden-extensions2", "alibi.json");
    slope["alibi_slopes"][0] = json!(1e39);
    write(dir.path(), "c_huge_slope.json", &slope);
    // A tolerance under which anything passes.
    let mut loose = plain_case();
    loose["tolerance"] = json!({"abs": 1e300, "rel": 0.0});
    loose["expected"]["context"]["data"][0] = json!(1e6);
    write(dir.path(), "d_loose.json", &loose);
    // Loose for one tensor only: the expected weights all below abs, so zeros would pass them.
    let mut one_loose = plain_case();
    one_loose["tolerance"] = json!({"abs": 1.5, "rel": 0.0});
    write(dir.path(), "f_one_tensor_loose.json", &one_loose);
    let mut negative_tol = plain_case();
    negative_tol["tolerance"] = json!({"abs": -1.0, "rel": 0.0});
    write(dir.path(), "e_negative_tolerance.json", &negative_tol);
    // Every implementation that runs on flex, the chunked one included.
    let flex = sdpa::BackendFamily::Flex;
    for implementation in sdpa::Implementation::all(2).filter(|i| i.runs_on(flex)) {
        let implementation = &implementation.to_string();
        let run = |strict: bool| {
            let mut args = vec![
                "golden".to_string(),
                arg(dir.path()),
                "--backend".into(),
                "flex".into(),
                "--implementation".into(),
                implementation.clone(),
            ];
            if strict {
                args.push("--strict".into());
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            sdpa(&args)
        };
        let out = run(true);
        let printed = text(&out);
        assert_eq!(code(&out), Some(1), "{implementation}: {printed}");
        assert!(
            printed.contains("2 passed, 4 failed"),
            "{implementation}: {printed}"
        );
        assert!(
            printed.contains("cannot fail on")
                && printed.contains("expected.weights")
                && printed.contains("abs = 1e300"),
            "{implementation}: {printed}"
        );
        assert!(!printed.contains("panicked"), "{implementation}: {printed}");
        assert!(
            printed.contains("alibi_slopes"),
            "{implementation}: {printed}"
        );
        assert!(
            printed.contains("must be finite and ≥ 0"),
            "{implementation}: {printed}"
        );
        // Without --strict the loose cases are checked on what can fail, and say the rest.
        let out = run(false);
        let printed = text(&out);
        assert_eq!(code(&out), Some(1), "{implementation}: {printed}");
        assert!(
            printed.contains("4 passed, 2 failed; 2 of the passed with a check that cannot fail"),
            "{implementation}: {printed}"
        );
        for file in ["d_loose.json", "f_one_tensor_loose.json"] {
            let line = printed.lines().find(|l| l.contains(file)).unwrap_or("");
            assert!(
                line.starts_with("ok") && line.contains("(cannot fail)"),
                "{implementation}: {file}: {printed}"
            );
        }
        assert!(
            printed.contains("must be finite and ≥ 0"),
            "{implementation}: {printed}"
        );
    }
}

/// Scores that overflow f32 on finite inputs follow one rule on every implementation (issue 51,
/// item 6): the hand-made cases of `tests/data/golden-overflow` (their README states the rule)
/// pass, under `--strict`, on every path that runs on the CPU backends, forward, backward and
/// row statistics. Before, the CPU kernel (which `Auto` takes there) gave a zero row for the
/// issue's example, and Naive, Chunked and Fused NaN.
#[test]
fn scores_that_overflow_follow_one_rule_on_every_implementation() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("tests/data/golden-overflow");
    for backend in ["flex", "ndarray"] {
        for implementation in [
            "naive",
            "chunked:2",
            "chunked",
            "fused",
            "cpu_kernel",
            "auto",
        ] {
            let out = sdpa(&[
                "golden",
                &arg(&dir),
                "--backend",
                backend,
                "--implementation",
                implementation,
                "--strict",
            ]);
            let printed = text(&out);
            assert_eq!(code(&out), Some(0), "{backend} {implementation}: {printed}");
            assert!(
                printed.contains("4 passed, 0 failed"),
                "{backend} {implementation}: {printed}"
            );
        }
    }
}

/// The issue's example through the library on Flex: the CPU kernel asked for by name no longer
/// returns the zero row it returned (the call is reported and run as the chunked path), the
/// context is v0 and v0 gets the row's whole value gradient; an ordinary call, and one whose
/// non-finite inputs the non-finite policy handles, keeps the kernel.
#[test]
fn the_issue_s_overflowing_example_is_v0_and_keeps_its_value_gradient() {
    use burn::prelude::*;
    use burn::tensor::TensorData;
    use sdpa::{AttentionInput, AttentionPath, Implementation, ScaledDotProductAttentionConfig};

    let device = Device::flex().autodiff();
    let t = |data: Vec<f32>, shape: [usize; 4]| {
        Tensor::<4>::from_data(TensorData::new(data, shape), &device).require_grad()
    };
    // One query row [3e38, 0]; keys [2, 0] (score +∞ in f32) and [0, 1] (score 0).
    let value = t(vec![1.5, -2.0, 0.25, 4.0], [1, 1, 2, 2]);
    let input = |query: Vec<f32>| {
        AttentionInput::new(
            t(query, [1, 1, 1, 2]),
            t(vec![2.0, 0.0, 0.0, 1.0], [1, 1, 2, 2]),
            value.clone(),
        )
    };
    let kernel = ScaledDotProductAttentionConfig::new()
        .with_implementation(Implementation::CpuKernel)
        .init();
    assert_eq!(
        kernel.path(&input(vec![3e38, 0.0])).unwrap(),
        AttentionPath::Chunked(256)
    );
    assert_eq!(
        kernel.path(&input(vec![0.5, 0.0])).unwrap(),
        AttentionPath::CpuKernel
    );
    // A NaN or infinite query is the non-finite policy's, which the kernel applies itself: it
    // keeps the call when the finite entries cannot overflow.
    for bad in [f32::NAN, f32::INFINITY] {
        assert_eq!(
            kernel.path(&input(vec![bad, 0.5])).unwrap(),
            AttentionPath::CpuKernel
        );
    }
    let out = kernel.forward(input(vec![3e38, 0.0]));
    let context: Vec<f32> = out.context.clone().into_data().try_to_vec::<f32>().unwrap();
    assert_eq!(context, [1.5, -2.0], "the old answer was [0, 0]");
    let grads = out.context.sum().backward();
    let grad_value: Vec<f32> = value
        .grad(&grads)
        .unwrap()
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    assert_eq!(
        grad_value,
        [1.0, 1.0, 0.0, 0.0],
        "the old gradient was all 0"
    );
}
