//! Experiment 6 (`compare`): the article's experiment 2. Our module vs Burn's built-in
//! `attention` vs a hand-written matmul/softmax/matmul, on the same inputs; then the causality
//! check (values after position 5 multiplied by 100: earlier outputs unchanged, later changed).

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn_sdpa::mask::causal_mask;
use burn_sdpa::{AttentionInput, CausalAlignment, Implementation, ScaledDotProductAttentionConfig};
use serde::Serialize;

use super::{Experiment, ExperimentOutput, md_table, write_csv};
use crate::claims::{Claim, Source};
use crate::context::{LabContext, LabError, normal_tensor, to_vec};

/// `0` for an exact zero (bit-identical), else `1.2e-7`.
fn sci(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.1e}")
    }
}

/// One backend's comparison.
#[derive(Debug, Clone, Serialize)]
pub struct CompareRow {
    /// Backend.
    pub backend: String,
    /// max |ours − Burn's attention| (causal).
    pub ours_vs_burn: f64,
    /// max |ours − naive| (causal).
    pub ours_vs_naive: f64,
    /// max |Burn's attention − naive| (causal).
    pub burn_vs_naive: f64,
    /// max |ours − naive| without a mask.
    pub ours_vs_naive_unmasked: f64,
    /// Largest change of the outputs at positions 0..=4 after the change.
    pub causal_early_change: f64,
    /// Largest change of the outputs at positions 5.. after the change.
    pub causal_late_change: f64,
}

fn max_abs(a: Tensor<4>, b: Tensor<4>) -> Result<f64, LabError> {
    Ok(to_vec((a - b).abs().max())?[0])
}

/// The naive attention of the article, with a −∞-filled causal mask.
pub fn naive(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, causal: bool) -> Tensor<4> {
    let [_, _, n, d] = q.dims();
    let m = k.dims()[2];
    let mut scores = q.matmul(k.transpose()) / (d as f64).sqrt();
    if causal {
        let mask = causal_mask(n, m, CausalAlignment::TopLeft, &scores.device())
            .unsqueeze::<4>()
            .expand(scores.dims());
        scores = scores.mask_fill(mask, f32::NEG_INFINITY);
    }
    softmax(scores, 3).matmul(v)
}

/// The experiment.
pub struct Compare;

impl Experiment for Compare {
    fn name(&self) -> &'static str {
        "compare"
    }

    fn title(&self) -> &'static str {
        "Our module vs Burn's attention vs a hand-written one; the causality check"
    }

    fn run(&self, ctx: &LabContext) -> Result<ExperimentOutput, LabError> {
        let t0 = Instant::now();
        // The article: b, h, seq, d = 2, 4, 8, 16.
        let (b, h, s, d) = (2, 4, 8, 16);
        // Our own computation (the naive path), not the fused path that delegates to Burn.
        let attn = ScaledDotProductAttentionConfig::new()
            .with_implementation(Implementation::Naive)
            .try_init()?;
        let mut rows = Vec::new();
        for backend in &ctx.backends {
            let device = &backend.device;
            let mut rng = ctx.rng(6);
            let q = normal_tensor(&mut rng, [b, h, s, d], device);
            let k = normal_tensor(&mut rng, [b, h, s, d], device);
            let v = normal_tensor(&mut rng, [b, h, s, d], device);
            let ours = attn
                .try_forward(AttentionInput::new(q.clone(), k.clone(), v.clone()).causal())?
                .context;
            let burn = attention(
                q.clone(),
                k.clone(),
                v.clone(),
                None,
                None,
                AttentionModuleOptions {
                    is_causal: true,
                    ..Default::default()
                },
            );
            let hand = naive(q.clone(), k.clone(), v.clone(), true);
            let ours_plain = attn
                .try_forward(AttentionInput::new(q.clone(), k.clone(), v.clone()))?
                .context;
            let hand_plain = naive(q.clone(), k.clone(), v.clone(), false);
            // V2[:, :, 5:] = randn * 100
            let noise = normal_tensor(&mut rng, [b, h, s - 5, d], device) * 100.0;
            let v2 = Tensor::cat(vec![v.clone().slice(s![.., .., 0..5, ..]), noise], 2);
            let ours2 = attn
                .try_forward(AttentionInput::new(q, k, v2).causal())?
                .context;
            let early = max_abs(
                ours.clone().slice(s![.., .., 0..5, ..]),
                ours2.clone().slice(s![.., .., 0..5, ..]),
            )?;
            let late = max_abs(
                ours.clone().slice(s![.., .., 5.., ..]),
                ours2.slice(s![.., .., 5.., ..]),
            )?;
            rows.push(CompareRow {
                backend: backend.name.clone(),
                ours_vs_burn: max_abs(ours.clone(), burn.clone())?,
                ours_vs_naive: max_abs(ours, hand.clone())?,
                burn_vs_naive: max_abs(burn, hand)?,
                ours_vs_naive_unmasked: max_abs(ours_plain, hand_plain)?,
                causal_early_change: early,
                causal_late_change: late,
            });
        }
        let table = md_table(
            &[
                "backend",
                "ours vs Burn attention",
                "ours vs hand-written",
                "Burn vs hand-written",
                "ours vs hand-written (no mask)",
                "change at positions 0–4",
                "change at positions 5–7",
            ],
            &rows
                .iter()
                .map(|r| {
                    vec![
                        r.backend.clone(),
                        format!("{:.2e}", r.ours_vs_burn),
                        format!("{:.2e}", r.ours_vs_naive),
                        format!("{:.2e}", r.burn_vs_naive),
                        format!("{:.2e}", r.ours_vs_naive_unmasked),
                        format!("{:.2e}", r.causal_early_change),
                        format!("{:.2e}", r.causal_late_change),
                    ]
                })
                .collect::<Vec<_>>(),
        );
        let markdown = format!(
            "b, h, seq, d = {b}, {h}, {s}, {d} as in the article; causal masking (n = m, so both alignments \
             agree). The article compares its hand-written attention with PyTorch's \
             `F.scaled_dot_product_attention` and prints \"完全一致\" (identical); here the built-in is \
             Burn's `burn::tensor::module::attention`. The causality check replaces the values after \
             position 5 by 100× noise and compares the outputs before and after.\n\n{table}"
        );
        let csv = write_csv(
            ctx,
            "compare.csv",
            "backend,ours_vs_burn,ours_vs_naive,burn_vs_naive,ours_vs_naive_unmasked,causal_early_change,causal_late_change",
            &rows
                .iter()
                .map(|r| {
                    format!(
                        "{},{},{},{},{},{},{}",
                        r.backend,
                        r.ours_vs_burn,
                        r.ours_vs_naive,
                        r.burn_vs_naive,
                        r.ours_vs_naive_unmasked,
                        r.causal_early_change,
                        r.causal_late_change
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        let claims = claims(&rows);
        let per_backend = ["ours vs Burn attention", "ours vs hand-written"]
            .into_iter()
            .map(|quantity| super::BackendValues {
                quantity: format!("compare: max |{quantity}|"),
                values: rows
                    .iter()
                    .map(|r| {
                        let v = if quantity.contains("Burn") {
                            r.ours_vs_burn
                        } else {
                            r.ours_vs_naive
                        };
                        (r.backend.clone(), v)
                    })
                    .collect(),
                // Errors of outputs whose size is of order 1 (unit-variance inputs): compared
                // against 1, not against each other.
                floor: 1.0,
            })
            .collect();
        Ok(ExperimentOutput::new(
            self,
            ctx,
            claims,
            markdown,
            serde_json::json!({ "rows": rows }),
            t0,
        )
        .files(vec![], vec![csv])
        .on_every_backend(ctx, per_backend))
    }
}

/// The claims of `compare`, decided by its rows (one per backend).
pub fn claims(rows: &[CompareRow]) -> Vec<Claim> {
    let worst = |pick: fn(&CompareRow) -> f64| rows.iter().map(pick).fold(0.0, f64::max);
    let backends = rows
        .iter()
        .map(|r| r.backend.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let agree = worst(|r| {
        r.ours_vs_burn
            .max(r.ours_vs_naive)
            .max(r.ours_vs_naive_unmasked)
    });
    let early = worst(|r| r.causal_early_change);
    let late = rows
        .iter()
        .map(|r| r.causal_late_change)
        .fold(f64::INFINITY, f64::min);
    vec![
        Claim::decided(
            "implementations-agree",
            Source::Article("experiment 2"),
            format!("the hand-written attention and the built-in agree ({backends})"),
            "largest |difference| between ours, Burn's attention and the hand-written one ≤ 1e−5",
            format!("largest difference {}", sci(agree)),
            Some(agree <= 1e-5),
        ),
        Claim::decided(
            "causal-past-unchanged",
            Source::Article("experiment 2"),
            format!(
                "with a causal mask, changing later values leaves earlier outputs unchanged ({backends})"
            ),
            "largest change at positions 0–4 is exactly 0",
            format!("largest change {}", sci(early)),
            Some(early == 0.0),
        ),
        Claim::decided(
            "causal-future-changes",
            Source::Lab,
            format!("the outputs that may see the changed values do change ({backends})"),
            "smallest largest-change at positions 5–7 > 1",
            format!("smallest {}", sci(late)),
            Some(late > 1.0),
        ),
    ]
}
