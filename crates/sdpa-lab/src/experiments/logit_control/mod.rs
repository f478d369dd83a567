//! Experiment `logit-control`: √d_k scaling beside the modern answers to the same problem —
//! logit soft-capping (Gemma 2) and QK-norm (ViT-22B, OLMo 2) — at initialization for d_k from 16
//! to 1024 (the measures of `attention-saturation` and `gradients`), and in training on *match*
//! (seeds, success rates, steps to 99%). The article never meets them: its only control is the
//! scale.

mod claims;
mod control;
mod init;
mod train;

use std::time::Instant;

use serde::Serialize;

pub use claims::claims;
pub use control::Control;
pub use init::{InitRow, InitValues};
pub use train::{ControlCell, ControlRun};

use super::{Experiment, ExperimentOutput, md_table, out_path, write_csv};
use crate::claims::show;
use crate::context::{LabContext, LabError, normal_vec};
use crate::experiments::training::Comparison;
use crate::parallel::map_parallel;
use crate::plot::{LinePlot, Series, line_plot};
use crate::stats::Estimate;

/// Sizes of the experiment.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Queries and keys at initialization (n = m).
    pub n: usize,
    /// d_k at initialization.
    pub dims: Vec<usize>,
    /// Draws per (d_k, control) at initialization.
    pub draws: usize,
    /// Controls at initialization.
    pub init_controls: Vec<Control>,
    /// d_k in training.
    pub train_dims: Vec<usize>,
    /// Controls in training.
    pub train_controls: Vec<Control>,
    /// The (d_k, control) cells trained (every control at every d_k of `train_dims`, and the
    /// fast controls at d_k = 1024 in the full design).
    pub train_cells: Vec<(usize, Control)>,
    /// Seeds per (d_k, control) in training.
    pub seeds: Vec<u64>,
    /// Step budget per run.
    pub steps: usize,
    /// Evaluation interval.
    pub eval_every: usize,
}

/// The soft-caps at initialization: strong, medium, and Gemma 2's 50.
pub const CAPS: [f64; 3] = [5.0, 15.0, 50.0];
/// The margin of the training equivalence claims: 50 steps, five evaluations, a tenth of the
/// full budget.
pub const EQUIVALENCE_STEPS: f64 = 50.0;
/// The soft-cap in training (a priori: it still allows p_max > 0.999 among the 8 keys of
/// *match*, since e^{2·5} ≫ 7).
pub const TRAIN_CAP: f64 = 5.0;

impl Config {
    /// The full design, or a small one with `quick`.
    ///
    /// At d_k = 1024 the full design trains only the controls that keep the logits small at
    /// initialization (1/√d_k, the cap, QK-norm + 1/√d_k): a step of the default model there costs
    /// ~0.1 s with two runs at once on 2 cores (measured), and no control at all, or QK-norm alone,
    /// take most of the 500-step budget, so their 20 runs would add ~8 minutes to a report
    /// budgeted at 20. `training` measures no scaling at d_k = 1024 with the same configuration.
    pub fn new(quick: bool, seed: u64) -> Self {
        let mut init_controls = vec![Control::Scaled, Control::Unscaled];
        init_controls.extend(CAPS.map(Control::SoftCap));
        init_controls.extend([Control::QkNorm, Control::QkNormScaled]);
        let train_dims = if quick { vec![64] } else { vec![16, 64, 256] };
        let train_controls = vec![
            Control::Scaled,
            Control::Unscaled,
            Control::SoftCap(TRAIN_CAP),
            Control::QkNorm,
            Control::QkNormScaled,
        ];
        let mut train_cells: Vec<(usize, Control)> = train_dims
            .iter()
            .flat_map(|&d_k| train_controls.iter().map(move |&c| (d_k, c)))
            .collect();
        if !quick {
            train_cells.extend(
                [
                    Control::Scaled,
                    Control::SoftCap(TRAIN_CAP),
                    Control::QkNormScaled,
                ]
                .map(|c| (1024, c)),
            );
        }
        Self {
            n: if quick { 64 } else { 256 },
            dims: vec![16, 64, 256, 1024],
            draws: if quick { 3 } else { 10 },
            init_controls,
            train_dims,
            train_controls,
            train_cells,
            seeds: (0..if quick { 3 } else { 10 }).map(|i| seed + i).collect(),
            steps: if quick { 200 } else { 500 },
            eval_every: 10,
        }
    }
}

/// The experiment.
pub struct LogitControl;

impl Experiment for LogitControl {
    fn name(&self) -> &'static str {
        "logit-control"
    }

    fn title(&self) -> &'static str {
        "√d_k beside soft-capping and QK-norm: initialization over d_k and training on match"
    }

    fn run(&self, ctx: &LabContext) -> Result<ExperimentOutput, LabError> {
        let t0 = Instant::now();
        let config = Config::new(ctx.quick, ctx.seed);
        let backend = ctx.primary();
        let n = config.n;
        let mut rows = Vec::new();
        for &d_k in &config.dims {
            let mut rng = ctx.rng(14_000 + d_k as u64);
            let draws: Vec<[Vec<f32>; 4]> = (0..config.draws)
                .map(|_| std::array::from_fn(|_| normal_vec(&mut rng, n * d_k)))
                .collect();
            for &control in &config.init_controls {
                let values = draws
                    .iter()
                    .map(|data| init::measure(backend, control, d_k, n, data))
                    .collect::<Result<Vec<_>, _>>()?;
                rows.push(InitRow::new(d_k, control, values));
            }
        }
        let mut jobs: Vec<(usize, Control, u64)> = Vec::new();
        for &(d_k, control) in &config.train_cells {
            jobs.extend(config.seeds.iter().map(|&seed| (d_k, control, seed)));
        }
        let progress = ctx.progress_lines("logit-control training", jobs.len());
        let root = ctx.out_dir.join("runs").join("logit-control");
        let runs = map_parallel(
            &jobs,
            |&job| train::run(backend, &root, job, config.steps, config.eval_every),
            |finished, run: &ControlRun| {
                progress.update(
                    finished as u64,
                    &format!(
                        "d_k {} {} seed {}: {}",
                        run.d_k,
                        run.control.label(),
                        run.seed,
                        run.steps_to_target
                            .map_or("target not reached".into(), |s| format!("99% at step {s}"))
                    ),
                );
            },
        )?;
        progress.finish(&format!("{} runs", runs.len()));
        let cells = train::cells(&runs, &config.train_cells, config.steps);
        let csv = vec![
            write_csv(
                ctx,
                "logit_control_init.csv",
                "d_k,control,draw,logit_std,max_p,entropy,jacobian_norm,share_keys,rms_dq",
                &rows
                    .iter()
                    .flat_map(|r| {
                        r.draws.iter().enumerate().map(move |(i, v)| {
                            format!(
                                "{},{},{i},{},{},{},{},{},{}",
                                r.d_k,
                                r.control.slug(),
                                v.logit_std,
                                v.max_p,
                                v.entropy,
                                v.jacobian_norm,
                                v.share_keys,
                                v.rms_dq
                            )
                        })
                    })
                    .collect::<Vec<_>>(),
            )?,
            write_csv(
                ctx,
                "logit_control_training.csv",
                "d_k,control,seed,steps_to_target,final_accuracy,diverged_at,seconds",
                &runs
                    .iter()
                    .map(|r| {
                        format!(
                            "{},{},{},{},{},{},{}",
                            r.d_k,
                            r.control.slug(),
                            r.seed,
                            r.steps_to_target.map(|s| s.to_string()).unwrap_or_default(),
                            r.final_accuracy,
                            r.diverged_at.map(|s| s.to_string()).unwrap_or_default(),
                            r.seconds
                        )
                    })
                    .collect::<Vec<_>>(),
            )?,
        ];
        let plots = plot(ctx, &config, &rows, &cells)?;
        let markdown = markdown(&config, &rows, &cells, &plots);
        let claims = claims(&config, &rows, &cells);
        Ok(ExperimentOutput::new(
            self,
            ctx,
            claims,
            markdown,
            serde_json::json!({ "config": config, "init": rows, "cells": cells, "runs": runs }),
            t0,
        )
        .files(plots, csv))
    }
}

fn versus(c: Comparison) -> &'static str {
    match c {
        Comparison::UnscaledWorse => "worse",
        Comparison::UnscaledBetter => "better",
        Comparison::NoClearDifference => "no clear difference",
    }
}

fn markdown(config: &Config, rows: &[InitRow], cells: &[ControlCell], plots: &[String]) -> String {
    let init = md_table(
        &[
            "d_k",
            "control",
            "logit std",
            "mean max p",
            "entropy / ln m",
            "‖J‖_F per row",
            "keys with gradient",
            "RMS ∂L/∂Q",
        ],
        &rows
            .iter()
            .map(|r| {
                vec![
                    r.d_k.to_string(),
                    r.control.label(),
                    show(r.logit_std),
                    show(r.max_p),
                    show(r.entropy),
                    show(r.jacobian_norm),
                    show(r.share_keys),
                    show(r.rms_dq),
                ]
            })
            .collect::<Vec<_>>(),
    );
    let training = md_table(
        &[
            "d_k",
            "control",
            "reached 99% (Wilson 95%)",
            "mean steps, budget if never (95% CI)",
            "steps − 1/√d_k's (Welch 95%)",
            "vs 1/√d_k",
        ],
        &cells
            .iter()
            .map(|c| {
                vec![
                    c.d_k.to_string(),
                    c.control.label(),
                    show(c.success),
                    show(c.capped_steps),
                    if c.control == Control::Scaled {
                        "—".into()
                    } else {
                        show(c.steps_minus_scaled)
                    },
                    if c.control == Control::Scaled {
                        "(reference)".into()
                    } else {
                        versus(c.versus_scaled).into()
                    },
                ]
            })
            .collect::<Vec<_>>(),
    );
    format!(
        "**At initialization.** n = m = {} unit-variance queries, keys and values (d_v = d_k) and a random \
         upstream gradient G (L = Σ context·G), {} draws per cell (means with 95% t-intervals). Controls: \
         1/√d_k, none, soft-caps c ∈ {:?} on unscaled scores (c·tanh(s/c), Burn's and Gemma 2's order: \
         before bias and masks), QK-norm (RMSNorm of every query and key head, gain 1 at initialization) \
         without and with 1/√d_k. \"Keys with gradient\" is the share of a row's keys whose logit gradient \
         exceeds 1e−3 of the row's largest (read as the gradient of a zero bias added after scale and cap); \
         ∂L/∂Q goes through the cap's and the norm's derivatives.\n\n{init}\n\
         **In training.** The default model on *match* (Adam lr 3e-3, pre-LayerNorm, q/k initialized for \
         unit-variance components), {} seeds per cell, a budget of {} steps, evaluation every {} steps, \
         d_k ∈ {:?} for every control and d_k = 1024 for those that keep the logits small at \
         initialization (no control and QK-norm alone use most of the budget there: ~8 more minutes; \
         `training` has no scaling at d_k = 1024 with the same configuration); soft-cap c = {TRAIN_CAP}. \"vs 1/√d_k\" reads disjoint success-rate or mean-steps \
         intervals in either direction.\n\n{training}\n{}\n",
        config.n,
        config.draws,
        CAPS,
        config.seeds.len(),
        config.steps,
        config.eval_every,
        config.train_dims,
        plots
            .iter()
            .map(|p| format!("![{p}]({p})"))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// Max p, RMS ∂L/∂Q and the share of keys against d_k per control (init), and mean steps to
/// 99% against d_k per control (training), with 95% bands.
fn plot(
    ctx: &LabContext,
    config: &Config,
    rows: &[InitRow],
    cells: &[ControlCell],
) -> Result<Vec<String>, LabError> {
    type Pick = fn(&InitRow) -> Estimate;
    let specs: [(&str, &str, &str, bool, Pick); 3] = [
        (
            "logit_control_max_p.png",
            "Mean max p at initialization",
            "mean max p",
            false,
            |r| r.max_p,
        ),
        (
            "logit_control_keys_share.png",
            "Share of keys receiving logit gradient at initialization",
            "share of keys",
            false,
            |r| r.share_keys,
        ),
        (
            "logit_control_query_rms.png",
            "RMS ∂L/∂Q at initialization",
            "per-element RMS",
            true,
            |r| r.rms_dq,
        ),
    ];
    let mut files = Vec::new();
    for (name, title, y_label, log_y, pick) in specs {
        let series = config
            .init_controls
            .iter()
            .map(|&control| {
                Series::with_band(
                    control.label(),
                    rows.iter()
                        .filter(|r| r.control == control)
                        .map(|r| {
                            let e = pick(r);
                            (r.d_k as f64, e.value, e.lo, e.hi)
                        })
                        .collect(),
                )
            })
            .collect();
        line_plot(
            &out_path(ctx, name),
            &LinePlot {
                title: format!("{title} (95% bands)"),
                x_label: "d_k".into(),
                y_label: y_label.into(),
                log_x: true,
                log_y,
                series,
            },
        )?;
        files.push(name.to_string());
    }
    if config
        .train_cells
        .iter()
        .any(|&(d_k, _)| d_k != config.train_dims[0])
    {
        let name = "logit_control_training.png";
        line_plot(
            &out_path(ctx, name),
            &LinePlot {
                title: format!(
                    "Mean steps to 99% on match (budget {} if never, 95% bands)",
                    config.steps
                ),
                x_label: "d_k".into(),
                y_label: "steps".into(),
                log_x: true,
                log_y: false,
                series: config
                    .train_controls
                    .iter()
                    .map(|&control| {
                        Series::with_band(
                            control.label(),
                            cells
                                .iter()
                                .filter(|c| c.control == control)
                                .map(|c| {
                                    let e = c.capped_steps;
                                    (c.d_k as f64, e.value, e.lo, e.hi)
                                })
                                .collect(),
                        )
                    })
                    .collect(),
            },
        )?;
        files.push(name.to_string());
    }
    Ok(files)
}
