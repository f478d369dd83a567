//! `gradients` (§3.1, Q1): gradient flow through the softmax with and without √d scaling,
//! measured with Burn's autodiff on every backend asked for. The score gradient is read as the
//! gradient of an all-zero additive bias (∂L/∂bias = ∂L/∂scores: the bias is added to the
//! scaled scores); the softmax Jacobian diag(p) − ppᵀ is computed analytically from p and, on
//! one draw per cell, through autodiff.
//!
//! Two designs: the primary keeps d_v = 64 whatever d (so that the upstream gradient g·v_j,
//! which grows like √d_v, does not ride along with d), the second is d_v = d (the lab's earlier
//! design, kept to show how much of "∂L/∂Q grows with d" was that artifact). Each cell measures
//! both scalings on the same draws, so ratios unscaled / scaled are paired. The primary design
//! is repeated at other numbers of keys m ([`SWEEP_MS`]): whether the unscaled Jacobian is the
//! smaller one depends on d *and* m.

mod analyze;
mod claims;
mod measure;
mod render;

use serde::{Deserialize, Serialize};

pub use analyze::GradientsData;
pub use measure::DrawValues;

use crate::context::{Env, LabError};
use crate::experiment::{Analysis, AnalyzeFn, Cell, Measured, Plan, RenderFn, Stages, Weight};

/// The value width of the primary design.
pub const FIXED_D_V: usize = 64;

/// One cell: one d, one d_v, one backend, both scalings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GradientsConfig {
    /// d (queries and keys).
    pub d: usize,
    /// d_v.
    pub d_v: usize,
    /// Queries = keys.
    pub n: usize,
    /// Independent draws of Q, K, V and the upstream gradient.
    pub draws: usize,
    /// Query rows of the autodiff Jacobian check (none: no check).
    pub jacobian_rows: Option<usize>,
    /// Seed.
    pub seed: u64,
    /// Backend.
    pub backend: String,
    /// A cell of the key sweep: the primary design (d_v fixed) on the primary backend at another
    /// number of queries = keys `n` than the main cells', without the Jacobian check.
    #[serde(default)]
    pub m_sweep: bool,
}

/// The numbers of keys of the sweep beside the main cells' (where the unscaled and scaled
/// Jacobians cross depends on m).
pub const SWEEP_MS: [usize; 2] = [64, 1024];

/// One cell's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GradientsResult {
    /// Every draw, scaled by 1/√d.
    pub scaled: Vec<DrawValues>,
    /// Every draw, unscaled.
    pub unscaled: Vec<DrawValues>,
    /// Largest |autodiff − analytic| per-row ‖J‖_F on the first draw: (scaled, unscaled).
    pub jacobian_check: Option<(f64, f64)>,
}

/// Rows, ratios, the cross-backend table and claims.
pub fn analyze(
    plan: &Plan,
    cells: &[Measured<GradientsConfig, GradientsResult>],
) -> Analysis<GradientsData> {
    let data = analyze::data(plan, cells);
    let per_backend = analyze::cross_backend(cells);
    let claims = claims::claims(plan, cells, &data, &per_backend);
    Analysis {
        claims,
        data,
        per_backend,
        skipped: Vec::new(),
        headline: Vec::new(),
    }
}

/// The experiment.
pub struct Gradients;

impl Stages for Gradients {
    type Config = GradientsConfig;
    type Result = GradientsResult;
    type Data = GradientsData;
    const ANALYZE: AnalyzeFn<Self> = analyze;
    const RENDER: RenderFn<Self> = render::render;

    fn name(&self) -> &'static str {
        "gradients"
    }

    fn title(&self) -> &'static str {
        "Gradient flow through softmax without √d scaling, measured with autodiff on each backend"
    }

    fn plan(
        &self,
        plan: &Plan,
        _: usize,
        _: &[Measured<GradientsConfig, GradientsResult>],
    ) -> Vec<Cell<GradientsConfig>> {
        let (n, dims, draws, rows, sweep): (usize, &[usize], usize, usize, &[usize]) = if plan.quick
        {
            (64, &[16, 64, 256, 1024], 3, 8, &[256])
        } else {
            (256, &[16, 32, 64, 128, 256, 512, 1024], 10, 16, &SWEEP_MS)
        };
        let mut cells = Vec::new();
        for &m in sweep {
            for &d in dims {
                cells.push(Cell {
                    id: format!("sweep/m{m}/d{d}/{}", plan.primary()),
                    config: GradientsConfig {
                        d,
                        d_v: FIXED_D_V,
                        n: m,
                        draws,
                        jacobian_rows: None,
                        seed: plan.seed,
                        backend: plan.primary().into(),
                        m_sweep: true,
                    },
                    weight: Weight::Light,
                });
            }
        }
        for &d in dims {
            for backend in &plan.backends {
                cells.push(Cell {
                    id: format!("dv{FIXED_D_V}/d{d}/{backend}"),
                    config: GradientsConfig {
                        d,
                        d_v: FIXED_D_V,
                        n,
                        draws,
                        jacobian_rows: Some(rows),
                        seed: plan.seed,
                        backend: backend.clone(),
                        m_sweep: false,
                    },
                    weight: Weight::Light,
                });
            }
            cells.push(Cell {
                id: format!("dv=d/d{d}/{}", plan.primary()),
                config: GradientsConfig {
                    d,
                    d_v: d,
                    n,
                    draws,
                    jacobian_rows: None,
                    seed: plan.seed,
                    backend: plan.primary().into(),
                    m_sweep: false,
                },
                weight: Weight::Light,
            });
        }
        cells
    }

    fn measure(&self, c: &GradientsConfig, env: &Env) -> Result<GradientsResult, LabError> {
        measure::measure(c, env.device(&c.backend)?)
    }

    fn describe(&self, c: &GradientsConfig, r: &GradientsResult) -> String {
        format!(
            "d = {}, d_v = {}: ‖J‖ unscaled {:.3}",
            c.d,
            c.d_v,
            r.unscaled.first().map_or(f64::NAN, |v| v.jacobian_norm)
        )
    }
}
