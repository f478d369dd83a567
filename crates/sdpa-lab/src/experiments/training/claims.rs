//! The claims of `training`, decided by its cells.

use super::{
    ADAM_LRS, Cell, Comparison, Condition, Part, SGD_LRS, SWEEP_D_K, TrainingGrid, compare,
    opt_name,
};
use crate::claims::{Claim, Source, show};

/// The claims of `training`, decided by its cells.
pub fn claims(grid: &TrainingGrid, cells: &[Cell]) -> Vec<Claim> {
    let pair = |c: &Condition| {
        let find = |scaled| {
            cells
                .iter()
                .find(|x| x.condition == *c && x.scaled == scaled)
        };
        find(true).zip(find(false))
    };
    let describe = |c: &Condition, s: &Cell, u: &Cell| {
        format!(
            "{} lr {} d_k {}{}: reached {} vs {}, steps {} vs {}",
            opt_name(c.optimizer),
            c.lr,
            c.d_k,
            if c.layer_norm { "" } else { " no-LN" },
            show(s.success),
            show(u.success),
            show(s.capped_steps),
            show(u.capped_steps)
        )
    };
    let verdict_of = |conds: Vec<&Condition>, want: Comparison| -> (Option<bool>, String) {
        let pairs: Vec<(&Condition, &Cell, &Cell)> = conds
            .into_iter()
            .filter_map(|c| pair(c).map(|(s, u)| (c, s, u)))
            .collect();
        if pairs.is_empty() {
            return (None, "not run (quick)".into());
        }
        let outcomes: Vec<Comparison> = pairs.iter().map(|(_, s, u)| compare(s, u)).collect();
        let holds = if outcomes.iter().all(|o| *o == want) {
            Some(true)
        } else if outcomes
            .iter()
            .any(|o| *o != want && *o != Comparison::NoClearDifference)
        {
            Some(false)
        } else {
            None
        };
        (
            holds,
            pairs
                .iter()
                .map(|(c, s, u)| describe(c, s, u))
                .collect::<Vec<_>>()
                .join("; "),
        )
    };
    // Each optimizer at the largest d_k it trains at.
    let largest: Vec<&Condition> = grid
        .conditions
        .iter()
        .filter(|c| {
            c.part == Part::Main
                && grid
                    .conditions
                    .iter()
                    .filter(|o| o.part == Part::Main && o.optimizer == c.optimizer)
                    .all(|o| o.d_k <= c.d_k)
        })
        .collect();
    let sizes = largest
        .iter()
        .map(|c| format!("{} d_k = {}", opt_name(c.optimizer), c.d_k))
        .collect::<Vec<_>>()
        .join(", ");
    let (holds, measured) = verdict_of(largest, Comparison::UnscaledWorse);
    let mut claims = vec![Claim::decided(
        "unscaled-trains-worse",
        Source::Article("§4"),
        format!(
            "without √d_k, training is slower or fails (each optimizer at its largest d_k: {sizes})"
        ),
        "for each optimizer: unscaled success-rate (Wilson) or mean-steps (t) interval entirely worse than scaled",
        measured,
        holds,
    )];
    let all: Vec<&Condition> = grid.conditions.iter().collect();
    let better: Vec<String> = all
        .iter()
        .filter_map(|c| {
            pair(c)
                .filter(|(s, u)| compare(s, u) == Comparison::UnscaledBetter)
                .map(|(s, u)| describe(c, s, u))
        })
        .collect();
    claims.push(Claim::decided(
        "unscaled-never-better",
        Source::Lab,
        "unscaled is never significantly better than scaled, in any cell",
        "no cell with UnscaledBetter (both directions are tested in every cell)",
        if better.is_empty() {
            format!("{} cells, none better", all.len())
        } else {
            better.join("; ")
        },
        Some(better.is_empty()),
    ));
    let d_min = grid.conditions.iter().map(|c| c.d_k).min().unwrap_or(0);
    let main_at_min: Vec<&Condition> = grid
        .conditions
        .iter()
        .filter(|c| c.part == Part::Main && c.d_k == d_min)
        .collect();
    let (holds, measured) = verdict_of(main_at_min, Comparison::NoClearDifference);
    claims.push(Claim::decided(
        "small-dk-no-difference",
        Source::Lab,
        format!("at the smallest d_k ({d_min}) scaling makes no clear difference"),
        "for each optimizer: the scaled and unscaled intervals overlap",
        measured,
        holds,
    ));
    let lowest_lr: Vec<&Condition> = grid
        .conditions
        .iter()
        .filter(|c| c.part == Part::LearningRate && (c.lr == ADAM_LRS[0] || c.lr == SGD_LRS[0]))
        .collect();
    let (holds, measured) = verdict_of(lowest_lr, Comparison::UnscaledWorse);
    claims.push(Claim::decided(
        "not-a-step-size-artifact",
        Source::Lab,
        format!("unscaled's trouble is not a too-large step: at the smallest learning rate it is still worse (d_k = {SWEEP_D_K})"),
        "for each optimizer at its smallest lr: unscaled interval entirely worse than scaled",
        measured,
        holds,
    ));
    let no_ln: Vec<&Condition> = grid
        .conditions
        .iter()
        .filter(|c| c.part == Part::NoLayerNorm && c.d_k == 256)
        .collect();
    let (holds, measured) = verdict_of(no_ln, Comparison::UnscaledWorse);
    claims.push(Claim::decided(
        "without-layernorm-too",
        Source::Lab,
        "without LayerNorm, unscaled is still worse (d_k = 256)",
        "unscaled interval entirely worse than scaled",
        measured,
        holds,
    ));
    claims
}
