//! The CubeCL flash kernel on CUDA against `Naive`, forward and backward (f32, and bf16 where
//! the GPU has it). Needs a CUDA GPU: ignored elsewhere (run it with `--ignored` on one). The
//! refusals without a GPU are tested in `tests/faults/cli.rs` and `src/backend.rs`.

#![cfg(feature = "cuda")]

use burn::prelude::*;
use burn::tensor::{DType, Distribution, FloatDType};
use sdpa::{
    AttentionInput, AttentionPath, BackendFamily, BackendKind, Implementation,
    ScaledDotProductAttentionConfig,
};

use crate::common::values;

/// The context and the gradients of q, k, v (of Σ context ∘ w) of `implementation`.
fn run(input: &AttentionInput, implementation: Implementation, w: &Tensor<4>) -> [Vec<f64>; 4] {
    let leaf = |t: &Tensor<4>| t.clone().detach().require_grad();
    let (q, k, v) = (leaf(&input.query), leaf(&input.key), leaf(&input.value));
    let mut input = input.clone();
    (input.query, input.key, input.value) = (q.clone(), k.clone(), v.clone());
    let attention = ScaledDotProductAttentionConfig::new()
        .with_implementation(implementation)
        .init();
    if implementation == Implementation::CubeKernel {
        let path = attention.path(&input).expect("served");
        assert_eq!(path, AttentionPath::CubeKernel);
    }
    let context = attention.forward(input).context.cast(DType::F32);
    let grads = (context.clone() * w.clone()).sum().backward();
    let grad = |t: &Tensor<4>| values(t.grad(&grads).expect("a gradient").cast(DType::F32));
    [values(context), grad(&q), grad(&k), grad(&v)]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_cube_kernel_trains_like_naive_on_cuda() {
    let device = BackendKind::Cuda
        .device()
        .expect("a CUDA GPU and its driver")
        .autodiff();
    assert_eq!(BackendFamily::of(&device), BackendFamily::CubeCl);
    device.seed(11);
    // bf16: the kernel computes in f32, the naive path in bf16 (relative to the largest value).
    for (dtype, tolerance) in [(DType::F32, 1e-4), (DType::BF16, 3e-2)] {
        if dtype == DType::BF16 && !device.supports_dtype(FloatDType::BF16) {
            continue;
        }
        for (n, m, h, d, causal) in [(37, 53, 4, 16, false), (256, 256, 2, 64, true)] {
            let random = |shape: [usize; 4]| {
                Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device).cast(dtype)
            };
            let mut input = AttentionInput::new(
                random([2, h, n, d]),
                random([2, h, m, d]),
                random([2, h, m, d]),
            );
            if causal {
                input = input.causal();
            }
            let w = Tensor::<4>::random([2, h, n, d], Distribution::Normal(0.0, 1.0), &device);
            let got = run(&input, Implementation::CubeKernel, &w);
            let want = run(&input, Implementation::Naive, &w);
            for (what, (g, e)) in ["context", "dq", "dk", "dv"]
                .iter()
                .zip(got.iter().zip(&want))
            {
                assert_eq!(g.len(), e.len(), "{dtype:?} n {n}: {what}");
                let err = g
                    .iter()
                    .zip(e)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                let scale = e.iter().map(|x| x.abs()).fold(1.0, f64::max);
                let err = err / scale;
                assert!(
                    err < tolerance,
                    "{dtype:?} n {n} causal {causal}: {what} off by {err}"
                );
            }
        }
    }
}
