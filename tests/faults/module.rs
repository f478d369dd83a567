//! The module refuses what it cannot compute with a typed error, and every path follows one
//! policy for NaN and infinite inputs.

use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, RngSeed};
use sdpa::{
    AttentionError, AttentionInput, AttentionPath, CausalAlignment, Implementation, ScalePolicy,
    ScaledDotProductAttentionConfig,
};

fn tensor(shape: [usize; 4], seed: u64, device: &Device) -> Tensor<4> {
    let len: usize = shape.iter().product();
    let data: Vec<f32> = (0..len)
        .map(|i| (((i as u64 + 1) * (seed * 2654435761 + 97)) % 1000) as f32 / 250.0 - 2.0)
        .collect();
    Tensor::from_data(TensorData::new(data, shape), device)
}

fn input(device: &Device) -> AttentionInput {
    AttentionInput::new(
        tensor([1, 2, 3, 4], 1, device),
        tensor([1, 2, 5, 4], 2, device),
        tensor([1, 2, 5, 4], 3, device),
    )
}

#[test]
fn mixed_dtypes_and_devices_are_typed_errors() {
    let flex = Device::flex();
    let attn = ScaledDotProductAttentionConfig::new().init();
    let mut mixed = input(&flex);
    mixed.key = mixed.key.cast(DType::F64);
    let e = attn.try_forward(mixed).unwrap_err();
    assert!(
        matches!(e, AttentionError::DtypeMismatch { other: "key", .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("F64"), "{e}");

    let mut biased = input(&flex);
    biased.bias = Some(tensor([1, 1, 3, 5], 4, &flex).cast(DType::F64));
    let e = attn.try_forward(biased).unwrap_err();
    assert!(
        matches!(e, AttentionError::DtypeMismatch { other: "bias", .. }),
        "{e:?}"
    );

    #[cfg(feature = "ndarray")]
    {
        #[allow(deprecated)]
        let ndarray = Device::ndarray();
        let mut elsewhere = input(&flex);
        elsewhere.value = tensor([1, 2, 5, 4], 3, &ndarray);
        let e = attn.try_forward(elsewhere).unwrap_err();
        assert!(
            matches!(e, AttentionError::DeviceMismatch { other: "value", .. }),
            "{e:?}"
        );
    }
    let mut half_autodiff = input(&flex);
    half_autodiff.key = tensor([1, 2, 5, 4], 2, &flex.clone().autodiff());
    let e = attn.try_forward(half_autodiff).unwrap_err();
    assert!(
        matches!(e, AttentionError::DeviceMismatch { other: "key", .. }),
        "{e:?}"
    );
}

#[test]
fn a_scale_set_after_init_is_checked_at_every_call() {
    let device = Device::flex();
    let mut attn = ScaledDotProductAttentionConfig::new().init();
    for bad in [f64::NAN, 1e300, 0.0, -1.0, 1e-60] {
        attn.scale = ScalePolicy::Fixed(bad);
        let e = attn.try_forward(input(&device)).unwrap_err();
        assert!(matches!(e, AttentionError::InvalidScale(_)), "{bad}: {e:?}");
    }
    assert!(
        ScaledDotProductAttentionConfig::new()
            .with_scale(ScalePolicy::Fixed(1e300))
            .try_init()
            .is_err()
    );
}

/// A random problem with NaN and infinities planted in q, k, v and the bias.
#[derive(Debug, Clone)]
struct Planted {
    n: usize,
    m: usize,
    group: usize,
    causal: Option<CausalAlignment>,
    masked_keys: Vec<bool>,
    plants: Vec<(u8, usize, u8)>,
}

fn planted() -> impl Strategy<Value = Planted> {
    (
        1..=6usize,
        1..=7usize,
        1..=2usize,
        0..3u8,
        proptest::collection::vec(any::<bool>(), 7),
        proptest::collection::vec((0..4u8, any::<usize>(), 0..4u8), 0..4),
    )
        .prop_map(|(n, m, group, causal, masked_keys, plants)| Planted {
            n,
            m,
            group,
            causal: match causal {
                0 => None,
                1 => Some(CausalAlignment::TopLeft),
                _ => Some(CausalAlignment::BottomRight),
            },
            masked_keys,
            plants,
        })
}

/// The context of every path that serves the call on flex, then of `Auto`: the naive path's
/// first (it serves every call; [`AttentionPath::all`] lists it first).
fn contexts(p: &Planted) -> Vec<(Implementation, Vec<f32>)> {
    let implementations: Vec<_> = AttentionPath::all(2)
        .into_iter()
        .map(AttentionPath::implementation)
        .chain([Implementation::Auto])
        .collect();
    let contexts = contexts_on(p, &Device::flex(), &implementations);
    assert_eq!(contexts[0].0, Implementation::Naive);
    contexts
}

/// The context of each of `implementations` on `device` (skipping those that cannot serve it).
fn contexts_on(
    p: &Planted,
    device: &Device,
    implementations: &[Implementation],
) -> Vec<(Implementation, Vec<f32>)> {
    let device = device.clone();
    let (h, d) = (2 * p.group, 3);
    let data = |shape: [usize; 4], seed: u64, which: u8| -> Vec<f32> {
        let mut values = tensor(shape, seed, &device)
            .into_data()
            .try_into_vec::<f32>()
            .expect("f32");
        for &(target, at, value) in &p.plants {
            if target == which {
                let len = values.len();
                values[at % len] =
                    [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::NAN][value as usize];
            }
        }
        values
    };
    let q = data([1, h, p.n, d], 1, 0);
    let k = data([1, 2, p.m, d], 2, 1);
    let v = data([1, 2, p.m, d], 3, 2);
    let bias = data([1, h, p.n, p.m], 4, 3);
    let mask: Vec<bool> = p.masked_keys[..p.m].to_vec();
    let mut out = Vec::new();
    for &implementation in implementations {
        let attn = ScaledDotProductAttentionConfig::new()
            .with_causal_alignment(p.causal.unwrap_or_default())
            .with_implementation(implementation)
            .init();
        let mut input = AttentionInput::new(
            Tensor::from_data(TensorData::new(q.clone(), [1, h, p.n, d]), &device),
            Tensor::from_data(TensorData::new(k.clone(), [1, 2, p.m, d]), &device),
            Tensor::from_data(TensorData::new(v.clone(), [1, 2, p.m, d]), &device),
        )
        .bias(Tensor::from_data(
            TensorData::new(bias.clone(), [1, h, p.n, p.m]),
            &device,
        ))
        .padding_mask(Tensor::from_data(
            TensorData::new(mask.clone(), [1, p.m]),
            &device,
        ));
        if p.causal.is_some() {
            input = input.causal();
        }
        match attn.try_forward(input) {
            Ok(o) => out.push((
                implementation,
                o.context.into_data().try_into_vec::<f32>().expect("f32"),
            )),
            // Fused knows no top-left alignment with n != m: skipped, with its reason.
            Err(AttentionError::Unsupported { .. }) => {}
            Err(e) => panic!("{implementation}: {e}"),
        }
    }
    out
}

fn config() -> PropConfig {
    PropConfig {
        cases: 64,
        rng_seed: RngSeed::Fixed(20261130),
        failure_persistence: None,
        ..PropConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Every path gives the same NaN rows and, elsewhere, the same finite values.
    #[test]
    fn every_path_follows_the_non_finite_policy(p in planted()) {
        let all = contexts(&p);
        let (_, naive) = &all[0];
        for (implementation, got) in &all[1..] {
            for (idx, (g, w)) in got.iter().zip(naive).enumerate() {
                prop_assert_eq!(g.is_nan(), w.is_nan(), "{} at {}: {} vs naive {} ({:?})", implementation, idx, g, w, p);
                prop_assert!(g.is_nan() || (g - w).abs() <= 1e-4 + 1e-4 * w.abs(),
                    "{} at {}: {} vs naive {} ({:?})", implementation, idx, g, w, p);
                prop_assert!(!g.is_infinite(), "{}: an infinite output", implementation);
            }
        }
    }
}

#[cfg(feature = "wgpu")]
proptest! {
    #![proptest_config(config())]

    /// The CubeCL kernel on wgpu applies the policy key by key: the same NaN rows as Naive on
    /// flex and, elsewhere, the same finite values.
    #[test]
    fn the_cube_kernel_follows_the_non_finite_policy(p in planted()) {
        let naive = contexts(&p).remove(0).1;
        let device = sdpa::BackendKind::Wgpu.device().expect("wgpu");
        let cube = contexts_on(&p, &device, &[Implementation::CubeKernel]);
        prop_assert_eq!(cube.len(), 1, "the kernel serves every planted case");
        for (idx, (g, w)) in cube[0].1.iter().zip(&naive).enumerate() {
            prop_assert_eq!(g.is_nan(), w.is_nan(), "at {}: {} vs naive {} ({:?})", idx, g, w, p);
            prop_assert!(g.is_nan() || (g - w).abs() <= 1e-4 + 1e-4 * w.abs(),
                "at {}: {} vs naive {} ({:?})", idx, g, w, p);
        }
    }
}

#[test]
fn the_policy_on_a_worked_example() {
    // Keys 0..5; key 4 is padding. A NaN value at the padded key touches no row; a NaN query
    // row poisons its own row only; an infinite key seen by every row poisons them all.
    let device = Device::flex();
    let attn = ScaledDotProductAttentionConfig::new().init();
    let run = |q: Tensor<4>, k: Tensor<4>, v: Tensor<4>| -> Vec<f32> {
        let padding = Tensor::<2, Bool>::from_data(
            TensorData::new(vec![false, false, false, false, true], [1, 5]),
            &device,
        );
        attn.forward(AttentionInput::new(q, k, v).padding_mask(padding))
            .context
            .into_data()
            .try_into_vec::<f32>()
            .expect("f32")
    };
    let (q, k, v) = (
        tensor([1, 1, 3, 4], 1, &device),
        tensor([1, 1, 5, 4], 2, &device),
        tensor([1, 1, 5, 4], 3, &device),
    );
    let nan_at = |t: Tensor<4>, idx: usize, value: f32| {
        let shape = t.dims();
        let mut data = t.into_data().try_into_vec::<f32>().expect("f32");
        data[idx] = value;
        Tensor::<4>::from_data(TensorData::new(data, shape), &device)
    };
    let clean = run(q.clone(), k.clone(), v.clone());
    assert!(clean.iter().all(|x| x.is_finite()));
    // v of the padded key 4: nothing changes.
    assert_eq!(
        run(q.clone(), k.clone(), nan_at(v.clone(), 4 * 4 + 1, f32::NAN)),
        clean
    );
    // q row 1: row 1 is NaN, rows 0 and 2 unchanged.
    let got = run(nan_at(q.clone(), 4 + 2, f32::NAN), k.clone(), v.clone());
    assert!(got[4..8].iter().all(|x| x.is_nan()));
    assert_eq!(&got[..4], &clean[..4]);
    assert_eq!(&got[8..], &clean[8..]);
    // k of the visible key 2 is infinite: every row sees it.
    let got = run(q, nan_at(k, 2 * 4, f32::INFINITY), v);
    assert!(got.iter().all(|x| x.is_nan()));
}

/// Context and the gradients of Q, K and V of one call (an autodiff device), or the error.
fn forward_backward(
    implementation: Implementation,
    alignment: CausalAlignment,
    causal: bool,
    window: Option<(Option<usize>, Option<usize>)>,
    device: &Device,
) -> Result<Vec<Vec<f32>>, AttentionError> {
    let attn = ScaledDotProductAttentionConfig::new()
        .with_implementation(implementation)
        .with_causal_alignment(alignment)
        .init();
    let q = tensor([1, 2, 3, 4], 1, device).require_grad();
    let k = tensor([1, 2, 5, 4], 2, device).require_grad();
    let v = tensor([1, 2, 5, 4], 3, device).require_grad();
    let mut input = AttentionInput::new(q.clone(), k.clone(), v.clone());
    if causal {
        input = input.causal();
    }
    if let Some((left, right)) = window {
        input = input.window(left, right);
    }
    let context = attn.try_forward(input)?.context;
    let grads = context
        .clone()
        .mul(tensor([1, 2, 3, 4], 9, device))
        .sum()
        .backward();
    let read = |t: Tensor<4>| {
        t.into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .expect("f32")
    };
    Ok(vec![
        read(context.without_autodiff()),
        read(q.grad(&grads).expect("dq")),
        read(k.grad(&grads).expect("dk")),
        read(v.grad(&grads).expect("dv")),
    ])
}

#[test]
fn a_window_past_every_key_is_exactly_an_unbounded_one() {
    let mut devices = vec![("flex", Device::flex())];
    #[cfg(feature = "ndarray")]
    #[allow(deprecated)]
    devices.push(("ndarray", Device::ndarray()));
    #[cfg(feature = "wgpu")]
    if let Ok(device) = sdpa::BackendKind::Wgpu.device() {
        devices.push(("wgpu", device));
    }
    let huge = [
        5usize,
        8,
        (1 << 31) - 1,
        1 << 31,
        (1 << 63) - 1,
        1 << 63,
        usize::MAX,
    ];
    let paths: Vec<_> = Implementation::all(2).collect();
    let mut compared = 0;
    for (name, device) in &devices {
        let device = device.clone().autodiff();
        for &path in &paths {
            for alignment in [CausalAlignment::BottomRight, CausalAlignment::TopLeft] {
                for causal in [false, true] {
                    // The reference: the same call with the huge side left out.
                    let Ok(want) = forward_backward(path, alignment, causal, None, &device) else {
                        continue;
                    };
                    for &w in &huge {
                        for (window, reference) in [
                            ((Some(w), None), want.clone()),
                            ((None, Some(w)), want.clone()),
                            ((Some(w), Some(w)), want.clone()),
                        ] {
                            let got =
                                forward_backward(path, alignment, causal, Some(window), &device)
                                    .unwrap_or_else(|e| {
                                        panic!("{name} {path} {alignment:?} window {window:?}: {e}")
                                    });
                            for (part, (g, r)) in ["context", "dq", "dk", "dv"]
                                .iter()
                                .zip(got.iter().zip(&reference))
                            {
                                let err = g
                                    .iter()
                                    .zip(r)
                                    .map(|(a, b)| (a - b).abs())
                                    .fold(0.0f32, f32::max);
                                assert!(
                                    err <= 1e-5,
                                    "{name} {path} {alignment:?} causal {causal} window \
                                     {window:?}: {part} differs by {err}"
                                );
                            }
                            compared += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(
        compared >= 7 * 3 * 2 * 2 * 3,
        "only {compared} calls compared"
    );
}
