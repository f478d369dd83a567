//! Autodiff gradients agree with central finite differences computed on a float64 device.

use burn::prelude::*;
use sdpa::{
    AttentionInput, CausalAlignment, Implementation, ScalePolicy, ScaledDotProductAttentionConfig,
};

use crate::common::{lcg_values, tensor4_f64, values};

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
}

/// The loss sum(context · g) for a causal, masked (one fully masked row), biased, grouped-query
/// problem, in float64. Returns the loss and, when `grads`, the gradients of q, k, v.
fn loss(
    x: &Inputs,
    device: &Device,
    grads: bool,
    implementation: Implementation,
) -> (f64, Option<[Vec<f64>; 3]>) {
    let device = if grads {
        device.clone().autodiff()
    } else {
        device.clone()
    };
    let mut q = tensor4_f64(&x.q, [B, H, N, D], &device);
    let mut k = tensor4_f64(&x.k, [B, H_KV, M, D], &device);
    let mut v = tensor4_f64(&x.v, [B, H_KV, M, D], &device);
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
    let bias = tensor4_f64(&x.bias, [1, 1, N, M], &device);
    let attn = ScaledDotProductAttentionConfig::new()
        .with_scale(ScalePolicy::Fixed(0.8))
        .with_causal_alignment(CausalAlignment::BottomRight)
        .with_implementation(implementation)
        .init();
    let out = attn.forward(
        AttentionInput::new(q.clone(), k.clone(), v.clone())
            .mask(mask)
            .bias(bias)
            .causal(),
    );
    let g = tensor4_f64(&x.g, [B, H, N, D], &device);
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
    for implementation in [
        Implementation::Naive,
        Implementation::Chunked { block_size: 3 },
        Implementation::Fused,
    ] {
        check_gradients(implementation);
    }
}

#[cfg(feature = "flex")]
fn check_gradients(implementation: Implementation) {
    let device = Device::flex();
    let x = Inputs {
        q: lcg_values(1, B * H * N * D),
        k: lcg_values(2, B * H_KV * M * D),
        v: lcg_values(3, B * H_KV * M * D),
        g: lcg_values(4, B * H * N * D),
        bias: lcg_values(5, N * M),
    };
    let (_, grads) = loss(&x, &device, true, implementation);
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
                };
                match which {
                    0 => y.q[idx] += delta,
                    1 => y.k[idx] += delta,
                    _ => y.v[idx] += delta,
                }
                loss(&y, &device, false, implementation).0
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
