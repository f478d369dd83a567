//! `logit-control`: √d_k scaling beside the modern answers to the same problem — logit
//! soft-capping (Gemma 2) and QK-norm (ViT-22B, OLMo 2) — at initialization, for d_k from 16 to
//! 1024, with the measures of `attention-saturation` and `gradients`. (How they train is part of
//! `training`, on the same paired seeds as its 1/√d_k arm.) The article never meets them: its
//! only control is the scale.
//!
//! One cell per d_k: every control on the same draws.

mod analyze;
mod render;

use burn::prelude::*;
use burn_sdpa::{AttentionInput, QkNorm, ScaledDotProductAttentionConfig};
use serde::{Deserialize, Serialize};

pub use analyze::{LogitControlData, analyze};

use crate::context::{Env, LabError, normal_vec, rng, scalar, tensor, to_vec};
use crate::experiment::{AnalyzeFn, Cell, Measured, Plan, RenderFn, Stages, Weight};
use crate::measures::attention::{
    analytic_jacobian_norms, mean_row_max, share_of_keys_with_gradient,
};
use crate::measures::training::Arm;
use crate::stats::mean;

/// The soft-caps at initialization: strong, medium, and Gemma 2's 50.
pub const CAPS: [f64; 3] = [5.0, 15.0, 50.0];

/// The controls compared.
pub fn controls() -> Vec<Arm> {
    let mut c = vec![Arm::Scaled, Arm::Unscaled];
    c.extend(CAPS.map(Arm::SoftCap));
    c.extend([Arm::QkNorm, Arm::QkNormScaled]);
    c
}

/// One cell: one d_k, every control.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogitControlConfig {
    /// d_k.
    pub d_k: usize,
    /// Queries = keys.
    pub n: usize,
    /// Draws.
    pub draws: usize,
    /// The controls.
    pub controls: Vec<Arm>,
    /// Seed.
    pub seed: u64,
    /// Backend.
    pub backend: String,
}

/// What one draw measures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct InitValues {
    /// Standard deviation of the logits that enter the softmax (after scale and cap).
    pub logit_std: f64,
    /// Mean largest probability of a row.
    pub max_p: f64,
    /// Mean entropy of a row divided by ln m (1 = uniform, 0 = one-hot).
    pub entropy: f64,
    /// Mean ‖diag(p) − ppᵀ‖_F of a row, from p.
    pub jacobian_norm: f64,
    /// Mean share of a row's keys whose |∂L/∂logit| exceeds 1e−3 of the row's largest.
    pub share_keys: f64,
    /// Per-element RMS of ∂L/∂Q (through the cap's and the norm's derivatives).
    pub rms_dq: f64,
}

/// One cell's measurement: per control (in the config's order), every draw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogitControlResult {
    /// `draws[control][draw]`.
    pub draws: Vec<Vec<InitValues>>,
}

/// One draw: Q, K, V and the upstream gradient G `[1, 1, n, d_k]` (unit variance), the loss
/// L = Σ context · G, the logits' gradient read as that of a zero additive bias (added after
/// the scale and the cap).
fn measure_draw(
    device: &Device,
    control: Arm,
    d_k: usize,
    n: usize,
    data: &[Vec<f32>; 4],
) -> Result<InitValues, LabError> {
    let device = device.clone().autodiff();
    let [qd, kd, vd, gd] = data;
    let q = tensor(qd, [1, 1, n, d_k], &device).require_grad();
    let k = tensor(kd, [1, 1, n, d_k], &device).require_grad();
    let v = tensor(vd, [1, 1, n, d_k], &device);
    let norm = match control {
        Arm::QkNorm | Arm::QkNormScaled => QkNorm::RmsNorm,
        _ => QkNorm::None,
    };
    // QK-norm at initialization: RMSNorm with its gain at 1, as the layer starts.
    let (q_in, k_in) = match norm.init(d_k, &device) {
        Some(norm) => (norm.forward(q.clone()), norm.forward(k.clone())),
        None => (q.clone(), k.clone()),
    };
    let bias = Tensor::<4>::zeros([1, 1, n, n], &device).require_grad();
    let attn = ScaledDotProductAttentionConfig::new()
        .with_scale(control.scale(d_k))
        .with_softcap(match control {
            Arm::SoftCap(c) => Some(c),
            _ => None,
        })
        .try_init()?;
    let out = attn.try_forward(
        AttentionInput::new(q_in, k_in, v)
            .bias(bias.clone())
            .need_weights()
            .need_scores(),
    )?;
    let missing = |from: &'static str, what: &str| LabError::Missing {
        from,
        what: what.to_string(),
    };
    let weights = out
        .weights
        .ok_or_else(|| missing("the attention module", "weights"))?;
    let scores = out
        .scores
        .ok_or_else(|| missing("the attention module", "scores"))?;
    let grads = (out.context * tensor(gd, [1, 1, n, d_k], &device))
        .sum()
        .backward();
    let ds = bias
        .grad(&grads)
        .ok_or_else(|| missing("autodiff", "logit gradient"))?;
    let dq = q
        .grad(&grads)
        .ok_or_else(|| missing("autodiff", "query gradient"))?;
    let share_keys = share_of_keys_with_gradient(ds)?;
    let logits = to_vec(scores.without_autodiff())?;
    let p = to_vec(weights.without_autodiff())?;
    let logit_mean = mean(&logits);
    let entropy = mean(
        &p.chunks(n)
            .map(|r| {
                -r.iter()
                    .filter(|&&x| x > 0.0)
                    .map(|x| x * x.ln())
                    .sum::<f64>()
                    / (n as f64).ln()
            })
            .collect::<Vec<_>>(),
    );
    Ok(InitValues {
        logit_std: (logits.iter().map(|x| (x - logit_mean).powi(2)).sum::<f64>()
            / logits.len() as f64)
            .sqrt(),
        max_p: mean_row_max(&p, n),
        entropy,
        jacobian_norm: mean(&analytic_jacobian_norms(&p, n)),
        share_keys,
        rms_dq: scalar(dq.square().mean().sqrt())?,
    })
}

/// The experiment.
pub struct LogitControl;

impl Stages for LogitControl {
    type Config = LogitControlConfig;
    type Result = LogitControlResult;
    type Data = LogitControlData;
    const ANALYZE: AnalyzeFn<Self> = |_, cells| analyze(cells);
    const RENDER: RenderFn<Self> = render::render;

    fn name(&self) -> &'static str {
        "logit-control"
    }

    fn title(&self) -> &'static str {
        "√d_k beside soft-capping and QK-norm at initialization, d_k 16–1024"
    }

    fn plan(
        &self,
        plan: &Plan,
        _: usize,
        _: &[Measured<LogitControlConfig, LogitControlResult>],
    ) -> Vec<Cell<LogitControlConfig>> {
        let (n, draws) = if plan.quick { (64, 3) } else { (256, 10) };
        [16, 64, 256, 1024]
            .iter()
            .map(|&d_k| Cell {
                id: format!("dk{d_k}"),
                config: LogitControlConfig {
                    d_k,
                    n,
                    draws,
                    controls: controls(),
                    seed: plan.seed,
                    backend: plan.primary().into(),
                },
                weight: Weight::Light,
            })
            .collect()
    }

    fn measure(&self, c: &LogitControlConfig, env: &Env) -> Result<LogitControlResult, LabError> {
        let device = env.device(&c.backend)?;
        let mut r = rng(c.seed, 14_000 + c.d_k as u64);
        let data: Vec<[Vec<f32>; 4]> = (0..c.draws)
            .map(|_| std::array::from_fn(|_| normal_vec(&mut r, c.n * c.d_k)))
            .collect();
        let draws = c
            .controls
            .iter()
            .map(|&control| {
                data.iter()
                    .map(|d| measure_draw(device, control, c.d_k, c.n, d))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(LogitControlResult { draws })
    }
}
