//! `saturation`'s table, CSV and plot.

use super::{NS, SaturationData};
use crate::answers::Question;
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::markdown::{f, md_table, opt};
use crate::plot::{LinePlot, Series};

fn write_csv(data: &SaturationData, canvas: &mut Canvas) -> Result<(), LabError> {
    // Every batch behind the means and their intervals (rows / batches rows each).
    canvas.csv(
        "saturation_draws.csv",
        "n,scale,batch,max_p,entropy,entropy_share_of_uniform",
        &data
            .rows
            .iter()
            .flat_map(|r| {
                r.batches.iter().enumerate().map(move |(i, (p, e))| {
                    format!("{},{},{i},{p},{e},{}", r.n, r.scale, e / r.ln_n)
                })
            })
            .collect::<Vec<_>>(),
    )?;
    canvas.csv(
        "saturation.csv",
        "n,scale,max_p,max_p_lo,max_p_hi,entropy,entropy_lo,entropy_hi,ln_n,article_max_p,article_entropy",
        &data
            .rows
            .iter()
            .map(|r| {
                format!(
                    "{},{},{},{},{},{},{},{},{},{},{}",
                    r.n,
                    r.scale,
                    r.max_p.value,
                    r.max_p.lo,
                    r.max_p.hi,
                    r.entropy.value,
                    r.entropy.lo,
                    r.entropy.hi,
                    r.ln_n,
                    r.article_max_p.map_or(String::new(), |x| x.to_string()),
                    r.article_entropy.map_or(String::new(), |x| x.to_string())
                )
            })
            .collect::<Vec<_>>(),
    )?;
    Ok(())
}

/// The section.
pub fn render(data: &SaturationData, canvas: &mut Canvas) -> Result<String, LabError> {
    let table = md_table(
        &[
            "n",
            "logit std s",
            "max p ours [95% CI]",
            "article",
            "entropy ours [95% CI]",
            "article",
            "ln n",
        ],
        &data
            .rows
            .iter()
            .filter(|r| r.article_max_p.is_some() || r.scale == 8.0)
            .map(|r| {
                vec![
                    r.n.to_string(),
                    f(r.scale, 1),
                    r.max_p.show(4),
                    opt(r.article_max_p, 4),
                    r.entropy.show(3),
                    opt(r.article_entropy, 3),
                    f(r.ln_n, 3),
                ]
            })
            .collect::<Vec<_>>(),
    );
    write_csv(data, canvas)?;
    let mut series = Vec::new();
    for (k, &n) in NS.iter().enumerate() {
        series.push(
            Series::with_band(
                format!("n = {n}"),
                data.rows
                    .iter()
                    .filter(|r| r.n == n)
                    .map(|r| (r.scale, r.entropy.value, r.entropy.lo, r.entropy.hi))
                    .collect(),
            )
            .colored(k),
        );
    }
    let scales: Vec<f64> = {
        let mut s: Vec<f64> = data.rows.iter().map(|r| r.scale).collect();
        s.sort_by(|a, b| a.total_cmp(b));
        s.dedup();
        s
    };
    // Each n's uniform entropy in its curve's colour.
    for (k, &n) in NS.iter().enumerate() {
        series.push(
            Series::reference(
                format!("ln {n} (uniform)"),
                scales.iter().map(|&s| (s, (n as f64).ln())).collect(),
            )
            .colored(k),
        );
    }
    let plot = canvas.line_plot(
        "saturation_entropy.png",
        &LinePlot {
            title: "Softmax entropy vs logit scale (95% bands)".into(),
            x_label: "logit standard deviation s".into(),
            y_label: "mean entropy (nats)".into(),
            log_x: true,
            log_y: false,
            series,
        },
    )?;
    let at_8: Vec<f64> = data
        .rows
        .iter()
        .filter(|r| r.scale == 8.0)
        .map(|r| r.entropy.value / r.ln_n)
        .collect();
    // The second question's screen: at what logit std softmax saturates (n = 64 keys).
    let at = |scale: f64| {
        data.rows
            .iter()
            .find(|r| r.n == 64 && r.scale == scale)
            .map(|r| {
                crate::stats::percent(
                    r.entropy.value / r.ln_n,
                    r.entropy.lo / r.ln_n,
                    r.entropy.hi / r.ln_n,
                )
            })
    };
    if let (Some(s1), Some(s4), Some(s8), Some(s16)) = (at(1.0), at(4.0), at(8.0), at(16.0)) {
        canvas.answer(
            Question::Saturation,
            None,
            format!(
                "**At what logit std.** Softmax of 64 random logits with standard deviation s keeps \
                 {s1} of the uniform distribution's entropy (its spread over the keys) at s = 1, \
                 what the scale gives; {s4} at s = 4, {s8} at s = 8 (unscaled, d_k = 64) and {s16} \
                 at s = 16 (95% intervals; the article's own table is in the appendix, \
                 `saturation`)."
            ),
        );
    }
    if let (Some(lo), Some(hi)) = (
        at_8.iter().copied().reduce(f64::min),
        at_8.iter().copied().reduce(f64::max),
    ) {
        canvas.key_number(
            "logit-std-8-clearly-saturated",
            format!(
                "entropy {:.0}–{:.0}% of uniform's at std 8 (n = {}–{} keys)",
                100.0 * lo,
                100.0 * hi,
                NS[0],
                NS[NS.len() - 1]
            ),
        );
    }
    Ok(format!(
        "{} rows of n standard normal logits times s, softmax per row (Burn's `softmax`); each cell \
         reseeds, like the article. Means with 95% t-intervals over the rows. Unscaled attention \
         logits have s = √d_k (8 for d_k = 64, 11.3 for 128). The table shows the article's cells and \
         s = 8.\n\n{table}\n{plot}\n",
        data.rows_per_cell
    ))
}
