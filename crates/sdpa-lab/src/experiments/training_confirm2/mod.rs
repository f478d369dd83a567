//! `training-confirm-2`: the second confirmatory run of `training`'s main question (issue 66).
//! Its [`design`] was committed before any of its runs: the premise from the article's own
//! example, each arm's learning rate tuned for this budget and one rate shared by both, a budget
//! long enough that «extremely slow» can fail on runs that finished, the two halves of the
//! article's sentence at 2.5% each, and seeds from a simulated power with censoring.
//!
//! Two stages: the tuning runs, then the test runs at the rates they choose ([`rates`]). The
//! full run takes about 70 minutes on 2 cores, so it runs only with `--long` (or at `--quick`
//! sizes); otherwise the experiment measures nothing and analyses the committed measurement
//! ([`runs::COMMITTED`]).

pub mod analyze;
pub mod answer;
pub mod design;
pub mod frozen;
pub mod hypotheses;
pub mod power;
pub mod rates;
pub mod render;
pub mod runs;

use sdpa_model::{OptimizerKind, QkInit};

use crate::context::{Env, LabError};
use crate::experiment::{Analysis, AnalyzeFn, Cell, Plan, RenderFn, Stages, Weight};
use crate::experiments::training::{Role, Run, TrainingCell};
use crate::measures::training::{Arm, TrainingOutcome, TrainingSpec, init_name, run};
use design::{
    BUDGET, LR_GRID, PREMISE, RateScheme, SEEDS, STUCK_COST, TEST_SEED_OFFSET, TUNING_SEED_OFFSET,
    TUNING_SEEDS,
};

/// The sizes of a run: the design's, or the quick ones (one condition, two rates, budget 100).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Sizes {
    /// The conditions.
    pub conditions: Vec<(QkInit, usize)>,
    /// The learning-rate grid.
    pub grid: Vec<f64>,
    /// Tuning seeds per (condition, arm, rate).
    pub tuning_seeds: usize,
    /// Test seeds per condition.
    pub seeds: usize,
    /// The budget.
    pub budget: usize,
    /// What a stuck tuning run costs in a rate's score.
    pub stuck_cost: usize,
}

impl Sizes {
    /// The design's sizes, or the quick ones.
    pub fn new(quick: bool) -> Self {
        if quick {
            Self {
                conditions: vec![(QkInit::Unit, 64)],
                grid: vec![1e-3, 1e-2],
                tuning_seeds: 2,
                seeds: 3,
                budget: 100,
                stuck_cost: 200,
            }
        } else {
            Self {
                conditions: PREMISE.to_vec(),
                grid: LR_GRID.to_vec(),
                tuning_seeds: TUNING_SEEDS,
                seeds: SEEDS,
                budget: BUDGET,
                stuck_cost: STUCK_COST,
            }
        }
    }
}

/// Whether this plan measures the experiment (`--long`, or `--quick` sizes); otherwise the
/// committed measurement is analysed.
pub fn measures(plan: &Plan) -> bool {
    plan.long || plan.quick
}

/// The experiment.
pub struct TrainingConfirm2;

fn cell(
    role: Role,
    init: QkInit,
    d_k: usize,
    arm: Arm,
    lr: f64,
    seed: u64,
    plan: &Plan,
) -> Cell<TrainingCell> {
    let budget = Sizes::new(plan.quick).budget;
    let spec = TrainingSpec {
        d_k,
        arm,
        init,
        optimizer: OptimizerKind::Adam,
        lr,
        seed,
        budget,
        stop_at_target: true,
        backend: plan.primary().into(),
    };
    let stage = if role == Role::Tuning { "tune" } else { "test" };
    Cell {
        id: format!(
            "confirm2/{stage}/{}/dk{d_k}/{}/lr{lr}/s{seed}",
            init_name(init),
            arm.slug()
        ),
        config: TrainingCell { role, spec },
        weight: Weight::Heavy,
    }
}

/// The analysis, with the appendix's first summary line: the report's answer.
fn analyze_with_headline(plan: &Plan, cells: &[Run]) -> Analysis<analyze::Confirm2Data> {
    let analysis = analyze::analyze(plan, cells);
    let headline = answer::headline(&analysis.data);
    analysis.with_headline(headline)
}

impl Stages for TrainingConfirm2 {
    type Config = TrainingCell;
    type Result = TrainingOutcome;
    type Data = analyze::Confirm2Data;
    const ANALYZE: AnalyzeFn<Self> = analyze_with_headline;
    const RENDER: RenderFn<Self> = render::render;

    fn name(&self) -> &'static str {
        "training-confirm-2"
    }

    fn title(&self) -> &'static str {
        "The second confirmatory run: rates tuned for its budget, one premise, no verdict on the budget's edge"
    }

    fn stages(&self) -> usize {
        2
    }

    fn plan(&self, plan: &Plan, stage: usize, earlier: &[Run]) -> Vec<Cell<TrainingCell>> {
        if !measures(plan) {
            return Vec::new();
        }
        let sizes = Sizes::new(plan.quick);
        let mut cells = Vec::new();
        if stage == 0 {
            for &(init, d_k) in &sizes.conditions {
                for arm in [Arm::Scaled, Arm::Unscaled] {
                    for &lr in &sizes.grid {
                        for i in 0..sizes.tuning_seeds {
                            let seed = plan.seed + TUNING_SEED_OFFSET + i as u64;
                            cells.push(cell(Role::Tuning, init, d_k, arm, lr, seed, plan));
                        }
                    }
                }
            }
            return cells;
        }
        let rows: Vec<runs::Row> = earlier.iter().map(runs::Row::of).collect();
        let refs: Vec<&runs::Row> = rows.iter().collect();
        for chosen in rates::choose_all(&sizes, &refs) {
            let (init, d_k) = (chosen.init, chosen.d_k);
            for scheme in RateScheme::ALL {
                let (scaled_lr, unscaled_lr) = chosen.rates(scheme);
                for (arm, lr) in [(Arm::Scaled, scaled_lr), (Arm::Unscaled, unscaled_lr)] {
                    for i in 0..sizes.seeds {
                        let seed = plan.seed + TEST_SEED_OFFSET + i as u64;
                        let c = cell(Role::Evaluation, init, d_k, arm, lr, seed, plan);
                        // The same (arm, rate, seed) under both schemes is one run.
                        if !cells.iter().any(|x: &Cell<TrainingCell>| x.id == c.id) {
                            cells.push(c);
                        }
                    }
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
