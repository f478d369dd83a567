//! Experiment 4 (`gradients`): gradient flow through the softmax, with and without √d scaling,
//! measured with Burn's autodiff on every backend asked for. The score gradient is read as the
//! gradient of an all-zero additive bias (∂L/∂bias = ∂L/∂scores, since the bias is added to the
//! scaled scores); the softmax Jacobian diag(p) − ppᵀ is computed analytically from p and,
//! on one draw per cell, through autodiff.

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::TensorData;
use burn_sdpa::{AttentionInput, ScalePolicy, ScaledDotProductAttentionConfig};
use serde::Serialize;

mod claims;

pub use claims::claims;

use super::{BackendValues, Experiment, ExperimentOutput, md_table, out_path, write_csv};
use crate::claims::show;
use crate::context::{LabBackend, LabContext, LabError, normal_vec, to_vec};
use crate::plot::{LinePlot, Series, line_plot};
use crate::stats::{Estimate, mean, mean_ci};

/// Sizes of the experiment.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Queries and keys (n = m).
    pub n: usize,
    /// Head dimensions.
    pub dims: Vec<usize>,
    /// Independent draws of Q, K, V and the upstream gradient per (d, scaling).
    pub draws: usize,
    /// Query rows of the autodiff Jacobian check.
    pub jacobian_rows: usize,
}

impl Config {
    /// The sizes (n = m = 256, d from 16 to 1024, 10 draws), or small ones with `quick`.
    pub fn new(quick: bool) -> Self {
        if quick {
            Self {
                n: 64,
                dims: vec![16, 64, 256, 1024],
                draws: 3,
                jacobian_rows: 8,
            }
        } else {
            Self {
                n: 256,
                dims: vec![16, 32, 64, 128, 256, 512, 1024],
                draws: 10,
                jacobian_rows: 16,
            }
        }
    }
}

/// What one draw measures.
#[derive(Debug, Clone, Copy, Serialize)]
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

/// One (backend, d, scaling) cell over its draws: means with 95% t-intervals.
#[derive(Debug, Clone, Serialize)]
pub struct GradientRow {
    /// Backend.
    pub backend: String,
    /// d.
    pub d: usize,
    /// Whether the scores are divided by √d.
    pub scaled: bool,
    /// Every draw.
    pub draws: Vec<DrawValues>,
    /// RMS of ∂L/∂Q.
    pub rms_dq: Estimate,
    /// RMS of ∂L/∂K.
    pub rms_dk: Estimate,
    /// RMS of ∂L/∂V.
    pub rms_dv: Estimate,
    /// RMS of ∂L/∂scores.
    pub rms_ds: Estimate,
    /// ‖diag(p) − ppᵀ‖_F per row.
    pub jacobian_norm: Estimate,
    /// Share of keys receiving gradient.
    pub share_keys: Estimate,
    /// Mean max p.
    pub max_p: Estimate,
    /// Largest |analytic − autodiff| per-row Jacobian norm, on the first draw.
    pub jacobian_autodiff_max_diff: f64,
}

fn tensor(data: &[f32], shape: [usize; 4], device: &Device) -> Tensor<4> {
    Tensor::from_data(TensorData::new(data.to_vec(), shape), device)
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

/// One draw on one backend: L = Σ context · G for a random upstream gradient G.
fn measure_draw(
    backend: &LabBackend,
    d: usize,
    n: usize,
    scaled: bool,
    data: &[Vec<f32>; 4],
) -> Result<DrawValues, LabError> {
    let m = n;
    let device = backend.device.clone().autodiff();
    let [qd, kd, vd, gd] = data;
    let q = tensor(qd, [1, 1, n, d], &device).require_grad();
    let k = tensor(kd, [1, 1, m, d], &device).require_grad();
    let v = tensor(vd, [1, 1, m, d], &device).require_grad();
    let bias = Tensor::<4>::zeros([1, 1, n, m], &device).require_grad();
    let out = module(scaled)?.try_forward(
        AttentionInput::new(q.clone(), k.clone(), v.clone())
            .bias(bias.clone())
            .need_weights(),
    )?;
    let weights = out
        .weights
        .clone()
        .ok_or_else(|| LabError::Other("no weights".into()))?;
    let grads = (out.context * tensor(gd, [1, 1, n, d], &device))
        .sum()
        .backward();
    let missing = |what: &str| LabError::Other(format!("autodiff gave no gradient for {what}"));
    let ds = bias.grad(&grads).ok_or_else(|| missing("the scores"))?;
    let dq = q.grad(&grads).ok_or_else(|| missing("Q"))?;
    let dk = k.grad(&grads).ok_or_else(|| missing("K"))?;
    let dv = v.grad(&grads).ok_or_else(|| missing("V"))?;
    let rms = |t: Tensor<4>| -> Result<f64, LabError> { Ok(to_vec(t.square().mean().sqrt())?[0]) };
    let share_keys = share_of_keys_with_gradient(ds.clone())?;
    let p: Vec<f64> = to_vec(weights.without_autodiff())?;
    Ok(DrawValues {
        rms_dq: rms(dq)?,
        rms_dk: rms(dk)?,
        rms_dv: rms(dv)?,
        rms_ds: rms(ds)?,
        jacobian_norm: mean(&analytic_jacobian_norms(&p, m)),
        share_keys,
        max_p: mean(
            &p.chunks(m)
                .map(|r| r.iter().cloned().fold(0.0, f64::max))
                .collect::<Vec<_>>(),
        ),
    })
}

/// The mean share of a row's keys whose |∂L/∂score| exceeds 1e−3 of the row's largest, from the
/// score gradient `[b, h, n, m]`.
pub fn share_of_keys_with_gradient(ds: Tensor<4>) -> Result<f64, LabError> {
    let abs_ds = ds.abs();
    let row_max = abs_ds.clone().max_dim(3);
    Ok(to_vec(abs_ds.greater(row_max * 1e-3).float().mean_dim(3).mean())?[0])
}

/// ‖diag(p) − ppᵀ‖_F of every row of `p` (rows of `m`): Σ p²(1−p)² + (Σp²)² − Σp⁴,
/// square-rooted.
pub fn analytic_jacobian_norms(p: &[f64], m: usize) -> Vec<f64> {
    p.chunks(m)
        .map(|row| {
            let a: f64 = row.iter().map(|x| x * x * (1.0 - x) * (1.0 - x)).sum();
            let s2: f64 = row.iter().map(|x| x * x).sum();
            let s4: f64 = row.iter().map(|x| x.powi(4)).sum();
            (a + s2 * s2 - s4).max(0.0).sqrt()
        })
        .collect()
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
    backend: &LabBackend,
    d: usize,
    n: usize,
    rows: usize,
    scaled: bool,
    data: &[Vec<f32>; 4],
) -> Result<f64, LabError> {
    let (m, rows) = (n, rows.min(n));
    let device = backend.device.clone().autodiff();
    let [qd, kd, vd, _] = data;
    let module = module(scaled)?;
    let mut analytic = Vec::new();
    // Σ_j Σ_j' (∂p_ij/∂s_ij')² per row i, accumulated over the chunks of j: [rows].
    let mut squares = vec![0.0f64; rows];
    for start in (0..m).step_by(JACOBIAN_CHUNK) {
        let c = JACOBIAN_CHUNK.min(m - start);
        let q = tensor(&qd[..rows * d], [1, 1, rows, d], &device).expand([c, 1, rows, d]);
        let k = tensor(kd, [1, 1, m, d], &device).expand([c, 1, m, d]);
        let v = tensor(vd, [1, 1, m, d], &device).expand([c, 1, m, d]);
        let bias = Tensor::<4>::zeros([c, 1, rows, m], &device).require_grad();
        let out = module.try_forward(
            AttentionInput::new(q, k, v)
                .bias(bias.clone())
                .need_weights(),
        )?;
        let w = out
            .weights
            .ok_or_else(|| LabError::Other("no weights".into()))?;
        if start == 0 {
            analytic =
                analytic_jacobian_norms(&to_vec(w.clone().slice(s![0..1]).without_autodiff())?, m);
        }
        // selector[c', 0, i, j'] = 1 when j' == start + c'
        let eye: Vec<f32> = (0..c * m)
            .map(|x| if x % m == start + x / m { 1.0 } else { 0.0 })
            .collect();
        let selector = Tensor::<4>::from_data(TensorData::new(eye, [c, 1, 1, m]), &device);
        let grads = (w * selector).sum().backward();
        let jac = bias
            .grad(&grads)
            .ok_or_else(|| LabError::Other("no gradient in the Jacobian pass".into()))?;
        // Sum over the chunk's output coordinates (batch axis) and the key axis (j').
        let chunk: Vec<f64> = to_vec(jac.square().sum_dim(0).sum_dim(3))?;
        for (total, part) in squares.iter_mut().zip(chunk) {
            *total += part;
        }
    }
    Ok(analytic
        .iter()
        .zip(&squares)
        .map(|(a, b)| (a - b.sqrt()).abs())
        .fold(0.0, f64::max))
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
        let config = Config::new(ctx.quick);
        let n = config.n;
        let mut rows = Vec::new();
        for &d in &config.dims {
            // The same draws on every backend.
            let mut rng = ctx.rng(4_000 + d as u64);
            let draws: Vec<[Vec<f32>; 4]> = (0..config.draws)
                .map(|_| {
                    [
                        normal_vec(&mut rng, n * d),
                        normal_vec(&mut rng, n * d),
                        normal_vec(&mut rng, n * d),
                        normal_vec(&mut rng, n * d),
                    ]
                })
                .collect();
            for backend in &ctx.backends {
                for scaled in [true, false] {
                    let values = draws
                        .iter()
                        .map(|data| measure_draw(backend, d, n, scaled, data))
                        .collect::<Result<Vec<_>, LabError>>()?;
                    let ci = |pick: fn(&DrawValues) -> f64| {
                        mean_ci(&values.iter().map(pick).collect::<Vec<_>>())
                    };
                    rows.push(GradientRow {
                        backend: backend.name.clone(),
                        d,
                        scaled,
                        rms_dq: ci(|v| v.rms_dq),
                        rms_dk: ci(|v| v.rms_dk),
                        rms_dv: ci(|v| v.rms_dv),
                        rms_ds: ci(|v| v.rms_ds),
                        jacobian_norm: ci(|v| v.jacobian_norm),
                        share_keys: ci(|v| v.share_keys),
                        max_p: ci(|v| v.max_p),
                        jacobian_autodiff_max_diff: jacobian_check(
                            backend,
                            d,
                            n,
                            config.jacobian_rows,
                            scaled,
                            &draws[0],
                        )?,
                        draws: values,
                    });
                }
            }
        }
        let table = md_table(
            &[
                "backend",
                "d",
                "scaling",
                "mean max p",
                "‖J‖_F per row",
                "RMS ∂L/∂s",
                "keys with gradient",
                "RMS ∂L/∂Q",
                "RMS ∂L/∂K",
                "RMS ∂L/∂V",
                "autodiff − analytic ‖J‖",
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
                        show(r.max_p),
                        show(r.jacobian_norm),
                        show(r.rms_ds),
                        show(r.share_keys),
                        show(r.rms_dq),
                        show(r.rms_dk),
                        show(r.rms_dv),
                        format!("{:.1e}", r.jacobian_autodiff_max_diff),
                    ]
                })
                .collect::<Vec<_>>(),
        );
        let markdown = format!(
            "n = m = {n} queries and keys, unit-variance Q, K, V (d_v = d) and a random upstream gradient G \
             on the context (L = Σ context·G); means with 95% t-intervals over {} independent draws per \
             cell. ∂L/∂scores is read as the gradient of a zero additive bias; the Jacobian of each \
             softmax row, diag(p) − ppᵀ, is computed analytically from p, and through autodiff on the \
             first draw ({} query rows, one batched backward pass over all m output coordinates). The \
             exponents of the claims are least-squares slopes on log-log axes over every draw.\n\n{table}",
            config.draws, config.jacobian_rows,
        );
        let csv = write_csv(
            ctx,
            "gradients.csv",
            "backend,d,scaled,draw,max_p,jacobian_norm,rms_ds,share_keys,rms_dq,rms_dk,rms_dv",
            &rows
                .iter()
                .flat_map(|r| {
                    r.draws.iter().enumerate().map(move |(i, v)| {
                        format!(
                            "{},{},{},{i},{},{},{},{},{},{},{}",
                            r.backend,
                            r.d,
                            r.scaled,
                            v.max_p,
                            v.jacobian_norm,
                            v.rms_ds,
                            v.share_keys,
                            v.rms_dq,
                            v.rms_dk,
                            v.rms_dv
                        )
                    })
                })
                .collect::<Vec<_>>(),
        )?;
        let plots = plot(ctx, &rows)?;
        let per_backend = cross_backend(&rows);
        let claims = claims(&ctx.primary().name, &rows, &per_backend);
        Ok(ExperimentOutput::new(
            self,
            ctx,
            claims,
            markdown,
            serde_json::json!({ "config": config, "rows": rows }),
            t0,
        )
        .files(plots, vec![csv])
        .on_every_backend(ctx, per_backend))
    }
}

/// The first draw's values of every cell on every backend (the same inputs).
fn cross_backend(rows: &[GradientRow]) -> Vec<BackendValues> {
    let mut out: Vec<BackendValues> = Vec::new();
    for r in rows {
        let Some(first) = r.draws.first() else {
            continue;
        };
        for (name, value) in [
            ("‖J‖", first.jacobian_norm),
            ("RMS ∂L/∂Q", first.rms_dq),
            ("RMS ∂L/∂s", first.rms_ds),
        ] {
            let quantity = format!(
                "{name}, d = {}, {}",
                r.d,
                if r.scaled { "scaled" } else { "unscaled" }
            );
            match out.iter_mut().find(|b| b.quantity == quantity) {
                Some(b) => b.values.push((r.backend.clone(), value)),
                None => out.push(BackendValues {
                    quantity,
                    values: vec![(r.backend.clone(), value)],
                    floor: 0.0,
                }),
            }
        }
    }
    out
}

/// One plot: (file, title, y label, log y, the quantity).
type PlotSpec = (
    &'static str,
    &'static str,
    &'static str,
    bool,
    fn(&GradientRow) -> Estimate,
);

/// The plots: ‖J‖, RMS ∂L/∂Q and ∂L/∂s, and the share of keys against d, with 95% bands.
fn plot(ctx: &LabContext, rows: &[GradientRow]) -> Result<Vec<String>, LabError> {
    let primary = &ctx.primary().name;
    let band = |scaled: bool, pick: fn(&GradientRow) -> Estimate| -> Vec<(f64, f64, f64, f64)> {
        rows.iter()
            .filter(|r| &r.backend == primary && r.scaled == scaled)
            .map(|r| {
                let e = pick(r);
                (r.d as f64, e.value, e.lo, e.hi)
            })
            .collect()
    };
    let label = |scaled: bool| if scaled { "scaled 1/√d" } else { "unscaled" };
    let mut files = Vec::new();
    let specs: [PlotSpec; 3] = [
        (
            "gradients_jacobian_norm.png",
            "Softmax Jacobian ‖diag(p) − ppᵀ‖_F vs d (95% bands)",
            "mean Frobenius norm per row",
            true,
            |r| r.jacobian_norm,
        ),
        (
            "gradients_keys_share.png",
            "Share of keys receiving score gradient vs d (95% bands)",
            "share of keys with |∂L/∂s| > 1e-3 · row max",
            false,
            |r| r.share_keys,
        ),
        (
            "gradients_query_rms.png",
            "RMS of ∂L/∂Q vs d (95% bands)",
            "per-element RMS",
            true,
            |r| r.rms_dq,
        ),
    ];
    for (name, title, y_label, log_y, pick) in specs {
        line_plot(
            &out_path(ctx, name),
            &LinePlot {
                title: format!("{title}, {primary}"),
                x_label: "d".into(),
                y_label: y_label.into(),
                log_x: true,
                log_y,
                series: [false, true]
                    .into_iter()
                    .map(|s| Series::with_band(label(s), band(s, pick)))
                    .collect(),
            },
        )?;
        files.push(name.to_string());
    }
    Ok(files)
}
