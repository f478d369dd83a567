//! `attention-map`'s section: tables, CSV and plots from the analysis.

use super::analyze::*;
use crate::claims::show;
use crate::context::LabError;
use crate::experiment::Canvas;
use crate::markdown::{f, md_table};

/// Every draw behind the section's intervals: each random draw's hits (of rows 4–7) and mean
/// weight on the twin, each trained model's best head, and the first model's heads.
fn write_draws(data: &AttentionMapData, canvas: &mut Canvas) -> Result<(), LabError> {
    let mut lines = Vec::new();
    if let Some(r) = &data.random {
        for (i, &hits) in r.hits_per_draw.iter().enumerate() {
            let weight = r.twin_weights.get(i).map_or(f64::NAN, |w| *w);
            lines.push(format!(
                "random draw,{i},{hits},4,{},{weight}",
                hits as f64 / 4.0
            ));
        }
    }
    for (i, share) in data.trained_best.iter().enumerate() {
        lines.push(format!("trained model's best head,{i},,,{share},"));
    }
    if let Some(t) = &data.trained {
        for (head, &hits) in t.twin_hits.iter().enumerate() {
            lines.push(format!(
                "first trained model's head,{head},{hits},{},{},",
                t.rows,
                hits as f64 / t.rows.max(1) as f64
            ));
        }
    }
    canvas.csv(
        "attention_map_draws.csv",
        "part,index,twin_hits,rows,share,mean_twin_weight",
        &lines,
    )?;
    Ok(())
}

/// The section.
pub fn render(data: &AttentionMapData, canvas: &mut Canvas) -> Result<String, LabError> {
    write_draws(data, canvas)?;
    let mut out = String::new();
    if let Some(r) = &data.random {
        let mut headers = vec![String::new()];
        headers.extend((0..8).map(|j| j.to_string()));
        let h: Vec<&str> = headers.iter().map(|s| s.as_str()).collect();
        let rows: Vec<Vec<String>> = r
            .first
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let mut cells = vec![format!("t{i}")];
                cells.extend(row.iter().map(|v| f(*v, 2)));
                cells
            })
            .collect();
        let plot = canvas.heatmap(
            "attention_map_random.png",
            &format!(
                "One draw; rows 4–7: twin on top in {:.0}% over {} draws (chance 25%)",
                100.0 * data.random_share.value,
                r.draws
            ),
            &r.first,
            "key",
            "query",
        )?;
        out.push_str(&format!(
            "**The article's setup.** 8 tokens of width 32 (x ~ N(0, 0.5²)), tokens 4–7 copies of 0–3, Q, K \
             from two independent random `nn.Linear(32, 32)` (PyTorch's default init), softmax of QKᵀ/√32. One \
             draw:\n\n{}\n{plot}\n\nOver {} draws: the share of rows 4–7 whose largest weight is on their twin \
             (or on themselves, whose key is identical) is {} (mean over draws with its t-interval; chance would give 25%), and the mean \
             weight of a row on its twin is {} (t-interval over draws; uniform is 0.125). q_i·k_j = x_iᵀW_QᵀW_K x_j \
             with *independent* random W_Q, W_K is not largest at x_j = x_i unless W_QᵀW_K is positive definite, \
             which training can learn; a copy is never *preferred* to itself: columns i and i − 4 always get the \
             same weight.\n\n",
            md_table(&h, &rows),
            r.draws,
            show(data.random_share),
            show(data.random_twin_weight),
        ));
    }
    if let Some(t) = &data.trained {
        let plot = canvas.heatmap(
            "attention_map_trained.png",
            &format!("Trained on match, head {}", t.head),
            &t.weights,
            "key",
            "query",
        )?;
        out.push_str(&format!(
            "**Trained models.** The default model (2 heads) trained on *match*, {} seeds; the best head's share \
             of second-half rows whose largest weight is on their twin, per model: {} (mean {}, t-interval over \
             models). The first model ({} steps, held-out accuracy {}), per head (Wilson 95% over a held-out \
             batch): {}. Its head {} on one held-out sequence (tokens {:?}; rows 8–15 are the second half, their \
             twins are in columns 0–7):\n\n{plot}\n",
            data.trained_best.len(),
            data.trained_best.iter().map(|x| f(*x, 3)).collect::<Vec<_>>().join(", "),
            show(data.trained_best_mean),
            t.steps,
            f(t.accuracy, 4),
            data.trained_shares.iter().map(|s| show(*s)).collect::<Vec<_>>().join(", "),
            t.head,
            t.tokens,
        ));
    }
    Ok(out)
}
