//! `training-variants`: does `training`'s answer hold beyond its small model, and what does the
//! attention do while it trains? The article's question (1/√d_k against none, Adam, Burn's
//! default initialization, d_k = 64) on four variants of the model — the base model, 128 tokens
//! instead of 16, no LayerNorm, two layers of four heads — with the attention's entropy and
//! largest logit recorded at every evaluation from the training forward's row statistics (the
//! "entropy collapse" that motivates QK-norm: Zhai et al. 2023, Dehghani et al. 2023).
//!
//! Two stages, as in `training`: with `--tune` each (variant, arm) tunes its learning rate on its
//! own seeds ([`design::LRS`], [`design::TUNING_SEEDS`] seeds; without it, the rates that tuning
//! chose, [`design::COMMITTED_LRS`]), then the evaluation runs train the whole budget on paired
//! seeds (same parameters and batches in both arms), so that their curves are complete.

pub mod analyze;
mod claims;
pub mod design;
mod render;

use serde::{Deserialize, Serialize};

use crate::context::{Env, LabError};
use crate::experiment::{Analysis, AnalyzeFn, Cell, Measured, Plan, RenderFn, Stages, Weight};
use crate::experiments::training::{Role, pick_lr};
use crate::measures::training::{
    Arm, TrainingOutcome, TrainingSpec, model_config, run_config, train_config,
};
pub use analyze::VariantsData;
pub use design::Sizes;
use design::{ARMS, D_K, EVAL_SEED_OFFSET, INIT, TUNING_SEED_OFFSET, Variant, committed_lr};

/// One cell: one training run of one variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariantCell {
    /// Tuning or evaluation.
    pub role: Role,
    /// The variant of the model.
    pub variant: Variant,
    /// The arm.
    pub arm: Arm,
    /// Adam's learning rate.
    pub lr: f64,
    /// The seed (parameters and batches).
    pub seed: u64,
    /// Step budget.
    pub budget: usize,
    /// Backend.
    pub backend: String,
}

impl VariantCell {
    /// The lab's spec of the run (d_k, arm, initialization, Adam, budget).
    pub fn spec(&self) -> TrainingSpec {
        TrainingSpec {
            d_k: D_K,
            arm: self.arm,
            init: INIT,
            optimizer: sdpa_model::OptimizerKind::Adam,
            lr: self.lr,
            seed: self.seed,
            budget: self.budget,
            // Tuning reads the steps to 99% only; evaluation trains the whole budget so that
            // the attention's curves cover it in every run.
            stop_at_target: self.role == Role::Tuning,
            backend: self.backend.clone(),
        }
    }

    /// Its training configuration: the lab's, with the variant's task and model.
    pub fn train_config(&self) -> sdpa_model::TrainConfig {
        let spec = self.spec();
        let mut config = train_config(&spec);
        config.task = self.variant.task();
        config.model = self.variant.model(model_config(&config.task, &spec));
        config
    }

    fn id(&self) -> String {
        let base = format!("{}/{}", self.variant.slug(), self.arm.slug());
        match self.role {
            Role::Tuning => format!("tune/{base}/lr{}/s{}", self.lr, self.seed),
            Role::Evaluation => format!("eval/{base}/s{}", self.seed),
        }
    }
}

/// A measured run.
pub type Run = Measured<VariantCell, TrainingOutcome>;

/// The rate a (variant, arm) evaluates at, chosen from its tuning runs over `lrs` by
/// `training`'s rule.
pub fn chosen_lr(runs: &[Run], variant: Variant, arm: Arm, lrs: &[f64]) -> Option<f64> {
    pick_lr(lrs, |lr| {
        runs.iter()
            .filter(|r| {
                let c = &r.config;
                c.role == Role::Tuning && c.variant == variant && c.arm == arm && c.lr == lr
            })
            .map(|r| (r.result.steps_to_target, r.config.budget))
            .collect()
    })
}

/// Rows, paired comparisons, claims and the abstract's line.
pub fn analyze(sizes: Sizes, cells: &[Run]) -> Analysis<VariantsData> {
    let data = analyze::data(sizes, cells);
    let claims = claims::claims(&data);
    let headline = render::headline(&data, &claims).into_iter().collect();
    Analysis::new(claims, data).with_headline(headline)
}

/// The experiment.
pub struct TrainingVariants;

impl Stages for TrainingVariants {
    type Config = VariantCell;
    type Result = TrainingOutcome;
    type Data = VariantsData;
    const ANALYZE: AnalyzeFn<Self> = |plan, cells| analyze(Sizes::new(plan.quick), cells);
    const RENDER: RenderFn<Self> = render::render;

    fn name(&self) -> &'static str {
        "training-variants"
    }

    fn title(&self) -> &'static str {
        "Beyond the small model: seq 128, no LayerNorm, 2 layers × 4 heads; the attention's entropy and largest logit during training"
    }

    fn stages(&self) -> usize {
        2
    }

    fn plan(&self, plan: &Plan, stage: usize, earlier: &[Run]) -> Vec<Cell<VariantCell>> {
        let sizes = Sizes::new(plan.quick);
        let mut cells = Vec::new();
        for variant in Variant::ALL {
            for arm in ARMS {
                let cell = |role, lr, seed| VariantCell {
                    role,
                    variant,
                    arm,
                    lr,
                    seed,
                    budget: sizes.budget(variant),
                    backend: plan.primary().into(),
                };
                let configs: Vec<VariantCell> = if stage == 0 {
                    if !plan.tune && committed_lr(variant, arm).is_some() {
                        continue;
                    }
                    sizes
                        .lrs
                        .iter()
                        .flat_map(|&lr| {
                            (0..sizes.tuning_seeds)
                                .map(move |i| (lr, plan.seed + TUNING_SEED_OFFSET + i as u64))
                        })
                        .map(|(lr, seed)| cell(Role::Tuning, lr, seed))
                        .collect()
                } else {
                    let lr = if plan.tune {
                        chosen_lr(earlier, variant, arm, &sizes.lrs)
                    } else {
                        committed_lr(variant, arm)
                            .or_else(|| chosen_lr(earlier, variant, arm, &sizes.lrs))
                    };
                    let Some(lr) = lr else {
                        continue;
                    };
                    (0..sizes.eval_seeds)
                        .map(|i| {
                            cell(
                                Role::Evaluation,
                                lr,
                                plan.seed + EVAL_SEED_OFFSET + i as u64,
                            )
                        })
                        .collect()
                };
                cells.extend(configs.into_iter().map(|config| Cell {
                    id: config.id(),
                    config,
                    weight: Weight::Heavy,
                }));
            }
        }
        cells
    }

    fn measure(&self, c: &VariantCell, env: &Env) -> Result<TrainingOutcome, LabError> {
        run_config(&c.train_config(), &c.backend, env.device(&c.backend)?)
    }

    fn describe(&self, _: &VariantCell, r: &TrainingOutcome) -> String {
        r.summary()
    }
}
