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

/// Every golden case in `dtype` through `implementation` on `device` (`golden --dtype`): the
/// reports of the cases it served, the reasons of those it did not serve (a named blocker), and
/// the failures.
struct HalfRuns {
    reports: Vec<golden::CaseReport>,
    not_served: Vec<String>,
    failures: Vec<String>,
}

fn half_precision_runs(
    device: &burn::prelude::Device,
    implementation: Implementation,
    dtype: burn::tensor::FloatDType,
    files: &[PathBuf],
) -> HalfRuns {
    let mut runs = HalfRuns {
        reports: Vec::new(),
        not_served: Vec::new(),
        failures: Vec::new(),
    };
    for file in files {
        match golden::run_file_in(file, device, implementation, dtype) {
            Ok(r) => {
                println!("{dtype:?} {implementation:?}: {r}");
                if !r.passed_strict() {
                    runs.failures.push(r.to_string());
                }
                runs.reports.push(r);
            }
            Err(e) if e.unsupported => {
                println!("{dtype:?} {implementation:?}: not served: {e}");
                runs.not_served.push(e.to_string());
            }
            Err(e) => runs.failures.push(e.to_string()),
        }
    }
    runs
}

/// Whether `file` is one of the overflow cases (`golden-overflow`), which a half-precision run
/// does not check: their inputs (3e38) are past f16's range, so in f16 they test the policy for
/// infinite inputs instead; in bf16 their scores may overflow, and every kernel hands such a
/// call to the chunked path, which computes in bf16 itself (`golden --dtype` counts that as not
/// served; the test below checks it).
fn overflow_case(file: &std::path::Path) -> bool {
    file.components().any(|c| {
        c.as_os_str()
            .to_str()
            .is_some_and(|c| c.contains("overflow"))
    })
}

/// Every golden case but the overflow cases ([`overflow_case`]).
fn half_precision_files() -> Vec<PathBuf> {
    golden_files()
        .into_iter()
        .filter(|f| !overflow_case(f))
        .collect()
}

#[test]
fn every_golden_case_passes_in_bf16_on_flex_through_the_cpu_kernel() {
    use burn::tensor::FloatDType;
    let device = sdpa::BackendKind::Flex.device().expect("flex");
    let files = half_precision_files();
    assert!(files.len() >= 50);
    let runs = half_precision_runs(&device, Implementation::Auto, FloatDType::BF16, &files);
    assert!(runs.failures.is_empty(), "{:#?}", runs.failures);
    assert_eq!(runs.reports.len(), files.len(), "{:#?}", runs.not_served);
    for r in &runs.reports {
        // Auto takes the CPU kernel for bf16 on Flex; every gradient checked.
        assert_eq!(r.path, Some(sdpa::AttentionPath::CpuKernel), "{r}");
        let checked: Vec<&str> = r.checks.iter().map(|c| c.name).collect();
        assert!(checked.contains(&"grad_key"), "{r}");
    }
    // An overflow case asked of the CPU kernel goes to the chunked path: not served, not passed.
    let overflow: Vec<PathBuf> = golden_files()
        .into_iter()
        .filter(|f| overflow_case(f))
        .collect();
    let handed_over = golden::run_file_in(
        &overflow[0],
        &device,
        Implementation::CpuKernel,
        FloatDType::BF16,
    )
    .expect_err("handed to the chunked path");
    assert!(
        handed_over.unsupported && handed_over.reason.contains("chunked"),
        "{handed_over}"
    );
    // The rule can fail: Naive computing in bf16 itself (its scores, weights and sums rounded
    // at every op) misses it on some case.
    let naive = half_precision_runs(&device, Implementation::Naive, FloatDType::BF16, &files);
    assert!(
        !naive.failures.is_empty(),
        "Naive in bf16 passed the 4-roundings rule on every case: the rule cannot fail"
    );
}

/// The tensor-core path (`cube_tensor_cores`) on a Vulkan device with cooperative matrices:
/// every golden case forward and backward, in each half type the device lists matrix
/// instructions for, within the half-precision rule of `golden --dtype` (f32 `Naive` on the
/// same rounded inputs), every case through that path, but those refused by a named blocker
/// (head sizes whose tiles pass the device's shared memory), which do not count as passed, and
/// the overflow cases ([`overflow_case`]). Needs a driver that Debian 12 lacks; run it with
/// Debian sid's lavapipe (Mesa 26.2), under the script that loads it:
///
/// ```sh
/// cargo test --release --features vulkan --test library --no-run
/// .ci/lavapipe-coopmat.sh -- target/release/deps/library-<hash> --ignored tensor_cores
/// ```
#[test]
#[cfg(feature = "vulkan")]
#[ignore = "needs a Vulkan driver with cooperative matrices: run it under .ci/lavapipe-coopmat.sh"]
fn every_golden_case_passes_through_the_tensor_cores_on_vulkan() {
    use burn::tensor::FloatDType;
    // A device without matrix instructions runs no case: the last assertion fails then. (Mesa's
    // 8×8×8 cooperative matrices are not what `has_tensor_cores` counts, so it is not asked.)
    let device = sdpa::BackendKind::Vulkan.device().expect("vulkan");
    let files = half_precision_files();
    let mut ran = Vec::new();
    for dtype in [FloatDType::F16, FloatDType::BF16] {
        if !device.supports_dtype(dtype) {
            println!("{dtype:?}: the device has no such tensors, not run");
            continue;
        }
        let runs = half_precision_runs(&device, Implementation::CubeTensorCores, dtype, &files);
        if runs.reports.is_empty()
            && runs
                .not_served
                .iter()
                .all(|reason| reason.contains("matrix instruction"))
        {
            println!("{dtype:?}: the device lists no matrix instruction for it, not run");
            continue;
        }
        assert!(runs.failures.is_empty(), "{dtype:?}: {:#?}", runs.failures);
        for r in &runs.reports {
            assert_eq!(r.path, Some(sdpa::AttentionPath::CubeTensorCores), "{r}");
        }
        // Not served: only head sizes whose tiles pass the device's shared memory, by name.
        for reason in &runs.not_served {
            assert!(reason.contains("shared memory"), "{reason}");
        }
        assert!(
            runs.reports.len() >= files.len() - 2,
            "{:#?}",
            runs.not_served
        );
        println!(
            "{dtype:?}: {} cases passed through the tensor cores, {} not served",
            runs.reports.len(),
            runs.not_served.len()
        );
        ran.push(dtype);
    }
    assert!(!ran.is_empty(), "no half type ran through the tensor cores");
    println!("ran through the tensor cores in {ran:?}");
}
