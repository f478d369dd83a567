//! The CubeCL kernel against `Naive` over a sweep of lengths at large head sizes, forward and
//! backward, for every tiling a device's shared memory allows: the lengths are odd and sit around
//! and above every edge the kernels have (the blocks of 32 queries or keys a cube owns, the tiles
//! of 4, 8, 16 or 32 streamed rows, one query decoding over a few hundred keys), the head sizes a
//! fixed list up to 512 with d_k ≠ d_v.
//!
//! One process per tiling, the environment read once per process (`tile.rs`): plane broadcasts
//! (the device's default on lavapipe), shared tiles in the device's own shared memory, and shared
//! tiles in 16 KiB (the least WebGPU guarantees). Each of the two shared-tile tilings runs in a
//! child process of this test binary.
//!
//! **Time cap: 10 minutes** for the four tests together on 2 cores. The kernels compile once per
//! head size, tiling and mask kind, and that is most of the time on lavapipe. Measured alone
//! (`cargo test --release --features wgpu --test library cube_sweep -- --test-threads=2`, AMD
//! EPYC, 2 cores, 2026-12-05): 574 s, each tiling's sweep 230–345 s. CI's last full run spent
//! 70 minutes in this binary with eight lengths and five head sizes (three per shared tiling),
//! so the sweep keeps five lengths and three head sizes (two per shared tiling).

#![cfg(feature = "wgpu")]

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::Distribution;
use sdpa::{
    AttentionInput, AttentionPath, BackendKind, CausalAlignment, Implementation,
    ScaledDotProductAttentionConfig,
};

use crate::common::{max_abs_diff, values};
use crate::cube::assert_trains_like_naive;

/// Runs `input` through the kernel and `Naive`, forward and backward, where the kernel's blocker
/// admits it; where it refuses it (only lavapipe's loop limit can, at these sizes), asserts that
/// the reason names the limit and that `Auto`'s context is `Naive`'s. Returns whether the
/// kernel ran.
fn kernel_or_refusal_matches_naive(
    label: &str,
    input: &AttentionInput,
    weights: &Tensor<4>,
) -> bool {
    let attention = |implementation| {
        ScaledDotProductAttentionConfig::new()
            .with_implementation(implementation)
            .init()
    };
    let why = attention(Implementation::Auto)
        .why_not(input, AttentionPath::CubeKernel)
        .expect("a valid call");
    match why {
        None => {
            assert_trains_like_naive(label, input, CausalAlignment::BottomRight, None, weights);
            true
        }
        Some(reason) => {
            assert!(reason.contains("loop"), "{label}: refused for {reason}");
            let auto = values(
                attention(Implementation::Auto)
                    .forward(input.clone())
                    .context,
            );
            let naive = values(
                attention(Implementation::Naive)
                    .forward(input.clone())
                    .context,
            );
            assert!(max_abs_diff(&auto, &naive) < 1e-4, "{label}: Auto");
            false
        }
    }
}

/// The head sizes swept, `(d_k, d_v)`: 256 (where the kernel was wrong), the largest it serves,
/// and d_k ≠ d_v above the unrolled sizes.
const HEAD_SIZES: [(usize, usize); 3] = [(256, 256), (512, 512), (96, 320)];

/// `(n, m)`: decoding (one query) over 301 keys, square calls of odd lengths below one block of
/// 32 and above four, and n ≠ m both ways across block and tile edges.
const LENGTHS: [(usize, usize); 5] = [(1, 301), (31, 31), (129, 129), (65, 129), (161, 63)];

/// The head sizes swept in the shared-tile tilings (child processes, where CI's time goes to
/// compiling): 256, and d_k ≠ d_v.
const CHILD_HEAD_SIZES: [(usize, usize); 2] = [(256, 256), (96, 320)];

/// The sweep on wgpu over `head_sizes`: every head size at every length, plain, and causal (bottom-right) at the
/// lengths where the band cuts tiles; with two query heads sharing one key head.
fn sweep(head_sizes: &[(usize, usize)]) {
    let device = BackendKind::Wgpu.device().expect("wgpu").autodiff();
    device.seed(51);
    let started = Instant::now();
    for &(d_k, d_v) in head_sizes {
        let head_started = Instant::now();
        for (n, m) in LENGTHS {
            let random = |shape: [usize; 4]| {
                Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device)
            };
            let plain = AttentionInput::new(
                random([1, 2, n, d_k]),
                random([1, 1, m, d_k]),
                random([1, 1, m, d_v]),
            );
            let weights = random([1, 2, n, d_v]);
            let label = format!("d_k {d_k}, d_v {d_v}, n {n}, m {m}");
            let ran = kernel_or_refusal_matches_naive(&label, &plain, &weights);
            println!("{label}: {}", if ran { "kernel" } else { "refused" });
            if n > 1 && m > 1 {
                let causal = plain.clone().causal();
                kernel_or_refusal_matches_naive(&format!("{label}, causal"), &causal, &weights);
            }
        }
        println!(
            "d_k {d_k}, d_v {d_v}: {} lengths in {:.1} s",
            LENGTHS.len(),
            head_started.elapsed().as_secs_f64()
        );
    }
    println!("sweep in {:.1} s", started.elapsed().as_secs_f64());
}

/// The longest sequences the blocker admits at a head size run right: the largest m with one
/// query (the forward pass and dQ stream m keys) and the largest n over 33 keys (dK/dV streams
/// n queries of each of the group's heads), found from the blocker's own bound, against
/// `Naive` forward and backward; one more key or query is refused. Only where the device has a
/// loop limit (lavapipe); elsewhere the test checks that nothing is refused.
fn the_longest_admitted_sequences_run_right(d_k: usize, d_v: usize) {
    let device = BackendKind::Wgpu.device().expect("wgpu").autodiff();
    device.seed(52);
    let attention = ScaledDotProductAttentionConfig::new().init();
    let input = |n: usize, m: usize| {
        let random =
            |shape: [usize; 4]| Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        AttentionInput::new(
            random([1, 2, n, d_k]),
            random([1, 1, m, d_k]),
            random([1, 1, m, d_v]),
        )
    };
    let admitted = |n: usize, m: usize| {
        let shape = |len, d| Tensor::<4>::zeros([1, 1, len, d], &device);
        let probe = AttentionInput::new(
            Tensor::<4>::zeros([1, 2, n, d_k], &device),
            shape(m, d_k),
            shape(m, d_v),
        );
        attention
            .why_not(&probe, AttentionPath::CubeKernel)
            .expect("a valid call")
            .is_none()
    };
    // The largest length in 1..=65 536 that `fits`, by bisection (admitted lengths are a prefix).
    let largest = |fits: &dyn Fn(usize) -> bool| {
        let (mut lo, mut hi) = (1usize, 65_536usize);
        if fits(hi) {
            return None;
        }
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if fits(mid) { lo = mid } else { hi = mid }
        }
        Some(lo)
    };
    let Some(m_max) = largest(&|m| admitted(1, m)) else {
        println!("d_k {d_k}, d_v {d_v}: no loop limit on this device");
        return;
    };
    let n_max = largest(&|n| admitted(n, 33)).expect("a limit for n too");
    println!("d_k {d_k}, d_v {d_v}: m up to {m_max} with one query, n up to {n_max} over 33 keys");
    for (n, m) in [(1, m_max), (n_max, 33)] {
        let call = input(n, m);
        let weights = Tensor::<4>::random([1, 2, n, d_v], Distribution::Normal(0.0, 1.0), &device);
        let label = format!("d_k {d_k}, d_v {d_v}, n {n}, m {m} (the longest admitted)");
        assert!(
            kernel_or_refusal_matches_naive(&label, &call, &weights),
            "{label}"
        );
    }
    assert!(!admitted(1, m_max + 1) && !admitted(n_max + 1, 33));
}

#[test]
fn the_longest_sequences_the_loop_limit_admits_run_right() {
    for (d_k, d_v) in [(256, 256), (512, 512)] {
        the_longest_admitted_sequences_run_right(d_k, d_v);
    }
}

/// Runs the ignored test `name` of this binary alone in a child process with `env`, and asserts
/// that it ran and passed.
fn run_child(name: &str, env: &[(&str, &str)]) {
    crate::common::in_child(&format!("cube_sweep::{name}"), env);
}

/// Run by the shared-tile tests below in a child process, with the knobs set.
#[test]
#[ignore = "run by its parent tests in a child process, with the knobs set"]
fn child_sweep_in_the_limits_set_by_the_environment() {
    sweep(&CHILD_HEAD_SIZES);
}

#[test]
fn the_kernel_matches_naive_over_the_sweep_with_the_devices_tiling() {
    crate::common::in_child(
        "cube_sweep::child_the_kernel_matches_naive_over_the_sweep_with_the_devices_tiling",
        &[],
    );
}

/// The body of [`the_kernel_matches_naive_over_the_sweep_with_the_devices_tiling`], run in a child process: its own wgpu device, so that lavapipe
/// compiles its kernels on the second core while this binary's other tests use the first
/// (`common::in_child`).
#[test]
#[ignore = "run by its parent test in a child process"]
fn child_the_kernel_matches_naive_over_the_sweep_with_the_devices_tiling() {
    sweep(&HEAD_SIZES);
}

#[test]
fn the_kernel_matches_naive_over_the_sweep_in_shared_tiles() {
    run_child(
        "child_sweep_in_the_limits_set_by_the_environment",
        &[("SDPA_CUBE_PLANES", "off")],
    );
}

#[test]
fn the_kernel_matches_naive_over_the_sweep_in_16_kib_tiles() {
    run_child(
        "child_sweep_in_the_limits_set_by_the_environment",
        &[
            ("SDPA_CUBE_SHARED_BYTES", "16384"),
            ("SDPA_CUBE_PLANES", "off"),
        ],
    );
}
