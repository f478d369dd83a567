//! `compare` (§6 experiment 2): our module on the path `Auto` takes (the fused kernel of the
//! backend where one serves the call: the CPU kernel on flex and ndarray, the CubeCL kernel on
//! wgpu) vs Burn's built-in `attention` vs a hand-written matmul/softmax/matmul, on the same
//! inputs; then the causality check through the same path (values after position 5 replaced by
//! 100× noise: earlier outputs unchanged, later ones changed). One cell per backend.

mod analyze;
mod render;

use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn_sdpa::mask::causal_mask;
use burn_sdpa::{AttentionInput, CausalAlignment, ScaledDotProductAttentionConfig};
use serde::{Deserialize, Serialize};

pub use analyze::{CompareData, analyze, claims};

use crate::context::{Env, LabError, normal_tensor, rng, scalar};
use crate::experiment::{AnalyzeFn, Cell, Measured, Plan, RenderFn, Stages, Weight};

/// One cell: one backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareConfig {
    /// Seed.
    pub seed: u64,
    /// Backend.
    pub backend: String,
}

/// One backend's comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareResult {
    /// The path our module took (`Auto`'s choice on this backend).
    #[serde(default)]
    pub ours_path: String,
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
    scalar((a - b).abs().max())
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

/// The article's sizes: b, h, seq, d = 2, 4, 8, 16.
pub const SHAPE: [usize; 4] = [2, 4, 8, 16];

/// The experiment.
pub struct Compare;

impl Stages for Compare {
    type Config = CompareConfig;
    type Result = CompareResult;
    type Data = CompareData;
    const ANALYZE: AnalyzeFn<Self> = |_, cells| analyze(cells);
    const RENDER: RenderFn<Self> = render::render;

    fn name(&self) -> &'static str {
        "compare"
    }

    fn title(&self) -> &'static str {
        "Our module vs Burn's attention vs a hand-written one; the causality check"
    }

    fn version(&self) -> u32 {
        // 2: "ours" is the path Auto takes (it was the naive path).
        2
    }

    fn plan(
        &self,
        plan: &Plan,
        _: usize,
        _: &[Measured<CompareConfig, CompareResult>],
    ) -> Vec<Cell<CompareConfig>> {
        plan.backends
            .iter()
            .map(|b| Cell {
                id: b.clone(),
                config: CompareConfig {
                    seed: plan.seed,
                    backend: b.clone(),
                },
                weight: Weight::Light,
            })
            .collect()
    }

    fn measure(&self, c: &CompareConfig, env: &Env) -> Result<CompareResult, LabError> {
        let device = env.device(&c.backend)?;
        let [b, h, s, d] = SHAPE;
        // The path a user gets: `Auto` (the fused kernel where one serves the call).
        let attn = ScaledDotProductAttentionConfig::new().try_init()?;
        let mut rng = rng(c.seed, 6);
        let q = normal_tensor(&mut rng, [b, h, s, d], device);
        let k = normal_tensor(&mut rng, [b, h, s, d], device);
        let v = normal_tensor(&mut rng, [b, h, s, d], device);
        let causal_input = AttentionInput::new(q.clone(), k.clone(), v.clone()).causal();
        let ours_path = attn.path(&causal_input)?.to_string();
        let ours = attn.try_forward(causal_input)?.context;
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
        Ok(CompareResult {
            ours_path,
            causal_early_change: max_abs(
                ours.clone().slice(s![.., .., 0..5, ..]),
                ours2.clone().slice(s![.., .., 0..5, ..]),
            )?,
            causal_late_change: max_abs(
                ours.clone().slice(s![.., .., 5.., ..]),
                ours2.slice(s![.., .., 5.., ..]),
            )?,
            ours_vs_burn: max_abs(ours.clone(), burn.clone())?,
            ours_vs_naive: max_abs(ours, hand.clone())?,
            burn_vs_naive: max_abs(burn, hand)?,
            ours_vs_naive_unmasked: max_abs(ours_plain, hand_plain)?,
        })
    }
}
