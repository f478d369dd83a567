//! `gradients`' tables, CSV and plots.

use super::analyze::GradientRow;
use super::{FIXED_D_V, GradientsData};
use crate::answers::Question;
use crate::claims::show;
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::experiments::training_confirm2::design::PREMISE_MIN_D_K_UNIT_ENTRIES;
use crate::markdown::md_table;
use crate::plot::{LinePlot, Series};
use crate::stats::Estimate;
use crate::stats::{round_down, round_up};

fn rows_table(rows: &[&GradientRow]) -> String {
    md_table(
        &[
            "backend",
            "d",
            "scaling",
            "mean max p",
            "‖J‖_F per row",
            "RMS ∂L/∂s",
            "keys with gradient",
            "RMS ∂L/∂Q",
            "RMS ∂L/∂K",
            "RMS ∂L/∂V",
            "autodiff − analytic ‖J‖",
        ],
        &rows
            .iter()
            .map(|r| {
                vec![
                    r.backend.clone(),
                    r.d.to_string(),
                    if r.scaled { "1/√d" } else { "none" }.into(),
                    show(r.max_p),
                    show(r.jacobian_norm),
                    show(r.rms_ds),
                    show(r.share_keys),
                    show(r.rms_dq),
                    show(r.rms_dk),
                    show(r.rms_dv),
                    r.jacobian_check.map_or("–".into(), |x| format!("{x:.1e}")),
                ]
            })
            .collect::<Vec<_>>(),
    )
}

type Pick = fn(&GradientRow) -> Estimate;

fn ratios_table(data: &GradientsData) -> String {
    md_table(
        &[
            "design",
            "d",
            "‖J‖ unscaled / scaled",
            "RMS ∂L/∂Q unscaled / scaled",
            "RMS ∂L/∂s unscaled / scaled",
        ],
        &data
            .ratios
            .iter()
            .map(|r| {
                vec![
                    if r.d_v_fixed {
                        format!("d_v = {FIXED_D_V}")
                    } else {
                        "d_v = d".into()
                    },
                    r.d.to_string(),
                    show(r.jacobian),
                    show(r.query),
                    show(r.scores),
                ]
            })
            .collect::<Vec<_>>(),
    )
}

/// The ‖J‖ ratio per (m, d) and the crossover per m.
fn keys_table(data: &GradientsData) -> String {
    let ms = data.key_counts();
    let mut dims: Vec<usize> = data.by_keys.iter().map(|r| r.d).collect();
    dims.sort_unstable();
    dims.dedup();
    let mut header = vec!["m".to_string(), "crossover d".to_string()];
    header.extend(dims.iter().map(|d| format!("d = {d}")));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    md_table(
        &header,
        &ms.iter()
            .map(|&m| {
                let crossover = data
                    .crossover_by_keys
                    .iter()
                    .find(|(k, _)| *k == m)
                    .and_then(|(_, e)| *e)
                    .map_or("none in range".into(), |e| e.show(0));
                let mut row = vec![m.to_string(), crossover];
                row.extend(dims.iter().map(|&d| {
                    data.by_keys
                        .iter()
                        .find(|r| r.m == m && r.d == d)
                        .map_or("–".into(), |r| show(r.jacobian))
                }));
                row
            })
            .collect::<Vec<_>>(),
    )
}

fn keys_plot(data: &GradientsData, canvas: &mut Canvas) -> Result<String, LabError> {
    let ms = data.key_counts();
    let dims: Vec<f64> = data.by_keys.iter().map(|r| r.d as f64).collect();
    let (d_lo, d_hi) = dims
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(a, b), &d| (a.min(d), b.max(d)));
    let mut series: Vec<Series> = ms
        .iter()
        .map(|&m| {
            Series::with_band(
                format!("m = {m}"),
                data.by_keys
                    .iter()
                    .filter(|r| r.m == m)
                    .map(|r| (r.d as f64, r.jacobian.value, r.jacobian.lo, r.jacobian.hi))
                    .collect(),
            )
        })
        .collect();
    if d_hi > 0.0 {
        series.push(Series::reference(
            "1: equal (below: unscaled smaller)",
            vec![(d_lo, 1.0), (d_hi, 1.0)],
        ));
    }
    canvas.line_plot(
        "gradients_jacobian_ratio_by_keys.png",
        &LinePlot {
            title: format!(
                "‖J‖ unscaled / scaled vs d, per m keys, d_v = {FIXED_D_V}, {} paired draws (95% bands)",
                data.draws
            ),
            x_label: "d".into(),
            y_label: "‖J‖ unscaled / scaled".into(),
            log_x: true,
            log_y: true,
            series,
        },
    )
}

fn exponents_table(data: &GradientsData) -> String {
    let fixed = format!("exponent on d, d_v = {FIXED_D_V}");
    md_table(
        &["quantity", fixed.as_str(), "exponent on d, d_v = d"],
        &data
            .exponents
            .iter()
            .map(|(q, a, b)| vec![q.clone(), show(*a), show(*b)])
            .collect::<Vec<_>>(),
    )
}

fn write_csv(data: &GradientsData, canvas: &mut Canvas) -> Result<(), LabError> {
    canvas.csv(
        "gradients.csv",
        "design,backend,d,scaled,max_p,jacobian_norm,rms_ds,share_keys,rms_dq,rms_dk,rms_dv",
        &data
            .rows
            .iter()
            .map(|r| {
                format!(
                    "{},{},{},{},{},{},{},{},{},{},{}",
                    if r.d_v_fixed { "dv_fixed" } else { "dv_eq_d" },
                    r.backend,
                    r.d,
                    r.scaled,
                    r.max_p.value,
                    r.jacobian_norm.value,
                    r.rms_ds.value,
                    r.share_keys.value,
                    r.rms_dq.value,
                    r.rms_dk.value,
                    r.rms_dv.value
                )
            })
            .collect::<Vec<_>>(),
    )?;
    let values = |v: &super::DrawValues| {
        format!(
            "{},{},{},{},{},{},{}",
            v.max_p, v.jacobian_norm, v.rms_ds, v.share_keys, v.rms_dq, v.rms_dk, v.rms_dv
        )
    };
    canvas.csv(
        "gradients_draws.csv",
        "design,backend,m,d,d_v,draw,unscaled_max_p,unscaled_jacobian_norm,unscaled_rms_ds,\
         unscaled_share_keys,unscaled_rms_dq,unscaled_rms_dk,unscaled_rms_dv,scaled_max_p,\
         scaled_jacobian_norm,scaled_rms_ds,scaled_share_keys,scaled_rms_dq,scaled_rms_dk,scaled_rms_dv",
        &data
            .per_draw
            .iter()
            .map(|r| {
                format!(
                    "{},{},{},{},{},{},{},{}",
                    r.design,
                    r.backend,
                    r.m,
                    r.d,
                    r.d_v,
                    r.draw,
                    values(&r.unscaled),
                    values(&r.scaled)
                )
            })
            .collect::<Vec<_>>(),
    )?;
    Ok(())
}

/// One plot's series: each scaling (and, with `both_designs`, each design) with its 95% band.
fn series(data: &GradientsData, pick: Pick, both_designs: bool) -> Vec<Series> {
    let designs: &[bool] = if both_designs {
        &[true, false]
    } else {
        &[true]
    };
    let mut out = Vec::new();
    for &fixed in designs {
        for scaled in [false, true] {
            let points: Vec<(f64, f64, f64, f64)> = data
                .rows
                .iter()
                .filter(|r| r.d_v_fixed == fixed && r.backend == data.primary && r.scaled == scaled)
                .map(|r| {
                    let e = pick(r);
                    (r.d as f64, e.value, e.lo, e.hi)
                })
                .collect();
            let design = match (both_designs, fixed) {
                (false, _) => String::new(),
                (true, true) => format!(", d_v = {FIXED_D_V}"),
                (true, false) => ", d_v = d".into(),
            };
            let name = if scaled { "scaled 1/√d" } else { "unscaled" };
            // The report's arm colours (1/√d_k blue, none red); the second design dashed.
            let mut series =
                Series::with_band(format!("{name}{design}"), points).colored(usize::from(!scaled));
            series.dashed = !fixed;
            out.push(series);
        }
    }
    out
}

fn plots(data: &GradientsData, canvas: &mut Canvas) -> Result<Vec<String>, LabError> {
    let specs: [(&str, &str, &str, bool, Pick, bool); 3] = [
        (
            "gradients_jacobian_norm.png",
            "Softmax Jacobian ‖diag(p) − ppᵀ‖_F vs d",
            "mean Frobenius norm per row",
            true,
            |r| r.jacobian_norm,
            false,
        ),
        (
            "gradients_keys_share.png",
            "Share of keys receiving score gradient vs d",
            "share of keys with |∂L/∂s| > 1e-3 · row max",
            false,
            |r| r.share_keys,
            false,
        ),
        (
            "gradients_query_rms.png",
            "RMS of ∂L/∂Q vs d (d_v fixed and d_v = d)",
            "per-element RMS of ∂L/∂Q",
            true,
            |r| r.rms_dq,
            true,
        ),
    ];
    let mut links = Vec::new();
    for (name, title, y_label, log_y, pick, both) in specs {
        links.push(canvas.line_plot(
            name,
            &LinePlot {
                title: format!(
                    "{title}, m = {} keys{} (95% bands)",
                    data.n,
                    if both {
                        String::new()
                    } else {
                        format!(", d_v = {FIXED_D_V}")
                    }
                ),
                x_label: "d".into(),
                y_label: y_label.into(),
                log_x: true,
                log_y,
                series: series(data, pick, both),
            },
        )?);
    }
    Ok(links)
}

/// The section.
pub fn render(data: &GradientsData, canvas: &mut Canvas) -> Result<String, LabError> {
    let primary: Vec<&GradientRow> = data.rows.iter().filter(|r| r.d_v_fixed).collect();
    let second: Vec<&GradientRow> = data.rows.iter().filter(|r| !r.d_v_fixed).collect();
    write_csv(data, canvas)?;
    let plots = plots(data, canvas)?;
    let keys_plot = keys_plot(data, canvas)?;
    answer(data, canvas)?;
    Ok(format!(
        "n = m = {} queries and keys, unit-variance Q, K, V and a random upstream gradient G on the context \
         (L = Σ context·G); means with 95% t-intervals over {} independent draws per cell, both scalings on the \
         same draws (so the ratios are paired). ∂L/∂scores is read as the gradient of a zero additive bias; the \
         Jacobian of each softmax row, diag(p) − ppᵀ, is computed analytically from p, and through autodiff on \
         the first draw ({} query rows). **Primary design: d_v = {FIXED_D_V}** whatever d (the upstream gradient \
         reaching the scores is p·(g·v_j − g·o), and g·v_j grows like √d_v: with d_v = d that growth rides along \
         with d). The d_v = d design is shown second. Exponents are least-squares slopes on log-log axes over \
         every draw.\n\n**Ratios unscaled / scaled (paired per draw, {})**\n\n{}\n\
         **Where the unscaled Jacobian becomes the smaller one depends on the number of keys m** (primary \
         design at m = {}; ‖J‖ unscaled / scaled, paired per draw, and the crossover d with its 95% bootstrap \
         interval)\n\n{}\n{keys_plot}\n\n\
         **Growth exponents of the unscaled gradients, both designs**\n\n{}\n\
         **Primary design (d_v = {FIXED_D_V})**\n\n{}\n**Second design (d_v = d)**\n\n{}\n{}\n",
        data.n,
        data.draws,
        data.jacobian_rows,
        data.primary,
        ratios_table(data),
        data.key_counts()
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        keys_table(data),
        exponents_table(data),
        rows_table(&primary),
        rows_table(&second),
        plots.join("\n"),
    ))
}

/// The third question: the paired ratios unscaled / scaled of the three gradients against d (the
/// primary design), on one plot, and the answer built on them.
fn answer(data: &GradientsData, canvas: &mut Canvas) -> Result<(), LabError> {
    let primary: Vec<&super::analyze::RatioRow> =
        data.ratios.iter().filter(|r| r.d_v_fixed).collect();
    let (Some(at_64), Some(last)) = (
        primary.iter().find(|r| r.d == 64),
        primary.iter().max_by_key(|r| r.d),
    ) else {
        return Ok(());
    };
    let band = |pick: fn(&super::analyze::RatioRow) -> Estimate| -> Vec<(f64, f64, f64, f64)> {
        primary
            .iter()
            .map(|r| {
                let e = pick(r);
                (r.d as f64, e.value, e.lo, e.hi)
            })
            .collect()
    };
    let plot = canvas.line_plot(
        "gradients_ratios.png",
        &LinePlot {
            title: format!(
                "Gradients without / with the 1/√d scale, m = {} keys, d_v = {FIXED_D_V}, {} paired draws",
                data.n, data.draws
            ),
            x_label: "d (= d_k)".into(),
            y_label: "unscaled / scaled (above 1: larger unscaled)".into(),
            log_x: true,
            log_y: true,
            series: vec![
                // Blue and red are the two arms elsewhere in the report: these three quantities
                // take colours of their own.
                Series::with_band("∂L/∂Q: reaches W_Q", band(|r| r.query)).colored(2),
                Series::with_band("∂L/∂scores", band(|r| r.scores)).colored(5),
                Series::with_band("softmax Jacobian ‖J‖", band(|r| r.jacobian)).colored(3),
                Series::reference(
                    "1: no difference",
                    primary.iter().map(|r| (r.d as f64, 1.0)).collect(),
                )
                .colored(7),
                Series::reference(
                    "0.1: «almost 0» (‖J‖)",
                    primary.iter().map(|r| (r.d as f64, 0.1)).collect(),
                )
                .colored(4),
            ],
        },
    )?;
    let crossover = data
        .crossover_d
        .map_or("beyond the measured d".to_string(), |e| e.show(0));
    canvas.key_number(
        "jacobian-vanishes",
        format!(
            "softmax's slope ‖J‖, unscaled / scaled: {} at d_k 64 ({} keys), below 1 from d_k ≈ \
             {crossover}; {} conditions = {} key counts × {} d_k",
            at_64.jacobian.show(2),
            data.n,
            data.by_keys.len(),
            data.key_counts().len(),
            data.by_keys.len() / data.key_counts().len().max(1),
        ),
    );
    // The premise's claims: the unscaled slope against saturation, and the gradient reaching Q,
    // at d_k 64 and the largest d_k (this run's m).
    let premise: Vec<&super::analyze::KeysRow> = data
        .by_keys
        .iter()
        .filter(|r| r.m == data.n && r.d >= 64)
        .collect();
    if let (Some(first), Some(top)) = (premise.first(), premise.last()) {
        let (xs, ys): (Vec<f64>, Vec<f64>) = premise
            .iter()
            .flat_map(|r| r.unscaled_draws.iter().map(move |j| (r.d as f64, *j)))
            .unzip();
        canvas.key_number(
            "jacobian-tends-to-zero",
            format!(
                "unscaled ‖J‖ ∝ d_k^{} over d_k {}–{} ({} keys)",
                crate::stats::exponent_ci(&xs, &ys).show(2),
                first.d,
                top.d,
                data.n
            ),
        );
        let family = super::claims::premise_rows(data).count();
        canvas.key_number(
            "query-gradient-vanishes",
            format!(
                "∂L/∂Q unscaled / scaled: {} at d_k {}, {} at d_k {} ({} keys; family-wise \
                 intervals over the {family} (key count, d_k) with d_k ≥ 64, so wider than the \
                 bullet's): the smaller slope is multiplied by the larger scores and by K",
                first.query.show(1),
                first.d,
                top.query.show(1),
                top.d,
                data.n
            ),
        );
    }
    canvas.key_number(
        "jacobian-almost-zero",
        format!(
            "‖J‖ ratio {} at d_k {} (\"almost 0\": below 0.1)",
            last.jacobian.show(2),
            last.d
        ),
    );
    // Where the slope crosses, per number of keys, and the key sweep's conditions.
    let by_keys = data
        .crossover_by_keys
        .iter()
        .map(|(m, e)| match e {
            Some(e) if e.value.is_finite() => {
                format!("m = {m}: d_k {}", e.show(0))
            }
            _ => format!("m = {m}: never up to d_k {}", last.d),
        })
        .collect::<Vec<_>>()
        .join("; ");
    let mut d_values: Vec<usize> = data.by_keys.iter().map(|r| r.d).collect();
    d_values.sort_unstable();
    d_values.dedup();
    let dims = d_values
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    canvas.answer(
        Question::Gradients,
        Some(format!(
            "{}: the gradient reaching Q is {:.0}× [{}, {}] larger unscaled (d_k 64), on \
             fewer keys; softmax's slope falls below the scaled one past d_k {} \
             ({} keys).",
            if at_64.query.lo > 1.0 { "Not in size" } else { "Not here" },
            at_64.query.value,
            round_down(at_64.query.lo, 0),
            round_up(at_64.query.hi, 0),
            data.crossover_d
                .map_or(format!("{} (not measured beyond)", last.d), |e| e.show(0)),
            data.n,
        )),
        format!(
            "**Setup.** One attention layer, {} queries and keys with unit-variance entries (values \
             of size d_v = {FIXED_D_V}), a random loss on its output; autodiff gives every gradient with and without the scale on the same \
             {} draws, so each ratio below is paired.\n\n{plot}\n\n**Effect.** Softmax's derivative \
             (its Jacobian, the matrix diag(p) − ppᵀ) falls as the logits grow, but starts higher: \
             without the scale it is still {} times the scaled one at d_k = 64 (the scaled one is \
             small too: many nearly equal weights), {} at d_k = {}, and smaller only from d_k {} \
             on. But that derivative is multiplied by the unscaled logits' larger size: the gradient \
             on the scores is {}× and the gradient reaching Q (and W_Q) {}× the scaled one at d_k = \
             64, growing with d_k ({}× at {}). Why {:.0}× and not {:.0}× (√64, the scale left out): the \
             gradient reaching Q is the score gradient times K, which the scale would also have \
             divided by √d_k, so the two factors multiply ({:.1} × {:.0} ≈ {:.0}).\n\n**Caveat.** The \
             attention gradient concentrates on a few keys without the scale (appendix, `gradients`): \
             the gradient does not vanish, it narrows. Where softmax's slope crosses the scaled one \
             depends on the number of keys m: {}. The key sweep measures {} conditions (m × d_k {}); \
             the verdict table counts the {} where q and k meet the premise (d_k ≥ {}, logits at \
             least as spread as in the article's example), with intervals family-wise over them.",
            data.n,
            data.draws,
            at_64.jacobian.show(2),
            last.jacobian.show(2),
            last.d,
            crossover,
            at_64.scores.show(1),
            at_64.query.show(1),
            last.query.show(0),
            last.d,
            at_64.query.value,
            (at_64.d as f64).sqrt(),
            at_64.scores.value,
            (at_64.d as f64).sqrt(),
            at_64.scores.value * (at_64.d as f64).sqrt(),
            by_keys,
            data.by_keys.len(),
            dims,
            super::claims::premise_rows(data).count(),
            PREMISE_MIN_D_K_UNIT_ENTRIES,
        ),
    );
    Ok(())
}
