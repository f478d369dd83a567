//! `dot-std`'s table, CSV and plot.

use super::DotStdData;
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::markdown::{f, md_table, opt};
use crate::plot::{LinePlot, Series};

fn write_csv(data: &DotStdData, canvas: &mut Canvas) -> Result<(), LabError> {
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
            title: "std of q·k vs dimension".into(),
            x_label: "d".into(),
            y_label: "std".into(),
            log_x: true,
            log_y: true,
            series: vec![
                Series::reference("√d", xy(|r| Some(r.sqrt_d))),
                Series::line("std(q·k), ours", xy(|r| Some(r.pooled_std))),
                Series::line("std(q·k), article", xy(|r| r.article_std)),
                Series::line("std(q·k)/√d, ours", xy(|r| Some(r.scaled.value))),
            ],
        },
    )?;
    Ok(format!(
        "{} independent draws of {} pairs of standard normal vectors per d (a draw's std, averaged over \
         the draws with its t-interval; the last column shows single draws of the article's size). Var[q·k] = Σ Var[q_i]Var[k_i] \
         = d, so std = √d.\n\n{table}\n{plot}\n",
        data.repeats, data.pairs,
    ))
}
