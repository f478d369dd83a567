//! `masks` (§3.3, Q3): additive masks with fill values −∞, −10⁹, −10⁴ and the dtype's most
//! negative finite value, in f32, f16 and bf16 where the backend supports them; one mask, two
//! masks added together (a causal and a padding mask), and a fully masked row; through a plain
//! softmax and through the module. Also the article's own two examples: its causal −∞ mask, and
//! softmax([5.0, −1e9]). One cell per (backend, dtype).

mod analyze;
mod measure;
mod render;

use serde::{Deserialize, Serialize};

pub use analyze::{MasksData, analyze};
pub use measure::{MaskRow, MasksResult};

use crate::context::{Env, LabError};
use crate::experiment::{AnalyzeFn, Cell, Measured, Plan, RenderFn, Stages, Weight};

/// The logits of the test row (4 keys; keys 2 and 3 are masked in the partial case).
pub const SCORES: [f64; 4] = [1.5, -0.5, 2.0, 0.3];
/// The dtypes tried.
pub const DTYPES: [&str; 3] = ["f32", "f16", "bf16"];

/// One cell: one backend, one dtype.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MasksConfig {
    /// Backend.
    pub backend: String,
    /// `f32`, `f16` or `bf16`.
    pub dtype: String,
    /// Seed (of the causal example's scores).
    pub seed: u64,
}

/// The experiment.
pub struct Masks;

impl Stages for Masks {
    type Config = MasksConfig;
    type Result = MasksResult;
    type Data = MasksData;
    const ANALYZE: AnalyzeFn<Self> = |_, cells| analyze(cells);
    const RENDER: RenderFn<Self> = render::render;

    fn name(&self) -> &'static str {
        "masks"
    }

    fn title(&self) -> &'static str {
        "Mask fill values in half precision: −∞, −1e9, −1e4, dtype min; one and two masks; fully masked rows"
    }

    fn plan(
        &self,
        plan: &Plan,
        _: usize,
        _: &[Measured<MasksConfig, MasksResult>],
    ) -> Vec<Cell<MasksConfig>> {
        plan.backends
            .iter()
            .flat_map(|b| {
                DTYPES.iter().map(move |d| Cell {
                    id: format!("{b}/{d}"),
                    config: MasksConfig {
                        backend: b.clone(),
                        dtype: d.to_string(),
                        seed: plan.seed,
                    },
                    weight: Weight::Light,
                })
            })
            .collect()
    }

    fn measure(&self, c: &MasksConfig, env: &Env) -> Result<MasksResult, LabError> {
        measure::measure(c, env.device(&c.backend)?)
    }
}
