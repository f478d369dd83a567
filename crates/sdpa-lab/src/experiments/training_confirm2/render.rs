//! `training-confirm-2`'s section: the design in brief, the chosen rates, the hypotheses under
//! both rate schemes, each condition, and the CSV of every run (tuning and test).

use super::analyze::{Confirm2Data, SchemeResult, premise_words};
use super::design::{HALF_ALPHA, RateScheme, SLOW_FACTOR};
use super::hypotheses::Decided;
use super::runs::HEADER;
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::markdown::md_table;
use crate::measures::training::init_name;
use crate::plot::{LinePlot, Series};

/// The share of `steps` (one per run, `None`: never) at 99% by each step, as a step curve from
/// the first step to `budget`.
fn reached_curve(steps: &[Option<usize>], budget: usize, stretch: f64) -> Vec<(f64, f64)> {
    let n = steps.len().max(1) as f64;
    let mut done: Vec<f64> = steps
        .iter()
        .flatten()
        .map(|&s| s as f64 * stretch)
        .collect();
    done.sort_by(|a, b| a.total_cmp(b));
    // The curve starts at half the first run's steps (at least 1): nothing happens before.
    let start = done.first().map_or(1.0, |f| (f / 2.0).max(1.0));
    let mut points = vec![(start, 0.0)];
    // Steps past the budget (a stretched curve) are cut there: the curve ends at its level.
    for (i, t) in done
        .iter()
        .enumerate()
        .filter(|(_, t)| **t <= budget as f64)
    {
        points.push((*t, i as f64 / n));
        points.push((*t, (i + 1) as f64 / n));
    }
    let last = points.last().map_or(0.0, |p| p.1);
    points.push((budget as f64, last));
    points
}

/// The key figure: for each arm and rate scheme, the share of runs that had reached 99% by each
/// step, pooled over the conditions; the scaled curve stretched 4× is «extremely slow»'s line.
fn reached_plot(data: &Confirm2Data, canvas: &mut Canvas) -> Result<String, LabError> {
    let budget = data.sizes.budget;
    let mut series = Vec::new();
    for s in &data.schemes {
        let scaled: Vec<Option<usize>> = s.pairs.iter().map(|p| p.scaled).collect();
        let unscaled: Vec<Option<usize>> = s.pairs.iter().map(|p| p.unscaled).collect();
        let style = |label: String, points, color| {
            let line = if s.scheme == RateScheme::Own {
                Series::curve(label, points)
            } else {
                Series::reference(label, points)
            };
            line.colored(color)
        };
        let which = s.scheme.slug();
        let hidden = if s.scheme == RateScheme::Own {
            ""
        } else {
            " (under solid)"
        };
        series.push(style(
            format!("1/√d_k, {which} rate{hidden}"),
            reached_curve(&scaled, budget, 1.0),
            0,
        ));
        series.push(style(
            format!("no scaling, {which} rate"),
            reached_curve(&unscaled, budget, 1.0),
            1,
        ));
        if s.scheme == RateScheme::Own {
            series.push(
                Series::curve(
                    "1/√d_k at 4× its steps: «extremely slow»",
                    reached_curve(&scaled, budget, 4.0),
                )
                .colored(7),
            );
        }
    }
    // The budget, where every curve ends.
    series.push(
        Series::reference(
            format!("the budget ({budget} steps)"),
            vec![(budget as f64, 0.0), (budget as f64, 1.0)],
        )
        .colored(7),
    );
    canvas.line_plot(
        "training_confirm2_reached.png",
        &LinePlot {
            title: format!(
                "Runs at 99% accuracy by each step ({} pairs)",
                data.schemes.first().map_or(0, |s| s.pairs.len())
            ),
            x_label: format!("training steps (log scale; the budget: {budget})"),
            y_label: "share of runs that reached 99%".into(),
            log_x: true,
            log_y: false,
            series,
        },
    )
}

fn end(x: Option<f64>) -> String {
    x.map_or("∞".into(), |v| format!("{v:.2}"))
}

/// One scheme's pooled row: (scheme, 1a, 1b, 1, 2, 3).
fn scheme_row(s: &SchemeResult) -> Vec<String> {
    let d = &s.pooled;
    let o = d.outcomes;
    vec![
        s.scheme.name().into(),
        format!(
            "{} of {} stuck near chance [{:.2}, {:.2}]; {} more never at 99% ({})",
            d.near_chance.count,
            d.near_chance.n,
            d.near_chance.lo,
            d.near_chance.hi,
            d.never_not_stuck,
            o[0].label()
        ),
        format!(
            "{} [{}, {}], {} censored ({})",
            end(d.ratio.km.value),
            end(d.ratio.km.lo),
            end(d.ratio.km.hi),
            d.ratio.km.censored,
            o[1].label()
        ),
        format!("**{}**", o[2].label()),
        format!("{} ({})", d.stuck.show(), o[3].label()),
        format!("{} ({})", d.later.show(), o[4].label()),
    ]
}

fn condition_row(
    scheme: RateScheme,
    (init, d_k): (sdpa_model::QkInit, usize),
    d: &Decided,
) -> Vec<String> {
    let (m, lo, hi, n) = d.finished_ratio;
    vec![
        scheme.slug().into(),
        format!("{} init d_k {d_k}", init_name(init)),
        d.pairs.to_string(),
        format!("{} / {}", d.near_chance.count, d.never_not_stuck),
        d.scaled_never.to_string(),
        format!(
            "{} [{}, {}]",
            end(d.ratio.km.value),
            end(d.ratio.km.lo),
            end(d.ratio.km.hi)
        ),
        if n == 0 {
            "–".into()
        } else if lo.is_nan() || hi.is_nan() {
            // Too few finished pairs for a distribution-free 95% interval.
            format!("{m:.2} (n = {n}, too few for an interval)")
        } else {
            format!("{m:.2} [{lo:.2}, {hi:.2}] (n = {n})")
        },
    ]
}

/// The section.
pub fn render(data: &Confirm2Data, canvas: &mut Canvas) -> Result<String, LabError> {
    let mut out = format!(
        "**Design** (committed before any of these runs, `experiments/training_confirm2/design.rs`): \
         the conditions where the unscaled logits start at least as spread as in the article's own \
         example ({}: {}); {} test seeds per condition, budget {} steps; each arm's learning rate tuned \
         for this budget on {} seeds of its own per rate, and one rate shared by both arms; the \
         article's sentence decided at {:.1}% per half.\n\n",
        super::frozen::premise_rule_words(),
        premise_words(&data.sizes),
        data.sizes.seeds,
        data.sizes.budget,
        data.sizes.tuning_seeds,
        HALF_ALPHA * 100.0,
    );
    if let Some(why) = &data.missing {
        out.push_str(&format!("**Not analysed**: {why}.\n"));
        return Ok(out);
    }
    out.push_str(if data.measured_here {
        "Measured by this run.\n\n"
    } else {
        "Not measured by this run: the committed measurement (`crates/sdpa-lab/assets/confirm2/runs.csv`), analysed by this code.\n\n"
    });
    let rates: Vec<Vec<String>> = data
        .chosen
        .iter()
        .map(|c| {
            vec![
                format!("{} init d_k {}", init_name(c.init), c.d_k),
                c.own_scaled.to_string(),
                c.own_unscaled.to_string(),
                format!("{} (regret {:.2}×)", c.shared, c.shared_regret),
                if c.at_edge { "yes".into() } else { "no".into() },
            ]
        })
        .collect();
    out.push_str("**The rates the tuning chose**\n\n");
    out.push_str(&md_table(
        &[
            "condition",
            "1/√d_k's own",
            "unscaled own",
            "shared",
            "a rate at the grid's edge",
        ],
        &rates,
    ));
    out.push_str("\n**The hypotheses, pooled over the conditions**\n\n");
    let rows: Vec<Vec<String>> = data.schemes.iter().map(scheme_row).collect();
    out.push_str(&md_table(
        &[
            "learning rates",
            "1a «fails completely» (97.5%)",
            "1b «extremely slow»: median ratio (97.5%)",
            "1 (primary) the sentence",
            "2 stuck more often",
            "3 later",
        ],
        &rows,
    ));
    if let Some(own) = data.scheme(RateScheme::Own) {
        let (o, n) = (&own.pooled, &own.pooled.near_chance);
        let stuck = n.count as f64 / n.n.max(1) as f64;
        let cut = super::answer::cut_off(o) as f64 / (o.pairs - o.ratio.left_out).max(1) as f64;
        out.push_str(&level_words((stuck, cut), canvas)?);
    }
    out.push_str("\n**Each condition** (described, not tested)\n\n");
    let per: Vec<Vec<String>> = data
        .schemes
        .iter()
        .flat_map(|s| {
            s.per_condition
                .iter()
                .map(|(c, d)| condition_row(s.scheme, *c, d))
        })
        .collect();
    out.push_str(&md_table(
        &[
            "rates",
            "condition",
            "pairs",
            "unscaled stuck near chance / never at 99% otherwise",
            "scaled never at 99%",
            "Kaplan–Meier median ratio (97.5%)",
            "median ratio where both finished (95%)",
        ],
        &per,
    ));
    let figure = reached_plot(data, canvas)?;
    super::answer::answer(data, canvas, &figure);
    out.push_str(&format!("\n{figure}\n\n"));
    out.push_str(
        "*Each curve: the share of the runs of one arm that had reached 99% accuracy by that step, \
         pooled over the conditions (solid: each arm at its own rate; dashed: one shared rate). \
         Where a curve ends below 1 at the budget, the rest never got there. The grey line is \
         the scaled curve with every run 4× slower, an illustration: the test reads the paired \
         ratios, seed by seed, not these pooled curves.*\n",
    );
    let lines: Vec<String> = data.rows.iter().map(|r| r.line()).collect();
    canvas.csv("training_confirm2_runs.csv", HEADER, &lines)?;
    out.push_str("\nEvery run, tuning and test: `training_confirm2_runs.csv`.\n");
    Ok(out)
}

/// The «extremely slow» half's level by simulation (`power::level_draws`), in words, with
/// every simulated run in `training_confirm2_level_draws.csv`: runs with no stuck pairs, and
/// runs with as many stuck as this run's own rates left (`stuck_share`), each with censoring
/// apart from and tied to the ratio.
fn level_words(
    (stuck_share, real_cut): (f64, f64),
    canvas: &mut Canvas,
) -> Result<String, LabError> {
    use super::power::{
        Censoring, LEVEL_LOG_SPREAD, LEVEL_SEED, LEVEL_SIMULATIONS, level_draws, level_summary,
        templates,
    };
    let Ok(t) = templates() else {
        return Ok(String::new());
    };
    let mut lines = Vec::new();
    let mut words = Vec::new();
    let mut most_cut = 0.0f64;
    for (censoring, name) in [
        (Censoring::Independent, "censoring apart from the ratio"),
        (Censoring::TiedToRatio, "censoring tied to it"),
    ] {
        for stuck in [0.0, stuck_share] {
            let draws = level_draws(
                &t,
                censoring,
                (SLOW_FACTOR, stuck),
                LEVEL_SIMULATIONS,
                LEVEL_SEED,
            );
            if draws.is_empty() {
                continue;
            }
            let (holds, cut) = level_summary(&draws);
            let (lo, hi) = crate::stats::wilson_interval(holds, draws.len(), 0.95);
            most_cut = most_cut.max(cut);
            words.push(format!(
                "{name}, {:.0}% stuck ({:.0}% of pairs cut off): {holds} ({:.1}% [{}, {}])",
                100.0 * stuck,
                100.0 * cut,
                100.0 * holds as f64 / draws.len() as f64,
                crate::stats::round_down(100.0 * lo, 1),
                crate::stats::round_up(100.0 * hi, 1),
            ));
            for (i, d) in draws.iter().enumerate() {
                lines.push(format!(
                    "{censoring:?},{stuck:.3},{i},{},{},{},{}",
                    d.pairs,
                    d.cut_off,
                    d.lower_end.map_or(String::new(), |v| format!("{v:.4}")),
                    d.holds
                ));
            }
        }
    }
    canvas.csv(
        "training_confirm2_level_draws.csv",
        "censoring,stuck_share,draw,pairs,cut_off,lower_end,holds",
        &lines,
    )?;
    Ok(format!(
        "\n**The level of «extremely slow», by simulation** (after the runs: added after a review, \
         not part of the design). {LEVEL_SIMULATIONS} simulated runs per case at this design's \
         sizes, the scaled steps resampled from the frozen first confirmatory run, the true median \
         slowdown over all pairs exactly {SLOW_FACTOR}×: a share of the unscaled runs stuck near \
         chance (cut off, as in the real runs), the others' ratio log-normal (sd \
         {LEVEL_LOG_SPREAD} in ln), cut off by the budget. «Extremely slow» held in, of \
         {LEVEL_SIMULATIONS}: {}. Nominal: {:.2}% («holds» reads only the lower end of the half's \
         {:.1}% interval, so it uses half of the half's {:.1}%). In the real runs {:.0}% of the \
         unscaled runs were stuck and {:.0}% of the pairs cut off at the own rates ({}); runs cut \
         off while above chance (slow, not stuck) are not simulated. Every \
         simulated run: `training_confirm2_level_draws.csv` (`power::level_draws`; its test fails \
         above 40 of 2,000).\n",
        words.join("; "),
        HALF_ALPHA * 50.0,
        100.0 - HALF_ALPHA * 100.0,
        HALF_ALPHA * 100.0,
        100.0 * stuck_share,
        100.0 * real_cut,
        if real_cut > most_cut {
            "more than in any case here"
        } else {
            "within the cases here"
        },
    ))
}
