//! The plots of `training`, drawn from the saved run files.

use sdpa_model::OptimizerKind;

use super::{Condition, Part, TrainingGrid, TrainingRun, opt_name, read_metrics, run_name};
use crate::context::{LabContext, LabError};
use crate::experiments::out_path;
use crate::plot::{LinePlot, Series, line_plot};

/// Time-to-target curves (share of seeds at 99% by step t) of the main Adam and SGD conditions,
/// and the loss curves of the first seed, drawn from the saved files.
pub(super) fn plot(
    ctx: &LabContext,
    grid: &TrainingGrid,
    runs: &[TrainingRun],
    root: &std::path::Path,
) -> Result<Vec<String>, LabError> {
    let mut plots = Vec::new();
    for optimizer in [OptimizerKind::Adam, OptimizerKind::Sgd] {
        let main: Vec<&Condition> = grid
            .conditions
            .iter()
            .filter(|c| c.optimizer == optimizer && c.part == Part::Main)
            .collect();
        if main.is_empty() {
            continue;
        }
        let mut curves = Vec::new();
        let mut losses = Vec::new();
        for c in &main {
            for scaled in [true, false] {
                let label = format!(
                    "d_k={} {}",
                    c.d_k,
                    if scaled { "scaled" } else { "unscaled" }
                );
                let rs: Vec<&TrainingRun> = runs
                    .iter()
                    .filter(|r| r.condition == **c && r.scaled == scaled)
                    .collect();
                curves.push(Series::line(
                    label.clone(),
                    (0..=grid.steps)
                        .step_by(grid.eval_every)
                        .map(|t| {
                            let reached = rs
                                .iter()
                                .filter(|r| r.steps_to_target.is_some_and(|s| s <= t))
                                .count();
                            (t as f64, reached as f64 / rs.len().max(1) as f64)
                        })
                        .collect(),
                ));
                let name = run_name(c, scaled, grid.seeds[0]);
                let metrics = read_metrics(&root.join(&name).join("metrics.csv"), 1)?;
                losses.push(Series::line(
                    label,
                    metrics.iter().map(|m| (m.step as f64, m.loss)).collect(),
                ));
            }
        }
        let lr = main[0].lr;
        for (kind, title, y_label, series, log_y) in [
            (
                "time_to_target",
                "Share of seeds at 99% by step t",
                "share of seeds",
                curves,
                false,
            ),
            (
                "loss",
                "Training loss, first seed",
                "cross-entropy",
                losses,
                true,
            ),
        ] {
            let p = format!("training_{kind}_{}.png", opt_name(optimizer));
            line_plot(
                &out_path(ctx, &p),
                &LinePlot {
                    title: format!("{title} ({} lr {lr})", opt_name(optimizer)),
                    x_label: "step".into(),
                    y_label: y_label.into(),
                    log_x: false,
                    log_y,
                    series,
                },
            )?;
            plots.push(p);
        }
    }
    Ok(plots)
}
