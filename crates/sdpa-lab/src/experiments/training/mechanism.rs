//! `training`'s initial-logit mechanism: per initialization, arm and d_k, Spearman's ρ between a
//! run's initial logit std and its steps to 99% over the evaluation seeds, with a bootstrap
//! interval. Within one d_k, so that the association is not carried by the differences between
//! d_k values (which change far more than the logit std); the intervention arm
//! (`Arm::UnscaledSmallInit`) is the causal test beside it.

use serde::Serialize;

use super::{Role, Run};
use crate::measures::training::{Arm, TrainingOutcome};
use crate::stats::{Estimate, bonferroni_level, cluster_bootstrap, spearman_rho};

/// Bootstrap resamples of the mechanism's interval, and the stream's seed.
const BOOTSTRAP: (usize, u64) = (2000, 7);

pub(super) fn mechanism(cells: &[Run], dims: &[usize]) -> Vec<Mechanism> {
    let groups: Vec<(sdpa_model::QkInit, Arm, usize)> =
        [sdpa_model::QkInit::Default, sdpa_model::QkInit::Unit]
            .into_iter()
            .flat_map(|init| {
                dims.iter()
                    .flat_map(move |&d_k| [(init, Arm::Scaled, d_k), (init, Arm::Unscaled, d_k)])
            })
            .collect();
    let level = bonferroni_level(0.95, groups.len());
    let mut out = Vec::new();
    for (init, arm, d_k) in groups.iter().copied() {
        let rs: Vec<&Run> = cells
            .iter()
            .filter(|r| {
                let s = &r.config.spec;
                r.config.role == Role::Evaluation
                    && s.init == init
                    && s.optimizer == sdpa_model::OptimizerKind::Adam
                    && s.arm == arm
                    && s.d_k == d_k
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
        // One run per seed here; the clusters keep the resampling by seed should a group ever
        // hold several runs of one seed.
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
            d_k,
            logit_std_cv: crate::stats::std(&x) / crate::stats::mean(&x),
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
/// never got there ranked last) within one arm and d_k of the main part, over its seeds.
#[derive(Debug, Clone, Serialize)]
pub struct Mechanism {
    /// The initialization.
    pub init: String,
    /// The arm.
    pub arm: Arm,
    /// d_k.
    pub d_k: usize,
    /// The coefficient of variation of the initial logit std over the seeds: how much the
    /// association has to work with (within one d_k, little).
    pub logit_std_cv: f64,
    /// Spearman's ρ with its family-wise 95% interval (Bonferroni over the mechanism's
    /// conditions), a percentile bootstrap over seeds.
    pub rho: Estimate,
}

/// Steps to the target, +∞ for a run that never got there.
pub(super) fn time(o: &TrainingOutcome) -> f64 {
    o.steps_to_target.map_or(f64::INFINITY, |s| s as f64)
}
