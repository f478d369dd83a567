//! The design of `training-variants`, fixed before its first run: the variants of the model,
//! the arms, the learning rates and seeds, the budgets and every threshold its claims use,
//! each with its reason. Where a pilot run informed a value, its comment says so; no value is
//! chosen from the outcome of a claim it decides.

use sdpa_model::{ModelConfig, QkInit, TaskConfig};
use serde::{Deserialize, Serialize};

use crate::measures::training::Arm;

/// d_k of every run: the article's own example (§3.1: "d_k = 64 时，点积 std 是 8"), where the
/// main part of `training` finds the unscaled arm slower at both initializations.
pub const D_K: usize = 64;
/// Burn's default initialization of W_Q and W_K: the one a Burn user gets.
pub const INIT: QkInit = QkInit::Default;
/// The arms: the article's question, 1/√d_k against none.
pub const ARMS: [Arm; 2] = [Arm::Scaled, Arm::Unscaled];
/// Adam's rates for this experiment's own tuning: the rates `training`'s sweep chose for these
/// two arms at this d_k (3e-3 and 1e-2, at both initializations), one grid step below and one
/// above. Not the sweep's 7 rates: the seq-128 variant's runs cost ~10 s each, and this
/// experiment must fit beside `training` in the report's 30 minutes. A rate chosen at an end of
/// the grid is marked in the report (the arm may be under-tuned there). Disclosed: the first run
/// of this experiment (at 83f95a1) had no 3e-2, and 1/√d_k chose its top rate 1e-2 in all four
/// variants while the unscaled arm had a rate above its choice; a reviewer found the asymmetry,
/// and 3e-2 was added before the report's run.
pub const LRS: [f64; 4] = [1e-3, 3e-3, 1e-2, 3e-2];
/// The rates this experiment's tuning ([`LRS`], [`TUNING_SEEDS`] seeds, `training`'s rule)
/// chose for every (variant, arm) in the report measured at commit 5a13d16 (`docs/report`
/// until the commit that added this table): the default report evaluates at them, and
/// `sdpa report --tune` tunes again (same seeds and rule, so the same choice on the same code)
/// and evaluates at what it chooses.
pub const COMMITTED_LRS: [(Variant, Arm, f64); 8] = [
    (Variant::Base, Arm::Scaled, 0.01),
    (Variant::Base, Arm::Unscaled, 0.003),
    (Variant::Long, Arm::Scaled, 0.01),
    (Variant::Long, Arm::Unscaled, 0.003),
    (Variant::NoLayerNorm, Arm::Scaled, 0.01),
    (Variant::NoLayerNorm, Arm::Unscaled, 0.003),
    (Variant::Deep, Arm::Scaled, 0.01),
    (Variant::Deep, Arm::Unscaled, 0.003),
];

/// The committed rate of (variant, arm) ([`COMMITTED_LRS`]).
pub fn committed_lr(variant: Variant, arm: Arm) -> Option<f64> {
    COMMITTED_LRS
        .iter()
        .find(|(v, a, _)| (*v, *a) == (variant, arm))
        .map(|e| e.2)
}

/// Tuning seeds per (variant, arm, rate): five, as issue 30 asks of every tuned rate; never
/// evaluation seeds.
pub const TUNING_SEEDS: usize = 5;
/// Paired evaluation seeds per (variant, arm): 12. The exact sign test gives p = 0.0005 when
/// every pair goes one way and 0.0063 at 11 to 1, which Holm over the four variants decides
/// at any step (its strictest level is 0.0125); 10 to 2 (p = 0.039) decides only as Holm's last
/// step. 20 as in `training` would cost ~4 minutes more of the report's 30, mostly at seq 128.
pub const EVAL_SEEDS: usize = 12;
/// Tuning seeds are `plan seed + TUNING_SEED_OFFSET + i`, evaluation seeds
/// `plan seed + EVAL_SEED_OFFSET + i`: apart from each other and from `training`'s seeds.
pub const TUNING_SEED_OFFSET: u64 = 20_000;
/// See [`TUNING_SEED_OFFSET`].
pub const EVAL_SEED_OFFSET: u64 = 30_000;
/// The family-wise level of every claim: Holm over the claim's variants, two-sided.
pub const ALPHA: f64 = 0.05;
/// "Before the model has learned": for a pair of runs, the recorded steps after the first update
/// and before the first step where either run's held-out accuracy reaches this (chance is 1/8
/// at seq 16 and 1/64 at seq 128; the target is 0.99). The attention's entropy over these steps
/// is what the entropy-collapse claim reads. Disclosed: in this experiment's first run (at
/// 83f95a1, with its claims seen) the window was each run's own, from step 0; the arm that
/// learns later then averages over more and later steps, where the entropy has fallen further,
/// and step 0 compares only the initializations. The pair's common window removes both.
pub const LEARNED_ACCURACY: f64 = 0.5;

/// One variant of the lab's training model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Variant {
    /// The main model of `training` (seq 16, one layer, one head, LayerNorm), with its
    /// attention recorded over the whole budget: the reference for the others.
    Base,
    /// *match* with k = 64: 128 tokens, 64 classes (vocabulary 256, so the 64 distinct tokens
    /// of a sequence are drawn from a larger set, as k = 8 of 64 are).
    Long,
    /// No LayerNorm anywhere (before attention, MLP or head): the attention's input is the raw
    /// embedding sum, whose scale training is free to change.
    NoLayerNorm,
    /// Two blocks of four heads (d_k = 64 each, d_v = 16 so the heads fill d_model = 64).
    Deep,
}

impl Variant {
    /// Every variant, in report order.
    pub const ALL: [Variant; 4] = [
        Variant::Base,
        Variant::Long,
        Variant::NoLayerNorm,
        Variant::Deep,
    ];

    /// File- and id-safe name.
    pub fn slug(self) -> &'static str {
        match self {
            Variant::Base => "base",
            Variant::Long => "seq128",
            Variant::NoLayerNorm => "no-layernorm",
            Variant::Deep => "2x4",
        }
    }

    /// As the report names it.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Base => "base model",
            Variant::Long => "seq 128",
            Variant::NoLayerNorm => "no LayerNorm",
            Variant::Deep => "2 layers × 4 heads",
        }
    }

    /// The step budget. 300 as in `training` at seq 16. At seq 128 a pilot (one seed each,
    /// this machine, before this design: 1/√d_k reached 99% at step 300 with lr 3e-3 and 200
    /// with 1e-2; none at 450 and 350) showed a plateau of ~200 steps before either arm learns,
    /// so the budget is doubled to 600.
    pub fn budget(self) -> usize {
        match self {
            Variant::Long => 600,
            _ => 300,
        }
    }

    /// The task.
    pub fn task(self) -> TaskConfig {
        match self {
            Variant::Long => TaskConfig::new().with_k(64).with_vocab(256),
            _ => TaskConfig::new(),
        }
    }

    /// The lab's model (`measures::training::model_config`) changed as the variant says.
    pub fn model(self, mut model: ModelConfig) -> ModelConfig {
        match self {
            Variant::Base | Variant::Long => {}
            Variant::NoLayerNorm => model.layer_norm = false,
            Variant::Deep => {
                model.n_layers = 2;
                model.n_heads = 4;
                model.d_v = Some(model.d_model / 4);
            }
        }
        model
    }
}

/// The steps of every run in the quick design (`--quick`: a first look, and the tests).
pub const QUICK_BUDGET: usize = 60;

/// Sizes of a run of the design: the full one, or the quick one (same variants, arms and
/// claims; fewer seeds and rates, short runs: most claims are undecided there).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sizes {
    /// Tuning seeds per (variant, arm, rate).
    pub tuning_seeds: usize,
    /// Paired evaluation seeds per (variant, arm).
    pub eval_seeds: usize,
    /// Adam's rates.
    pub lrs: Vec<f64>,
    /// Whether this is the quick design.
    pub quick: bool,
}

impl Sizes {
    /// The full design, or the quick one.
    pub fn new(quick: bool) -> Self {
        if quick {
            Self {
                tuning_seeds: 1,
                eval_seeds: 3,
                lrs: vec![3e-3, 1e-2],
                quick,
            }
        } else {
            Self {
                tuning_seeds: TUNING_SEEDS,
                eval_seeds: EVAL_SEEDS,
                lrs: LRS.to_vec(),
                quick,
            }
        }
    }

    /// The step budget of a variant's runs.
    pub fn budget(&self, variant: Variant) -> usize {
        if self.quick {
            QUICK_BUDGET
        } else {
            variant.budget()
        }
    }
}
