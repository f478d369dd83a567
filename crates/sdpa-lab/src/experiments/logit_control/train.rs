//! `logit-control` in training: the default model on *match* with each control, every seed, and
//! the time to 99% held-out accuracy.

use serde::Serialize;

use super::control::Control;
use crate::context::{LabBackend, LabError};
use crate::experiments::training::{Comparison, compare_runs, lab_run, match_config};
use crate::stats::{Estimate, diff_ci, mean_ci, wilson};

/// One training run.
#[derive(Debug, Clone, Serialize)]
pub struct ControlRun {
    /// d_k per head.
    pub d_k: usize,
    /// The control.
    pub control: Control,
    /// Seed.
    pub seed: u64,
    /// First evaluation step at or above the target, if reached.
    pub steps_to_target: Option<usize>,
    /// Final held-out accuracy (NaN for a run that diverged).
    pub final_accuracy: f64,
    /// The step at which the run diverged, if it did (it then never reached the target).
    pub diverged_at: Option<usize>,
    /// Wall time (s).
    pub seconds: f64,
}

/// One (d_k, control) cell over its seeds.
#[derive(Debug, Clone, Serialize)]
pub struct ControlCell {
    /// d_k.
    pub d_k: usize,
    /// The control.
    pub control: Control,
    /// Share of seeds at the target (Wilson 95%).
    pub success: Estimate,
    /// Mean steps to the target, the budget for a run that never got there (t 95%).
    pub capped_steps: Estimate,
    /// The steps to the target of every seed (the budget when never reached).
    pub capped: Vec<f64>,
    /// Mean steps minus 1/√d_k's at the same d_k (Welch 95%).
    pub steps_minus_scaled: Estimate,
    /// Against 1/√d_k at the same d_k.
    pub versus_scaled: Comparison,
}

/// Trains one (d_k, control, seed) run of `steps` steps, evaluated every `eval_every`.
pub fn run(
    backend: &LabBackend,
    root: &std::path::Path,
    (d_k, control, seed): (usize, Control, u64),
    steps: usize,
    eval_every: usize,
) -> Result<ControlRun, LabError> {
    let mut config = match_config(d_k, seed, steps, eval_every);
    config.model.scale = control.scale();
    config.model.softcap = control.softcap();
    config.model.qk_norm = control.qk_norm();
    let summary = lab_run(
        &config,
        backend,
        root.join(format!("dk{d_k}-{}-s{seed}", control.slug())),
    )?;
    Ok(ControlRun {
        d_k,
        control,
        seed,
        steps_to_target: summary.steps_to_target,
        final_accuracy: summary.final_eval_accuracy,
        diverged_at: summary.diverged_at,
        seconds: summary.time_s,
    })
}

/// The cells of the runs, each compared with 1/√d_k at its d_k.
pub fn cells(
    runs: &[ControlRun],
    train_cells: &[(usize, Control)],
    steps: usize,
) -> Vec<ControlCell> {
    let stats = |d_k: usize, control: Control| {
        let rs: Vec<&ControlRun> = runs
            .iter()
            .filter(|r| r.d_k == d_k && r.control == control)
            .collect();
        let reached = rs.iter().filter(|r| r.steps_to_target.is_some()).count();
        let capped: Vec<f64> = rs
            .iter()
            .map(|r| r.steps_to_target.unwrap_or(steps) as f64)
            .collect();
        (wilson(reached, rs.len()), mean_ci(&capped), capped)
    };
    train_cells
        .iter()
        .map(|&(d_k, control)| {
            let (ref_success, ref_steps, ref_capped) = stats(d_k, Control::Scaled);
            let (success, capped_steps, capped) = stats(d_k, control);
            ControlCell {
                d_k,
                control,
                success,
                capped_steps,
                steps_minus_scaled: diff_ci(&capped, &ref_capped),
                capped,
                versus_scaled: compare_runs((ref_success, ref_steps), (success, capped_steps)),
            }
        })
        .collect()
}
