//! The learning-rate curves' plots and table: per initialization and d_k of the sweep, the
//! median steps to 99% and the median held-out loss at the budget against the rate, one line
//! per arm with the tuning seeds' range as its band.

use sdpa_model::{OptimizerKind, QkInit};

use super::analyze::{Curve, TrainingData};
use super::design::SWEEP_ARMS;
use crate::claims::short;
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::markdown::md_table;
use crate::measures::training::{Arm, init_name};
use crate::plot::{LinePlot, Series};

/// The curves of the four arms the sweep asks for ([`SWEEP_ARMS`]) at one (initialization,
/// d_k), Adam (the other tuned arms' curves are in the table and the CSV: eight translucent
/// bands on one plot hide each other).
fn of(data: &TrainingData, init: QkInit, d_k: usize) -> Vec<&Curve> {
    SWEEP_ARMS
        .iter()
        .filter_map(|&arm| {
            data.curves.iter().find(|c| {
                c.arm == arm
                    && c.condition.optimizer == OptimizerKind::Adam
                    && c.condition.init == init
                    && c.condition.d_k == d_k
            })
        })
        .collect()
}

/// An arm's colour, the same in every plot of the report (1/√d_k and none as in the attention
/// and gradient plots: palette colours 0 and 1).
pub(super) fn arm_color(arm: Arm) -> usize {
    match arm {
        Arm::Scaled => 0,
        Arm::Unscaled => 1,
        Arm::InvDk => 2,
        Arm::QkNorm => 3,
        Arm::Learned => 4,
        Arm::QkNormScaled => 5,
        Arm::UnscaledSmallInit => 6,
        Arm::ScaledLargeInit => 7,
        Arm::SoftCap(_) => 8,
    }
}

/// The two plots of every (initialization, d_k) of the sweep; returns their Markdown links.
pub fn plots(data: &TrainingData, canvas: &mut Canvas) -> Result<Vec<String>, LabError> {
    let budget = data.sizes.budget as f64;
    // Where "never" is drawn: a median (or a band's end) beyond the budget.
    let never = budget * 1.1;
    let clip = |y: f64| if y.is_finite() { y } else { never };
    let mut links = Vec::new();
    for init in [QkInit::Default, QkInit::Unit] {
        for &d_k in &data.sizes.sweep_dims {
            let curves = of(data, init, d_k);
            if curves.is_empty() {
                continue;
            }
            let name = init_name(init);
            // Per arm: the median line through the rates where it is finite (with the seeds' range
            // as its band), and hollow markers where it is not (most seeds never reached 99%, or
            // diverged), drawn at the top: never joined to the others by a line.
            let series = |value: &dyn Fn(&super::analyze::SweepPoint) -> (f64, f64, f64),
                          finite: &dyn Fn(&super::analyze::SweepPoint) -> bool,
                          at_top: f64| {
                curves
                    .iter()
                    .enumerate()
                    .flat_map(|(k, c)| {
                        let seen = c.points.iter().filter(|p| p.seeds > 0);
                        let points = seen
                            .clone()
                            .filter(|p| finite(p))
                            .map(|p| {
                                let (v, lo, hi) = value(p);
                                (p.lr, v, lo, hi)
                            })
                            .collect();
                        // Each arm's "never" row a little higher than the last, so that two
                        // arms' markers never hide each other.
                        let top = at_top * (1.0 + 0.025 * k as f64);
                        let never: Vec<(f64, f64)> =
                            seen.filter(|p| !finite(p)).map(|p| (p.lr, top)).collect();
                        [
                            Series::with_band(c.arm.label(), points).colored(arm_color(c.arm)),
                            Series::scatter(
                                format!("{}: median never", c.arm.label()),
                                never,
                                true,
                            )
                            .colored(arm_color(c.arm)),
                        ]
                    })
                    .filter(|s| !s.points.is_empty())
                    .collect::<Vec<_>>()
            };
            links.push(canvas.line_plot(
                &format!("training_lr_steps_{name}_dk{d_k}.png"),
                &LinePlot {
                    title: format!("Steps to 99% vs learning rate: Adam, {name} init, d_k = {d_k}"),
                    x_label: "learning rate".into(),
                    y_label: format!(
                        "steps to 99%: median, range of {} seeds (hollow, above {budget}: never)",
                        data.sizes.tuning_seeds
                    ),
                    log_x: true,
                    log_y: false,
                    series: {
                        let mut s = series(
                            &|p| (clip(p.steps.value), clip(p.steps.lo), clip(p.steps.hi)),
                            &|p| p.steps.value.is_finite(),
                            never,
                        );
                        // "Never" has no step count: its markers sit in a labelled grey band
                        // above the budget, not at an invented height on the axis.
                        let lrs = curves.iter().flat_map(|c| c.points.iter().map(|p| p.lr));
                        let (lo, hi) =
                            lrs.fold((f64::INFINITY, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
                        if lo.is_finite() {
                            let top = never * 1.1;
                            s.push(
                                Series::with_band(
                                    "grey band: never at 99%",
                                    vec![(lo, never, budget, top), (hi, never, budget, top)],
                                )
                                .colored(7),
                            );
                        }
                        s
                    },
                },
            )?);
            // A diverged run's loss is +∞: drawn at the top of the finite ones.
            let top = curves
                .iter()
                .flat_map(|c| c.points.iter())
                .flat_map(|p| [p.final_loss.value, p.final_loss.hi])
                .filter(|v| v.is_finite())
                .fold(1.0f64, f64::max)
                * 2.0;
            // A loss is positive; a zero (never seen) cannot sit on the log axis and is left out.
            let floor = |v: f64| {
                if !v.is_finite() {
                    top
                } else if v > 0.0 {
                    v
                } else {
                    f64::NAN
                }
            };
            links.push(canvas.line_plot(
                &format!("training_lr_loss_{name}_dk{d_k}.png"),
                &LinePlot {
                    title: format!(
                        "Held-out loss vs learning rate: Adam, {name} init, d_k = {d_k}"
                    ),
                    x_label: "learning rate".into(),
                    y_label: format!(
                        "held-out loss at step {budget}: median, range (diverged: top)"
                    ),
                    log_x: true,
                    log_y: true,
                    series: series(
                        &|p| {
                            (
                                floor(p.final_loss.value),
                                floor(p.final_loss.lo),
                                floor(p.final_loss.hi),
                            )
                        },
                        &|p| p.final_loss.value.is_finite(),
                        top,
                    ),
                },
            )?);
        }
    }
    Ok(links)
}

/// Every tuned arm's curve in one row: the rate chosen for evaluation, the best rate, its
/// outcome and the width of the good range.
pub fn table(data: &TrainingData) -> String {
    // The evaluation runs' Kaplan–Meier median at the chosen rate, beside the tuning seeds'
    // selected best (the best of 7 medians of 5 seeds is optimistic).
    let km = |c: &Curve| {
        data.comparisons.iter().find_map(|s| {
            let x = &s.comparison;
            (x.condition == c.condition).then_some(())?;
            if x.reference == c.arm {
                Some(s.reference_km.show(s.budget as f64))
            } else if x.other == c.arm {
                Some(s.other_km.show(s.budget as f64))
            } else {
                None
            }
        })
    };
    let chosen = |c: &Curve| {
        data.tuned
            .iter()
            .find(|t| t.condition == c.condition && t.arm == c.arm)
            .and_then(|t| t.chosen)
            .map_or("– (not evaluated)".into(), |lr| {
                format!("{lr} ({})", km(c).unwrap_or_else(|| "–".into()))
            })
    };
    md_table(
        &[
            "condition",
            "arm",
            "rate for evaluation (its evaluation KM median)",
            "selected best rate (median steps)",
            "median steps to 99% there (seeds' range; selected)",
            "seeds at 99% there",
            "rates within the factor (grid steps)",
            "best rate (median final loss)",
            "median final loss there (seeds' range)",
        ],
        &data
            .curves
            .iter()
            .map(|c| {
                let best = c.best.map(|i| &c.points[i]);
                let best_loss = c.best_loss.map(|i| &c.points[i]);
                vec![
                    format!(
                        "{}, {} init, d_k = {}",
                        crate::measures::training::optimizer_name(c.condition.optimizer),
                        init_name(c.condition.init),
                        c.condition.d_k
                    ),
                    c.arm.label(),
                    chosen(c),
                    best.map_or("– (never at 99%)".into(), |p| p.lr.to_string()),
                    best.map_or("–".into(), |p| steps_range(p.steps)),
                    best.map_or("–".into(), |p| format!("{} of {}", p.reached, p.seeds)),
                    c.good.map_or("–".into(), |(lo, hi)| {
                        format!(
                            "{lo} – {hi} ({:.1}{})",
                            c.width,
                            if c.good_at_edge {
                                ", at the grid's end"
                            } else {
                                ""
                            }
                        )
                    }),
                    best_loss.map_or("–".into(), |p| p.lr.to_string()),
                    best_loss.map_or("–".into(), |p| with_range(p.final_loss)),
                ]
            })
            .collect::<Vec<_>>(),
    )
}

/// `value [lo, hi]`, or the value alone when there is no interval (a single seed).
fn with_range(e: crate::stats::Estimate) -> String {
    if e.lo.is_nan() {
        short(e.value)
    } else {
        format!("{} [{}, {}]", short(e.value), short(e.lo), short(e.hi))
    }
}

/// Steps (whole numbers, ∞ for never) as `median [lo, hi]`.
fn steps_range(e: crate::stats::Estimate) -> String {
    let n = |x: f64| {
        if x.is_finite() {
            format!("{x:.0}")
        } else {
            short(x)
        }
    };
    if e.lo.is_nan() {
        n(e.value)
    } else {
        format!("{} [{}, {}]", n(e.value), n(e.lo), n(e.hi))
    }
}

/// Every point of every curve, for the CSV.
pub fn csv_rows(data: &TrainingData) -> Vec<String> {
    data.curves
        .iter()
        .flat_map(|c| {
            c.points.iter().map(move |p| {
                format!(
                    "{},{},{},{},{},{},{},{},{},{},{},{},{}",
                    crate::measures::training::optimizer_name(c.condition.optimizer),
                    init_name(c.condition.init),
                    c.condition.d_k,
                    c.arm.slug(),
                    p.lr,
                    p.seeds,
                    p.reached,
                    p.steps.value,
                    p.steps.lo,
                    p.steps.hi,
                    p.final_loss.value,
                    p.final_loss.lo,
                    p.final_loss.hi
                )
            })
        })
        .collect()
}

/// The CSV's header.
pub const CSV_HEADER: &str = "optimizer,init,d_k,arm,lr,seeds,reached,median_steps,steps_lo,steps_hi,\
                              median_final_loss,loss_lo,loss_hi";
