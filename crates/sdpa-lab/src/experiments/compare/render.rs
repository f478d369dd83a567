//! `compare`'s section: tables, CSV and plots from the analysis.

use super::SHAPE;
use super::analyze::*;
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::markdown::md_table;

/// The section.
pub fn render(data: &CompareData, canvas: &mut Canvas) -> Result<String, LabError> {
    let table = md_table(
        &[
            "backend",
            "our path (Auto)",
            "ours vs Burn attention",
            "ours vs hand-written",
            "Burn vs hand-written",
            "ours vs hand-written (no mask)",
            "change at positions 0–4",
            "change at positions 5–7",
        ],
        &data
            .rows
            .iter()
            .map(|(b, r)| {
                vec![
                    b.clone(),
                    format!("`{}`", r.ours_path),
                    sci(r.ours_vs_burn),
                    sci(r.ours_vs_naive),
                    sci(r.burn_vs_naive),
                    sci(r.ours_vs_naive_unmasked),
                    sci(r.causal_early_change),
                    sci(r.causal_late_change),
                ]
            })
            .collect::<Vec<_>>(),
    );
    canvas.csv(
        "compare.csv",
        "backend,ours_path,ours_vs_burn,ours_vs_naive,burn_vs_naive,ours_vs_naive_unmasked,causal_early_change,causal_late_change",
        &data
            .rows
            .iter()
            .map(|(b, r)| {
                format!(
                    "{b},{},{},{},{},{},{},{}",
                    r.ours_path,
                    r.ours_vs_burn,
                    r.ours_vs_naive,
                    r.burn_vs_naive,
                    r.ours_vs_naive_unmasked,
                    r.causal_early_change,
                    r.causal_late_change
                )
            })
            .collect::<Vec<_>>(),
    )?;
    let [b, h, s, d] = SHAPE;
    Ok(format!(
        "b, h, seq, d = {b}, {h}, {s}, {d} as in the article; causal masking (n = m, so both alignments agree). \
         The article compares its hand-written attention with PyTorch's `F.scaled_dot_product_attention` and \
         prints \"完全一致\" (identical); here the built-in is Burn's `burn::tensor::module::attention`, and \
         \"ours\" is the module on the path `Auto` takes (the fused kernel of the backend where one serves \
         the call, named in the table), so our kernel's own computation is among those compared. The \
         causality check, through the same path, replaces the values after position 5 by 100× noise and compares the outputs before \
         and after.\n\n{table}"
    ))
}
