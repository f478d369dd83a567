//! `training`'s initial-logit mechanism: per initialization and arm, Spearman's ρ between a
//! run's initial logit std and its steps to 99%, with a seed-clustered bootstrap interval.

use serde::Serialize;

use super::{Role, Run};
use crate::measures::training::{Arm, TrainingOutcome};
use crate::stats::{Estimate, bonferroni_level, cluster_bootstrap, spearman_rho};

/// Bootstrap resamples of the mechanism's interval, and the stream's seed.
const BOOTSTRAP: (usize, u64) = (2000, 7);

pub(super) fn mechanism(cells: &[Run]) -> Vec<Mechanism> {
    let groups: Vec<(sdpa_model::QkInit, Arm)> =
        [sdpa_model::QkInit::Default, sdpa_model::QkInit::Unit]
            .into_iter()
            .flat_map(|init| [(init, Arm::Scaled), (init, Arm::Unscaled)])
            .collect();
    let level = bonferroni_level(0.95, groups.len());
    let mut out = Vec::new();
    for (init, arm) in groups.iter().copied() {
        let rs: Vec<&Run> = cells
            .iter()
            .filter(|r| {
                let s = &r.config.spec;
                r.config.role == Role::Evaluation
                    && s.init == init
                    && s.optimizer == sdpa_model::OptimizerKind::Adam
                    && s.arm == arm
            })
            .collect();
        if rs.len() <= 3 {
            continue;
        }
        let x: Vec<f64> = rs.iter().map(|r| r.result.initial.logit_std).collect();
        let y: Vec<f64> = rs.iter().map(|r| time(&r.result)).collect();
        let mut seeds: Vec<u64> = rs.iter().map(|r| r.config.spec.seed).collect();
        seeds.sort_unstable();
        seeds.dedup();
        // The runs of one seed share its batches: they are resampled together.
        let clusters: Vec<Vec<usize>> = seeds
            .iter()
            .map(|&seed| {
                (0..rs.len())
                    .filter(|&i| rs[i].config.spec.seed == seed)
                    .collect()
            })
            .collect();
        let statistic = |idx: &[usize]| {
            let pick = |v: &[f64]| idx.iter().map(|&i| v[i]).collect::<Vec<_>>();
            spearman_rho(&pick(&x), &pick(&y))
        };
        let (lo, hi) = cluster_bootstrap(&clusters, &statistic, BOOTSTRAP.0, BOOTSTRAP.1, level);
        out.push(Mechanism {
            init: crate::measures::training::init_name(init).into(),
            arm,
            rho: Estimate {
                value: spearman_rho(&x, &y),
                lo,
                hi,
                n: rs.len(),
                ci90: None,
            },
        });
    }
    out
}

/// The rank correlation of the initial logit std with the steps to the target (a run that
/// never got there ranked last) within one arm of the main part, over its d_k and seeds.
#[derive(Debug, Clone, Serialize)]
pub struct Mechanism {
    /// The initialization.
    pub init: String,
    /// The arm.
    pub arm: Arm,
    /// Spearman's ρ with its family-wise 95% interval (Bonferroni over the mechanism's
    /// conditions), a percentile bootstrap over seeds (a seed's runs resampled together).
    pub rho: Estimate,
}

/// Steps to the target, +∞ for a run that never got there.
pub(super) fn time(o: &TrainingOutcome) -> f64 {
    o.steps_to_target.map_or(f64::INFINITY, |s| s as f64)
}
