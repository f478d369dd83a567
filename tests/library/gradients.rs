//! Autodiff gradients agree with central finite differences computed on a float64 device.

use burn::prelude::*;
use sdpa::{
    AttentionInput, AttentionPath, BackendFamily, CausalAlignment, Implementation, ScalePolicy,
    ScaledDotProductAttentionConfig,
};

use crate::common::{cpu_devices, lcg_values, tensor4, tensor4_f64, values};

const B: usize = 1;
const H: usize = 2;
const H_KV: usize = 1;
const N: usize = 3;
const M: usize = 4;
const D: usize = 3;

struct Inputs {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    g: Vec<f64>,
    bias: Vec<f64>,
    /// Also soft-cap the scores (c = 1.5) and restrict each query to a window `(1, None)`.
    extensions: bool,
}

/// The loss sum(context · g) for a causal, masked (one fully masked row), biased, grouped-query
/// problem (soft-capped and windowed when `x.extensions`), in float64 (`float64`) or float32. Returns the loss and, when `grads`, the
/// gradients of q, k, v.
fn loss(
    x: &Inputs,
    device: &Device,
    grads: bool,
    implementation: Implementation,
    float64: bool,
) -> (f64, Option<[Vec<f64>; 3]>) {
    let device = if grads {
        device.clone().autodiff()
    } else {
        device.clone()
    };
    let tensor = |data: &[f64], shape| {
        if float64 {
            tensor4_f64(data, shape, &device)
        } else {
            tensor4(data, shape, &device)
        }
    };
    let mut q = tensor(&x.q, [B, H, N, D]);
    let mut k = tensor(&x.k, [B, H_KV, M, D]);
    let mut v = tensor(&x.v, [B, H_KV, M, D]);
    if grads {
        q = q.require_grad();
        k = k.require_grad();
        v = v.require_grad();
    }
    // Query row 0 of head 1 sees nothing; key 2 is hidden from everyone in head 0.
    let mut mask = vec![false; H * N * M];
    for j in 0..M {
        mask[N * M + j] = true;
    }
    for i in 0..N {
        mask[i * M + 2] = true;
    }
    let mask =
        Tensor::<4, Bool>::from_data(burn::tensor::TensorData::new(mask, [1, H, N, M]), &device);
    let bias = tensor(&x.bias, [1, 1, N, M]);
    let attn = ScaledDotProductAttentionConfig::new()
        .with_scale(ScalePolicy::Fixed(0.8))
        .with_causal_alignment(CausalAlignment::BottomRight)
        .with_implementation(implementation)
        .with_softcap(x.extensions.then_some(1.5))
        .init();
    let mut input = AttentionInput::new(q.clone(), k.clone(), v.clone())
        .mask(mask)
        .bias(bias)
        .causal();
    if x.extensions {
        // Query i (centre i + 1) sees keys i ..= i + 1 with the causal mask.
        input = input.window(1, None);
    }
    let out = attn.forward(input);
    let g = tensor(&x.g, [B, H, N, D]);
    let l = (out.context * g).sum();
    let value = values(l.clone())[0];
    let grads = grads.then(|| {
        let gr = l.backward();
        [
            values(q.grad(&gr).expect("dq")),
            values(k.grad(&gr).expect("dk")),
            values(v.grad(&gr).expect("dv")),
        ]
    });
    (value, grads)
}

#[cfg(feature = "flex")]
#[test]
fn gradients_match_central_finite_differences_in_f64() {
    for implementation in f64_paths() {
        check_gradients(implementation, false);
    }
}

/// The same with soft-capping and a window: on the tensor-op paths, through autodiff of tanh and
/// of the window's mask (Fused builds an explicit one).
#[cfg(feature = "flex")]
#[test]
fn capped_and_windowed_gradients_match_central_finite_differences_in_f64() {
    for implementation in f64_paths() {
        check_gradients(implementation, true);
    }
}

/// The explicit paths that serve a float64 training call on flex, each asked with
/// [`why_not`](sdpa::ScaledDotProductAttention::why_not) (the kernels compute in f32 and refuse
/// f64); at least the three tensor-op paths do, else these tests would check less than they say.
#[cfg(feature = "flex")]
fn f64_paths() -> Vec<Implementation> {
    let device = Device::flex().autodiff();
    let q = tensor4_f64(&lcg_values(1, B * H * N * D), [B, H, N, D], &device);
    let kv = tensor4_f64(&lcg_values(2, B * H_KV * M * D), [B, H_KV, M, D], &device);
    let input = AttentionInput::new(q, kv.clone(), kv).causal();
    let attn = ScaledDotProductAttentionConfig::new().init();
    let family = BackendFamily::of(&device);
    let served: Vec<Implementation> = AttentionPath::all(3)
        .into_iter()
        .filter(|&path| path.runs_on(family))
        .filter(|&path| attn.why_not(&input, path).expect("a valid call").is_none())
        .map(AttentionPath::implementation)
        .collect();
    for tensor_ops in [
        Implementation::Naive,
        Implementation::Chunked { block_size: 3 },
        Implementation::Fused,
    ] {
        assert!(
            served.contains(&tensor_ops),
            "{tensor_ops} refused f64: {served:?}"
        );
    }
    served
}

#[cfg(feature = "flex")]
fn check_gradients(implementation: Implementation, extensions: bool) {
    let device = Device::flex();
    let x = Inputs {
        q: lcg_values(1, B * H * N * D),
        k: lcg_values(2, B * H_KV * M * D),
        v: lcg_values(3, B * H_KV * M * D),
        g: lcg_values(4, B * H * N * D),
        bias: lcg_values(5, N * M),
        extensions,
    };
    let (_, grads) = loss(&x, &device, true, implementation, true);
    let [dq, dk, dv] = grads.expect("grads");
    let eps = 1e-6;
    let mut worst = 0.0f64;
    for (which, analytic) in [(0, &dq), (1, &dk), (2, &dv)] {
        for (idx, &autodiff) in analytic.iter().enumerate() {
            let perturb = |delta: f64| {
                let mut y = Inputs {
                    q: x.q.clone(),
                    k: x.k.clone(),
                    v: x.v.clone(),
                    g: x.g.clone(),
                    bias: x.bias.clone(),
                    extensions: x.extensions,
                };
                match which {
                    0 => y.q[idx] += delta,
                    1 => y.k[idx] += delta,
                    _ => y.v[idx] += delta,
                }
                loss(&y, &device, false, implementation, true).0
            };
            let numeric = (perturb(eps) - perturb(-eps)) / (2.0 * eps);
            let err = (numeric - autodiff).abs();
            worst = worst.max(err);
            assert!(
                err < 1e-6 + 1e-5 * numeric.abs(),
                "{implementation:?}: tensor {which} index {idx}: autodiff {autodiff} vs finite difference {numeric}"
            );
        }
    }
    println!("{implementation:?}: worst |autodiff - finite difference| = {worst:.2e}");
    // The fully masked query row (head 1, row 0) receives exactly zero gradient.
    assert!(
        dq[(N) * D..(N + 1) * D].iter().all(|&x| x == 0.0),
        "masked row gradient {:?}",
        &dq[N * D..(N + 1) * D]
    );
    assert!(dq.iter().chain(&dk).chain(&dv).all(|x| x.is_finite()));
}

/// Asserts that the f32 gradients of `implementation` on `device` (`label` in messages) agree
/// with central finite differences of the float64 loss (the naive path on flex), including the
/// exact zero of the fully masked row, with (`extensions`) and without the soft-cap and the
/// window.
#[cfg(feature = "flex")]
fn assert_matches_finite_differences(
    label: &str,
    device: &Device,
    implementation: Implementation,
    extensions: bool,
) {
    let reference = Device::flex();
    let eps = 1e-6;
    let x = Inputs {
        q: lcg_values(1, B * H * N * D),
        k: lcg_values(2, B * H_KV * M * D),
        v: lcg_values(3, B * H_KV * M * D),
        g: lcg_values(4, B * H * N * D),
        bias: lcg_values(5, N * M),
        extensions,
    };
    let (_, grads) = loss(&x, device, true, implementation, false);
    let [dq, dk, dv] = grads.expect("grads");
    for (which, analytic) in [(0, &dq), (1, &dk), (2, &dv)] {
        for (idx, &kernel) in analytic.iter().enumerate() {
            let perturb = |delta: f64| {
                let mut y = Inputs {
                    q: x.q.clone(),
                    k: x.k.clone(),
                    v: x.v.clone(),
                    g: x.g.clone(),
                    bias: x.bias.clone(),
                    extensions: x.extensions,
                };
                match which {
                    0 => y.q[idx] += delta,
                    1 => y.k[idx] += delta,
                    _ => y.v[idx] += delta,
                }
                loss(&y, &reference, false, Implementation::Naive, true).0
            };
            let numeric = (perturb(eps) - perturb(-eps)) / (2.0 * eps);
            assert!(
                (numeric - kernel).abs() < 1e-5 + 1e-4 * numeric.abs(),
                "{label} (extensions: {extensions}): tensor {which} index {idx}: kernel {kernel} vs finite difference {numeric}"
            );
        }
    }
    assert!(
        dq[N * D..(N + 1) * D].iter().all(|&g| g == 0.0),
        "{label}: masked row"
    );
}

/// The CPU kernel computes in f32 with its own backward pass: its gradients, on every CPU backend
/// where it runs in place, agree with central finite differences of the float64 loss.
#[cfg(feature = "flex")]
#[test]
fn cpu_kernel_gradients_match_finite_differences() {
    let mut checked = 0;
    for (backend, device) in cpu_devices() {
        if !sdpa::cpu_kernel::runs_in_place(&device) {
            continue;
        }
        for extensions in [false, true] {
            assert_matches_finite_differences(
                &backend.to_string(),
                &device,
                Implementation::CpuKernel,
                extensions,
            );
            checked += 1;
        }
    }
    assert!(checked >= 2, "no CPU backend ran the kernel in place");
}

/// The CubeCL kernel computes in f32 with its own backward pass: its gradients on wgpu (Mesa
/// lavapipe in CI) agree with central finite differences of the float64 loss.
#[cfg(all(feature = "flex", feature = "wgpu"))]
#[test]
fn cube_kernel_gradients_match_finite_differences() {
    let device = sdpa::BackendKind::Wgpu
        .device()
        .expect("wgpu (lavapipe in CI)");
    for extensions in [false, true] {
        assert_matches_finite_differences("wgpu", &device, Implementation::CubeKernel, extensions);
    }
}
