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
    /// Share of rows 4–7 with the twin as argmax: mean over draws of a draw's share, with its
    /// t-interval over draws (the rows of one draw share its projections).
    pub random_share: Estimate,
    /// Mean weight on the twin (t-interval over draws).
    pub random_twin_weight: Estimate,
    /// The first trained model's map (the plot).
    pub trained: Option<TrainedMap>,
    /// The first trained model, per head: share of second-half rows with the twin as argmax
    /// (Wilson over its rows).
    pub trained_shares: Vec<Estimate>,
    /// Per trained model (seed): its best head's share.
    pub trained_best: Vec<f64>,
    /// Their mean with its t-interval over models.
    pub trained_best_mean: Estimate,
}

/// Claims and data.
pub fn analyze(
    cells: &[Measured<AttentionMapConfig, AttentionMapResult>],
) -> Analysis<AttentionMapData> {
    let mut data = AttentionMapData {
        random: None,
        random_share: Estimate::point(f64::NAN, 0),
        random_twin_weight: Estimate::point(f64::NAN, 0),
        trained: None,
        trained_shares: Vec::new(),
        trained_best: Vec::new(),
        trained_best_mean: Estimate::point(f64::NAN, 0),
    };
    for c in cells {
        match &c.result {
            AttentionMapResult::Random(r) => {
                data.random_share = mean_ci(
                    &r.hits_per_draw
                        .iter()
                        .map(|&h| h as f64 / 4.0)
                        .collect::<Vec<_>>(),
                );
                data.random_twin_weight = mean_ci(&r.twin_weights);
                data.random = Some(r.clone());
            }
            AttentionMapResult::Trained(t) => {
                let best = t.twin_hits.iter().copied().max().unwrap_or(0);
                data.trained_best.push(best as f64 / t.rows.max(1) as f64);
                if data.trained.is_none() {
                    data.trained_shares = t.twin_hits.iter().map(|&h| wilson(h, t.rows)).collect();
                    data.trained = Some(t.clone());
                }
            }
        }
    }
    // A share: its t-interval cut to [0, 1].
    let share = |e: Estimate| Estimate {
        lo: e.lo.max(0.0),
        hi: e.hi.min(1.0),
        ci90: e.ci90.map(|(lo, hi)| (lo.max(0.0), hi.min(1.0))),
        ..e
    };
    data.random_share = share(data.random_share);
    data.trained_best_mean = share(mean_ci(&data.trained_best));
    Analysis::new(claims(&data), data)
}

/// The claims.
pub fn claims(data: &AttentionMapData) -> Vec<Claim> {
    vec![
        Claim::above(
            "copies-attend-to-twins",
            Source::Article(&article::COPIES_POINT_AT_TWINS),
            "with random projections, a copied token puts its largest weight on its twin (most rows 4–7)",
            "share of rows 4–7 with the twin as argmax, mean over draws (t-interval over draws), against ½",
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
            "the best head's share of rows with the twin as argmax, mean over the trained models (t-interval over \
             models: the rows of one model are not independent)",
            data.trained_best_mean,
            0.9,
        ),
    ]
}
