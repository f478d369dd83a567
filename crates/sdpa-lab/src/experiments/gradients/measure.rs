//! One cell of `gradients`: every draw through the module under autodiff, and the Jacobian
//! check.

use burn::prelude::*;
use burn::tensor::TensorData;
use burn_sdpa::{AttentionInput, ScalePolicy, ScaledDotProductAttentionConfig};
use serde::{Deserialize, Serialize};

use super::{GradientsConfig, GradientsResult};
use crate::context::{LabError, normal_vec, rng, scalar, tensor, to_vec};
use crate::measures::attention::{
    analytic_jacobian_norms, mean_row_max, share_of_keys_with_gradient,
};
use crate::stats::mean;

/// What one draw measures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DrawValues {
    /// Per-element RMS of ∂L/∂Q.
    pub rms_dq: f64,
    /// ... of ∂L/∂K.
    pub rms_dk: f64,
    /// ... of ∂L/∂V.
    pub rms_dv: f64,
    /// ... of ∂L/∂scores.
    pub rms_ds: f64,
    /// Mean over rows of ‖diag(p) − ppᵀ‖_F, from p.
    pub jacobian_norm: f64,
    /// Mean share of a row's keys whose |∂L/∂score| exceeds 1e−3 of the row's largest.
    pub share_keys: f64,
    /// Mean largest probability of a row.
    pub max_p: f64,
}

fn module(scaled: bool) -> Result<burn_sdpa::ScaledDotProductAttention, LabError> {
    Ok(ScaledDotProductAttentionConfig::new()
        .with_scale(if scaled {
            ScalePolicy::InvSqrtDk
        } else {
            ScalePolicy::Unscaled
        })
        .try_init()?)
}

/// Q, K `[n, d]`, V and the upstream gradient G `[n, d_v]` of one draw (the same on every
/// backend and for both scalings).
fn draw(c: &GradientsConfig, i: usize) -> [Vec<f32>; 4] {
    let mut r = rng(
        c.seed,
        4_000_000 + (c.d * 10_000 + c.d_v) as u64 * 100 + i as u64,
    );
    [
        normal_vec(&mut r, c.n * c.d),
        normal_vec(&mut r, c.n * c.d),
        normal_vec(&mut r, c.n * c.d_v),
        normal_vec(&mut r, c.n * c.d_v),
    ]
}

/// One draw: L = Σ context · G.
fn measure_draw(
    c: &GradientsConfig,
    device: &Device,
    scaled: bool,
    data: &[Vec<f32>; 4],
) -> Result<DrawValues, LabError> {
    let (n, d, d_v) = (c.n, c.d, c.d_v);
    let device = device.clone().autodiff();
    let [qd, kd, vd, gd] = data;
    let q = tensor(qd, [1, 1, n, d], &device).require_grad();
    let k = tensor(kd, [1, 1, n, d], &device).require_grad();
    let v = tensor(vd, [1, 1, n, d_v], &device).require_grad();
    let bias = Tensor::<4>::zeros([1, 1, n, n], &device).require_grad();
    let out = module(scaled)?.try_forward(
        AttentionInput::new(q.clone(), k.clone(), v.clone())
            .bias(bias.clone())
            .need_weights(),
    )?;
    let weights = out.weights.clone().ok_or_else(|| LabError::Missing {
        from: "the attention module",
        what: "weights".into(),
    })?;
    let grads = (out.context * tensor(gd, [1, 1, n, d_v], &device))
        .sum()
        .backward();
    let missing = |what: &str| LabError::Missing {
        from: "autodiff",
        what: format!("gradient for {what}"),
    };
    let ds = bias.grad(&grads).ok_or_else(|| missing("the scores"))?;
    let dq = q.grad(&grads).ok_or_else(|| missing("Q"))?;
    let dk = k.grad(&grads).ok_or_else(|| missing("K"))?;
    let dv = v.grad(&grads).ok_or_else(|| missing("V"))?;
    let rms = |t: Tensor<4>| scalar(t.square().mean().sqrt());
    let share_keys = share_of_keys_with_gradient(ds.clone())?;
    let p: Vec<f64> = to_vec(weights.without_autodiff())?;
    Ok(DrawValues {
        rms_dq: rms(dq)?,
        rms_dk: rms(dk)?,
        rms_dv: rms(dv)?,
        rms_ds: rms(ds)?,
        jacobian_norm: mean(&analytic_jacobian_norms(&p, n)),
        share_keys,
        max_p: mean_row_max(&p, n),
    })
}

/// Output coordinates per backward pass of [`jacobian_check`]: the batch copies of K and V stay
/// at 32 · m · d values (32 MiB at m = 256, d = 1024; a whole batch of m copies, 256 MiB, is more
/// than Mesa's lavapipe gives one wgpu buffer).
const JACOBIAN_CHUNK: usize = 32;

/// The Jacobian of the first `rows` query rows through autodiff, [`JACOBIAN_CHUNK`] of its m rows
/// per backward pass (batch entry c gets the loss Σ_i p_ij with j = chunk start + c, whose
/// gradient with respect to the zero bias of row i is row j of that row's Jacobian), against the
/// analytic norms: the largest per-row |difference|.
fn jacobian_check(
    c: &GradientsConfig,
    device: &Device,
    rows: usize,
    scaled: bool,
    data: &[Vec<f32>; 4],
) -> Result<f64, LabError> {
    let (m, d, d_v, rows) = (c.n, c.d, c.d_v, rows.min(c.n));
    let device = device.clone().autodiff();
    let [qd, kd, vd, _] = data;
    let module = module(scaled)?;
    let mut analytic = Vec::new();
    // Σ_j Σ_j' (∂p_ij/∂s_ij')² per row i, accumulated over the chunks of j: [rows].
    let mut squares = vec![0.0f64; rows];
    for start in (0..m).step_by(JACOBIAN_CHUNK) {
        let chunk = JACOBIAN_CHUNK.min(m - start);
        let q = tensor(&qd[..rows * d], [1, 1, rows, d], &device).expand([chunk, 1, rows, d]);
        let k = tensor(kd, [1, 1, m, d], &device).expand([chunk, 1, m, d]);
        let v = tensor(vd, [1, 1, m, d_v], &device).expand([chunk, 1, m, d_v]);
        let bias = Tensor::<4>::zeros([chunk, 1, rows, m], &device).require_grad();
        let out = module.try_forward(
            AttentionInput::new(q, k, v)
                .bias(bias.clone())
                .need_weights(),
        )?;
        let w = out.weights.ok_or_else(|| LabError::Missing {
            from: "the attention module",
            what: "weights".into(),
        })?;
        if start == 0 {
            analytic =
                analytic_jacobian_norms(&to_vec(w.clone().slice(s![0..1]).without_autodiff())?, m);
        }
        // selector[c', 0, i, j'] = 1 when j' == start + c'
        let eye: Vec<f32> = (0..chunk * m)
            .map(|x| if x % m == start + x / m { 1.0 } else { 0.0 })
            .collect();
        let selector = Tensor::<4>::from_data(TensorData::new(eye, [chunk, 1, 1, m]), &device);
        let grads = (w * selector).sum().backward();
        let jac = bias.grad(&grads).ok_or_else(|| LabError::Missing {
            from: "autodiff",
            what: "gradient in the Jacobian pass".into(),
        })?;
        // Sum over the chunk's output coordinates (batch axis) and the key axis (j').
        let part: Vec<f64> = to_vec(jac.square().sum_dim(0).sum_dim(3))?;
        for (total, p) in squares.iter_mut().zip(part) {
            *total += p;
        }
    }
    Ok(analytic
        .iter()
        .zip(&squares)
        .map(|(a, b)| (a - b.sqrt()).abs())
        .fold(0.0, f64::max))
}

/// Measures a cell.
pub fn measure(c: &GradientsConfig, device: &Device) -> Result<GradientsResult, LabError> {
    let draws: Vec<[Vec<f32>; 4]> = (0..c.draws).map(|i| draw(c, i)).collect();
    let run = |scaled| {
        draws
            .iter()
            .map(|data| measure_draw(c, device, scaled, data))
            .collect::<Result<Vec<_>, LabError>>()
    };
    let jacobian_check = match (c.jacobian_rows, draws.first()) {
        (Some(rows), Some(first)) => Some((
            jacobian_check(c, device, rows, true, first)?,
            jacobian_check(c, device, rows, false, first)?,
        )),
        _ => None,
    };
    Ok(GradientsResult {
        scaled: run(true)?,
        unscaled: run(false)?,
        jacobian_check,
    })
}
