//! `attention-map` (§6 experiment 3): 8 tokens, tokens 4–7 copies of 0–3, random linear
//! projections of width 32 — printed and drawn, with the share of rows 4–7 whose largest weight
//! is on their twin measured over many draws; then the map of a model trained on *match*, which
//! learns the permutation. Two cells: the random maps, and the trained model (heavy).

mod analyze;
mod measure;
mod render;

use serde::{Deserialize, Serialize};

pub use analyze::{AttentionMapData, analyze};
pub use measure::{RandomMaps, TrainedMap};

use crate::context::{Env, LabError};
use crate::experiment::{AnalyzeFn, Cell, Measured, Plan, RenderFn, Stages, Weight};

/// One cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AttentionMapConfig {
    /// The article's random-projection maps, `draws` of them.
    Random {
        /// Draws.
        draws: usize,
        /// Seed.
        seed: u64,
        /// Backend.
        backend: String,
    },
    /// The default model trained on *match*.
    Trained {
        /// Seed.
        seed: u64,
        /// Backend.
        backend: String,
    },
}

/// One cell's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AttentionMapResult {
    /// The random maps.
    Random(RandomMaps),
    /// The trained model's map.
    Trained(TrainedMap),
}

/// Trained models (seeds): the claim about them is decided over models, since the rows of one
/// model are not independent draws. Five take ~10 s; the quick run trains two.
fn trained_models(quick: bool) -> usize {
    if quick { 2 } else { 5 }
}

/// The experiment.
pub struct AttentionMap;

impl Stages for AttentionMap {
    type Config = AttentionMapConfig;
    type Result = AttentionMapResult;
    type Data = AttentionMapData;
    const ANALYZE: AnalyzeFn<Self> = |_, cells| analyze(cells);
    const RENDER: RenderFn<Self> = render::render;

    fn name(&self) -> &'static str {
        "attention-map"
    }

    fn version(&self) -> u32 {
        // 2: the random maps record their hits per draw.
        2
    }

    fn title(&self) -> &'static str {
        "Attention maps: random projections (the article's experiment 3) vs a trained model"
    }

    fn plan(
        &self,
        plan: &Plan,
        _: usize,
        _: &[Measured<Self::Config, Self::Result>],
    ) -> Vec<Cell<Self::Config>> {
        let backend = plan.primary().to_string();
        [Cell {
            id: "random".into(),
            config: AttentionMapConfig::Random {
                draws: if plan.quick { 200 } else { 1000 },
                seed: plan.seed,
                backend: backend.clone(),
            },
            weight: Weight::Light,
        }]
        .into_iter()
        .chain((0..trained_models(plan.quick)).map(|i| Cell {
            id: format!("trained/s{i}"),
            config: AttentionMapConfig::Trained {
                seed: plan.seed + i as u64,
                backend: backend.clone(),
            },
            weight: Weight::Heavy,
        }))
        .collect()
    }

    fn measure(&self, c: &Self::Config, env: &Env) -> Result<Self::Result, LabError> {
        match c {
            AttentionMapConfig::Random {
                draws,
                seed,
                backend,
            } => Ok(AttentionMapResult::Random(measure::random_maps(
                *draws,
                *seed,
                env.device(backend)?,
            )?)),
            AttentionMapConfig::Trained { seed, backend } => Ok(AttentionMapResult::Trained(
                measure::trained_map(*seed, backend, env.device(backend)?)?,
            )),
        }
    }
}
