//! The first confirmatory run's key figure: every seed's steps with 1/√d_k against without,
//! the runs that never got there in a labelled band above the budget.

use super::analyze::ConfirmData;
use super::hypotheses::is_saturated;
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::measures::training::{Arm, init_name};
use crate::plot::{LinePlot, Series};

/// Every seed's steps with 1/√d_k (x) against without (y), one colour per condition.
pub(super) fn paired_plot(data: &ConfirmData, canvas: &mut Canvas) -> Result<String, LabError> {
    let budget = data.budget as f64;
    // A run that never got there has no step count: it sits in the grey band above the budget,
    // one row per condition (so that the rows stay countable; the legend counts them), spread a
    // little by seed.
    let never_row = |k: usize, seed: u64| {
        budget * (1.05 + 0.06 * k as f64) + (seed % 3) as f64 * budget * 0.012
    };
    // Colours of their own (1/√d_k and none keep palette 0 and 1 across the report; grey and
    // purple are the reference lines).
    const CONDITION_COLORS: [usize; 3] = [2, 3, 5];
    let mut series = Vec::new();
    let saturated = data
        .per_condition
        .iter()
        .filter(|s| is_saturated(s.comparison.condition.init, s.comparison.condition.d_k));
    let mut rows = 0;
    for (row, s) in saturated.enumerate() {
        rows = row + 1;
        let k = CONDITION_COLORS[row % CONDITION_COLORS.len()];
        let c = s.comparison.condition;
        let of = |arm: Arm| {
            data.runs
                .iter()
                .filter(move |r| r.condition == c && r.arm == arm)
        };
        let steps = |s: Option<usize>, seed: u64| s.map_or(never_row(row, seed), |s| s as f64);
        let (mut both, mut censored) = (Vec::new(), Vec::new());
        for a in of(Arm::Scaled) {
            if let Some(u) = of(Arm::Unscaled).find(|u| u.seed == a.seed) {
                let p = (
                    steps(a.outcome.steps_to_target, a.seed),
                    steps(u.outcome.steps_to_target, a.seed),
                );
                if a.outcome.steps_to_target.is_some() && u.outcome.steps_to_target.is_some() {
                    both.push(p);
                } else {
                    censored.push(p);
                }
            }
        }
        let label = format!("{} init, d_k {}", init_name(c.init), c.d_k);
        let n = censored.len();
        series.push(Series::scatter(label.clone(), both, false).colored(k));
        series
            .push(Series::scatter(format!("{label}: never, {n} pairs"), censored, true).colored(k));
    }
    let top = budget * (1.05 + 0.06 * rows as f64 + 0.03);
    // The budget as a line, and above it a labelled grey band, where a run that never got there
    // is drawn; the reference lines stop at the budget.
    series.push(
        Series::with_band(
            format!("budget ({}); above: never at 99%", data.budget),
            vec![
                (0.0, budget, budget, top),
                (budget * 1.2, budget, budget, top),
            ],
        )
        .colored(7),
    );
    series
        .push(Series::reference("y = x (as fast)", vec![(0.0, 0.0), (budget, budget)]).colored(7));
    series.push(
        Series::reference(
            "y = 4x: our reading of «extremely slow»",
            vec![(0.0, 0.0), (budget / 4.0, budget)],
        )
        .colored(4),
    );
    canvas.line_plot(
        "training_confirm_paired.png",
        &LinePlot {
            title: format!(
                "Steps to 99% accuracy, saturated conditions, {} paired seeds each",
                data.seeds
            ),
            x_label: "steps with 1/√d_k (Adam, each arm at its own learning rate)".into(),
            y_label: format!(
                "steps without scaling (hollow, above {}: never in {} steps)",
                data.budget, data.budget
            ),
            log_x: false,
            log_y: false,
            series: series
                .into_iter()
                .filter(|s| !s.points.is_empty())
                .collect(),
        },
    )
}
