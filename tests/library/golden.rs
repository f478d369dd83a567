//! Every golden case (PyTorch, float64) passes forward and backward on every compiled backend:
//! the base cases (`sdpa/`), the soft-cap and window cases (`extensions/`), the packed-sequence
//! and ALiBi cases (`extensions2/`), the quiet-softmax and attention-sink cases (`extensions3/`,
//! their sinks' gradients checked too), the head sizes 96 to 512 (`tests/data/golden-head-sizes`,
//! generated in the repository by its `generate.py`) and the hand-made cases whose scores overflow
//! f32 (`tests/data/golden-overflow`, NaN written `null`: its README states the rule).

use std::path::PathBuf;

use sdpa::Implementation;
use sdpa::golden;

use crate::common::{devices, full_lavapipe};

/// A golden folder: `shared/golden/<shared>` beside the repository when it is there (the source
/// of truth, with any cases added since), else the copy in `tests/data/<vendored>`.
fn golden_dir(shared: &str, vendored: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let shared = root.join("../shared/golden").join(shared);
    if shared.is_dir() {
        shared
    } else {
        root.join("tests/data").join(vendored)
    }
}

/// Every case file of the folders: at least the 12 base cases, the 5 + 4 + 4 extension cases, the
/// 25 head-size cases and the 4 overflow cases.
fn golden_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for (shared, vendored, at_least) in [
        ("sdpa", "golden", 12),
        ("extensions", "golden-extensions", 5),
        ("extensions2", "golden-extensions2", 4),
        ("extensions3", "golden-extensions3", 4),
        ("head-sizes", "golden-head-sizes", 25),
        ("overflow", "golden-overflow", 4),
    ] {
        let dir = golden_dir(shared, vendored);
        let found = golden::case_files(&dir).expect("golden folder");
        assert!(
            found.len() >= at_least,
            "expected at least {at_least} cases in {}, found {}",
            dir.display(),
            found.len()
        );
        files.extend(found);
    }
    files
}

fn golden_on_every_backend(implementation: Implementation) {
    let files = golden_files();
    let mut failures = Vec::new();
    // The tensor-op paths on lavapipe (CI: 2 cores) leave out the 25 head-size cases, unless
    // `SDPA_TEST_FULL` is set: those paths are the same backend-generic tensor code at every
    // head size (they pass those cases on the CPU backends here), what depends on the head size
    // on wgpu is the CubeCL kernel's tiling, which runs them all (`Auto` here, `CubeKernel`
    // below and in `cube_head_sizes.rs`). They took about 5 of CI's minutes.
    let tensor_ops = matches!(
        implementation,
        Implementation::Naive | Implementation::Chunked { .. }
    );
    for (backend, device) in devices() {
        let trim = tensor_ops && backend == sdpa::BackendKind::Wgpu && !full_lavapipe();
        for file in &files {
            if trim
                && file.components().any(|c| {
                    c.as_os_str()
                        .to_str()
                        .is_some_and(|c| c.contains("head-sizes"))
                })
            {
                continue;
            }
            match golden::run_file(file, &device, implementation) {
                Ok(report) => {
                    println!("{backend} {implementation:?}: {report}");
                    if !report.passed_strict() {
                        failures.push(format!("{backend}: {report}"));
                    }
                }
                Err(e) => failures.push(format!("{backend}: {e}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "failing golden cases ({implementation:?}):\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_golden_case_passes_on_every_backend_naive() {
    golden_on_every_backend(Implementation::Naive);
}

#[test]
fn every_golden_case_passes_on_every_backend_chunked() {
    crate::common::in_child(
        "golden::child_every_golden_case_passes_on_every_backend_chunked",
        &[],
    );
}

/// The body of [`every_golden_case_passes_on_every_backend_chunked`], run in a child process: its own wgpu device, so that lavapipe
/// compiles its kernels on the second core while this binary's other tests use the first
/// (`common::in_child`).
#[test]
#[ignore = "run by its parent test in a child process"]
fn child_every_golden_case_passes_on_every_backend_chunked() {
    // Blocks of 2 keys: every case spans several blocks, and some blocks are fully masked.
    golden_on_every_backend(Implementation::Chunked { block_size: 2 });
}

#[test]
fn every_golden_case_passes_on_every_backend_auto() {
    crate::common::in_child(
        "golden::child_every_golden_case_passes_on_every_backend_auto",
        &[],
    );
}

/// The body of [`every_golden_case_passes_on_every_backend_auto`], run in a child process: its own wgpu device, so that lavapipe
/// compiles its kernels on the second core while this binary's other tests use the first
/// (`common::in_child`).
#[test]
#[ignore = "run by its parent test in a child process"]
fn child_every_golden_case_passes_on_every_backend_auto() {
    golden_on_every_backend(Implementation::Auto);
}

#[test]
fn every_golden_case_passes_on_every_backend_fused_where_it_applies() {
    crate::common::in_child(
        "golden::child_every_golden_case_passes_on_every_backend_fused_where_it_applies",
        &[],
    );
}

/// The body of [`every_golden_case_passes_on_every_backend_fused_where_it_applies`], run in a child process: its own wgpu device, so that lavapipe
/// compiles its kernels on the second core while this binary's other tests use the first
/// (`common::in_child`).
#[test]
#[ignore = "run by its parent test in a child process"]
fn child_every_golden_case_passes_on_every_backend_fused_where_it_applies() {
    // Fused only knows bottom-right causal alignment: the top-left cases with n != m are
    // rejected with a clear error, and every other case passes.
    let mut failures = Vec::new();
    for (backend, device) in devices() {
        for file in golden_files() {
            let case = golden::load_case(&file).expect("case");
            let n = case.query.shape[2];
            let m = case.key.shape[2];
            let result = golden::run_case(
                &case,
                &file.display().to_string(),
                &device,
                Implementation::Fused,
            );
            if case.causal == golden::Causal::TopLeft && n != m {
                let e = result.expect_err("fused cannot do top-left with n != m");
                assert!(e.to_string().contains("bottom-right"), "{e}");
                assert!(e.unsupported, "{e}");
                continue;
            }
            match result {
                Ok(r) if r.passed_strict() => println!("{backend} Fused: {r}"),
                Ok(r) => failures.push(format!("{backend}: {r}")),
                Err(e) => failures.push(format!("{backend}: {e}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "failing golden cases (Fused):\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_golden_case_passes_on_every_backend_cpu_kernel() {
    // The CPU kernel serves every case (masks, biases, both causal alignments, grouped-query
    // heads, fully masked rows). Where it runs in place (Flex, NdArray) the case is checked
    // forward and backward through its own backward pass; elsewhere (wgpu) it serves inference
    // on host copies, and the context and row statistics are checked.
    let mut failures = Vec::new();
    let mut with_gradients = 0;
    for (backend, device) in devices() {
        let in_place = sdpa::cpu_kernel::runs_in_place(&device);
        for file in golden_files() {
            match golden::run_file(&file, &device, Implementation::CpuKernel) {
                Ok(r) if r.passed_strict() => {
                    println!("{backend} CpuKernel: {r}");
                    let checked: Vec<&str> = r.checks.iter().map(|c| c.name).collect();
                    if in_place {
                        assert!(checked.contains(&"grad_key"), "{backend}: {checked:?}");
                        with_gradients += 1;
                    } else {
                        assert_eq!(checked[0], "context", "{backend}");
                        assert!(!checked.contains(&"grad_key"), "{backend}: {checked:?}");
                    }
                }
                Ok(r) => failures.push(format!("{backend}: {r}")),
                Err(e) => failures.push(format!("{backend}: {e}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "failing golden cases (CpuKernel):\n{}",
        failures.join("\n")
    );
    // flex and ndarray are on by default: at least their 2 × (12 + 5 + 4 + 4 + 25 + 4) cases
    // ran backward.
    assert!(
        with_gradients >= 100,
        "only {with_gradients} cases ran backward"
    );
}

#[test]
fn vendored_copy_matches_the_cases_it_was_copied_from() {
    // The copy in tests/data must stay loadable and complete on its own.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let files = golden::case_files(&root.join("tests/data/golden")).expect("vendored folder");
    assert_eq!(files.len(), 12);
    for f in files {
        golden::load_case(&f).unwrap_or_else(|e| panic!("{e}"));
    }
    let files = golden::case_files(&root.join("tests/data/golden-extensions")).expect("vendored");
    assert_eq!(files.len(), 5);
    let (mut capped, mut windowed) = (0, 0);
    for f in files {
        let case = golden::load_case(&f).unwrap_or_else(|e| panic!("{e}"));
        capped += usize::from(case.softcap.is_some());
        windowed += usize::from(case.window.is_some());
    }
    assert_eq!((capped, windowed), (2, 3));
    let files = golden::case_files(&root.join("tests/data/golden-extensions2")).expect("vendored");
    assert_eq!(files.len(), 4);
    let (mut packed, mut alibi) = (0, 0);
    for f in files {
        let case = golden::load_case(&f).unwrap_or_else(|e| panic!("{e}"));
        packed += usize::from(case.segments.is_some());
        alibi += usize::from(case.alibi_slopes.is_some());
    }
    assert_eq!((packed, alibi), (2, 2));
    let files = golden::case_files(&root.join("tests/data/golden-extensions3")).expect("vendored");
    assert_eq!(files.len(), 4);
    let (mut quiet, mut sinks) = (0, 0);
    for f in files {
        let case = golden::load_case(&f).unwrap_or_else(|e| panic!("{e}"));
        quiet += usize::from(case.quiet_softmax == Some(true));
        sinks += usize::from(case.sinks.is_some() && case.expected.grad_sinks.is_some());
    }
    assert_eq!((quiet, sinks), (2, 2));
    let files = golden::case_files(&root.join("tests/data/golden-head-sizes")).expect("vendored");
    assert_eq!(files.len(), 25);
    let mut head_sizes = std::collections::BTreeSet::new();
    for f in files {
        let case = golden::load_case(&f).unwrap_or_else(|e| panic!("{e}"));
        head_sizes.insert((case.query.shape[3], case.value.shape[3]));
    }
    for d_k in [96, 128, 160, 192, 256] {
        assert!(head_sizes.contains(&(d_k, d_k)), "d_k = d_v = {d_k}");
        assert!(
            head_sizes.iter().any(|&(k, v)| k == d_k && v != d_k),
            "d_v != {d_k}"
        );
    }
    // The overflow cases: two expect NaN rows (`null` read as NaN), in the context and weights.
    let files = golden::case_files(&root.join("tests/data/golden-overflow")).expect("vendored");
    assert_eq!(files.len(), 4);
    let mut with_nan = 0;
    for f in files {
        let case = golden::load_case(&f).unwrap_or_else(|e| panic!("{e}"));
        let nan = |t: &golden::JsonTensor| t.data.iter().any(|x| x.is_nan());
        with_nan += usize::from(nan(&case.expected.context) && nan(&case.expected.weights));
        assert!(!nan(&case.query) && !nan(&case.expected.grad_key));
    }
    assert_eq!(with_nan, 2);
}

#[test]
fn a_case_with_a_field_the_runner_does_not_know_is_refused() {
    // A field the runner ignored would let a case pass without the semantics it asks for.
    let dir = tempfile::tempdir().expect("tempdir");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("tests/data/golden-extensions/window_local.json"))
        .expect("case");
    let mut json: serde_json::Value = serde_json::from_str(&text).expect("json");
    json["dilation"] = serde_json::json!(2);
    let path = dir.path().join("unknown_field.json");
    std::fs::write(&path, json.to_string()).expect("write");
    let device = devices()[0].1.clone();
    let err = golden::run_file(&path, &device, Implementation::Auto).expect_err("must refuse");
    assert!(
        err.to_string().contains("unknown field `dilation`"),
        "{err}"
    );
    // Also inside a nested object.
    json.as_object_mut().expect("object").remove("dilation");
    json["tolerance"]["ulps"] = serde_json::json!(4);
    std::fs::write(&path, json.to_string()).expect("write");
    let err = golden::run_file(&path, &device, Implementation::Auto).expect_err("must refuse");
    assert!(err.to_string().contains("unknown field `ulps`"), "{err}");
    // A soft-cap that is not positive is the case's error, not the module's panic.
    json["tolerance"]
        .as_object_mut()
        .expect("object")
        .remove("ulps");
    json["softcap"] = serde_json::json!(0.0);
    std::fs::write(&path, json.to_string()).expect("write");
    let err = golden::run_file(&path, &device, Implementation::Auto).expect_err("must refuse");
    assert!(err.to_string().contains("softcap"), "{err}");
}

#[test]
fn a_broken_case_file_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("broken.json");
    std::fs::write(&path, "{\"name\": \"x\", \"query\": ").expect("write");
    let device = devices()[0].1.clone();
    let err = golden::run_file(&path, &device, Implementation::Auto).expect_err("must fail");
    assert!(err.to_string().contains("broken.json"), "{err}");

    let bad_len = path.with_file_name("bad_len.json");
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden/plain.json"),
    )
    .expect("plain case");
    let mut json: serde_json::Value = serde_json::from_str(&text).expect("json");
    json["query"]["shape"] = serde_json::json!([2, 3, 5, 5]);
    std::fs::write(&bad_len, json.to_string()).expect("write");
    let err = golden::run_file(&bad_len, &device, Implementation::Auto).expect_err("must fail");
    assert!(
        err.to_string().contains("query has shape [2, 3, 5, 5]"),
        "{err}"
    );
}

#[test]
#[cfg(feature = "wgpu")]
fn every_golden_case_passes_forward_and_backward_through_the_cube_kernel_on_wgpu() {
    let device = sdpa::BackendKind::Wgpu
        .device()
        .expect("wgpu (lavapipe in CI)");
    let mut failures = Vec::new();
    let files = golden_files();
    for file in &files {
        match golden::run_file(file, &device, Implementation::CubeKernel) {
            Ok(r) if r.passed_strict() => {
                let checked: Vec<&str> = r.checks.iter().map(|c| c.name).collect();
                assert!(
                    checked.contains(&"grad_key"),
                    "{}: {checked:?}",
                    file.display()
                );
            }
            Ok(r) => failures.push(r.to_string()),
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(files.len() >= 54);
}
