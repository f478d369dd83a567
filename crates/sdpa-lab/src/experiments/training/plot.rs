//! `training`'s plots, drawn from the saved runs: the share of runs at 99% by step t, the
//! held-out accuracy (median and quartiles over seeds), the paired seeds, and the initial-logit
//! mechanism.

use sdpa_model::{OptimizerKind, QkInit};

use super::analyze::{RunRow, TrainingData};
use super::design::FAILED_ACCURACY;
use super::design::SLOW_FACTOR;
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::measures::training::{Arm, EVAL_EVERY, init_name};
use crate::plot::{LinePlot, Series};
use crate::stats::quantile;

fn main_runs(data: &TrainingData, init: QkInit, d_k: usize, arm: Arm) -> Vec<&RunRow> {
    data.runs
        .iter()
        .filter(|r| {
            r.condition.optimizer == OptimizerKind::Adam
                && r.condition.init == init
                && r.condition.d_k == d_k
                && r.arm == arm
        })
        .collect()
}

/// A run's held-out accuracy at step t: its last evaluation at or before t (a run that stopped
/// at the target keeps its last value).
fn accuracy_at(run: &RunRow, t: usize) -> f64 {
    run.outcome
        .curve
        .iter()
        .take_while(|p| p.step <= t)
        .last()
        .map_or(f64::NAN, |p| p.accuracy)
}

fn arm_style(arm: Arm) -> &'static str {
    if arm == Arm::Scaled {
        "1/√d_k"
    } else {
        "none"
    }
}

/// The colour of each d_k of the main part (palette indices): never blue or red, which the
/// report keeps for the arms (1/√d_k and none) in every plot where colour means the arm.
const DK_COLORS: [usize; 4] = [2, 3, 5, 6];

fn dk_color(k: usize) -> usize {
    DK_COLORS[k % DK_COLORS.len()]
}

/// One initialization's curves: the share of runs at 99% by step t (every d_k, both arms) and
/// the held-out accuracy's median and quartiles (the smallest and largest d_k).
fn curves(data: &TrainingData, init: QkInit) -> (Vec<Series>, Vec<Series>) {
    let steps: Vec<usize> = (0..=data.sizes.budget).step_by(EVAL_EVERY).collect();
    let dims = &data.sizes.main_dims;
    let (mut reached, mut accuracy) = (Vec::new(), Vec::new());
    for (k, &d_k) in dims.iter().enumerate() {
        for arm in [Arm::Scaled, Arm::Unscaled] {
            let runs = main_runs(data, init, d_k, arm);
            if runs.is_empty() {
                continue;
            }
            let label = format!("d_k = {d_k}, {}", arm_style(arm));
            let share: Vec<(f64, f64)> = steps
                .iter()
                .map(|&t| {
                    let at = runs
                        .iter()
                        .filter(|r| r.outcome.steps_to_target.is_some_and(|s| s <= t))
                        .count();
                    (t as f64, at as f64 / runs.len() as f64)
                })
                .collect();
            let s = if arm == Arm::Scaled {
                Series::line(label.clone(), share)
            } else {
                Series::reference(label.clone(), share)
            };
            reached.push(s.colored(dk_color(k)));
            if k == 0 || k + 1 == dims.len() {
                let band: Vec<(f64, f64, f64, f64)> = steps
                    .iter()
                    .map(|&t| {
                        let mut v: Vec<f64> = runs
                            .iter()
                            .map(|r| accuracy_at(r, t))
                            .filter(|x| x.is_finite())
                            .collect();
                        v.sort_by(|a, b| a.total_cmp(b));
                        (
                            t as f64,
                            quantile(&v, 0.5),
                            quantile(&v, 0.25),
                            quantile(&v, 0.75),
                        )
                    })
                    .collect();
                // The same colour per d_k as the reached plot, the same line per arm (solid:
                // 1/√d_k, dashed: none).
                let mut series = Series::with_band(label, band).colored(dk_color(k));
                series.dashed = arm != Arm::Scaled;
                accuracy.push(series);
            }
        }
    }
    (reached, accuracy)
}

/// Every plot; returns their Markdown links.
pub fn plots(data: &TrainingData, canvas: &mut Canvas) -> Result<Vec<String>, LabError> {
    let mut links = Vec::new();
    for init in [QkInit::Default, QkInit::Unit] {
        let (reached, accuracy) = curves(data, init);
        if reached.is_empty() {
            continue;
        }
        let name = init_name(init);
        links.push(canvas.line_plot(
            &format!("training_reached_{name}.png"),
            &LinePlot {
                title: format!(
                    "Share of the {} seeds at 99% by step t (Adam, {name} init)",
                    data.sizes.eval_seeds
                ),
                x_label: "step".into(),
                y_label: "share of runs at 99% held-out accuracy".into(),
                log_x: false,
                log_y: false,
                series: reached,
            },
        )?);
        // Chance and the «fails completely» line, across the budget.
        let mut accuracy = accuracy;
        let span = [0.0, data.sizes.budget as f64];
        accuracy.push(
            Series::reference("chance (1/8)", span.iter().map(|&t| (t, 0.125)).collect())
                .colored(7),
        );
        accuracy.push(
            Series::reference(
                format!("{:.0}%: «fails completely» below", 100.0 * FAILED_ACCURACY),
                span.iter().map(|&t| (t, FAILED_ACCURACY)).collect(),
            )
            .colored(4),
        );
        links.push(canvas.line_plot(
            &format!("training_accuracy_{name}.png"),
            &LinePlot {
                title: format!(
                    "Held-out accuracy, median and quartiles over {} seeds (Adam, {name} init)",
                    data.sizes.eval_seeds
                ),
                x_label: "step".into(),
                y_label: "held-out accuracy".into(),
                log_x: false,
                log_y: false,
                series: accuracy,
            },
        )?);
    }
    for init in [QkInit::Default, QkInit::Unit] {
        if let Some(link) = paired(data, init, canvas)? {
            links.push(link);
        }
    }
    links.push(mechanism(data, canvas)?);
    Ok(links)
}

/// The main result seed by seed: each seed's steps to 99% with 1/√d_k (x) against the same
/// seed without scaling (y), per d_k; a run that never got there sits just beyond the budget
/// (hollow when either member of the pair is censored), with the lines y = x and y = 4x.
fn paired(
    data: &TrainingData,
    init: QkInit,
    canvas: &mut Canvas,
) -> Result<Option<String>, LabError> {
    let budget = data.sizes.budget as f64;
    // A run that never got there has no step count: it is drawn in a grey band above (or right
    // of) the budget, labelled as such, spread a little by seed so that pairs stay countable;
    // the legend says how many pairs each marker stands for.
    let never = budget * 1.1;
    let jitter = |seed: u64| (seed % 5) as f64 * budget * 0.012;
    let steps = |r: &RunRow| {
        r.outcome
            .steps_to_target
            .map_or(never + jitter(r.seed), |s| s as f64)
    };
    let mut series = Vec::new();
    for (k, &d_k) in data.sizes.main_dims.iter().enumerate() {
        let scaled = main_runs(data, init, d_k, Arm::Scaled);
        let unscaled = main_runs(data, init, d_k, Arm::Unscaled);
        let (mut both, mut only_unscaled, mut other) = (Vec::new(), Vec::new(), Vec::new());
        for a in &scaled {
            let Some(b) = unscaled.iter().find(|b| b.seed == a.seed) else {
                continue;
            };
            let point = (steps(a), steps(b));
            match (a.outcome.steps_to_target, b.outcome.steps_to_target) {
                (Some(_), Some(_)) => both.push(point),
                (Some(_), None) => only_unscaled.push(point),
                (None, Some(_)) => other.push((point.0, point.1, "▶".to_string())),
                (None, None) => other.push((point.0, point.1, "✕".to_string())),
            }
        }
        series.push(Series::scatter(format!("d_k = {d_k}"), both, false).colored(dk_color(k)));
        let n = only_unscaled.len();
        if n > 0 {
            series.push(
                Series::scatter(
                    format!("d_k = {d_k}: unscaled never, {n} pairs"),
                    only_unscaled,
                    true,
                )
                .colored(dk_color(k)),
            );
        }
        series.push(Series::texts(other).colored(dk_color(k)));
    }
    if series.iter().all(|s| s.points.is_empty()) {
        return Ok(None);
    }
    let top = never * 1.08;
    // The budget as lines on both axes; above it, where a run that never got there is drawn, a
    // labelled grey band; the reference lines stop at the budget.
    series.push(
        Series::with_band(
            format!("budget ({budget:.0}); beyond: never at 99%"),
            vec![(0.0, budget, budget, top), (top, budget, budget, top)],
        )
        .colored(7),
    );
    // The same band right of the budget, where a pair whose scaled run never got there is
    // drawn (▶, ✕): no marker stands at an invented step without the band behind it.
    series.push(
        Series::with_band(
            "",
            vec![(budget, budget, 0.0, top), (top, budget, 0.0, top)],
        )
        .colored(7),
    );
    series.push(Series::reference("", vec![(budget, 0.0), (budget, top)]).colored(7));
    // Grey and purple: not among the d_k colours.
    series
        .push(Series::reference("y = x (as fast)", vec![(0.0, 0.0), (budget, budget)]).colored(7));
    series.push(
        Series::reference(
            format!("y = {SLOW_FACTOR}x: our reading of «extremely slow»"),
            vec![(0.0, 0.0), (budget / SLOW_FACTOR, budget)],
        )
        .colored(4),
    );
    canvas
        .line_plot(
            &format!("training_paired_{}.png", init_name(init)),
            &LinePlot {
                title: format!(
                    "Steps to 99% per seed: 1/√d_k (x) vs none (y), Adam, {} init",
                    init_name(init)
                ),
                x_label: format!(
                    "steps with 1/√d_k (▶: only this run, ✕: both never at 99%, drawn past {budget:.0})"
                ),
                y_label: "steps without scaling".into(),
                log_x: false,
                log_y: false,
                series,
            },
        )
        .map(Some)
}

/// Steps to 99% against the initial logit std, every main run (both arms on one axis); runs
/// that never got there are hollow, at the budget.
fn mechanism(data: &TrainingData, canvas: &mut Canvas) -> Result<String, LabError> {
    let mut series = Vec::new();
    for (k, (init, arm)) in [
        (QkInit::Default, Arm::Scaled),
        (QkInit::Default, Arm::Unscaled),
        (QkInit::Unit, Arm::Scaled),
        (QkInit::Unit, Arm::Unscaled),
    ]
    .into_iter()
    .enumerate()
    {
        let runs: Vec<&RunRow> = data
            .runs
            .iter()
            .filter(|r| {
                r.condition.optimizer == OptimizerKind::Adam
                    && r.condition.init == init
                    && r.arm == arm
                    && data.sizes.main_dims.contains(&r.condition.d_k)
            })
            .collect();
        // "Never" drawn where every plot of the report draws it: a tenth above the budget.
        let point = |r: &&RunRow| {
            (
                r.outcome.initial.logit_std,
                r.outcome
                    .steps_to_target
                    .map_or(r.budget as f64 * 1.1, |s| s as f64),
            )
        };
        let label = format!("{} init, {}", init_name(init), arm_style(arm));
        series.push(
            Series::scatter(
                label.clone(),
                runs.iter()
                    .filter(|r| r.outcome.steps_to_target.is_some())
                    .map(point)
                    .collect(),
                false,
            )
            .colored(k),
        );
        series.push(
            Series::scatter(
                format!("{label}: never at 99%"),
                runs.iter()
                    .filter(|r| r.outcome.steps_to_target.is_none())
                    .map(point)
                    .collect(),
                true,
            )
            .colored(k),
        );
        // Each unscaled cluster is one d_k: its label above the "never" row, one row per
        // initialization so that neighbouring clusters' labels do not overlap. (The scaled
        // arm's d_k all start at one std: one cluster.)
        if arm == Arm::Unscaled {
            let row = if init == QkInit::Default { 1.18 } else { 1.26 };
            let texts = data
                .sizes
                .main_dims
                .iter()
                .filter_map(|&d_k| {
                    let stds: Vec<f64> = runs
                        .iter()
                        .filter(|r| r.condition.d_k == d_k)
                        .map(|r| r.outcome.initial.logit_std)
                        .filter(|x| x.is_finite())
                        .collect();
                    (!stds.is_empty()).then(|| {
                        (
                            crate::stats::median(&stds) * 0.92,
                            data.sizes.budget as f64 * row,
                            format!("d_k {d_k}"),
                        )
                    })
                })
                .collect();
            series.push(Series::texts(texts).colored(k));
        }
    }
    // Above the budget, where a run that never got there is drawn: a labelled grey band over
    // the stds the plotted runs span.
    let budget = data.sizes.budget as f64;
    let (lo, hi) = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|x| x.is_finite() && *x > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
    if lo <= hi {
        series.push(
            Series::with_band(
                format!("beyond {budget:.0}: never at 99%"),
                vec![
                    (lo * 0.9, budget, budget, budget * 1.14),
                    (hi * 1.1, budget, budget, budget * 1.14),
                ],
            )
            .colored(7),
        );
    }
    // The premise's cutoff: to its right the unscaled logits start at least as spread as in the
    // article's example (its median in this run).
    let cutoff = super::analyze::premise_std(data);
    series.push(
        Series::reference(
            format!("std {cutoff:.1}: premise cutoff"),
            vec![(cutoff, 0.0), (cutoff, data.sizes.budget as f64 * 1.1)],
        )
        .colored(7),
    );
    canvas.line_plot(
        "training_mechanism.png",
        &LinePlot {
            title: "Steps to 99% vs the initial logit std, every main Adam run".into(),
            x_label: "initial logit std at step 0 (none: one cluster per d_k, labelled; 1/√d_k: \
                      every d_k at one std)"
                .into(),
            y_label: format!(
                "steps to 99% (hollow, at {:.0}: never within the {}-step budget)",
                data.sizes.budget as f64 * 1.1,
                data.sizes.budget
            ),
            log_x: true,
            log_y: false,
            series,
        },
    )
}
