//! `attention-map`'s claims and section.

use serde::Serialize;

use super::{AttentionMapConfig, AttentionMapResult, RandomMaps, TrainedMap};
use crate::article;
use crate::claims::{Claim, Source};
use crate::experiment::{Analysis, Measured};
use crate::stats::{Estimate, mean_ci, wilson};

/// What `render` draws.
#[derive(Debug, Clone, Serialize)]
pub struct AttentionMapData {
    /// The random maps.
    pub random: Option<RandomMaps>,
    /// Share of rows 4–7 with the twin as argmax (Wilson).
    pub random_share: Estimate,
    /// Mean weight on the twin (t-interval over draws).
    pub random_twin_weight: Estimate,
    /// The trained map.
    pub trained: Option<TrainedMap>,
    /// Per head: share of second-half rows with the twin as argmax (Wilson).
    pub trained_shares: Vec<Estimate>,
}

/// Claims and data.
pub fn analyze(
    cells: &[Measured<AttentionMapConfig, AttentionMapResult>],
) -> Analysis<AttentionMapData> {
    let mut data = AttentionMapData {
        random: None,
        random_share: wilson(0, 0),
        random_twin_weight: Estimate::point(f64::NAN, 0),
        trained: None,
        trained_shares: Vec::new(),
    };
    for c in cells {
        match &c.result {
            AttentionMapResult::Random(r) => {
                data.random_share = wilson(r.twin_hits, r.rows);
                data.random_twin_weight = mean_ci(&r.twin_weights);
                data.random = Some(r.clone());
            }
            AttentionMapResult::Trained(t) => {
                data.trained_shares = t.twin_hits.iter().map(|&h| wilson(h, t.rows)).collect();
                data.trained = Some(t.clone());
            }
        }
    }
    Analysis::new(claims(&data), data)
}

/// The claims.
pub fn claims(data: &AttentionMapData) -> Vec<Claim> {
    let best = data
        .trained_shares
        .iter()
        .copied()
        .max_by(|a, b| a.value.total_cmp(&b.value))
        .unwrap_or(wilson(0, 0));
    vec![
        Claim::above(
            "copies-attend-to-twins",
            Source::Article(&article::COPIES_POINT_AT_TWINS),
            "with random projections, a copied token puts its largest weight on its twin (most rows 4–7)",
            "share of rows 4–7 with the twin as argmax (Wilson interval), against ½",
            data.random_share,
            0.5,
        ),
        Claim::in_range(
            "random-maps-are-near-uniform",
            Source::Lab,
            "with random projections every row is close to uniform: the weight on the twin is about 1/8 (band ±0.05)",
            "mean weight on the twin (t-interval over draws)",
            data.random_twin_weight,
            0.075,
            0.175,
        ),
        Claim::above(
            "training-learns-matching",
            Source::Lab,
            "a model trained on match learns content matching: in its best head, over 90% of the second-half rows point at their twins",
            "share of rows with the twin as argmax, best head (Wilson interval)",
            best,
            0.9,
        ),
    ]
}
