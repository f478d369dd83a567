//! `masks`'s section: tables, CSV and plots from the analysis.

use super::SCORES;
use super::analyze::*;
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::markdown::md_table;

/// The section.
pub fn render(data: &MasksData, canvas: &mut Canvas) -> Result<String, LabError> {
    if let Some(r) = data
        .cells
        .iter()
        .find(|c| c.dtype == "f16")
        .and_then(|c| find(c, "-1e9", 1, false))
    {
        canvas.key_number(
            "minus-1e9-overflows-f16",
            format!(
                "−1e9 in f16 reads {} (appendix, [masks](APPENDIX.md#masks))",
                r.masked_score
            ),
        );
    }
    let rows: Vec<Vec<String>> = data
        .cells
        .iter()
        .flat_map(|c| {
            c.result.rows.iter().map(move |r| {
                vec![
                    c.backend.clone(),
                    c.dtype.clone(),
                    r.fill.clone(),
                    r.n_masks.to_string(),
                    if r.fully_masked {
                        "fully masked"
                    } else {
                        "2 of 4 masked"
                    }
                    .into(),
                    r.masked_score.clone(),
                    r.softmax.clone(),
                    r.module_bias.clone(),
                    r.module_bool.clone(),
                ]
            })
        })
        .collect();
    let table = md_table(
        &[
            "backend",
            "dtype",
            "fill",
            "masks added",
            "row",
            "masked score becomes",
            "plain softmax",
            "module, additive mask as bias",
            "module, bool mask",
        ],
        &rows,
    );
    canvas.csv(
        "masks.csv",
        "backend,dtype,fill,n_masks,fully_masked,masked_score,softmax,module_bias,module_bool",
        &rows
            .iter()
            .map(|r| {
                r.iter()
                    .map(|c| format!("\"{c}\""))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect::<Vec<_>>(),
    )?;
    Ok(format!(
        "Logits {SCORES:?} for 4 keys; \"2 of 4 masked\" hides keys 2 and 3, \"fully masked\" hides all. The \
         additive mask is built in the dtype, as a model in that precision would hold it, and \"masks added\" = 2 \
         adds it to itself (e.g. a causal and a padding mask). The module sees the same row through d_k = 1, \
         q = 1, k = the logits and V = I, so that its context is its weights. The article's causal example \
         (`torch.triu(ones · −inf, diagonal=1)`) and its softmax([5.0, −1e9]) are checked in every dtype as \
         well.\n\n{table}"
    ))
}
