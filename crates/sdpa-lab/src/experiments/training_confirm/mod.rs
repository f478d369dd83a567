//! `training-confirm`: the confirmatory run of `training`'s main question. The exploratory run
//! (`training`) tuned the learning rates and showed where the effect is; this run fixes its
//! analysis beforehand ([`design`]: the hypotheses, the saturated conditions, the budget, the
//! learning rates, the seeds from a power target) and measures it once on fresh seeds: 1/√d_k
//! against no scaling, Adam, both initializations, d_k 16–1024, paired seeds.

pub mod analyze;
pub mod design;
pub mod hypotheses;
pub mod plot;
pub mod render;

use crate::context::{Env, LabError};
use crate::experiment::{AnalyzeFn, Cell, Plan, RenderFn, Stages, Weight};
use crate::experiments::training::{Role, Run, TrainingCell};
use crate::measures::training::{Arm, TrainingOutcome, TrainingSpec, init_name, run};
use design::{CONFIRM_SEED_OFFSET, ConfirmSizes};
use sdpa_model::OptimizerKind;

/// The experiment.
pub struct TrainingConfirm;

impl Stages for TrainingConfirm {
    type Config = TrainingCell;
    type Result = TrainingOutcome;
    type Data = analyze::ConfirmData;
    const ANALYZE: AnalyzeFn<Self> = analyze::analyze;
    const RENDER: RenderFn<Self> = render::render;

    fn name(&self) -> &'static str {
        "training-confirm"
    }

    fn title(&self) -> &'static str {
        "The confirmatory run: training with and without √d_k on fresh seeds, analysis fixed beforehand"
    }

    fn plan(&self, plan: &Plan, _stage: usize, _earlier: &[Run]) -> Vec<Cell<TrainingCell>> {
        let sizes = ConfirmSizes::new(plan.quick);
        let mut cells = Vec::new();
        for &(init, d_k, scaled_lr, unscaled_lr) in &sizes.conditions {
            for (arm, lr) in [(Arm::Scaled, scaled_lr), (Arm::Unscaled, unscaled_lr)] {
                for i in 0..sizes.seeds {
                    let spec = TrainingSpec {
                        d_k,
                        arm,
                        init,
                        optimizer: OptimizerKind::Adam,
                        lr,
                        seed: plan.seed + CONFIRM_SEED_OFFSET + i as u64,
                        budget: sizes.budget,
                        stop_at_target: true,
                        backend: plan.primary().into(),
                    };
                    cells.push(Cell {
                        id: format!(
                            "confirm/{}/dk{d_k}/{}/s{}",
                            init_name(init),
                            arm.slug(),
                            spec.seed
                        ),
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
