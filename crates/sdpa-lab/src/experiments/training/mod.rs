//! `training` (Q1: "softmax 饱和 → 梯度消失 → 训练完全失效或极慢"): does training without √d_k
//! fail, or crawl? The small model on *match*, designed to answer it:
//!
//! - **paired seeds**: two arms with one seed start from the same parameters and see the same
//!   batches, so arms are compared pair by pair (exact McNemar, sign tests);
//! - **each arm its own learning rate**, from a grid fixed in [`design`], chosen on tuning seeds
//!   that are never evaluation seeds (stage 1 of the plan, with `--tune`; stage 2 evaluates);
//!   without `--tune` the evaluation runs use the rates the full sweep chose, committed in
//!   [`rates::COMMITTED_LRS`];
//! - **censoring**: a run that never reaches 99% within the budget is censored there, never
//!   averaged as a number (Kaplan–Meier medians, sign tests with it ranked last);
//! - both initializations (Burn's default, unit-variance), d_k 16–1024, Adam primary, SGD
//!   secondary; 1/d_k and a learned temperature; soft-cap and QK-norm (see [`design::Part`]).

pub mod analyze;
mod claims;
pub mod design;
mod headline;
mod mechanism;
mod plot;
mod premise;
pub mod rates;
mod render;
pub mod sweep;
mod sweep_claims;
mod sweep_plot;

use serde::{Deserialize, Serialize};

pub use analyze::TrainingData;
use design::{Condition, Sizes, TUNING_SEED_OFFSET};
pub use rates::{pick_lr, tuned_lr};

use crate::context::{Env, LabError};
use crate::experiment::{Analysis, AnalyzeFn, Cell, Measured, Plan, RenderFn, Stages, Weight};
use crate::measures::training::{
    Arm, TrainingOutcome, TrainingSpec, init_name, optimizer_name, run,
};

/// Which stage a run belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// A tuning run (chooses the arm's learning rate).
    Tuning,
    /// An evaluation run (decides the claims).
    Evaluation,
}

/// One cell: one training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingCell {
    /// Tuning or evaluation.
    pub role: Role,
    /// The run.
    pub spec: TrainingSpec,
}

/// A measured run.
pub type Run = Measured<TrainingCell, TrainingOutcome>;

fn id(role: Role, spec: &TrainingSpec) -> String {
    let base = format!(
        "{}/{}/dk{}/{}",
        optimizer_name(spec.optimizer),
        init_name(spec.init),
        spec.d_k,
        spec.arm.slug()
    );
    match role {
        Role::Tuning => format!("tune/{base}/lr{}/s{}", spec.lr, spec.seed),
        Role::Evaluation => format!("eval/{base}/s{}", spec.seed),
    }
}

fn spec(
    role: Role,
    c: Condition,
    arm: Arm,
    lr: f64,
    seed: u64,
    sizes: &Sizes,
    plan: &Plan,
) -> TrainingSpec {
    TrainingSpec {
        // A tuning run is a point of its arm's learning-rate curve, which also reads the
        // held-out loss at the budget: it trains the whole budget.
        stop_at_target: role == Role::Evaluation,
        d_k: c.d_k,
        arm,
        init: c.init,
        optimizer: c.optimizer,
        lr,
        seed,
        budget: sizes.budget,
        backend: plan.primary().into(),
    }
}

/// The steps a run took to the target, `None` when it never got there.
pub fn steps(run: &TrainingOutcome) -> Option<usize> {
    run.steps_to_target
}

/// Tables and claims.
pub fn analyze(plan: &Plan, cells: &[Run]) -> Analysis<TrainingData> {
    let data = analyze::data(plan, cells);
    let mut claims = claims::claims(&data);
    claims.extend(sweep_claims::sweep_claims(&data));
    claims.extend(sweep_claims::intervention_claims(&data));
    let headline = headline::lines(&data, &claims);
    Analysis::new(claims, data).with_headline(headline)
}

/// The experiment.
pub struct Training;

impl Stages for Training {
    type Config = TrainingCell;
    type Result = TrainingOutcome;
    type Data = TrainingData;
    const ANALYZE: AnalyzeFn<Self> = analyze;
    const RENDER: RenderFn<Self> = render::render;

    fn name(&self) -> &'static str {
        "training"
    }

    fn title(&self) -> &'static str {
        "Training with and without √d_k on match: paired seeds, tuned learning rates, censoring-aware tests"
    }

    fn stages(&self) -> usize {
        2
    }

    fn plan(&self, plan: &Plan, stage: usize, earlier: &[Run]) -> Vec<Cell<TrainingCell>> {
        let sizes = Sizes::new(plan.quick);
        let mut cells = Vec::new();
        let arms = if stage == 0 {
            sizes.tuned_arms()
        } else {
            sizes.arms()
        };
        for (condition, arm) in arms {
            let grid = sizes.lrs(condition.optimizer);
            if stage == 0 {
                if !rates::tunes(plan.tune, &sizes, condition, arm) {
                    continue;
                }
                for &lr in grid {
                    for i in 0..sizes.tuning_seeds {
                        let seed = plan.seed + TUNING_SEED_OFFSET + i as u64;
                        let spec = spec(Role::Tuning, condition, arm, lr, seed, &sizes, plan);
                        cells.push(Cell {
                            id: id(Role::Tuning, &spec),
                            config: TrainingCell {
                                role: Role::Tuning,
                                spec,
                            },
                            weight: Weight::Heavy,
                        });
                    }
                }
            } else {
                let tuning: Vec<&Run> = earlier.iter().collect();
                let Some((lr, _)) = rates::evaluation_lr(plan.tune, &tuning, condition, arm, grid)
                else {
                    continue;
                };
                for i in 0..sizes.eval_seeds {
                    let seed = plan.seed + i as u64;
                    let spec = spec(Role::Evaluation, condition, arm, lr, seed, &sizes, plan);
                    cells.push(Cell {
                        id: id(Role::Evaluation, &spec),
                        config: TrainingCell {
                            role: Role::Evaluation,
                            spec,
                        },
                        weight: Weight::Heavy,
                    });
                }
            }
        }
        cells
    }

    fn measure(&self, c: &TrainingCell, env: &Env) -> Result<TrainingOutcome, LabError> {
        run(&c.spec, env.device(&c.spec.backend)?)
    }

    fn describe(&self, _: &TrainingCell, r: &TrainingOutcome) -> String {
        r.summary()
    }
}
