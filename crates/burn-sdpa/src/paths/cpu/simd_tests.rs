//! Tests of the softmax loops: every instance against the portable one and against f64.
#[test]
fn tanh_matches_std() {
    let mut worst: f32 = 0.0;
    for i in -200_000..=200_000 {
        let y = i as f32 * 1e-4;
        worst = worst.max((super::tanh(y, f32::mul_add) - y.tanh()).abs());
    }
    assert!(worst < 3e-7, "worst absolute error {worst}");
    assert_eq!(super::tanh(f32::INFINITY, f32::mul_add), 1.0);
    assert_eq!(super::tanh(-1e30, f32::mul_add), -1.0);
    let mut xs: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.7).collect();
    let want: Vec<f32> = xs.iter().map(|x| 3.0 * (x / 3.0).tanh()).collect();
    let mut grad = vec![0.0; xs.len()];
    super::softcap_with_grad(&mut xs, 3.0, &mut grad);
    for ((x, w), (g, i)) in xs.iter().zip(&want).zip(grad.iter().zip(0..)) {
        let t = ((i as f32 - 18.0) * 0.7 / 3.0).tanh();
        assert!(
            (x - w).abs() < 1e-6 && (g - (1.0 - t * t)).abs() < 1e-6,
            "{i}"
        );
    }
}

#[test]
fn exp_matches_std_on_the_softmax_range() {
    let mut worst: f32 = 0.0;
    for i in 0..=200_000 {
        let x = -87.0 * i as f32 / 200_000.0;
        let rel = (super::exp(x, f32::mul_add) - x.exp()).abs() / x.exp();
        worst = worst.max(rel);
    }
    assert!(worst < 5e-7, "worst relative error {worst}");
    assert_eq!(super::exp(f32::NEG_INFINITY, f32::mul_add), 0.0);
    assert_eq!(super::exp(-100.0, f32::mul_add), 0.0);
    assert_eq!(super::exp(0.0, f32::mul_add), 1.0);
}

#[test]
fn max_finds_the_largest_wherever_it_is_and_skips_nan() {
    assert_eq!(super::max(&[]), f32::NEG_INFINITY);
    for len in [1, 15, 16, 17, 63, 64, 65, 130] {
        for at in 0..len {
            let mut xs: Vec<f32> = (0..len).map(|i| -((i * 7 % 13) as f32)).collect();
            xs[at] = 5.0;
            if len > 1 {
                xs[(at + 1) % len] = f32::NAN;
            }
            assert_eq!(super::max(&xs), 5.0, "len {len}, largest at {at}");
            assert_eq!(
                super::portable::max_body(&xs),
                5.0,
                "len {len}, largest at {at}"
            );
        }
    }
    assert_eq!(super::max(&[f32::NEG_INFINITY; 40]), f32::NEG_INFINITY);
    assert_eq!(super::max(&[f32::NAN; 40]), f32::NEG_INFINITY);
}

#[test]
fn the_bf16_dot_widens_exactly_and_sums_every_element() {
    for len in [0, 1, 15, 16, 17, 64, 100] {
        let xs: Vec<burn::tensor::bf16> = (0..len)
            .map(|i| burn::tensor::bf16::from_f32((i as f32 - 7.0) * 0.37))
            .collect();
        let ys: Vec<burn::tensor::bf16> = (0..len)
            .map(|i| burn::tensor::bf16::from_f32(1.0 + (i % 5) as f32 * 0.25))
            .collect();
        let want: f64 = xs
            .iter()
            .zip(&ys)
            .map(|(x, y)| f64::from(x.to_f32()) * f64::from(y.to_f32()))
            .sum();
        let bits = |v: &[burn::tensor::bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
        let (xb, yb) = (bits(&xs), bits(&ys));
        for got in [
            super::dot_bf16(&xb, &yb),
            super::portable::dot_bf16_body(&xb, &yb),
        ] {
            assert!(
                (f64::from(got) - want).abs() <= 1e-5 * want.abs().max(1.0),
                "len {len}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn every_instance_agrees_with_the_portable_loops() {
    let xs: Vec<f32> = (0..103).map(|i| ((i * 37) % 101) as f32 * -0.173).collect();
    let max = super::max(&xs);
    assert_eq!(max, super::portable::max_body(&xs));
    let (mut a, mut b) = (xs.clone(), xs.clone());
    let sum_a = super::exp_sub_sum(&mut a, max);
    let sum_b = super::portable::exp_sub_sum_body(&mut b, max);
    assert!((sum_a - sum_b).abs() < 1e-5, "{sum_a} vs {sum_b}");
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-6);
    }
}

#[test]
fn the_statistics_passes_match_f64_and_skip_hidden_keys() {
    let plain: Vec<f32> = (0..37)
        .map(|i| ((i * 29) % 31) as f32 * 0.37 - 4.0)
        .collect();
    let mut hidden = plain.clone();
    hidden[3] = f32::NEG_INFINITY;
    hidden[20] = f32::NEG_INFINITY;
    // A band tile's row widened to whole vectors: hidden keys in the first and the last vector
    // only, which the unmasked pass must leave out when told (48 = three vectors; 40: two and
    // a tail, hidden in the first and in the tail, which is always checked; one vector hidden
    // at both ends; whole first and last vectors hidden), and a plain row told it may have
    // hidden ends (it has none).
    let band = |len: usize, start: usize, end: usize| -> Vec<f32> {
        (0..len)
            .map(|i| {
                if i < start || i >= end {
                    f32::NEG_INFINITY
                } else {
                    ((i * 29) % 31) as f32 * 0.37 - 4.0
                }
            })
            .collect()
    };
    let (band_a, band_b) = (band(48, 5, 43), band(40, 15, 38));
    let (band_c, band_d) = (band(16, 2, 9), band(48, 16, 32));
    for (xs, masked, hidden_ends) in [
        (&plain, false, (false, false)),
        (&plain, false, (true, true)),
        (&hidden, true, (false, false)),
        (&plain, true, (false, false)),
        (&band_a, false, (true, true)),
        (&band_b, false, (true, false)),
        (&band_c, false, (true, true)),
        (&band_d, false, (true, true)),
    ] {
        let max = super::max(xs);
        let m = f64::from(max);
        let visible: Vec<f64> = xs
            .iter()
            .filter(|x| x.is_finite())
            .map(|&x| x.into())
            .collect();
        let want = [
            visible.iter().map(|x| (x - m).exp()).sum::<f64>(),
            visible.iter().map(|x| (x - m).exp() * (x - m)).sum(),
            visible.len() as f64,
            visible.iter().map(|x| x - m).sum(),
            visible.iter().map(|x| (x - m).powi(2)).sum(),
        ];
        let (mut dispatched, mut portable) = (xs.clone(), xs.clone());
        let results = if masked {
            [
                super::exp_sub_sum_moments_masked(&mut dispatched, max),
                super::portable::exp_sub_sum_moments_masked_body(&mut portable, max),
            ]
        } else {
            [
                super::exp_sub_sum_moments(&mut dispatched, max, hidden_ends),
                super::portable::exp_sub_sum_moments_body(&mut portable, max, hidden_ends),
            ]
        };
        let plain_sums: [fn(&mut [f32], f32) -> f32; 2] =
            [super::exp_sub_sum, super::portable::exp_sub_sum_body];
        for ((ys, got), plain_sum) in [&dispatched, &portable]
            .into_iter()
            .zip(results)
            .zip(plain_sums)
        {
            for (idx, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (f64::from(*g) - w).abs() < 1e-5 * w.abs().max(1.0),
                    "masked {masked}, sum {idx}: {g} vs {w}"
                );
            }
            let mut weights = xs.clone();
            let sum = plain_sum(&mut weights, max);
            // The very sum of the softmax without statistics (same order of additions), so
            // that asking for them does not change a training step.
            assert_eq!(sum.to_bits(), got[0].to_bits(), "{sum} vs {}", got[0]);
            for (a, b) in weights.iter().zip(ys.iter()) {
                assert!((a - b).abs() < 1e-7, "{a} vs {b}");
            }
        }
    }
}
