//! The design of `training`, fixed before the run that uses it: the parts, their conditions and
//! arms, the seeds, the learning-rate grids, the budget and every threshold the claims use, each
//! with the reason beside it. Where an earlier full run informed a value, its comment says so
//! (the grids' upper ends, the budget's pilot); no value is chosen from the outcome of the
//! claims it decides.

use sdpa_model::{OptimizerKind, QkInit};
use serde::{Deserialize, Serialize};

use crate::measures::training::Arm;

/// Paired evaluation seeds per cell: 20, enough for an exact sign test to reach p < 0.001 when
/// one arm is slower in every pair (and for Wilson intervals of ±0.2 on a share).
pub const EVAL_SEEDS: usize = 20;
/// Tuning seeds per (arm, learning rate): never evaluation seeds (they start at
/// [`TUNING_SEED_OFFSET`]). Five, as issue 30 asked (the earlier design's two left the chosen
/// rates to chance where two rates were close): the tuning runs are also the learning-rate
/// sensitivity curves, so five seeds a point are what each curve's intervals rest on (the range
/// of five seeds is a 94% order-statistics interval for their median).
pub const TUNING_SEEDS: usize = 5;
/// Tuning seeds are `plan seed + TUNING_SEED_OFFSET + i`, evaluation seeds `plan seed + i`.
pub const TUNING_SEED_OFFSET: u64 = 10_000;
/// Adam's learning-rate grid: 7 rates, a factor √10 (rounded to 3) apart, from 1e-4 to 1e-1.
/// The earlier design's grid [1e-3, 3e-2] chose its top rate 1e-2 for most arms and an end of
/// the grid once, and the unscaled arm only tolerated 3e-3 where the scaled one took 1e-2
/// (issue 30): the grid is widened a factor 10 on each side, so that every arm's stable range
/// ends inside it (Wortsman et al. 2023 sweep the learning rate over three decades the same way).
/// A rate chosen at either end is still marked in the report.
pub const ADAM_LRS: [f64; 7] = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1];
/// SGD's (momentum 0.9), 7 rates the same factor apart around the earlier run's choice 0.3.
pub const SGD_LRS: [f64; 7] = [3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0];
/// The arms whose learning-rate curves issue 30 asks for at every initialization and every
/// d_k of [`Sizes::sweep_dims`] (the arms of the other parts are tuned on the same grid and
/// seeds, and their curves are shown too).
pub const SWEEP_ARMS: [Arm; 4] = [Arm::Scaled, Arm::Unscaled, Arm::InvDk, Arm::QkNorm];
/// The learning-rate sensitivity: a rate "trains well" for an arm when the median steps to 99%
/// over its tuning seeds are at most this factor times the arm's best median (Wortsman et al.
/// 2023 read the width of the rate range whose loss stays near the best in the same way). Two:
/// half the speed of the best rate, a difference no practitioner would call "as good". Fixed
/// before the sweep's first run.
pub const SENSITIVITY_FACTOR: f64 = 2.0;
/// The step budget of every run. Pilot runs (this design's model, unit-variance init, Adam
/// 3e-3, one seed per d_k) reached 99% in 20–70 steps scaled: 300 is at least 4× the slowest of
/// them, so an "extremely slow" arm (below) can show inside the budget. Sized by the report's
/// time budget too: a run stuck at d_k = 1024 costs ~10 s of one core, and the design trains
/// ~800 runs in ~13 minutes on 2 cores. The pilot was optimistic: evaluation runs of the
/// 1/√d_k arm take longer in some conditions, and where 4× their median exceeds the budget the
/// report says that only runs that never got there can show "extremely slow".
pub const BUDGET: usize = 300;
/// "Extremely slow" (极慢): the median over seeds of the paired ratio of steps to 99%
/// (unscaled / 1/√d_k) is at least this (a quarter of the speed: far more than "slower").
pub const SLOW_FACTOR: f64 = 4.0;
/// "Fails completely" (完全失效): a run whose held-out accuracy at the budget is below this
/// never learned the task to any useful degree (chance is 1/8; the target 0.99).
pub const FAILED_ACCURACY: f64 = 0.5;
/// The family-wise level of every claim (two-sided): Holm's correction for its tests and
/// Bonferroni for its intervals, across the claim's conditions.
pub const ALPHA: f64 = 0.05;
/// Margin of the equivalence claims ("trains as fast as"): the median paired ratio of steps to
/// 99% within a factor of 1.25 either way (a quarter more or fewer steps, whatever the arm's
/// speed). Disclosed change: until commit 18ac244 the margin was ±30 steps (three evaluations),
/// generous for an arm that needs 30 steps and strict for one that needs 200; issue 30 asked for
/// a ratio margin. 1.25 was chosen with the runs of commit 64d9de0 already seen (the report's
/// training runs are those same runs), so it is not a margin fixed before the data: each
/// equivalence condition also prints its outcome under the earlier ±30-step margin.
pub const EQUIVALENCE_RATIO: f64 = 1.25;
/// The article's own logit std at its example (§3.1: at d_k = 64 unit-variance q and k give
/// std 8 and "softmax is clearly saturated"): the premise's cutoff only where a run has no unit
/// init d_k 64 runs to measure it on. The premise itself (one rule for every claim, fixed by
/// the second confirmatory design, `training_confirm2::design::PREMISE`) is the article
/// example's own starting spread in the same run (`analyze::premise_std`); until that design
/// the cutoff was this 8, which left the example itself (std 7.4 in this model) out.
pub const SATURATED_LOGIT_STD: f64 = 8.0;
/// The soft-cap of the controls part (Gemma 2 uses 50 on scaled scores; unscaled scores at
/// d_k = 256 have std 16, so a cap of 5 is what actually bounds them).
pub const SOFTCAP: f64 = 5.0;
/// "Close to 1" in the article's premise: within a factor of 2.
pub const PREMISE_FACTOR: f64 = 2.0;

/// The parts of the design.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Part {
    /// 1/√d_k vs none, Adam, both initializations, d_k 16–1024: the article's question.
    Main,
    /// 1/d_k and a learned temperature beside them, d_k 64 and 256.
    Temperature,
    /// Soft-cap and QK-norm beside them, d_k 256, unit-variance init.
    Controls,
    /// The main comparison with SGD (secondary: its update follows the gradient's size).
    Sgd,
    /// The intervention: unscaled attention whose W_Q, W_K start × d_k^(−1/4) (its logits start
    /// as the scaled arm's) beside 1/√d_k and none; and 1/√d_k attention whose W_Q, W_K start ×
    /// d_k^(1/4) (its logits start as the unscaled arm's), at 1/√d_k's rate.
    Intervention,
}

impl Part {
    /// Every part, in report order.
    pub const ALL: [Part; 5] = [
        Part::Main,
        Part::Temperature,
        Part::Controls,
        Part::Sgd,
        Part::Intervention,
    ];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Part::Main => "main",
            Part::Temperature => "temperature",
            Part::Controls => "controls",
            Part::Sgd => "sgd",
            Part::Intervention => "intervention",
        }
    }
}

/// One condition: everything but the arm and the seed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Condition {
    /// Optimizer.
    pub optimizer: OptimizerKind,
    /// Initialization of the query and key projections.
    pub init: QkInit,
    /// d_k.
    pub d_k: usize,
}

impl Condition {
    /// The condition a run's spec belongs to.
    pub fn of(spec: &crate::measures::training::TrainingSpec) -> Self {
        Self {
            optimizer: spec.optimizer,
            init: spec.init,
            d_k: spec.d_k,
        }
    }
}

/// A comparison of two arms on paired seeds: `other` against `reference`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// The part it belongs to.
    pub part: Part,
    /// The condition.
    pub condition: Condition,
    /// The reference arm.
    pub reference: Arm,
    /// The other arm.
    pub other: Arm,
}

/// Sizes of a run of the design.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sizes {
    /// Evaluation seeds.
    pub eval_seeds: usize,
    /// Tuning seeds.
    pub tuning_seeds: usize,
    /// Budget.
    pub budget: usize,
    /// d_k of the main part.
    pub main_dims: Vec<usize>,
    /// d_k of the temperature part.
    pub side_dims: Vec<usize>,
    /// d_k of the SGD part.
    pub sgd_dims: Vec<usize>,
    /// d_k of the controls part.
    pub controls_dim: usize,
    /// d_k of the intervention part.
    pub intervention_dims: Vec<usize>,
    /// d_k where every arm of [`SWEEP_ARMS`] is tuned (its learning-rate curve), both
    /// initializations, Adam.
    pub sweep_dims: Vec<usize>,
    /// Adam's grid.
    pub adam_lrs: Vec<f64>,
    /// SGD's grid.
    pub sgd_lrs: Vec<f64>,
}

impl Sizes {
    /// The full design, or the quick one (same parts and claims, smaller: most claims are
    /// undecided there and the report says so).
    pub fn new(quick: bool) -> Self {
        if quick {
            Self {
                eval_seeds: 4,
                tuning_seeds: 1,
                budget: 100,
                main_dims: vec![16, 64],
                side_dims: vec![64],
                sgd_dims: vec![64],
                controls_dim: 64,
                intervention_dims: vec![64],
                sweep_dims: vec![16],
                adam_lrs: vec![3e-3, 1e-2],
                sgd_lrs: vec![0.1],
            }
        } else {
            Self {
                eval_seeds: EVAL_SEEDS,
                tuning_seeds: TUNING_SEEDS,
                budget: BUDGET,
                main_dims: vec![16, 64, 256, 1024],
                side_dims: vec![64, 256],
                // SGD is the secondary optimizer: one d_k, where the earlier report's "unscaled is
                // better" came from (a shared learning rate); 256 would cost ~2 minutes more.
                sgd_dims: vec![64],
                controls_dim: 256,
                // Where the unscaled logits start saturated at unit init (std 8 and 16) and
                // where they do not at Burn's default init; 1024 would cost ~3 minutes more.
                intervention_dims: vec![64, 256],
                // Three d_k, as issue 30 asks, spanning the main part's range but for 1024
                // (whose four main arms are tuned on the same grid: its curves are shown too).
                sweep_dims: vec![16, 64, 256],
                adam_lrs: ADAM_LRS.to_vec(),
                sgd_lrs: SGD_LRS.to_vec(),
            }
        }
    }

    /// The learning-rate grid of an optimizer.
    pub fn lrs(&self, optimizer: OptimizerKind) -> &[f64] {
        match optimizer {
            OptimizerKind::Adam => &self.adam_lrs,
            OptimizerKind::Sgd => &self.sgd_lrs,
        }
    }

    /// Every comparison of the design.
    pub fn comparisons(&self) -> Vec<Comparison> {
        use Arm::*;
        let mut out = Vec::new();
        let mut push = |part, optimizer, init, d_k, pairs: &[(Arm, Arm)]| {
            for &(reference, other) in pairs {
                out.push(Comparison {
                    part,
                    condition: Condition {
                        optimizer,
                        init,
                        d_k,
                    },
                    reference,
                    other,
                });
            }
        };
        let adam = OptimizerKind::Adam;
        for init in [QkInit::Default, QkInit::Unit] {
            for &d_k in &self.main_dims {
                push(Part::Main, adam, init, d_k, &[(Scaled, Unscaled)]);
            }
        }
        for init in [QkInit::Default, QkInit::Unit] {
            for &d_k in &self.side_dims {
                push(
                    Part::Temperature,
                    adam,
                    init,
                    d_k,
                    &[(Scaled, InvDk), (Scaled, Learned), (Unscaled, Learned)],
                );
            }
        }
        push(
            Part::Controls,
            adam,
            QkInit::Unit,
            self.controls_dim,
            &[
                (Scaled, SoftCap(SOFTCAP)),
                (Scaled, QkNorm),
                (Scaled, QkNormScaled),
                (Unscaled, QkNorm),
            ],
        );
        for &d_k in &self.sgd_dims {
            push(
                Part::Sgd,
                OptimizerKind::Sgd,
                QkInit::Unit,
                d_k,
                &[(Scaled, Unscaled)],
            );
        }
        for init in [QkInit::Default, QkInit::Unit] {
            for &d_k in &self.intervention_dims {
                push(
                    Part::Intervention,
                    adam,
                    init,
                    d_k,
                    &[
                        (Scaled, UnscaledSmallInit),
                        (Unscaled, UnscaledSmallInit),
                        (Scaled, ScaledLargeInit),
                    ],
                );
            }
        }
        out
    }

    /// Every (condition, arm) that is tuned: the evaluated ones ([`Sizes::arms`]) and the
    /// learning-rate curves' ([`SWEEP_ARMS`] at [`Sizes::sweep_dims`]), once each.
    pub fn tuned_arms(&self) -> Vec<(Condition, Arm)> {
        // An arm that trains at another arm's rate is not tuned itself.
        let mut out: Vec<(Condition, Arm)> = self
            .arms()
            .into_iter()
            .filter(|(_, arm)| arm.rate_arm() == *arm)
            .collect();
        for init in [QkInit::Default, QkInit::Unit] {
            for &d_k in &self.sweep_dims {
                for arm in SWEEP_ARMS {
                    let condition = Condition {
                        optimizer: OptimizerKind::Adam,
                        init,
                        d_k,
                    };
                    if !out.contains(&(condition, arm)) {
                        out.push((condition, arm));
                    }
                }
            }
        }
        out
    }

    /// Every (condition, arm) that is evaluated, once each, in a stable order.
    pub fn arms(&self) -> Vec<(Condition, Arm)> {
        let mut out: Vec<(Condition, Arm)> = Vec::new();
        for c in self.comparisons() {
            for arm in [c.reference, c.other] {
                if !out.contains(&(c.condition, arm)) {
                    out.push((c.condition, arm));
                }
            }
        }
        out
    }
}
