//! Experiment 5 (`training`): the trainable model on *match*, scaled vs unscaled, over d_k,
//! the query/key initialization, the optimizer and seeds: does learning stall without √d_k?

use std::time::Instant;

use burn_sdpa::ScalePolicy;
use sdpa_model::metrics::StepMetrics;
use sdpa_model::{
    OptimizerKind, Progress, ProgressMode, QkInit, RunOptions, TaskConfig, TrainConfig, train,
};
use serde::Serialize;

use super::{Experiment, ExperimentOutput, Verdict, f, md_table, out_path, write_csv};
use crate::context::{LabContext, LabError};
use crate::plot::{LinePlot, Series, line_plot};
use crate::stats::{mean, median};

/// The grid.
#[derive(Debug, Clone, Serialize)]
pub struct TrainingGrid {
    /// d_k values.
    pub d_k: Vec<usize>,
    /// Initializations.
    pub inits: Vec<QkInit>,
    /// Optimizers.
    pub optimizers: Vec<OptimizerKind>,
    /// Seeds.
    pub seeds: Vec<u64>,
    /// Step budget per run.
    pub steps: usize,
    /// Adam learning rate.
    pub adam_lr: f64,
    /// SGD learning rate (momentum 0.9).
    pub sgd_lr: f64,
    /// Target held-out accuracy.
    pub target: f64,
}

impl TrainingGrid {
    /// The full grid, or a small one with `quick`.
    pub fn new(quick: bool, seed: u64) -> Self {
        if quick {
            Self {
                d_k: vec![64],
                inits: vec![QkInit::Unit],
                optimizers: vec![OptimizerKind::Adam],
                seeds: vec![seed],
                steps: 400,
                adam_lr: 3e-3,
                sgd_lr: 0.1,
                target: 0.99,
            }
        } else {
            Self {
                d_k: vec![16, 64, 256],
                inits: vec![QkInit::Default, QkInit::Unit],
                optimizers: vec![OptimizerKind::Adam, OptimizerKind::Sgd],
                seeds: vec![seed, seed + 1, seed + 2],
                steps: 800,
                adam_lr: 3e-3,
                sgd_lr: 0.1,
                target: 0.99,
            }
        }
    }
}

/// One training run.
#[derive(Debug, Clone, Serialize)]
pub struct TrainingRun {
    /// Run name (its folder under `runs/training`).
    pub name: String,
    /// d_k.
    pub d_k: usize,
    /// Scaled by 1/√d_k.
    pub scaled: bool,
    /// Initialization.
    pub init: QkInit,
    /// Optimizer.
    pub optimizer: OptimizerKind,
    /// Seed.
    pub seed: u64,
    /// First evaluation step at or above the target, if reached.
    pub steps_to_target: Option<usize>,
    /// Final held-out accuracy.
    pub final_accuracy: f64,
    /// Normalized entropy of the initial attention (1 = uniform, 0 = one-hot).
    pub initial_normalized_entropy: f64,
    /// Logit std of the initial attention.
    pub initial_logit_std: f64,
    /// Saturated fraction of the initial attention.
    pub initial_saturated: f64,
    /// Wall time (s).
    pub seconds: f64,
}

fn init_name(i: QkInit) -> &'static str {
    match i {
        QkInit::Default => "default",
        QkInit::Unit => "unit",
    }
}

fn opt_name(o: OptimizerKind) -> &'static str {
    match o {
        OptimizerKind::Adam => "adam",
        OptimizerKind::Sgd => "sgd",
    }
}

/// The folder name of one run under `runs/training`.
fn run_name(optimizer: OptimizerKind, init: QkInit, d_k: usize, scaled: bool, seed: u64) -> String {
    format!(
        "{}-{}-dk{}-{}-s{}",
        opt_name(optimizer),
        init_name(init),
        d_k,
        if scaled { "scaled" } else { "unscaled" },
        seed
    )
}

/// Reads a run's saved metrics back (the plots are drawn from the files, not from memory).
pub fn read_metrics(path: &std::path::Path, n_layers: usize) -> Result<Vec<StepMetrics>, LabError> {
    let text = std::fs::read_to_string(path).map_err(|e| LabError::io(path, e))?;
    Ok(text
        .lines()
        .skip(1)
        .filter_map(|l| StepMetrics::from_csv_row(l, n_layers))
        .collect())
}

/// The experiment.
pub struct Training;

impl Experiment for Training {
    fn name(&self) -> &'static str {
        "training"
    }

    fn title(&self) -> &'static str {
        "Training with and without √d_k: steps to 99% on match across d_k, init, optimizer, seeds"
    }

    fn run(&self, ctx: &LabContext) -> Result<ExperimentOutput, LabError> {
        let t0 = Instant::now();
        let grid = TrainingGrid::new(ctx.quick, ctx.seed);
        let backend = ctx.primary();
        let root = ctx.out_dir.join("runs").join("training");
        let total =
            grid.d_k.len() * grid.inits.len() * grid.optimizers.len() * grid.seeds.len() * 2;
        let progress = Progress::new(
            if ctx.progress == ProgressMode::Quiet {
                ProgressMode::Quiet
            } else {
                ProgressMode::Lines
            },
            "training grid",
            0,
            total as u64,
        );
        let mut runs = Vec::new();
        for &optimizer in &grid.optimizers {
            for &init in &grid.inits {
                for &d_k in &grid.d_k {
                    for &seed in &grid.seeds {
                        for scaled in [true, false] {
                            let name = run_name(optimizer, init, d_k, scaled, seed);
                            let mut config = TrainConfig::for_task(TaskConfig::new());
                            config.model.d_k = Some(d_k);
                            config.model.qk_init = init;
                            config.model.scale = if scaled {
                                ScalePolicy::InvSqrtDk
                            } else {
                                ScalePolicy::Unscaled
                            };
                            config.optimizer = optimizer;
                            config.lr = match optimizer {
                                OptimizerKind::Adam => grid.adam_lr,
                                OptimizerKind::Sgd => grid.sgd_lr,
                            };
                            if optimizer == OptimizerKind::Sgd {
                                config.momentum = Some(0.9);
                            }
                            config.steps = grid.steps;
                            config.seed = seed;
                            config.eval_every = 25;
                            config.eval_batches = 8;
                            config.log_every = 5;
                            config.target_accuracy = grid.target;
                            let dir = root.join(&name);
                            let _ = std::fs::remove_dir_all(&dir);
                            let r = train(
                                &config,
                                &backend.device,
                                &RunOptions {
                                    out_dir: dir,
                                    resume: false,
                                    backend: backend.name.clone(),
                                    progress: ProgressMode::Quiet,
                                    // The lab's own run folder: a report run again replaces its runs.
                                    overwrite: true,
                                },
                            )?;
                            let init_att = r
                                .summary
                                .initial_attention
                                .first()
                                .copied()
                                .unwrap_or_default();
                            let run = TrainingRun {
                                name: name.clone(),
                                d_k,
                                scaled,
                                init,
                                optimizer,
                                seed,
                                steps_to_target: r.summary.steps_to_target,
                                final_accuracy: r.summary.final_eval_accuracy,
                                initial_normalized_entropy: init_att.normalized_entropy,
                                initial_logit_std: init_att.logit_std,
                                initial_saturated: init_att.saturated_fraction,
                                seconds: r.summary.time_s,
                            };
                            progress.println(&format!(
                                "[{}/{}] {name}: {} (final accuracy {:.3}, {:.1} s)",
                                runs.len() + 1,
                                total,
                                run.steps_to_target
                                    .map_or("target not reached".to_string(), |s| format!(
                                        "99% at step {s}"
                                    )),
                                run.final_accuracy,
                                run.seconds
                            ));
                            runs.push(run);
                        }
                    }
                }
            }
        }
        progress.finish(&format!("{} runs", runs.len()));

        // One row per (optimizer, init, d_k): scaled vs unscaled over seeds.
        let mut table_rows = Vec::new();
        let mut groups = Vec::new();
        for &optimizer in &grid.optimizers {
            for &init in &grid.inits {
                for &d_k in &grid.d_k {
                    let pick = |scaled: bool| -> Vec<&TrainingRun> {
                        runs.iter()
                            .filter(|r| {
                                r.optimizer == optimizer
                                    && r.init == init
                                    && r.d_k == d_k
                                    && r.scaled == scaled
                            })
                            .collect()
                    };
                    let describe = |rs: &[&TrainingRun]| {
                        let reached: Vec<f64> = rs
                            .iter()
                            .filter_map(|r| r.steps_to_target.map(|s| s as f64))
                            .collect();
                        let steps = rs
                            .iter()
                            .map(|r| r.steps_to_target.map_or("—".to_string(), |s| s.to_string()))
                            .collect::<Vec<_>>()
                            .join(" / ");
                        (
                            steps,
                            reached.len(),
                            if reached.is_empty() {
                                f64::NAN
                            } else {
                                median(&reached)
                            },
                        )
                    };
                    let (s, u) = (pick(true), pick(false));
                    let (s_steps, s_n, s_med) = describe(&s);
                    let (u_steps, u_n, u_med) = describe(&u);
                    let acc = |rs: &[&TrainingRun]| {
                        mean(&rs.iter().map(|r| r.final_accuracy).collect::<Vec<_>>())
                    };
                    let ent = |rs: &[&TrainingRun]| {
                        mean(
                            &rs.iter()
                                .map(|r| r.initial_normalized_entropy)
                                .collect::<Vec<_>>(),
                        )
                    };
                    let std_ = |rs: &[&TrainingRun]| {
                        mean(&rs.iter().map(|r| r.initial_logit_std).collect::<Vec<_>>())
                    };
                    groups.push((optimizer, init, d_k, s_n, s_med, u_n, u_med, s.len()));
                    table_rows.push(vec![
                        opt_name(optimizer).into(),
                        init_name(init).into(),
                        d_k.to_string(),
                        s_steps,
                        u_steps,
                        format!("{} / {}", f(acc(&s), 3), f(acc(&u), 3)),
                        format!("{} / {}", f(ent(&s), 2), f(ent(&u), 2)),
                        format!("{} / {}", f(std_(&s), 2), f(std_(&u), 2)),
                    ]);
                }
            }
        }
        let table = md_table(
            &[
                "optimizer",
                "qk init",
                "d_k",
                "steps to 99%, scaled (per seed)",
                "steps to 99%, unscaled",
                "final accuracy scaled / unscaled",
                "initial norm. entropy scaled / unscaled",
                "initial logit std scaled / unscaled",
            ],
            &table_rows,
        );
        // Verdict lines per group.
        let mut findings = Vec::new();
        for (optimizer, init, d_k, s_n, s_med, u_n, u_med, n) in &groups {
            let what = if *u_n < *s_n {
                format!("unscaled reaches 99% in {u_n}/{n} seeds vs {s_n}/{n} scaled")
            } else if u_med > s_med && *u_med > 1.25 * *s_med {
                format!(
                    "unscaled is slower (median {} vs {} steps)",
                    f(*u_med, 0),
                    f(*s_med, 0)
                )
            } else if s_med > u_med && *s_med > 1.25 * *u_med {
                format!(
                    "unscaled is *faster* (median {} vs {} steps)",
                    f(*u_med, 0),
                    f(*s_med, 0)
                )
            } else {
                format!(
                    "no clear difference (median {} vs {} steps)",
                    f(*u_med, 0),
                    f(*s_med, 0)
                )
            };
            findings.push(format!(
                "- {} / {} init / d_k = {d_k}: {what}",
                opt_name(*optimizer),
                init_name(*init)
            ));
        }
        let csv = write_csv(
            ctx,
            "training.csv",
            "name,optimizer,init,d_k,scaled,seed,steps_to_target,final_accuracy,initial_normalized_entropy,initial_logit_std,initial_saturated,seconds",
            &runs
                .iter()
                .map(|r| {
                    format!(
                        "{},{},{},{},{},{},{},{},{},{},{},{}",
                        r.name,
                        opt_name(r.optimizer),
                        init_name(r.init),
                        r.d_k,
                        r.scaled,
                        r.seed,
                        r.steps_to_target.map(|s| s.to_string()).unwrap_or_default(),
                        r.final_accuracy,
                        r.initial_normalized_entropy,
                        r.initial_logit_std,
                        r.initial_saturated,
                        r.seconds
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        // Curves of the first seed, unit init, each optimizer, from the saved metrics.
        let mut plots = Vec::new();
        let init = if grid.inits.contains(&QkInit::Unit) {
            QkInit::Unit
        } else {
            grid.inits[0]
        };
        for &optimizer in &grid.optimizers {
            let mut loss_series = Vec::new();
            let mut grad_series = Vec::new();
            for &d_k in &grid.d_k {
                for scaled in [true, false] {
                    let name = run_name(optimizer, init, d_k, scaled, grid.seeds[0]);
                    let metrics = read_metrics(&root.join(&name).join("metrics.csv"), 1)?;
                    let label = format!("d_k={d_k} {}", if scaled { "scaled" } else { "unscaled" });
                    loss_series.push(Series::line(
                        label.clone(),
                        metrics.iter().map(|m| (m.step as f64, m.loss)).collect(),
                    ));
                    grad_series.push(Series::line(
                        label,
                        metrics
                            .iter()
                            .map(|m| (m.step as f64, m.grad_norm_query.max(1e-12)))
                            .collect(),
                    ));
                }
            }
            let p = format!("training_loss_{}.png", opt_name(optimizer));
            line_plot(
                &out_path(ctx, &p),
                &LinePlot {
                    title: format!(
                        "Training loss on match ({}, {} init, seed {})",
                        opt_name(optimizer),
                        init_name(init),
                        grid.seeds[0]
                    ),
                    x_label: "step".into(),
                    y_label: "cross-entropy".into(),
                    log_x: false,
                    log_y: true,
                    series: loss_series,
                },
            )?;
            plots.push(p);
            let p = format!("training_grad_query_{}.png", opt_name(optimizer));
            line_plot(
                &out_path(ctx, &p),
                &LinePlot {
                    title: format!(
                        "‖∂L/∂W_Q‖ during training ({}, {} init)",
                        opt_name(optimizer),
                        init_name(init)
                    ),
                    x_label: "step".into(),
                    y_label: "query projection gradient norm".into(),
                    log_x: false,
                    log_y: true,
                    series: grad_series,
                },
            )?;
            plots.push(p);
        }
        let markdown = format!(
            "The default model (d_model = 64, 2 heads, 1 layer, pre-layer-norm) on *match* (k = 8, vocabulary 64), \
             d_k per head independent of d_model. Budget {} steps per run (evaluation every 25 steps on 8 \
             held-out batches; a run stops at 99%), Adam lr {} and SGD lr {} with momentum 0.9. \"unit\" init \
             draws W_Q, W_K so that q and k components have unit variance (the article's assumption: \
             unscaled logits then have std √d_k); \"default\" is Burn's Kaiming-uniform (components of \
             variance 1/3, unscaled logits std ≈ √d_k/3). \"—\" = 99% not reached within the budget.\n\n{table}\n\
             Findings, group by group:\n\n{}\n\n\
             {}\n",
            grid.steps,
            grid.adam_lr,
            grid.sgd_lr,
            findings.join("\n"),
            plots
                .iter()
                .map(|p| format!("![{p}]({p})"))
                .collect::<Vec<_>>()
                .join("\n"),
        );
        let slower = groups
            .iter()
            .filter(|g| g.5 < g.3 || (g.6 > 1.25 * g.4))
            .count();
        Ok(ExperimentOutput {
            name: self.name().into(),
            title: self.title().into(),
            verdict: Verdict::Measured,
            summary: format!(
                "unscaled is slower or fails in {slower} of {} (optimizer, init, d_k) groups",
                groups.len()
            ),
            markdown,
            results: serde_json::json!({ "grid": grid, "runs": runs }),
            plots,
            csv: vec![csv],
            skipped: vec![],
            backends: vec![backend.name.clone()],
            seconds: t0.elapsed().as_secs_f64(),
        })
    }
}
