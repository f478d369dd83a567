//! The CubeCL flash kernel on half-precision data (wgpu): f16 inputs are computed in f32 and
//! only the results are rounded, so the kernel's f16 context and gradients sit within a few f16
//! roundings of an f32 `Naive` run on the same (f16-exact) values — and closer to it than
//! `Naive` computing in f16 itself. Each half type is served where the device reports it
//! (`Device::supports_dtype`); where it does not (bf16 on lavapipe), the kernel refuses it with
//! the reason and `Auto` takes another path.

#![cfg(feature = "wgpu")]

use burn::prelude::*;
use burn::tensor::{DType, Distribution, FloatDType};
use sdpa::{
    AttentionInput, AttentionPath, BackendKind, CausalAlignment, Implementation,
    ScaledDotProductAttentionConfig,
};

use crate::common::values;

/// f16's unit roundoff, 2⁻¹¹: rounding a value x to f16 moves it by at most `U_F16 · |x|`.
const U_F16: f64 = 1.0 / 2048.0;
/// bf16's, 2⁻⁸.
const U_BF16: f64 = 1.0 / 256.0;

/// The tolerance, fixed before the run: every output within `ROUNDINGS` unit roundoffs of the
/// largest reference value of its tensor. One rounding comes from storing the result; the
/// backward pass also reads the rounded context (in D = rowsum(dO ∘ O)), whose error the softmax
/// gradient carries into dQ, dK and the bias gradient; 4 leaves room for both.
const ROUNDINGS: f64 = 4.0;

/// The context and the gradients of q, k, v and the bias of the loss Σ context ∘ w, with every
/// float input (and w) in `dtype`, through `implementation`; each as f64 values.
fn run(
    input: &AttentionInput,
    weights: &Tensor<4>,
    dtype: DType,
    implementation: Implementation,
    softcap: Option<f64>,
) -> [Vec<f64>; 5] {
    let leaf = |t: &Tensor<4>| t.clone().cast(dtype).detach().require_grad();
    let mut input = input.clone();
    let (q, k, v) = (leaf(&input.query), leaf(&input.key), leaf(&input.value));
    (input.query, input.key, input.value) = (q.clone(), k.clone(), v.clone());
    let bias = input.bias.as_ref().map(leaf);
    input.bias = bias.clone();
    let attention = ScaledDotProductAttentionConfig::new()
        .with_implementation(implementation)
        .with_causal_alignment(CausalAlignment::BottomRight)
        .with_softcap(softcap)
        .init();
    let context = attention.forward(input).context;
    assert_eq!(
        context.dtype(),
        dtype,
        "the context comes back in the inputs' dtype"
    );
    let grads = (context.clone() * weights.clone().cast(dtype))
        .sum()
        .backward();
    let grad = |t: &Tensor<4>| {
        let g = t.grad(&grads).expect("a gradient");
        assert_eq!(g.dtype(), dtype, "a gradient in its input's dtype");
        values(g)
    };
    let bias_grad = bias.as_ref().map(grad).unwrap_or_default();
    [values(context), grad(&q), grad(&k), grad(&v), bias_grad]
}

/// The largest |got − expected| over the largest |expected|.
fn relative_error(got: &[f64], expected: &[f64]) -> f64 {
    assert_eq!(got.len(), expected.len());
    let scale = expected
        .iter()
        .fold(0.0f64, |a, x| a.max(x.abs()))
        .max(1e-30);
    let err = got
        .iter()
        .zip(expected)
        .fold(0.0f64, |a, (g, e)| a.max((g - e).abs()));
    err / scale
}

/// A named case and its soft-cap.
type Case = (&'static str, AttentionInput, Option<f64>);

/// Random inputs `[2, h, n, d]` etc. already rounded to `dtype` (so the f32 reference sees
/// exactly the values the half-precision runs see), and the cases to compare.
fn cases(
    device: &Device,
    dtype: DType,
    (n, m, h, h_kv, d): (usize, usize, usize, usize, usize),
) -> (Tensor<4>, Vec<Case>) {
    let random = |shape: [usize; 4]| {
        Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), device)
            .cast(dtype)
            .cast(FloatDType::F32)
    };
    let plain = AttentionInput::new(
        random([2, h, n, d]),
        random([2, h_kv, m, d]),
        random([2, h_kv, m, d]),
    );
    let mask =
        Tensor::<4>::random([2, 1, n, m], Distribution::Uniform(0.0, 1.0), device).lower_elem(0.3);
    let thirds = |len: usize| {
        let docs = vec![len / 3, len / 3, len - 2 * (len / 3)];
        sdpa::mask::segment_ids_from_lengths(&[docs.clone(), docs], len, device).unwrap()
    };
    let slopes = Tensor::<1>::from_floats(sdpa::mask::alibi_slopes(h).as_slice(), device);
    let cases = vec![
        ("plain", plain.clone(), None),
        ("causal, soft-cap", plain.clone().causal(), Some(2.0)),
        (
            "bias [1, h, n, m], mask",
            plain.clone().bias(random([1, h, n, m])).mask(mask),
            None,
        ),
        (
            "segments, ALiBi, causal",
            plain
                .clone()
                .segments(thirds(n), thirds(m))
                .alibi(slopes)
                .causal(),
            None,
        ),
        ("window", plain.clone().window(7, 2), None),
    ];
    (random([2, h, n, d]), cases)
}

/// The kernel in `dtype` against `Naive` in f32 on the same values; `Naive` in `dtype` is
/// measured beside it, and its worst error must exceed the kernel's (it rounds every step).
fn compare(device: &Device, dtype: DType, unit_roundoff: f64) {
    let (mut worst, mut naive_worst) = (0.0f64, 0.0f64);
    // A short shape whose head size (12) takes the workgroup-memory tiles, a long one (16) the
    // plane broadcasts.
    for shape in [(37, 53, 4, 2, 12), (300, 260, 2, 1, 16)] {
        let (weights, cases) = cases(device, dtype, shape);
        for (name, input, softcap) in cases {
            let got = run(&input, &weights, dtype, Implementation::CubeKernel, softcap);
            let reference = run(&input, &weights, DType::F32, Implementation::Naive, softcap);
            let naive_half = run(&input, &weights, dtype, Implementation::Naive, softcap);
            for (idx, what) in ["context", "dq", "dk", "dv", "dbias"].iter().enumerate() {
                if reference[idx].is_empty() {
                    continue; // no bias, no bias gradient
                }
                let err = relative_error(&got[idx], &reference[idx]);
                let naive_err = relative_error(&naive_half[idx], &reference[idx]);
                println!(
                    "{dtype:?} {shape:?} {name}: {what} error {:.2} roundings (Naive in {dtype:?}: {:.2})",
                    err / unit_roundoff,
                    naive_err / unit_roundoff
                );
                assert!(
                    err <= ROUNDINGS * unit_roundoff,
                    "{dtype:?} {shape:?} {name}: {what} is {:.2} roundings from the f32 reference",
                    err / unit_roundoff
                );
                worst = worst.max(err);
                naive_worst = naive_worst.max(naive_err);
            }
        }
    }
    assert!(
        worst < naive_worst,
        "{dtype:?}: the kernel's worst error ({:.2} roundings) is not below Naive's in {dtype:?} ({:.2})",
        worst / unit_roundoff,
        naive_worst / unit_roundoff
    );
}

/// On a device without `dtype`, the kernel refuses it with the reason and `Auto` does not take
/// it.
fn assert_refused(device: &Device, dtype: DType) {
    // `empty` allocates without running a kernel in the missing type.
    let x = Tensor::<4>::empty([1, 1, 4, 8], (device, dtype));
    let input = AttentionInput::new(x.clone(), x.clone(), x);
    let err = ScaledDotProductAttentionConfig::new()
        .with_implementation(Implementation::CubeKernel)
        .init()
        .path(&input)
        .expect_err("a dtype the device lacks");
    assert!(
        err.to_string().contains("does not support this dtype"),
        "{err}"
    );
    let auto = ScaledDotProductAttentionConfig::new().init().path(&input);
    assert_ne!(auto.ok(), Some(AttentionPath::CubeKernel));
}

#[test]
fn the_cube_kernel_computes_f16_in_f32_on_wgpu() {
    let device = BackendKind::Wgpu.device().expect("wgpu").autodiff();
    device.seed(11);
    if !device.supports_dtype(FloatDType::F16) {
        println!("this wgpu device has no f16 (lavapipe, in CI, has it)");
        assert_refused(&device, DType::F16);
        return;
    }
    let x = Tensor::<4>::zeros([1, 1, 4, 8], (&device, DType::F16));
    let attention = ScaledDotProductAttentionConfig::new().init();
    assert_eq!(
        attention
            .path(&AttentionInput::new(x.clone(), x.clone(), x))
            .unwrap(),
        AttentionPath::CubeKernel,
        "Auto takes the kernel for f16"
    );
    compare(&device, DType::F16, U_F16);
}

#[test]
fn the_cube_kernel_serves_bf16_where_the_device_has_it() {
    let device = BackendKind::Wgpu.device().expect("wgpu").autodiff();
    device.seed(12);
    if device.supports_dtype(FloatDType::BF16) {
        compare(&device, DType::BF16, U_BF16);
    } else {
        assert_refused(&device, DType::BF16);
    }
}
