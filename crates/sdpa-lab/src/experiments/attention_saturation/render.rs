//! `attention-saturation`'s tables, CSV and plot.

use super::{ARTICLE, AttentionSaturationData};
use crate::answers::Question;
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
    // The draws behind each mean max p, share above 0.99 and logit std, and their intervals.
    canvas.csv(
        "attention_saturation_draws.csv",
        "m,d,scaled,draw,mean_max_p,share_max_p_above_0.99,logit_std",
        &data
            .corrected
            .iter()
            .flat_map(|r| {
                r.max_p_draws.iter().enumerate().map(move |(i, p)| {
                    let at = |v: &[f64]| v.get(i).map_or(String::new(), |x| x.to_string());
                    format!(
                        "{},{},{},{i},{p},{},{}",
                        r.m,
                        r.d,
                        r.scaled,
                        at(&r.saturated_draws),
                        at(&r.logit_std_draws)
                    )
                })
            })
            .collect::<Vec<_>>(),
    )?;
    // The article's code, every draw: the ranges its claims are decided on.
    canvas.csv(
        "attention_saturation_article_code_draws.csv",
        "d,draw,max_p_unscaled,max_p_scaled",
        &data
            .replicated
            .iter()
            .flat_map(|r| {
                r.unscaled.iter().enumerate().map(move |(i, u)| {
                    let scaled = r.scaled.get(i).map_or(String::new(), |x| x.to_string());
                    format!("{},{i},{u},{scaled}", r.d)
                })
            })
            .collect::<Vec<_>>(),
    )?;
    Ok(())
}

/// The section.
pub fn render(data: &AttentionSaturationData, canvas: &mut Canvas) -> Result<String, LabError> {
    write_csv(data, canvas)?;
    let (article_table, corrected_table) = (article_table(data), corrected_table(data));
    // The article's m only (the m-dependence is a lab claim, in the table), both scalings with
    // their bands, the article's own values, and the 0.999 its "one-hot" sentence says.
    let at = |scaled: bool| -> Vec<(f64, f64, f64, f64)> {
        data.corrected
            .iter()
            .filter(|r| r.m == data.m_main && r.scaled == scaled)
            .map(|r| (r.d as f64, r.max_p.value, r.max_p.lo, r.max_p.hi))
            .collect()
    };
    let dims: Vec<f64> = ARTICLE.iter().map(|a| a.0 as f64).collect();
    let series = vec![
        Series::with_band("none, measured (mean over queries)", at(false)).colored(1),
        Series::with_band("1/√d, measured", at(true)).colored(0),
        Series::scatter(
            "none, the article",
            ARTICLE.iter().map(|a| (a.0 as f64, a.1)).collect(),
            true,
        )
        .colored(1),
        Series::scatter(
            "1/√d, the article",
            ARTICLE.iter().map(|a| (a.0 as f64, a.2)).collect(),
            true,
        )
        .colored(0),
        Series::reference(
            "0.999: the article's \"one-hot\"",
            dims.iter().map(|&d| (d, 0.999)).collect(),
        ),
    ];
    let plot = canvas.line_plot(
        "attention_saturation_max_p.png",
        &LinePlot {
            // Short enough to fit; the sizes are in the x label. A linear axis: the gap between
            // 0.72 and the article's 0.999 is what the figure is about (a log axis hid it).
            title: "Largest attention weight of a query (mean, 95% band)".into(),
            x_label: format!(
                "d (= d_k); {} queries × m = {} keys, {} draws",
                data.n, data.m_main, data.draws
            ),
            y_label: "mean max p over queries (1 = one-hot)".into(),
            log_x: true,
            log_y: false,
            series,
        },
    )?;
    answer(data, canvas, &plot);
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

/// The second question's answer (the first screen's number) and this experiment's part of its
/// screen.
fn answer(data: &AttentionSaturationData, canvas: &mut Canvas, plot: &str) {
    let row = |d: usize, scaled: bool| {
        data.corrected
            .iter()
            .find(|r| r.m == data.m_main && r.d == d && r.scaled == scaled)
    };
    let (Some(none), Some(scaled)) = (row(64, false), row(64, true)) else {
        return;
    };
    canvas.key_number(
        "unscaled-is-one-hot",
        format!(
            "max p {} at d_k 64 ({} keys); {} of queries above 0.99",
            none.max_p.show(2),
            data.m_main,
            crate::stats::percent(
                none.saturated_fraction.value,
                none.saturated_fraction.lo,
                none.saturated_fraction.hi
            )
        ),
    );
    canvas.key_number(
        "scaled-max-p-band",
        format!("max p {} at d_k 64", scaled.max_p.show(3)),
    );
    let top = data
        .corrected
        .iter()
        .filter(|r| !r.scaled && r.m == data.m_main)
        .max_by_key(|r| r.d);
    canvas.answer(
        Question::Saturation,
        Some(format!(
            "{}: at d_k 64 (logit std {:.0}, {} keys) a query's top weight averages {}, {} \
             one-hot (article: 0.999); scaled {}.",
            if none.max_p.hi < 0.99 && none.max_p.lo > 0.5 {
                "Partly"
            } else if none.max_p.lo >= 0.99 {
                "Yes, to one-hot"
            } else {
                "Not strongly"
            },
            none.logit_std.value,
            data.m_main,
            none.max_p.show(2),
            if none.max_p.lo >= 0.99 { "near" } else { "not" },
            short_p(scaled.max_p.value),
        )),
        format!(
            "**In attention.** {} queries each attend over m = {} keys (the article's size), q and k with \
             unit-variance entries; we read each query's largest weight, max p (1 would be one-hot: all \
             attention on one key), over {} draws.\n\n{plot}\n\n**Effect.** At d_k = 64 without the \
             scale the logits (the scores q·k that softmax turns into weights) have std {:.1}, and \
             the mean max p is {} (95% interval); {} of the queries are nearly one-hot (max p > 0.99). With 1/√d_k it is {}: attention \
             spreads over many keys.{}\n\n**Caveat.** The article's 0.999 is one draw of a single \
             softmax over {} logits, not an average over queries; at d_k = 64 its code gives {} over {} \
             draws (appendix, `attention-saturation`).",
            data.n,
            data.m_main,
            data.draws,
            none.logit_std.value,
            none.max_p.show(3),
            crate::stats::percent(
                none.saturated_fraction.value,
                none.saturated_fraction.lo,
                none.saturated_fraction.hi
            ),
            scaled.max_p.show(3),
            top.map_or(String::new(), |r| format!(
                " Even at d_k = {} the unscaled mean is {}.",
                r.d,
                r.max_p.show(3)
            )),
            data.m_main,
            data.replicated.iter().find(|r| r.d == 64).map_or("–".to_string(), |r| {
                let (lo, hi) = range(&r.unscaled);
                format!("{lo:.2}–{hi:.2}")
            }),
            super::REPLICATION_DRAWS,
        ),
    );
}

/// A probability with 3 decimals.
fn short_p(p: f64) -> String {
    format!("{p:.3}")
}
