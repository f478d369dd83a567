//! Half-precision runs of a fused kernel against `Naive`: inputs rounded to the half type, the
//! kernel's context and gradients within a few roundings of an f32 `Naive` run on the same
//! values, and closer to it than `Naive` computing in the half type itself. Used by the CubeCL
//! kernel's tests on wgpu (`cube_dtypes.rs`) and the CPU kernel's on Flex (`cpu_dtypes.rs`).

use burn::prelude::*;
use burn::tensor::{DType, Distribution, FloatDType};
use sdpa::{AttentionInput, CausalAlignment, Implementation, ScaledDotProductAttentionConfig};

use crate::common::values;

/// f16's unit roundoff, 2⁻¹¹: rounding a value x to f16 moves it by at most `U_F16 · |x|`.
pub const U_F16: f64 = 1.0 / 2048.0;
/// bf16's, 2⁻⁸.
pub const U_BF16: f64 = 1.0 / 256.0;

/// The tolerance, fixed before the run: every output within `ROUNDINGS` unit roundoffs of the
/// largest reference value of its tensor. One rounding comes from storing the result; the
/// backward pass also reads the rounded context (in D = rowsum(dO ∘ O)), whose error the softmax
/// gradient carries into dQ, dK and the bias gradient; 4 leaves room for both.
const ROUNDINGS: f64 = 4.0;

/// The context and the gradients of q, k, v and the bias of the loss Σ context ∘ w, with every
/// float input (and w) in `dtype`, through `implementation`; each as f64 values.
pub fn run(
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
pub fn relative_error(got: &[f64], expected: &[f64]) -> f64 {
    assert_eq!(got.len(), expected.len());
    // A non-finite value fails whatever the tolerance (`max` would skip a NaN).
    if got
        .iter()
        .zip(expected)
        .any(|(g, e)| !g.is_finite() && e.is_finite())
    {
        return f64::INFINITY;
    }
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
fn cases(device: &Device, dtype: DType, (n, m, h, h_kv, d): Shape) -> (Tensor<4>, Vec<Case>) {
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

/// Shapes `(n, m, h, h_kv, d)` of [`compare`].
pub type Shape = (usize, usize, usize, usize, usize);

/// `kernel` in `dtype` against `Naive` in f32 on the same values, at each shape; `Naive` in
/// `dtype` is measured beside it, and its worst error must exceed the kernel's (it rounds every
/// step).
pub fn compare(
    device: &Device,
    dtype: DType,
    unit_roundoff: f64,
    kernel: Implementation,
    shapes: &[Shape],
) {
    let (mut worst, mut naive_worst) = (0.0f64, 0.0f64);
    for &shape in shapes {
        let (weights, cases) = cases(device, dtype, shape);
        for (name, input, softcap) in cases {
            let got = run(&input, &weights, dtype, kernel, softcap);
            let reference = run(&input, &weights, DType::F32, Implementation::Naive, softcap);
            let naive_half = run(&input, &weights, dtype, Implementation::Naive, softcap);
            for (idx, what) in ["context", "dq", "dk", "dv", "dbias"].iter().enumerate() {
                if reference[idx].is_empty() {
                    continue; // no bias, no bias gradient
                }
                let err = relative_error(&got[idx], &reference[idx]);
                let naive_err = relative_error(&naive_half[idx], &reference[idx]);
                println!(
                    "{kernel} {dtype:?} {shape:?} {name}: {what} error {:.2} roundings (Naive in {dtype:?}: {:.2})",
                    err / unit_roundoff,
                    naive_err / unit_roundoff
                );
                assert!(
                    err <= ROUNDINGS * unit_roundoff,
                    "{kernel} {dtype:?} {shape:?} {name}: {what} is {:.2} roundings from the f32 reference",
                    err / unit_roundoff
                );
                worst = worst.max(err);
                naive_worst = naive_worst.max(naive_err);
            }
        }
    }
    assert!(
        worst < naive_worst,
        "{kernel} {dtype:?}: the kernel's worst error ({:.2} roundings) is not below Naive's in {dtype:?} ({:.2})",
        worst / unit_roundoff,
        naive_worst / unit_roundoff
    );
}
