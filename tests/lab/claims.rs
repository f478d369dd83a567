//! Claims fail when their data say so: every experiment's claim checker, fed numbers that
//! contradict a claim, reports it as failed (and the verdict follows).

use sdpa::lab::experiments::{
    attention_saturation, compare, complexity, dot_std, gradients, logit_control, masks, training,
    why_softmax,
};
use sdpa::lab::stats::{Estimate, mean_ci, wilson};
use sdpa::lab::{Claim, Outcome, Verdict};

fn outcome(claims: &[Claim], id: &str) -> Outcome {
    claims
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no claim {id}"))
        .outcome
}

#[test]
fn dot_std_fails_when_the_std_does_not_grow_like_sqrt_d() {
    let config = dot_std::DotStdConfig::new(false);
    // std/√d falls like d^-0.25: the std grows like d^0.25, not √d.
    let rows: Vec<dot_std::DotStdRow> = [16usize, 64, 256, 1024]
        .iter()
        .map(|&d| {
            let scaled = (d as f64).powf(-0.25);
            let draws: Vec<f64> = (0..10).map(|i| scaled * (1.0 + 0.001 * i as f64)).collect();
            dot_std::DotStdRow {
                d,
                sqrt_d: (d as f64).sqrt(),
                std: scaled * (d as f64).sqrt(),
                scaled_std: scaled,
                single_draw_scaled: scaled,
                single_draw_range: (scaled, scaled),
                scaled_mean: scaled,
                scaled_spread: 0.0,
                draws_scaled: draws,
                article_std: 0.0,
                article_scaled: 1.0,
            }
        })
        .collect();
    let claims = dot_std::claims(&config, &rows);
    assert_eq!(outcome(&claims, "std-grows-as-sqrt-d"), Outcome::Fails);
    assert_eq!(outcome(&claims, "scaled-std-is-one"), Outcome::Fails);
}

fn gradient_row(
    d: usize,
    scaled: bool,
    jacobian: f64,
    dq: f64,
    share: f64,
) -> gradients::GradientRow {
    let draws: Vec<gradients::DrawValues> = (0..10)
        .map(|i| {
            let wobble = 1.0 + 0.01 * i as f64;
            gradients::DrawValues {
                rms_dq: dq * wobble,
                rms_dk: dq * wobble,
                rms_dv: 1.0,
                rms_ds: jacobian * wobble,
                jacobian_norm: jacobian * wobble,
                share_keys: share,
                max_p: 0.5,
            }
        })
        .collect();
    let ci = |pick: fn(&gradients::DrawValues) -> f64| {
        mean_ci(&draws.iter().map(pick).collect::<Vec<_>>())
    };
    gradients::GradientRow {
        backend: "flex".into(),
        d,
        scaled,
        rms_dq: ci(|v| v.rms_dq),
        rms_dk: ci(|v| v.rms_dk),
        rms_dv: ci(|v| v.rms_dv),
        rms_ds: ci(|v| v.rms_ds),
        jacobian_norm: ci(|v| v.jacobian_norm),
        share_keys: ci(|v| v.share_keys),
        max_p: ci(|v| v.max_p),
        jacobian_autodiff_max_diff: 1e-7,
        draws,
    }
}

#[test]
fn gradients_fail_when_the_jacobian_grows_and_the_query_gradient_vanishes() {
    // Contradicting data: unscaled, the Jacobian grows with d and ∂L/∂Q vanishes.
    let mut rows = Vec::new();
    for d in [16usize, 64, 256, 1024] {
        rows.push(gradient_row(
            d,
            false,
            0.1 * (d as f64).sqrt(),
            1.0 / d as f64,
            0.9,
        ));
        rows.push(gradient_row(d, true, 0.3, 1.0, 0.5));
    }
    let claims = gradients::claims("flex", &rows, &[]);
    assert_eq!(outcome(&claims, "jacobian-vanishes"), Outcome::Fails);
    assert_eq!(outcome(&claims, "query-gradient-vanishes"), Outcome::Holds);
    assert_eq!(outcome(&claims, "query-gradient-grows"), Outcome::Fails);
    assert_eq!(outcome(&claims, "gradient-concentrates"), Outcome::Fails);
    assert_ne!(Verdict::from_claims(&claims), Verdict::Reproduced);
}

#[test]
fn why_softmax_fails_when_softmax_is_flat_in_n() {
    // Contradicting data: softmax's output std does not depend on n (the article's claim).
    let mut rows = Vec::new();
    for method in why_softmax::METHODS {
        for n in [16usize, 64, 256, 1024] {
            let base = match method {
                "softmax" => 0.5,
                "raw dot products" => (n as f64).sqrt(),
                _ => 1.0 / (n as f64).sqrt(),
            };
            let stds: Vec<f64> = (0..10).map(|i| base * (1.0 + 0.001 * i as f64)).collect();
            rows.push(why_softmax::WhySoftmaxRow {
                method: method.to_string(),
                n,
                d: 64,
                scaled: true,
                output_std_ci: mean_ci(&stds),
                output_std: stds,
                weight_sum: 1.0,
                effective_keys_draws: vec![],
                effective_keys: None,
                entropy: None,
            });
        }
    }
    let claims = why_softmax::claims(&rows, 64, 256);
    assert_eq!(outcome(&claims, "softmax-bounded-in-n"), Outcome::Holds);
    assert_eq!(
        outcome(&claims, "softmax-averages-like-1-over-sqrt-n"),
        Outcome::Fails
    );
    assert_eq!(outcome(&claims, "raw-explodes"), Outcome::Holds);
}

fn training_cell(
    condition: training::Condition,
    scaled: bool,
    reached: usize,
    steps: f64,
) -> training::Cell {
    training::Cell {
        condition,
        scaled,
        success: wilson(reached, 10),
        capped_steps: Estimate {
            value: steps,
            lo: steps - 10.0,
            hi: steps + 10.0,
            n: 10,
        },
        initial_logit_std: 1.0,
        final_accuracy: 1.0,
        diverged: 0,
    }
}

#[test]
fn training_fails_when_unscaled_trains_faster() {
    let grid = training::TrainingGrid::new(false, 1);
    // Contradicting data: unscaled reaches the target sooner in every cell.
    let cells: Vec<training::Cell> = grid
        .conditions
        .iter()
        .flat_map(|c| {
            [
                training_cell(*c, true, 10, 300.0),
                training_cell(*c, false, 10, 100.0),
            ]
        })
        .collect();
    let claims = training::claims(&grid, &cells);
    assert_eq!(outcome(&claims, "unscaled-trains-worse"), Outcome::Fails);
    assert_eq!(outcome(&claims, "unscaled-never-better"), Outcome::Fails);
    assert_eq!(outcome(&claims, "not-a-step-size-artifact"), Outcome::Fails);
    assert_eq!(Verdict::from_claims(&claims), Verdict::NotSupported);
}

#[test]
fn compare_fails_when_causality_leaks() {
    let rows = vec![compare::CompareRow {
        backend: "flex".into(),
        ours_vs_burn: 1e-7,
        ours_vs_naive: 1e-7,
        burn_vs_naive: 1e-7,
        ours_vs_naive_unmasked: 1e-7,
        causal_early_change: 0.25,
        causal_late_change: 10.0,
    }];
    let claims = compare::claims(&rows);
    assert_eq!(outcome(&claims, "causal-past-unchanged"), Outcome::Fails);
    assert_eq!(Verdict::from_claims(&claims), Verdict::PartlySupported);
}

#[test]
fn masks_fail_when_the_module_gives_nan() {
    let row = |fill: &str, fully: bool, module_bool: &str| masks::MaskRow {
        backend: "flex".into(),
        dtype: "f32".into(),
        fill: fill.into(),
        n_masks: 1,
        fully_masked: fully,
        masked_score: "-inf".into(),
        softmax: "NaN".into(),
        module_bias: "NaN".into(),
        module_bool: module_bool.into(),
    };
    let claims = masks::claims(&[row("-inf", true, "NaN"), row("-inf", false, "correct")]);
    assert_eq!(
        outcome(&claims, "module-bool-mask-is-exact"),
        Outcome::Fails
    );
    assert_eq!(outcome(&claims, "module-never-nan"), Outcome::Fails);
}

#[test]
fn complexity_fails_when_the_time_is_linear() {
    let rows: Vec<complexity::ComplexityRow> = [512usize, 1024, 2048, 4096]
        .iter()
        .flat_map(|&n| {
            [
                "materialized weights (module, need_weights)",
                "fastest path (module, Auto)",
            ]
            .map(|path| complexity::ComplexityRow {
                path: path.into(),
                n,
                time_ms: n as f64,
                times_ms: vec![n as f64, n as f64 * 1.01, n as f64 * 0.99],
                peak_mib: Some(n as f64),
                weights_mib: path.starts_with("materialized").then_some(n as f64 / 2.0),
            })
        })
        .collect();
    let claims = complexity::claims(&rows, &complexity::MatrixMemory::llama_7b());
    assert_eq!(outcome(&claims, "time-quadratic"), Outcome::Fails);
    assert_eq!(outcome(&claims, "memory-quadratic"), Outcome::Fails);
    assert_eq!(outcome(&claims, "llama-per-layer"), Outcome::Holds);
}

#[test]
fn attention_saturation_fails_when_unscaled_stays_spread() {
    let e = |v: f64| Estimate {
        value: v,
        lo: v - 0.01,
        hi: v + 0.01,
        n: 10,
    };
    let corrected: Vec<attention_saturation::CorrectedRow> = [16usize, 64, 256, 1024]
        .iter()
        .flat_map(|&d| {
            [false, true].map(|scaled| attention_saturation::CorrectedRow {
                d,
                m: 256,
                scaled,
                logit_std: e(1.0),
                max_p: e(0.05),
                entropy: e(5.0),
                ln_m: 256f64.ln(),
                keys_above_1e3: e(200.0),
                saturated_fraction: e(0.0),
            })
        })
        .collect();
    let claims = attention_saturation::claims(&[], &corrected);
    assert_eq!(outcome(&claims, "unscaled-collapses"), Outcome::Fails);
    assert_eq!(
        outcome(&claims, "unscaled-saturates-at-every-m"),
        Outcome::Fails
    );
}

#[test]
fn logit_control_fails_when_the_cap_saturates_and_qk_norm_controls_the_logits() {
    use logit_control::{Control, InitRow, InitValues};
    let config = logit_control::Config::new(false, 42);
    // Data that contradict the claims: the cap saturates more than no cap, QK-norm's logits do
    // not grow with d_k, and QK-norm + 1/√d_k's Jacobian grows like √d_k.
    let rows: Vec<InitRow> = config
        .dims
        .iter()
        .flat_map(|&d_k| {
            config.init_controls.iter().map(move |&control| {
                let sqrt_d = (d_k as f64).sqrt();
                let (max_p, std, jacobian, share) = match control {
                    Control::SoftCap(_) => (0.99, 4.0, 0.01 * sqrt_d, 1.0),
                    Control::Unscaled => (0.5, sqrt_d, 0.2, 0.1),
                    Control::QkNorm => (0.5, 1.0, 0.2, 0.1),
                    Control::QkNormScaled => (0.1, 1.0, 0.1 * sqrt_d, 0.9),
                    _ => (0.1, 1.0, 0.2, 0.9),
                };
                let draws = (0..10)
                    .map(|i| {
                        let w = 1.0 + 0.001 * i as f64;
                        InitValues {
                            logit_std: std * w,
                            max_p: max_p * w.min(1.0),
                            entropy: 0.5,
                            jacobian_norm: jacobian * w,
                            share_keys: share,
                            rms_dq: 1.0,
                        }
                    })
                    .collect();
                InitRow::new(d_k, control, draws)
            })
        })
        .collect();
    let claims = logit_control::claims(&config, &rows, &[]);
    for id in [
        "cap-prevents-saturation",
        "cap-does-not-restore-gradient-share",
        "qk-norm-alone-grows-like-unscaled",
        "qk-norm-scaled-keeps-jacobian",
        "cap-jacobian-vanishes",
    ] {
        assert_eq!(outcome(&claims, id), Outcome::Fails, "{id}");
    }
}
