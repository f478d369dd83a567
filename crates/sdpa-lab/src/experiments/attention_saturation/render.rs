//! `attention-saturation`'s tables, CSV and plot.

use super::{ARTICLE, AttentionSaturationData};
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::markdown::{f, md_table};
use crate::plot::{LinePlot, Series};

fn range(xs: &[f64]) -> (f64, f64) {
    xs.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

fn article_table(data: &AttentionSaturationData) -> String {
    md_table(
        &[
            "d",
            "max p unscaled (article)",
            "replicated: first draw / range",
            "max p scaled (article)",
            "replicated: first draw / range",
            "\"entropy\" (article)",
            "−b ln b, b = replicated scaled max p: first draw / range",
            "\"uniform entropy\" ln d",
        ],
        &ARTICLE
            .iter()
            .filter_map(|a| data.replicated.iter().find(|r| r.d == a.0).map(|r| (a, r)))
            .map(|(a, r)| {
                let (u_lo, u_hi) = range(&r.unscaled);
                let (s_lo, s_hi) = range(&r.scaled);
                let first = |x: &[f64]| x.first().copied().unwrap_or(f64::NAN);
                vec![
                    a.0.to_string(),
                    f(a.1, 4),
                    format!(
                        "{} / {}–{}",
                        f(first(&r.unscaled), 4),
                        f(u_lo, 4),
                        f(u_hi, 4)
                    ),
                    f(a.2, 4),
                    format!("{} / {}–{}", f(first(&r.scaled), 4), f(s_lo, 4), f(s_hi, 4)),
                    f(a.3, 3),
                    {
                        let h = |b: f64| -(b * (b + 1e-10).ln());
                        let hs: Vec<f64> = r.scaled.iter().map(|&b| h(b)).collect();
                        let (lo, hi) = range(&hs);
                        format!(
                            "{} / {}–{}",
                            f(r.article_entropy_formula, 3),
                            f(lo, 3),
                            f(hi, 3)
                        )
                    },
                    f(a.4, 3),
                ]
            })
            .collect::<Vec<_>>(),
    )
}

fn corrected_table(data: &AttentionSaturationData) -> String {
    md_table(
        &[
            "m",
            "d",
            "scaling",
            "logit std",
            "mean max p [95% CI]",
            "entropy",
            "ln m",
            "keys with p > 1e-3 [95% CI]",
            "rows with max p > 0.99",
        ],
        &data
            .corrected
            .iter()
            .map(|r| {
                vec![
                    r.m.to_string(),
                    r.d.to_string(),
                    if r.scaled { "1/√d" } else { "none" }.into(),
                    f(r.logit_std.value, 2),
                    r.max_p.show(4),
                    r.entropy.show(3),
                    f(r.ln_m, 3),
                    r.keys_above_1e3.show(1),
                    r.saturated_fraction.show(2),
                ]
            })
            .collect::<Vec<_>>(),
    )
}

fn write_csv(data: &AttentionSaturationData, canvas: &mut Canvas) -> Result<(), LabError> {
    canvas.csv(
        "attention_saturation.csv",
        "m,d,scaled,logit_std,max_p,max_p_lo,max_p_hi,entropy,ln_m,keys_above_1e3,saturated_fraction",
        &data
            .corrected
            .iter()
            .map(|r| {
                format!(
                    "{},{},{},{},{},{},{},{},{},{},{}",
                    r.m,
                    r.d,
                    r.scaled,
                    r.logit_std.value,
                    r.max_p.value,
                    r.max_p.lo,
                    r.max_p.hi,
                    r.entropy.value,
                    r.ln_m,
                    r.keys_above_1e3.value,
                    r.saturated_fraction.value
                )
            })
            .collect::<Vec<_>>(),
    )?;
    Ok(())
}

/// The section.
pub fn render(data: &AttentionSaturationData, canvas: &mut Canvas) -> Result<String, LabError> {
    write_csv(data, canvas)?;
    let (article_table, corrected_table) = (article_table(data), corrected_table(data));
    let mut series = Vec::new();
    let mut ms: Vec<usize> = data.corrected.iter().map(|r| r.m).collect();
    ms.sort();
    ms.dedup();
    for scaled in [false, true] {
        for &m in &ms {
            series.push(Series::with_band(
                format!("{}, m = {m}", if scaled { "1/√d" } else { "none" }),
                data.corrected
                    .iter()
                    .filter(|r| r.m == m && r.scaled == scaled)
                    .map(|r| (r.d as f64, r.max_p.value, r.max_p.lo, r.max_p.hi))
                    .collect(),
            ));
        }
    }
    let plot = canvas.line_plot(
        "attention_saturation_max_p.png",
        &LinePlot {
            title: "Mean max p per query vs d (95% bands)".into(),
            x_label: "d".into(),
            y_label: "mean max p".into(),
            log_x: true,
            log_y: true,
            series,
        },
    )?;
    Ok(format!(
        "**What the article computed.** `dot = (q * k).sum(-1)` has shape [500]: 500 logits \
         q_i·k_i of independent unit-variance vectors, and `dot.softmax(-1)` one distribution over \
         them: statistically one attention row with m = 500 keys (given q, the logits q·k_j are \
         such a row). What is wrong is elsewhere: each number is a single draw, \
         the column it calls entropy is −b·ln b of one number b (the max p), and its \"uniform entropy\" is \
         ln d instead of ln 500. Our replication of that code, {} draws per d:\n\n{article_table}\n\
         **The corrected measurement.** {} queries against m keys with unit-variance components, a \
         softmax over the keys of each query, our module (scaled or not) and the library's \
         diagnostics; means with 95% t-intervals over {} independent draws per cell. The article's \
         claims are decided at its own m = {}; whether with 1/√d the max p depends on m rather than on d is \
         decided by the lab's claims `scaled-depends-on-m` and `scaled-is-flat` below.\n\n{corrected_table}\n{plot}\n",
        super::REPLICATION_DRAWS,
        data.n,
        data.draws,
        data.m_main
    ))
}
