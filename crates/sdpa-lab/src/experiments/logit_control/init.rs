//! `logit-control` at initialization: unit-variance queries and keys (the article's assumption)
//! through each control, with the measures of `attention-saturation` and `gradients`, read
//! through Burn's autodiff.

use burn::prelude::*;
use burn::tensor::TensorData;
use burn_sdpa::{AttentionInput, ScaledDotProductAttentionConfig};
use serde::Serialize;

use super::control::Control;
use crate::context::{LabBackend, LabError, to_vec};
use crate::experiments::gradients::{analytic_jacobian_norms, share_of_keys_with_gradient};
use crate::stats::{Estimate, mean, mean_ci};

/// What one draw measures.
#[derive(Debug, Clone, Copy, Serialize)]
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

/// One (d_k, control) cell over its draws: means with 95% t-intervals.
#[derive(Debug, Clone, Serialize)]
pub struct InitRow {
    /// d_k.
    pub d_k: usize,
    /// The control.
    pub control: Control,
    /// Every draw.
    pub draws: Vec<InitValues>,
    /// Logit std.
    pub logit_std: Estimate,
    /// Max p.
    pub max_p: Estimate,
    /// Normalized entropy.
    pub entropy: Estimate,
    /// ‖J‖_F per row.
    pub jacobian_norm: Estimate,
    /// Share of keys with gradient.
    pub share_keys: Estimate,
    /// RMS ∂L/∂Q.
    pub rms_dq: Estimate,
}

impl InitRow {
    /// The row of `draws`.
    pub fn new(d_k: usize, control: Control, draws: Vec<InitValues>) -> Self {
        let ci =
            |pick: fn(&InitValues) -> f64| mean_ci(&draws.iter().map(pick).collect::<Vec<_>>());
        Self {
            d_k,
            control,
            logit_std: ci(|v| v.logit_std),
            max_p: ci(|v| v.max_p),
            entropy: ci(|v| v.entropy),
            jacobian_norm: ci(|v| v.jacobian_norm),
            share_keys: ci(|v| v.share_keys),
            rms_dq: ci(|v| v.rms_dq),
            draws,
        }
    }
}

fn tensor(data: &[f32], shape: [usize; 4], device: &Device) -> Tensor<4> {
    Tensor::from_data(TensorData::new(data.to_vec(), shape), device)
}

/// One draw: Q, K, V and the upstream gradient G `[1, 1, n, d_k]` (unit variance), the loss
/// L = Σ context · G, and the logits' gradient read as that of a zero additive bias (added after
/// the scale and the cap).
pub fn measure(
    backend: &LabBackend,
    control: Control,
    d_k: usize,
    n: usize,
    data: &[Vec<f32>; 4],
) -> Result<InitValues, LabError> {
    let device = backend.device.clone().autodiff();
    let [qd, kd, vd, gd] = data;
    let q = tensor(qd, [1, 1, n, d_k], &device).require_grad();
    let k = tensor(kd, [1, 1, n, d_k], &device).require_grad();
    let v = tensor(vd, [1, 1, n, d_k], &device);
    // QK-norm at initialization: RMSNorm with its gain at 1, as the layer starts.
    let (q_in, k_in) = match control.qk_norm().init(d_k, &device) {
        Some(norm) => (norm.forward(q.clone()), norm.forward(k.clone())),
        None => (q.clone(), k.clone()),
    };
    let bias = Tensor::<4>::zeros([1, 1, n, n], &device).require_grad();
    let attn = ScaledDotProductAttentionConfig::new()
        .with_scale(control.scale())
        .with_softcap(control.softcap())
        .try_init()?;
    let out = attn.try_forward(
        AttentionInput::new(q_in, k_in, v)
            .bias(bias.clone())
            .need_weights()
            .need_scores(),
    )?;
    let missing = |what: &str| LabError::Other(format!("no {what} from the attention"));
    let weights = out.weights.ok_or_else(|| missing("weights"))?;
    let scores = out.scores.ok_or_else(|| missing("scores"))?;
    let grads = (out.context * tensor(gd, [1, 1, n, d_k], &device))
        .sum()
        .backward();
    let ds = bias.grad(&grads).ok_or_else(|| missing("logit gradient"))?;
    let dq = q.grad(&grads).ok_or_else(|| missing("query gradient"))?;
    let share_keys = share_of_keys_with_gradient(ds)?;
    let logits = to_vec(scores.without_autodiff())?;
    let p = to_vec(weights.without_autodiff())?;
    let rows = p.chunks(n);
    let logit_mean = mean(&logits);
    Ok(InitValues {
        logit_std: (logits.iter().map(|x| (x - logit_mean).powi(2)).sum::<f64>()
            / logits.len() as f64)
            .sqrt(),
        max_p: mean(
            &rows
                .clone()
                .map(|r| r.iter().cloned().fold(0.0, f64::max))
                .collect::<Vec<_>>(),
        ),
        entropy: mean(
            &rows
                .map(|r| {
                    -r.iter()
                        .filter(|&&x| x > 0.0)
                        .map(|x| x * x.ln())
                        .sum::<f64>()
                        / (n as f64).ln()
                })
                .collect::<Vec<_>>(),
        ),
        jacobian_norm: mean(&analytic_jacobian_norms(&p, n)),
        share_keys,
        rms_dq: to_vec(dq.square().mean().sqrt())?[0],
    })
}
