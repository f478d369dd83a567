//! `dot-std`'s table, CSV and plot.

use super::DotStdData;
use crate::answers::Question;
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::markdown::{f, md_table, opt};
use crate::plot::{LinePlot, Series};

fn write_csv(data: &DotStdData, canvas: &mut Canvas) -> Result<(), LabError> {
    // Every draw behind the means, their intervals and the exponent's fit.
    canvas.csv(
        "dot_std_draws.csv",
        "d,draw,std,std_over_sqrt_d",
        &data
            .rows
            .iter()
            .flat_map(|r| {
                r.draws_scaled
                    .iter()
                    .enumerate()
                    .map(move |(i, s)| format!("{},{i},{},{s}", r.d, s * r.sqrt_d))
            })
            .collect::<Vec<_>>(),
    )?;
    canvas.csv(
        "dot_std.csv",
        "d,sqrt_d,pooled_std,scaled_mean,scaled_lo,scaled_hi,scaled_spread,article_std,article_scaled",
        &data
            .rows
            .iter()
            .map(|r| {
                format!(
                    "{},{},{},{},{},{},{},{},{}",
                    r.d,
                    r.sqrt_d,
                    r.pooled_std,
                    r.scaled.value,
                    r.scaled.lo,
                    r.scaled.hi,
                    r.scaled_spread,
                    r.article_std.map_or(String::new(), |x| x.to_string()),
                    r.article_scaled.map_or(String::new(), |x| x.to_string())
                )
            })
            .collect::<Vec<_>>(),
    )?;
    Ok(())
}

/// The section.
pub fn render(data: &DotStdData, canvas: &mut Canvas) -> Result<String, LabError> {
    let table = md_table(
        &[
            "d",
            "√d",
            "std(q·k) ours: a draw's, mean [95% CI] over draws",
            "article",
            "std/√d ours: mean [95% CI] over draws",
            "article",
            "one draw of 2000: first / range over draws",
        ],
        &data
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.d.to_string(),
                    f(r.sqrt_d, 3),
                    r.std_mean.show(3),
                    opt(r.article_std, 3),
                    r.scaled.show(3),
                    opt(r.article_scaled, 3),
                    format!(
                        "{} / {}–{}",
                        f(r.first_draw_scaled, 3),
                        f(r.single_draw_range.0, 3),
                        f(r.single_draw_range.1, 3)
                    ),
                ]
            })
            .collect::<Vec<_>>(),
    );
    write_csv(data, canvas)?;
    let xy = |pick: fn(&super::DotStdRow) -> Option<f64>| -> Vec<(f64, f64)> {
        data.rows
            .iter()
            .filter_map(|r| pick(r).map(|y| (r.d as f64, y)))
            .collect()
    };
    let plot = canvas.line_plot(
        "dot_std.png",
        &LinePlot {
            title: format!(
                "std of q·k vs d_k: unit-normal entries, {} draws of {} pairs per d_k",
                data.repeats, data.pairs
            ),
            x_label: "d_k".into(),
            y_label: "std of q·k (and of q·k / √d_k)".into(),
            log_x: true,
            log_y: true,
            // The article's values as hollow markers over our lines, so that neither hides the
            // other where they agree; each in its line's colour, so the two legend entries
            // differ.
            series: vec![
                Series::reference("√d_k", xy(|r| Some(r.sqrt_d))).colored(7),
                Series::line("std(q·k), ours", xy(|r| Some(r.pooled_std))).colored(0),
                Series::scatter(
                    "std(q·k), the article's (hollow)",
                    xy(|r| r.article_std),
                    true,
                )
                .colored(0),
                Series::line("std(q·k)/√d_k, ours", xy(|r| Some(r.scaled.value))).colored(2),
                Series::scatter(
                    "std(q·k)/√d_k, the article's (hollow)",
                    xy(|r| r.article_scaled),
                    true,
                )
                .colored(2),
            ],
        },
    )?;
    answer(data, canvas, &plot);
    Ok(format!(
        "{} independent draws of {} pairs of standard normal vectors per d (a draw's std, averaged over \
         the draws with its t-interval; the last column shows single draws of the article's size). Var[q·k] = Σ Var[q_i]Var[k_i] \
         = d, so std = √d.\n\n{table}\n{plot}\n",
        data.repeats, data.pairs,
    ))
}

/// The first question's answer and screen.
fn answer(data: &DotStdData, canvas: &mut Canvas, plot: &str) {
    let e = data.exponent;
    let at_64 = data.rows.iter().find(|r| r.d == 64);
    canvas.key_number("std-grows-as-sqrt-d", format!("exponent {}", e.show(3)));
    canvas.answer(
        Question::DotStd,
        Some(format!(
            "{}: std(q·k) ∝ d_k^{}.",
            if e.lo >= 0.45 && e.hi <= 0.55 {
                "Yes"
            } else {
                "Not as √d_k"
            },
            e.show(3)
        )),
        format!(
            "**Setup.** q and k are vectors of d_k independent standard normal numbers; we drew {} \
             times {} pairs for each d_k and measured the standard deviation (std, the typical size) \
             of q·k. Each of the d_k products q_i·k_i has variance 1, so their sum has variance d_k and \
             std √d_k.\n\n{plot}\n\n**Effect.** The fitted slope of log std against log d_k is {} \
             (95% interval: a range computed by a rule that captures the true value in 95 of 100 \
             repeats of the experiment; √d_k means 0.5){}. Dividing by √d_k brings the std back to 1 at every \
             d_k.\n\n**Caveat.** This holds for independent entries with unit variance: trained q and k \
             are neither, which is why the other screens measure attention itself.",
            data.repeats,
            data.pairs,
            e.show(3),
            at_64.map_or(String::new(), |r| format!(
                "; at d_k = 64 the std is {} where √64 = 8",
                r.std_mean.show(2)
            )),
        ),
    );
}
