//! Experiment 4 (`gradients`): gradient flow through the softmax, measured with Burn's autodiff
//! on every backend asked for. The score gradient is read as the gradient of an all-zero
//! additive bias (∂L/∂bias = ∂L/∂scores, since the bias is added to the scaled scores), and the
//! softmax Jacobian diag(p) − ppᵀ is obtained both analytically and through autodiff.

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::TensorData;
use burn_sdpa::{AttentionInput, ScalePolicy, ScaledDotProductAttentionConfig};
use serde::Serialize;

use super::{Experiment, ExperimentOutput, Verdict, f, md_table, out_path, write_csv};
use crate::context::{LabBackend, LabContext, LabError, normal_vec, to_vec};
use crate::plot::{LinePlot, Series, line_plot};
use crate::stats::mean;

/// One (backend, d, scaling) measurement.
#[derive(Debug, Clone, Serialize)]
pub struct GradientRow {
    /// Backend.
    pub backend: String,
    /// d.
    pub d: usize,
    /// Whether the scores are divided by √d.
    pub scaled: bool,
    /// Mean over rows of ‖diag(p) − ppᵀ‖_F computed from p.
    pub jacobian_norm_analytic: f64,
    /// The same through autodiff.
    pub jacobian_norm_autodiff: f64,
    /// Largest per-row |analytic − autodiff|.
    pub jacobian_max_abs_diff: f64,
    /// Mean |∂L/∂score|.
    pub mean_abs_score_grad: f64,
    /// Mean share of a row's keys whose |∂L/∂score| exceeds 1e−3 of the row's largest.
    pub share_keys_with_gradient: f64,
    /// Mean largest probability of a row.
    pub max_p: f64,
    /// ‖∂L/∂Q‖_F.
    pub grad_q_norm: f64,
    /// ‖∂L/∂K‖_F.
    pub grad_k_norm: f64,
    /// ‖∂L/∂V‖_F.
    pub grad_v_norm: f64,
}

/// Scientific notation with two decimals.
fn sci(x: f64) -> String {
    format!("{x:.2e}")
}

/// A share as a percentage with one decimal.
fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn tensor(data: &[f32], shape: [usize; 4], device: &Device) -> Tensor<4> {
    Tensor::from_data(TensorData::new(data.to_vec(), shape), device)
}

/// Measures one cell on one backend.
pub fn measure(
    backend: &LabBackend,
    d: usize,
    n: usize,
    scaled: bool,
    data: &[Vec<f32>; 4],
) -> Result<GradientRow, LabError> {
    let m = n;
    let device = backend.device.clone().autodiff();
    let [qd, kd, vd, gd] = data;
    let attn = ScaledDotProductAttentionConfig::new()
        .with_scale(if scaled {
            ScalePolicy::InvSqrtDk
        } else {
            ScalePolicy::Unscaled
        })
        .try_init()?;

    // Pass 1: L = sum(context · G) for a random upstream gradient G.
    let q = tensor(qd, [1, 1, n, d], &device).require_grad();
    let k = tensor(kd, [1, 1, m, d], &device).require_grad();
    let v = tensor(vd, [1, 1, m, d], &device).require_grad();
    let bias = Tensor::<4>::zeros([1, 1, n, m], &device).require_grad();
    let out = attn.try_forward(
        AttentionInput::new(q.clone(), k.clone(), v.clone())
            .bias(bias.clone())
            .need_weights(),
    )?;
    let weights = out
        .weights
        .clone()
        .ok_or_else(|| LabError::Other("no weights".into()))?;
    let g = tensor(gd, [1, 1, n, d], &device);
    let grads = (out.context * g).sum().backward();
    let missing = |what: &str| LabError::Other(format!("autodiff gave no gradient for {what}"));
    let ds = bias.grad(&grads).ok_or_else(|| missing("the scores"))?;
    let dq = q.grad(&grads).ok_or_else(|| missing("Q"))?;
    let dk = k.grad(&grads).ok_or_else(|| missing("K"))?;
    let dv = v.grad(&grads).ok_or_else(|| missing("V"))?;
    let norm = |t: Tensor<4>| -> Result<f64, LabError> { Ok(to_vec(t.square().sum().sqrt())?[0]) };
    let abs_ds = ds.abs();
    let row_max = abs_ds.clone().max_dim(3);
    let share = to_vec(
        abs_ds
            .clone()
            .greater(row_max * 1e-3)
            .float()
            .mean_dim(3)
            .mean(),
    )?[0];
    let mean_abs = to_vec(abs_ds.mean())?[0];

    // Analytic Jacobian norm per row: ‖diag(p) − ppᵀ‖²_F = Σ p²(1−p)² + (Σp²)² − Σp⁴.
    let p: Vec<f64> = to_vec(weights.without_autodiff())?;
    let analytic: Vec<f64> = p
        .chunks(m)
        .map(|row| {
            let a: f64 = row.iter().map(|x| x * x * (1.0 - x) * (1.0 - x)).sum();
            let s2: f64 = row.iter().map(|x| x * x).sum();
            let s4: f64 = row.iter().map(|x| x.powi(4)).sum();
            (a + s2 * s2 - s4).max(0.0).sqrt()
        })
        .collect();
    let max_p = mean(
        &p.chunks(m)
            .map(|r| r.iter().cloned().fold(0.0, f64::max))
            .collect::<Vec<_>>(),
    );

    // Pass 2: the Jacobian through autodiff, all m rows of it in one backward pass. Batch entry
    // j gets the loss Σ_i p_ij, whose gradient with respect to the (zero) bias of row i is row j
    // of that row's Jacobian.
    let qj = tensor(qd, [1, 1, n, d], &device).expand([m, 1, n, d]);
    let kj = tensor(kd, [1, 1, m, d], &device).expand([m, 1, m, d]);
    let vj = tensor(vd, [1, 1, m, d], &device).expand([m, 1, m, d]);
    let bias_j = Tensor::<4>::zeros([m, 1, n, m], &device).require_grad();
    let out_j = attn.try_forward(
        AttentionInput::new(qj, kj, vj)
            .bias(bias_j.clone())
            .need_weights(),
    )?;
    let w_j = out_j
        .weights
        .ok_or_else(|| LabError::Other("no weights".into()))?;
    // selector[j, 0, i, j'] = 1 when j' == j
    let eye: Vec<f32> = (0..m * m)
        .map(|x| if x / m == x % m { 1.0 } else { 0.0 })
        .collect();
    let selector = Tensor::<4>::from_data(TensorData::new(eye, [m, 1, 1, m]), &device);
    let grads_j = (w_j * selector).sum().backward();
    let jac = bias_j
        .grad(&grads_j)
        .ok_or_else(|| missing("the Jacobian pass"))?;
    // ‖J_i‖²_F = Σ_j Σ_j' (∂p_ij/∂s_ij')²: sum over the batch axis (j) and the key axis (j').
    let per_row: Vec<f64> = to_vec(jac.square().sum_dim(0).sum_dim(3).sqrt())?;
    let max_diff = analytic
        .iter()
        .zip(&per_row)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);

    Ok(GradientRow {
        backend: backend.name.clone(),
        d,
        scaled,
        jacobian_norm_analytic: mean(&analytic),
        jacobian_norm_autodiff: mean(&per_row),
        jacobian_max_abs_diff: max_diff,
        mean_abs_score_grad: mean_abs,
        share_keys_with_gradient: share,
        max_p,
        grad_q_norm: norm(dq)?,
        grad_k_norm: norm(dk)?,
        grad_v_norm: norm(dv)?,
    })
}

/// The experiment.
pub struct Gradients;

impl Experiment for Gradients {
    fn name(&self) -> &'static str {
        "gradients"
    }

    fn title(&self) -> &'static str {
        "Gradient flow through softmax without √d scaling, measured with autodiff on each backend"
    }

    fn run(&self, ctx: &LabContext) -> Result<ExperimentOutput, LabError> {
        let t0 = Instant::now();
        let n = if ctx.quick { 32 } else { 64 };
        let dims = [16usize, 64, 256, 1024];
        let mut rows = Vec::new();
        for &d in &dims {
            // The same inputs on every backend.
            let mut rng = ctx.rng(4_000 + d as u64);
            let data = [
                normal_vec(&mut rng, n * d),
                normal_vec(&mut rng, n * d),
                normal_vec(&mut rng, n * d),
                normal_vec(&mut rng, n * d),
            ];
            for backend in &ctx.backends {
                for scaled in [true, false] {
                    rows.push(measure(backend, d, n, scaled, &data)?);
                }
            }
        }
        let agree = rows.iter().all(|r| r.jacobian_max_abs_diff <= 1e-4);
        let table = md_table(
            &[
                "backend",
                "d",
                "scaling",
                "mean max p",
                "‖J‖_F analytic",
                "‖J‖_F autodiff",
                "max diff",
                "mean |∂L/∂s|",
                "keys with gradient",
                "‖∂L/∂Q‖",
                "‖∂L/∂K‖",
                "‖∂L/∂V‖",
            ],
            &rows
                .iter()
                .map(|r| {
                    vec![
                        r.backend.clone(),
                        r.d.to_string(),
                        if r.scaled {
                            "1/√d".into()
                        } else {
                            "none".into()
                        },
                        f(r.max_p, 3),
                        format!("{:.3e}", r.jacobian_norm_analytic),
                        format!("{:.3e}", r.jacobian_norm_autodiff),
                        format!("{:.1e}", r.jacobian_max_abs_diff),
                        format!("{:.3e}", r.mean_abs_score_grad),
                        format!("{:.1}%", 100.0 * r.share_keys_with_gradient),
                        f(r.grad_q_norm, 2),
                        f(r.grad_k_norm, 2),
                        f(r.grad_v_norm, 2),
                    ]
                })
                .collect::<Vec<_>>(),
        );
        let primary = &ctx.primary().name;
        let pick = |d: usize, scaled: bool| {
            rows.iter()
                .find(|r| &r.backend == primary && r.d == d && r.scaled == scaled)
        };
        let g = |r: Option<&GradientRow>, sel: fn(&GradientRow) -> f64| r.map_or(f64::NAN, sel);
        // Unscaled ÷ scaled at equal d: what the missing 1/√d does, all else equal.
        let ratio =
            |d: usize, sel: fn(&GradientRow) -> f64| g(pick(d, false), sel) / g(pick(d, true), sel);
        let ratio_table = md_table(
            &[
                "d",
                "max p unscaled",
                "‖J‖_F",
                "mean |∂L/∂s|",
                "keys with gradient",
                "‖∂L/∂Q‖",
                "‖∂L/∂V‖",
            ],
            &dims
                .iter()
                .map(|&d| {
                    vec![
                        d.to_string(),
                        f(g(pick(d, false), |r| r.max_p), 3),
                        f(ratio(d, |r| r.jacobian_norm_analytic), 3),
                        f(ratio(d, |r| r.mean_abs_score_grad), 3),
                        f(ratio(d, |r| r.share_keys_with_gradient), 3),
                        f(ratio(d, |r| r.grad_q_norm), 1),
                        f(ratio(d, |r| r.grad_v_norm), 2),
                    ]
                })
                .collect::<Vec<_>>(),
        );
        let (d_lo, d_hi) = (dims[0], dims[dims.len() - 1]);
        let u_hi = pick(d_hi, false);
        let s_hi = pick(d_hi, true);
        let markdown = format!(
            "n = m = {n} queries and keys, unit-variance Q, K, V (d_v = d) and a random upstream gradient G \
             on the context (L = Σ context·G). ∂L/∂scores is read as the gradient of a zero additive bias; \
             the Jacobian of each softmax row, diag(p) − ppᵀ, is computed analytically from p and through \
             autodiff (one batched backward pass over all m output coordinates); they agree to 1e-4 in {}.\n\n{table}\n\
             The same numbers as ratios **unscaled ÷ scaled at equal d** ({primary}):\n\n{ratio_table}\n\
             **What vanishes.** The softmax Jacobian: unscaled, its mean Frobenius norm per row falls from {} \
             (d = {d_lo}) to {} (d = {d_hi}); scaled it stays near {}. The score gradient ∂L/∂s, which is the \
             Jacobian applied to the upstream signal, is {}× the scaled one at d = {d_hi}. And the gradient \
             collapses onto few keys: unscaled at d = {d_hi} only {} of a row's keys receive more than 10⁻³ of \
             its largest score gradient, against {} scaled.\n\n\
             **What does not vanish.** ‖∂L/∂Q‖ = ‖Σ_j ∂L/∂s_ij · k_j · scale‖: the smaller score gradients meet \
             a scale of 1 instead of 1/√d, so unscaled ‖∂L/∂Q‖ is {}× the scaled one at d = {d_hi} ({} vs {}): \
             it does not shrink on average, it is carried by one or two keys per row. ‖∂L/∂V‖ = ‖pᵀG‖ does not \
             pass through the Jacobian at all, and grows as p concentrates ({}×). \"Gradient vanishing\" is \
             precise for the softmax Jacobian and the score gradients; what the query and key projections \
             lose is the *spread* of the signal over keys (the ability to learn which other keys should \
             matter), not its size. Adam rescales updates per parameter, which hides the size effect \
             further (see `training`).\n",
            if agree {
                "every cell"
            } else {
                "NOT every cell (see max diff)"
            },
            sci(g(pick(d_lo, false), |r| r.jacobian_norm_analytic)),
            sci(g(u_hi, |r| r.jacobian_norm_analytic)),
            sci(g(s_hi, |r| r.jacobian_norm_analytic)),
            f(ratio(d_hi, |r| r.mean_abs_score_grad), 2),
            pct(g(u_hi, |r| r.share_keys_with_gradient)),
            pct(g(s_hi, |r| r.share_keys_with_gradient)),
            f(ratio(d_hi, |r| r.grad_q_norm), 1),
            f(g(u_hi, |r| r.grad_q_norm), 1),
            f(g(s_hi, |r| r.grad_q_norm), 1),
            f(ratio(d_hi, |r| r.grad_v_norm), 2),
        );
        let csv = write_csv(
            ctx,
            "gradients.csv",
            "backend,d,scaled,max_p,jacobian_norm_analytic,jacobian_norm_autodiff,jacobian_max_abs_diff,mean_abs_score_grad,share_keys_with_gradient,grad_q_norm,grad_k_norm,grad_v_norm",
            &rows
                .iter()
                .map(|r| {
                    format!(
                        "{},{},{},{},{},{},{},{},{},{},{},{}",
                        r.backend,
                        r.d,
                        r.scaled,
                        r.max_p,
                        r.jacobian_norm_analytic,
                        r.jacobian_norm_autodiff,
                        r.jacobian_max_abs_diff,
                        r.mean_abs_score_grad,
                        r.share_keys_with_gradient,
                        r.grad_q_norm,
                        r.grad_k_norm,
                        r.grad_v_norm
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        let series_of = |sel: fn(&GradientRow) -> f64| {
            let mut s = Vec::new();
            for b in &ctx.backends {
                for scaled in [true, false] {
                    s.push(Series::line(
                        format!(
                            "{}, {}",
                            if scaled { "scaled 1/√d" } else { "unscaled" },
                            b.name
                        ),
                        rows.iter()
                            .filter(|r| r.backend == b.name && r.scaled == scaled)
                            .map(|r| (r.d as f64, sel(r)))
                            .collect(),
                    ));
                }
            }
            s
        };
        let p1 = "gradients_jacobian_norm.png";
        line_plot(
            &out_path(ctx, p1),
            &LinePlot {
                title: "Softmax Jacobian ‖diag(p) − ppᵀ‖_F vs d (autodiff)".into(),
                x_label: "d".into(),
                y_label: "mean Frobenius norm per row".into(),
                log_x: true,
                log_y: true,
                series: series_of(|r| r.jacobian_norm_autodiff),
            },
        )?;
        let p2 = "gradients_keys_share.png";
        line_plot(
            &out_path(ctx, p2),
            &LinePlot {
                title: "Share of keys receiving score gradient vs d".into(),
                x_label: "d".into(),
                y_label: "share of keys with |∂L/∂s| > 1e-3 · row max".into(),
                log_x: true,
                log_y: false,
                series: series_of(|r| r.share_keys_with_gradient),
            },
        )?;
        Ok(ExperimentOutput {
            name: self.name().into(),
            title: self.title().into(),
            verdict: if agree {
                Verdict::Corrected
            } else {
                Verdict::Differs
            },
            summary: format!(
                "unscaled, ‖J‖_F falls from {:.2e} (d={d_lo}) to {:.2e} (d={d_hi}) and {:.1}% of keys get gradient (scaled {:.1}%); ‖∂L/∂Q‖ does not shrink ({}× scaled); autodiff = analytic to 1e-4 on {}",
                g(pick(d_lo, false), |r| r.jacobian_norm_analytic),
                g(u_hi, |r| r.jacobian_norm_analytic),
                100.0 * g(u_hi, |r| r.share_keys_with_gradient),
                100.0 * g(s_hi, |r| r.share_keys_with_gradient),
                f(ratio(d_hi, |r| r.grad_q_norm), 1),
                ctx.backends
                    .iter()
                    .map(|b| b.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            markdown,
            results: serde_json::json!({ "n": n, "rows": rows }),
            plots: vec![p1.into(), p2.into()],
            csv: vec![csv],
            skipped: vec![],
            backends: ctx.backends.iter().map(|b| b.name.clone()).collect(),
            seconds: t0.elapsed().as_secs_f64(),
        })
    }
}
