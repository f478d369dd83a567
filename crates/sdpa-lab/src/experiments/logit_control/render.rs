//! `logit-control`'s table, CSV and plots.

use super::analyze::InitRow;
use super::{CAPS, LogitControlData};
use crate::claims::show;
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::markdown::md_table;
use crate::plot::{LinePlot, Series};
use crate::stats::Estimate;

type Pick = fn(&InitRow) -> Estimate;

fn write_csv(data: &LogitControlData, canvas: &mut Canvas) -> Result<(), LabError> {
    canvas.csv(
        "logit_control.csv",
        "d_k,control,draw,logit_std,max_p,entropy,jacobian_norm,share_keys,rms_dq",
        &data
            .rows
            .iter()
            .flat_map(|r| {
                r.draws.iter().enumerate().map(move |(i, v)| {
                    format!(
                        "{},{},{i},{},{},{},{},{},{}",
                        r.d_k,
                        r.control.slug(),
                        v.logit_std,
                        v.max_p,
                        v.entropy,
                        v.jacobian_norm,
                        v.share_keys,
                        v.rms_dq
                    )
                })
            })
            .collect::<Vec<_>>(),
    )?;
    Ok(())
}

/// Max p, the share of keys with gradient and RMS ∂L/∂Q against d_k, one line per control.
fn plots(data: &LogitControlData, canvas: &mut Canvas) -> Result<Vec<String>, LabError> {
    let specs: [(&str, &str, &str, bool, Pick); 3] = [
        (
            "logit_control_max_p.png",
            "Mean max p at initialization",
            "mean max p (log scale)",
            true,
            |r| r.max_p,
        ),
        (
            "logit_control_keys_share.png",
            "Share of keys receiving logit gradient at initialization",
            "share of keys",
            false,
            |r| r.share_keys,
        ),
        (
            "logit_control_query_rms.png",
            "RMS ∂L/∂Q at initialization",
            "per-element RMS of ∂L/∂Q",
            true,
            |r| r.rms_dq,
        ),
    ];
    let mut plots = Vec::new();
    for (name, title, y_label, log_y, pick) in specs {
        let series = data
            .controls
            .iter()
            .map(|&control| {
                Series::with_band(
                    control.label(),
                    data.rows
                        .iter()
                        .filter(|r| r.control == control)
                        .map(|r| {
                            let e = pick(r);
                            (r.d_k as f64, e.value, e.lo, e.hi)
                        })
                        .collect(),
                )
            })
            .collect();
        plots.push(canvas.line_plot(
            name,
            &LinePlot {
                title: format!(
                    "{title}, m = {} keys, {} draws (95% bands)",
                    data.n, data.draws
                ),
                x_label: "d_k".into(),
                y_label: y_label.into(),
                log_x: true,
                log_y,
                series,
            },
        )?);
    }
    Ok(plots)
}

/// The section.
pub fn render(data: &LogitControlData, canvas: &mut Canvas) -> Result<String, LabError> {
    let table = md_table(
        &[
            "d_k",
            "control",
            "logit std",
            "mean max p",
            "entropy / ln m",
            "‖J‖_F per row",
            "keys with gradient",
            "RMS ∂L/∂Q",
        ],
        &data
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.d_k.to_string(),
                    r.control.label(),
                    show(r.logit_std),
                    show(r.max_p),
                    show(r.entropy),
                    show(r.jacobian_norm),
                    show(r.share_keys),
                    show(r.rms_dq),
                ]
            })
            .collect::<Vec<_>>(),
    );
    write_csv(data, canvas)?;
    let plots = plots(data, canvas)?;
    Ok(format!(
        "n = m = {} unit-variance queries, keys and values (d_v = d_k) and a random upstream gradient G \
         (L = Σ context·G), {} draws per cell (means with 95% t-intervals). Controls: 1/√d_k, none, soft-caps \
         c ∈ {CAPS:?} on unscaled scores (c·tanh(s/c), Burn's and Gemma 2's order: before bias and masks), \
         QK-norm (RMSNorm of every query and key head, gain 1 at initialization) without and with 1/√d_k. \
         \"Keys with gradient\" is the share of a row's keys whose logit gradient exceeds 1e−3 of the row's \
         largest; ∂L/∂Q goes through the cap's and the norm's derivatives. How these controls *train* is in \
         `training` (its controls part, paired with its 1/√d_k arm).\n\n{table}\n{}\n",
        data.n,
        data.draws,
        plots.join("\n")
    ))
}
