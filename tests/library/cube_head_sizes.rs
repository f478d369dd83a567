//! The CubeCL kernel at the head sizes models use (d_k, d_v up to 512, d_k ≠ d_v), with its
//! tiles sized from the device's shared memory (the PyTorch golden cases of
//! `tests/data/golden-head-sizes` run through every path in `golden.rs`): the kernel against
//! `Naive` over many tiles, `Auto` leaving the kernel where no tiling serves a
//! call, and, in child processes of this test binary, the tiles of a device with 16 KiB of
//! shared memory (the least WebGPU guarantees) without plane broadcasts, a limit too small for
//! any row (a refusal naming it), and one larger than the device's (a failed launch read back as
//! an error).

#![cfg(feature = "wgpu")]

use std::path::PathBuf;

use burn::prelude::*;
use burn::tensor::Distribution;
use sdpa::golden;
use sdpa::{
    AttentionError, AttentionInput, AttentionPath, BackendKind, CausalAlignment, Implementation,
    ScaledDotProductAttentionConfig,
};

use crate::common::{max_abs_diff, values};
use crate::cube::assert_trains_like_naive;

/// The head-size golden cases (PyTorch, float64; `generate.py` beside them).
pub(crate) fn head_size_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden-head-sizes");
    let files = golden::case_files(&dir).expect("head-size golden folder");
    assert_eq!(files.len(), 25, "{}", dir.display());
    files
}

fn attention(implementation: Implementation) -> sdpa::ScaledDotProductAttention {
    ScaledDotProductAttentionConfig::new()
        .with_implementation(implementation)
        .init()
}

fn random_input(device: &Device, [b, h, h_kv, n, m, d_k, d_v]: [usize; 7]) -> AttentionInput {
    let random =
        |shape: [usize; 4]| Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), device);
    AttentionInput::new(
        random([b, h, n, d_k]),
        random([b, h_kv, m, d_k]),
        random([b, h_kv, m, d_v]),
    )
}

/// Every head-size case through `implementation` on wgpu, forward and backward (the
/// gradients checked on every case).
fn head_size_cases_pass(implementation: Implementation, keep: impl Fn(&PathBuf) -> bool) {
    let device = BackendKind::Wgpu.device().expect("wgpu (lavapipe in CI)");
    let mut failures = Vec::new();
    for file in head_size_files().into_iter().filter(|f| keep(f)) {
        match golden::run_file(&file, &device, implementation) {
            Ok(r) if r.passed_strict() => {
                let checked: Vec<&str> = r.checks.iter().map(|c| c.name).collect();
                assert!(checked.contains(&"grad_key"), "{r}: {checked:?}");
                println!("{r}");
            }
            Ok(r) => failures.push(r.to_string()),
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn auto_takes_the_kernel_up_to_512_and_a_tensor_op_path_above() {
    let device = BackendKind::Wgpu.device().expect("wgpu");
    device.seed(36);
    for (d_k, d_v) in [(256, 256), (192, 128), (512, 512), (320, 512)] {
        let input = random_input(&device, [1, 2, 2, 3, 5, d_k, d_v]);
        let auto = attention(Implementation::Auto);
        assert_eq!(
            auto.path(&input).unwrap(),
            AttentionPath::CubeKernel,
            "d_k {d_k}, d_v {d_v}"
        );
        assert_eq!(
            auto.why_not(&input, AttentionPath::CubeKernel).unwrap(),
            None
        );
        // A training call too (what the golden runner's `Auto` pass makes).
        let training = random_input(&device.clone().autodiff(), [1, 2, 2, 3, 5, d_k, d_v]);
        assert_eq!(
            auto.path(&training).unwrap(),
            AttentionPath::CubeKernel,
            "training, d_k {d_k}, d_v {d_v}"
        );
    }
    for (d_k, d_v) in [(520, 64), (64, 576)] {
        let input = random_input(&device, [1, 2, 1, 3, 5, d_k, d_v]).causal();
        let auto = attention(Implementation::Auto);
        let path = auto.path(&input).unwrap();
        assert_ne!(path, AttentionPath::CubeKernel, "d_k {d_k}, d_v {d_v}");
        let why = auto
            .why_not(&input, AttentionPath::CubeKernel)
            .unwrap()
            .expect("a reason");
        assert!(
            why.contains("512") && why.contains(&format!("d_k = {d_k}")),
            "{why}"
        );
        // Auto's result is Naive's.
        let got = values(auto.forward(input.clone()).context);
        let naive = values(
            attention(Implementation::Naive)
                .forward(input.clone())
                .context,
        );
        assert!(max_abs_diff(&got, &naive) < 1e-5);
        // An explicit request is refused with the same reason.
        match attention(Implementation::CubeKernel).try_forward(input) {
            Err(AttentionError::Unsupported { reason, .. }) => assert_eq!(reason, why),
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }
}

/// A labelled case: `[b, h, h_kv, n, m, d_k, d_v]`, the options added to the random input, the
/// causal alignment.
type Case = (
    &'static str,
    [usize; 7],
    fn(AttentionInput) -> AttentionInput,
    CausalAlignment,
);

/// The kernel against `Naive` over many tiles and blocks at head sizes above 128 (forward and dQ
/// as loops over d, not unrolled), forward and backward: a causal window with grouped-query heads and n ≠ m;
/// d_k ≠ d_v with padding; head sizes that are not multiples of the plane width (shared-memory
/// tiles even where plane broadcasts are on), top-left causal with n > m.
#[test]
fn the_kernel_trains_like_naive_over_many_tiles_at_large_heads() {
    let device = BackendKind::Wgpu.device().expect("wgpu").autodiff();
    device.seed(37);
    let cases: [Case; 3] = [
        (
            "d 256, causal window 8, GQA 4/2",
            [1, 4, 2, 40, 70, 256, 256],
            |input| input.causal().window(8, 0),
            CausalAlignment::BottomRight,
        ),
        (
            "d_k 192, d_v 128, padding",
            [2, 2, 2, 33, 45, 192, 128],
            |input| {
                let device = input.query.device();
                // [b, m]: the last 10 keys of batch row 1 are padding.
                let padding = Tensor::<1, Int>::arange(0..45, &device)
                    .reshape([1, 45])
                    .expand([2, 45])
                    .greater_equal_elem(35)
                    .bool_and(
                        Tensor::<2, Bool>::from_data(
                            burn::tensor::TensorData::new(vec![false, true], [2, 1]),
                            &device,
                        )
                        .expand([2, 45]),
                    );
                input.padding_mask(padding)
            },
            CausalAlignment::BottomRight,
        ),
        (
            "d_k 132, d_v 140, top-left causal, n > m",
            [1, 2, 1, 37, 20, 132, 140],
            |input| input.causal(),
            CausalAlignment::TopLeft,
        ),
    ];
    for (label, dims, make, alignment) in cases {
        let input = make(random_input(&device, dims));
        let [b, h, _, n, _, _, d_v] = dims;
        let weights = Tensor::<4>::random([b, h, n, d_v], Distribution::Normal(0.0, 1.0), &device);
        assert_trains_like_naive(label, &input, alignment, None, &weights);
    }
}

/// Run by [`every_head_size_case_passes_in_16_kib_of_shared_memory`] in a child process with
/// `SDPA_CUBE_SHARED_BYTES=16384 SDPA_CUBE_PLANES=off` (it also passes on the device's own
/// limits): the golden cases and the many-tile comparison in the tiles of such a device.
#[test]
#[ignore = "run by its parent test in a child process, with the knobs set"]
fn child_head_size_cases_in_the_limits_set_by_the_environment() {
    // On lavapipe (CI: 2 cores), the cases at d = 256 (every option: the head size the kernel
    // was wrong at), 320/512 and 512; all 25 with `SDPA_TEST_FULL`. This child took 16.5 of
    // CI's minutes with all 25; the other head sizes pass in the device's own tiling
    // (`golden.rs`), and 16 KiB tiles are also checked against Naive over a sweep of lengths at
    // d 256 and d_k 96 / d_v 320 (`cube_sweep.rs`) and over many tiles at d 256, 192/128 and
    // 132/140 below.
    let full = crate::common::full_lavapipe();
    head_size_cases_pass(Implementation::CubeKernel, |file| {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        full || ["head_256", "head_320", "head_512"]
            .iter()
            .any(|p| name.starts_with(p))
    });
    the_kernel_trains_like_naive_over_many_tiles_at_large_heads();
}

/// Run by [`a_limit_no_row_fits_is_refused_and_an_oversized_tile_is_an_error`] with
/// `SDPA_CUBE_SHARED_BYTES` and `SDPA_CUBE_PLANES=off`, and the expected outcome in
/// `SDPA_TEST_EXPECT`: `refused` (no row of d = 512 fits: the kernel is refused naming the limit,
/// `Auto` takes a tensor-op path) or `launch-error` (a tile larger than the device's shared
/// memory: the launch fails and reading the result back is an error, not a panic; a 128 KiB tile
/// exceeds lavapipe's 32 KiB, the device CI runs on, and any device with less than 128 KiB).
#[test]
#[ignore = "run by its parent test in a child process, with the knobs set"]
fn child_oversized_head_in_the_limits_set_by_the_environment() {
    let device = BackendKind::Wgpu.device().expect("wgpu");
    device.seed(38);
    let input = random_input(&device, [1, 1, 1, 4, 6, 512, 512]);
    let kernel = attention(Implementation::CubeKernel);
    match std::env::var("SDPA_TEST_EXPECT").as_deref() {
        Ok("refused") => {
            let err = kernel.try_forward(input.clone()).expect_err("refused");
            let text = err.to_string();
            assert!(
                text.contains("4096 bytes") && text.contains("2048 bytes"),
                "{text}"
            );
            let auto = attention(Implementation::Auto);
            assert_ne!(auto.path(&input).unwrap(), AttentionPath::CubeKernel);
            let got = values(auto.forward(input.clone()).context);
            let naive = values(attention(Implementation::Naive).forward(input).context);
            assert!(max_abs_diff(&got, &naive) < 1e-5);
        }
        Ok("launch-error") => {
            let out = kernel.try_forward(input).expect("admitted by the blocker");
            let read = out.context.try_into_data();
            assert!(read.is_err(), "a 128 KiB tile cannot launch on lavapipe");
            println!(
                "read back: {}",
                read.err().map(|e| format!("{e:?}")).unwrap_or_default()
            );
        }
        Ok(other) => panic!("SDPA_TEST_EXPECT must be `refused` or `launch-error`, got {other:?}"),
        // Run outside its parent (e.g. `--include-ignored`): nothing to expect.
        Err(_) => println!("SDPA_TEST_EXPECT is not set: run by its parent test only"),
    }
}

/// Runs the ignored test `name` of this binary alone in a child process with `env`, and asserts
/// that it ran and passed.
fn run_child(name: &str, env: &[(&str, &str)]) {
    crate::common::in_child(&format!("cube_head_sizes::{name}"), env);
}

#[test]
fn every_head_size_case_passes_in_16_kib_of_shared_memory() {
    run_child(
        "child_head_size_cases_in_the_limits_set_by_the_environment",
        &[
            ("SDPA_CUBE_SHARED_BYTES", "16384"),
            ("SDPA_CUBE_PLANES", "off"),
        ],
    );
}

#[test]
fn a_limit_no_row_fits_is_refused_and_an_oversized_tile_is_an_error() {
    let child = "child_oversized_head_in_the_limits_set_by_the_environment";
    run_child(
        child,
        &[
            ("SDPA_CUBE_SHARED_BYTES", "2048"),
            ("SDPA_CUBE_PLANES", "off"),
            ("SDPA_TEST_EXPECT", "refused"),
        ],
    );
    run_child(
        child,
        &[
            ("SDPA_CUBE_SHARED_BYTES", "131072"),
            ("SDPA_CUBE_PLANES", "off"),
            ("SDPA_TEST_EXPECT", "launch-error"),
        ],
    );
}
