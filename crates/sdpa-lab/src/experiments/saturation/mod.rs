//! `saturation` (§3.1, the softmax saturation table): softmax of standard normal logits times s
//! over n elements — the larger s, the closer to one-hot.
//!
//! One cell per (n, s): 2000 rows of n logits, a softmax per row (the article reseeds per cell
//! and scales the same draw; so do we).

mod analyze;
mod render;

use burn::tensor::activation::softmax;
use serde::{Deserialize, Serialize};

pub use analyze::{SaturationData, SaturationRow, analyze};

use crate::context::{Env, LabError, normal_tensor, rng, to_vec};
use crate::experiment::{AnalyzeFn, Cell, Measured, Plan, RenderFn, Stages, Weight};
use crate::stats::{Estimate, mean_ci};

/// The article's table: (n, scale, max p, entropy).
pub const ARTICLE: [(usize, f64, f64, f64); 12] = [
    (4, 1.0, 0.5208, 1.110),
    (4, 4.0, 0.8313, 0.421),
    (4, 16.0, 0.9567, 0.105),
    (16, 1.0, 0.2481, 2.356),
    (16, 4.0, 0.7029, 0.848),
    (16, 16.0, 0.9263, 0.187),
    (64, 1.0, 0.1069, 3.686),
    (64, 4.0, 0.5887, 1.317),
    (64, 16.0, 0.8936, 0.273),
    (256, 1.0, 0.0436, 5.050),
    (256, 4.0, 0.5114, 1.778),
    (256, 16.0, 0.8766, 0.326),
];

/// Elements per softmax.
pub const NS: [usize; 4] = [4, 16, 64, 256];

/// One cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SaturationConfig {
    /// Elements per softmax.
    pub n: usize,
    /// Logit scale s.
    pub scale: f64,
    /// Rows (the article: 2000).
    pub rows: usize,
    /// Seed.
    pub seed: u64,
    /// Backend.
    pub backend: String,
}

/// The rows of a cell are split into this many batches of equal size: each batch's mean is one
/// independent draw, the interval is over them, and `saturation_draws.csv` holds every one.
pub const BATCHES: usize = 20;

/// One cell's measurement: means over rows, with their intervals over [`BATCHES`] batch means.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SaturationResult {
    /// Mean largest probability of a row.
    pub max_p: Estimate,
    /// Mean entropy (nats), computed like the article: −Σ p ln(p + 1e−10).
    pub entropy: Estimate,
    /// Each batch's mean largest probability.
    #[serde(default)]
    pub max_p_batches: Vec<f64>,
    /// Each batch's mean entropy.
    #[serde(default)]
    pub entropy_batches: Vec<f64>,
}

/// The means of `BATCHES` equal consecutive batches of `values` (a remainder is left out).
fn batch_means(values: &[f64]) -> Vec<f64> {
    let size = (values.len() / BATCHES).max(1);
    values
        .chunks_exact(size)
        .take(BATCHES)
        .map(|b| b.iter().sum::<f64>() / b.len() as f64)
        .collect()
}

/// The experiment.
pub struct Saturation;

impl Stages for Saturation {
    type Config = SaturationConfig;
    type Result = SaturationResult;
    type Data = SaturationData;
    const ANALYZE: AnalyzeFn<Self> = |_, cells| analyze(cells);
    const RENDER: RenderFn<Self> = render::render;

    fn name(&self) -> &'static str {
        "saturation"
    }

    fn title(&self) -> &'static str {
        "Softmax saturation: large logits make attention one-hot"
    }

    fn plan(
        &self,
        plan: &Plan,
        _: usize,
        _: &[Measured<SaturationConfig, SaturationResult>],
    ) -> Vec<Cell<SaturationConfig>> {
        // s = 8 is unscaled attention at d_k = 64, which §3.1 calls clearly saturated.
        let scales: &[f64] = if plan.quick {
            &[1.0, 4.0, 8.0, 16.0]
        } else {
            &[0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
        };
        NS.iter()
            .flat_map(|&n| {
                scales.iter().map(move |&scale| Cell {
                    id: format!("n{n}/s{scale}"),
                    config: SaturationConfig {
                        n,
                        scale,
                        rows: 2000,
                        seed: plan.seed,
                        backend: plan.primary().into(),
                    },
                    weight: Weight::Light,
                })
            })
            .collect()
    }

    fn measure(&self, c: &SaturationConfig, env: &Env) -> Result<SaturationResult, LabError> {
        let device = env.device(&c.backend)?;
        let mut rng = rng(c.seed, 2_000 + c.n as u64);
        let z = normal_tensor(&mut rng, [c.rows, c.n], device);
        let p = softmax(z * c.scale, 1);
        // One value per row; the rows are independent, so the means of equal batches of them
        // are independent draws, and the interval is over those.
        let max_p_batches = batch_means(&to_vec(p.clone().max_dim(1))?);
        let entropy_batches = batch_means(&to_vec((-(p.clone() * (p + 1e-10).log())).sum_dim(1))?);
        Ok(SaturationResult {
            max_p: mean_ci(&max_p_batches),
            entropy: mean_ci(&entropy_batches),
            max_p_batches,
            entropy_batches,
        })
    }

    fn describe(&self, c: &SaturationConfig, r: &SaturationResult) -> String {
        format!("n = {}, s = {}: max p {:.4}", c.n, c.scale, r.max_p.value)
    }
}
