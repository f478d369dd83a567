//! `dot-std` (§3.1): the standard deviation of q·k grows like √d, and dividing by √d brings it
//! back to 1 — the article's derivation and its first table, over independent draws.
//!
//! One cell per d: `repeats` independent draws of `pairs` pairs of standard normal vectors.

mod analyze;
mod render;

use serde::{Deserialize, Serialize};

pub use analyze::{DotStdData, DotStdRow, analyze};

use crate::context::{Env, LabError, normal_tensor, rng, to_vec};
use crate::experiment::{AnalyzeFn, Cell, Measured, Plan, RenderFn, Stages, Weight};
use crate::stats::std;

/// The article's measured std of q·k for d = 16, 64, 256, 1024.
pub const ARTICLE_STD: [f64; 4] = [4.001, 8.114, 16.144, 33.293];
/// The article's std after dividing by √d.
pub const ARTICLE_SCALED: [f64; 4] = [1.000, 1.014, 1.009, 1.040];
/// The article's dimensions.
pub const DIMS: [usize; 4] = [16, 64, 256, 1024];

/// One cell: one d.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DotStdConfig {
    /// The dimension.
    pub d: usize,
    /// Pairs per draw (the article: 2000).
    pub pairs: usize,
    /// Independent draws, to show the sampling spread of the std itself.
    pub repeats: usize,
    /// Seed.
    pub seed: u64,
    /// Backend.
    pub backend: String,
}

/// One cell's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DotStdResult {
    /// std(q·k) / √d of every draw.
    pub draws_scaled: Vec<f64>,
    /// std of all the dot products of every draw together.
    pub pooled_std: f64,
}

/// The experiment.
pub struct DotStd;

impl Stages for DotStd {
    type Config = DotStdConfig;
    type Result = DotStdResult;
    type Data = DotStdData;
    const ANALYZE: AnalyzeFn<Self> = |_, cells| analyze(cells);
    const RENDER: RenderFn<Self> = render::render;

    fn name(&self) -> &'static str {
        "dot-std"
    }

    fn title(&self) -> &'static str {
        "Why divide by √d_k: the std of q·k grows like √d"
    }

    fn plan(
        &self,
        plan: &Plan,
        _: usize,
        _: &[Measured<DotStdConfig, DotStdResult>],
    ) -> Vec<Cell<DotStdConfig>> {
        DIMS.iter()
            .map(|&d| Cell {
                id: format!("d{d}"),
                config: DotStdConfig {
                    d,
                    pairs: 2000,
                    repeats: if plan.quick { 5 } else { 30 },
                    seed: plan.seed,
                    backend: plan.primary().into(),
                },
                weight: Weight::Light,
            })
            .collect()
    }

    fn measure(&self, c: &DotStdConfig, env: &Env) -> Result<DotStdResult, LabError> {
        let device = env.device(&c.backend)?;
        let mut rng = rng(c.seed, 1_000 + c.d as u64);
        let mut all = Vec::new();
        let mut draws_scaled = Vec::new();
        for _ in 0..c.repeats.max(1) {
            let q = normal_tensor(&mut rng, [c.pairs, c.d], device);
            let k = normal_tensor(&mut rng, [c.pairs, c.d], device);
            // [pairs, d] -> [pairs, 1]: one dot product per pair
            let dots = to_vec((q * k).sum_dim(1))?;
            draws_scaled.push(std(&dots) / (c.d as f64).sqrt());
            all.extend(dots);
        }
        Ok(DotStdResult {
            draws_scaled,
            pooled_std: std(&all),
        })
    }

    fn describe(&self, c: &DotStdConfig, r: &DotStdResult) -> String {
        format!("d = {}: std {:.3}", c.d, r.pooled_std)
    }
}
