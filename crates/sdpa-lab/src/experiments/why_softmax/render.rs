//! `why-softmax`'s section: tables, CSV and plots from the analysis.

use super::METHODS;
use super::analyze::*;
use crate::claims::show;
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::markdown::md_table;
use crate::plot::{LinePlot, Series};

fn write_csv(data: &WhySoftmaxData, canvas: &mut Canvas) -> Result<(), LabError> {
    let rows = &data.rows;
    canvas.csv(
        "why_softmax.csv",
        "method,n,d,scaled,output_std,output_std_lo,output_std_hi,weight_sum_error,effective_keys,entropy",
        &rows
            .iter()
            .map(|r| {
                format!(
                    "\"{}\",{},{},{},{},{},{},{},{},{}",
                    r.method,
                    r.n,
                    r.d,
                    r.scaled,
                    r.output_std_ci.value,
                    r.output_std_ci.lo,
                    r.output_std_ci.hi,
                    r.weight_sum_error,
                    r.effective_keys_ci.map_or(f64::NAN, |e| e.value),
                    r.entropy.map_or(f64::NAN, |e| e.value)
                )
            })
            .collect::<Vec<_>>(),
    )?;
    // Every draw behind the intervals above and the fitted exponents.
    let draws: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            (0..r.output_std.len()).map(move |i| {
                let at = |v: &[f64]| v.get(i).map_or(f64::NAN, |x| *x);
                format!(
                    "\"{}\",{},{},{},{i},{},{},{}",
                    r.method,
                    r.n,
                    r.d,
                    r.scaled,
                    r.output_std[i],
                    at(&r.effective_keys),
                    at(&r.entropies)
                )
            })
        })
        .collect();
    canvas.csv(
        "why_softmax_draws.csv",
        "method,n,d,scaled,draw,output_std,effective_keys,entropy",
        &draws,
    )?;
    Ok(())
}

fn selectivity_table(data: &WhySoftmaxData) -> String {
    let rows = &data.rows;
    md_table(
        &[
            "weighting",
            "d",
            "scores",
            "effective keys 1/Σp²",
            "of n",
            "entropy (nats)",
            "output std",
        ],
        &rows
            .iter()
            .filter(|r| r.n == N_REF && r.effective_keys_ci.is_some())
            .map(|r| {
                let eff = r.effective_keys_ci.unwrap_or(r.output_std_ci);
                vec![
                    r.method.clone(),
                    r.d.to_string(),
                    if r.scaled {
                        "÷ √d"
                    } else {
                        "raw (std √d)"
                    }
                    .into(),
                    show(eff),
                    format!("{:.1}%", 100.0 * eff.value / r.n as f64),
                    r.entropy.map_or("–".into(), show),
                    show(r.output_std_ci),
                ]
            })
            .collect::<Vec<_>>(),
    )
}

/// The section.
pub fn render(data: &WhySoftmaxData, canvas: &mut Canvas) -> Result<String, LabError> {
    let rows = &data.rows;
    let mut headers = vec!["weighting (scores ÷ √d)".to_string()];
    headers.extend(data.ns.iter().map(|n| format!("n = {n}")));
    headers.push("fitted n-exponent [95% CI]".into());
    let h: Vec<&str> = headers.iter().map(|s| s.as_str()).collect();
    let by_n = md_table(
        &h,
        &data
            .exponents
            .iter()
            .map(|(m, e)| {
                let mut r = vec![m.clone()];
                for &n in &data.ns {
                    r.push(
                        rows.iter()
                            .find(|x| &x.method == m && x.n == n && x.d == D_REF && x.scaled)
                            .map_or("–".into(), |x| show(x.output_std_ci)),
                    );
                }
                r.push(show(*e));
                r
            })
            .collect::<Vec<_>>(),
    );
    let selectivity = selectivity_table(data);
    write_csv(data, canvas)?;
    let plot = canvas.line_plot(
        "why_softmax.png",
        &LinePlot {
            title: format!("Output scale vs number of keys (d = {D_REF}, scores ÷ √d, 95% bands)"),
            x_label: "number of keys n".into(),
            y_label: "std of the output".into(),
            log_x: true,
            log_y: true,
            series: METHODS
                .iter()
                .map(|m| {
                    Series::with_band(
                        *m,
                        rows.iter()
                            .filter(|r| r.method == *m && r.d == D_REF && r.scaled)
                            .map(|r| {
                                (
                                    r.n as f64,
                                    r.output_std_ci.value,
                                    r.output_std_ci.lo,
                                    r.output_std_ci.hi,
                                )
                            })
                            .collect(),
                    )
                })
                .collect(),
        },
    )?;
    Ok(format!(
        "Scores QKᵀ (divided by √d, std 1, or raw, std √d), values with unit variance (d_v = {}); the output's \
         component std for each weighting, means with 95% t-intervals over {} independent draws. The \
         n-exponents are least-squares slopes of log std on log n over every draw.\n\nBy number of keys n \
         (d = {D_REF}, scores ÷ √d):\n\n{by_n}\nSelectivity of the normalized weightings (n = {N_REF}): how many \
         keys a row really uses, with and without the 1/√d scaling.\n\n{selectivity}\n{plot}\n",
        data.d_v, data.draws,
    ))
}
