//! `complexity` (Q4): time and memory of attention as the sequence grows, with the n × m weights
//! materialized vs the fastest path available; memory counted by the lab's allocator (every
//! heap byte a forward holds at once), growth exponents fitted over a range fixed in advance,
//! one point per size (the median of its repeated timings: repeats of one size are not
//! independent points);
//! and the LLaMA-7B arithmetic, computed from a config. One cell per (path, n), timed alone.

mod analyze;
mod render;

use std::time::Instant;

use burn::prelude::*;
use burn_sdpa::{AttentionInput, Implementation, ScaledDotProductAttentionConfig};
use serde::{Deserialize, Serialize};

pub use analyze::{ComplexityData, MatrixMemory, analyze};

use crate::context::{Env, LabError, normal_tensor, rng, to_vec};
use crate::experiment::{AnalyzeFn, Cell, Measured, Plan, RenderFn, Stages, Weight};
use crate::memory::{measure_allocated, measure_peak};
use crate::stats::median;

/// Which path is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PathKind {
    /// The module asked for its weights: the n × m matrix is materialized.
    Materialized,
    /// The module's `Auto` path, no weights asked for.
    Fastest,
}

impl PathKind {
    /// As written in the report.
    pub fn label(self) -> &'static str {
        match self {
            PathKind::Materialized => "materialized (need_weights)",
            PathKind::Fastest => "fastest path (Auto)",
        }
    }
}

/// One cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComplexityConfig {
    /// The path.
    pub path: PathKind,
    /// n = m.
    pub n: usize,
    /// Batch, heads, head size.
    pub bhd: [usize; 3],
    /// Timed repetitions after a warm-up.
    pub reps: usize,
    /// Seed.
    pub seed: u64,
    /// Backend.
    pub backend: String,
}

/// One cell's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComplexityResult {
    /// Every timed forward (ms).
    pub times_ms: Vec<f64>,
    /// Most heap bytes one forward held at once (the lab's counting allocator), if installed.
    pub peak_allocated: Option<u64>,
    /// Rise of the resident high-water mark during one forward (bytes), where measurable.
    pub peak_resident: Option<u64>,
}

/// The experiment.
pub struct Complexity;

fn forward(
    c: &ComplexityConfig,
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
) -> Result<f64, LabError> {
    let input = AttentionInput::new(q.clone(), k.clone(), v.clone());
    match c.path {
        PathKind::Materialized => {
            let attn = ScaledDotProductAttentionConfig::new()
                .with_implementation(Implementation::Naive)
                .try_init()?;
            let out = attn.try_forward(input.need_weights())?;
            let w = out.weights.ok_or_else(|| LabError::Missing {
                from: "the attention module",
                what: "weights".into(),
            })?;
            Ok(to_vec(out.context.slice(s![0..1, 0..1, 0..1, 0..1]))?[0]
                + to_vec(w.slice(s![0..1, 0..1, 0..1, 0..1]))?[0])
        }
        PathKind::Fastest => {
            let attn = ScaledDotProductAttentionConfig::new().try_init()?;
            let out = attn.try_forward(input)?.context;
            Ok(to_vec(out.slice(s![0..1, 0..1, 0..1, 0..1]))?[0])
        }
    }
}

impl Stages for Complexity {
    type Config = ComplexityConfig;
    type Result = ComplexityResult;
    type Data = ComplexityData;
    const ANALYZE: AnalyzeFn<Self> = |_, cells| analyze(cells);
    const RENDER: RenderFn<Self> = render::render;

    fn name(&self) -> &'static str {
        "complexity"
    }

    fn title(&self) -> &'static str {
        "Cost of attention as the sequence grows; the LLaMA-7B attention-matrix arithmetic"
    }

    fn plan(
        &self,
        plan: &Plan,
        _: usize,
        _: &[Measured<Self::Config, Self::Result>],
    ) -> Vec<Cell<Self::Config>> {
        let ns: &[usize] = if plan.quick {
            &[128, 256, 512, 1024]
        } else {
            // √2 steps from 1024 on: the fit over n ≥ 1024 has five sizes (three degrees of
            // freedom once each size is one point; it had three sizes, one degree).
            &[128, 256, 512, 1024, 1448, 2048, 2896, 4096]
        };
        let reps = if plan.quick { 3 } else { 5 };
        ns.iter()
            .flat_map(|&n| {
                [PathKind::Materialized, PathKind::Fastest].map(|path| Cell {
                    id: format!(
                        "{}/n{n}",
                        if path == PathKind::Fastest {
                            "fastest"
                        } else {
                            "materialized"
                        }
                    ),
                    config: ComplexityConfig {
                        path,
                        n,
                        bhd: [1, 8, 64],
                        reps,
                        seed: plan.seed,
                        backend: plan.primary().into(),
                    },
                    // Timed: one after another, nothing else running.
                    weight: Weight::Light,
                })
            })
            .collect()
    }

    fn measure(&self, c: &Self::Config, env: &Env) -> Result<Self::Result, LabError> {
        let device = env.device(&c.backend)?;
        let [b, h, d] = c.bhd;
        let mut r = rng(c.seed, 10_000 + c.n as u64);
        let q = normal_tensor(&mut r, [b, h, c.n, d], device);
        let k = normal_tensor(&mut r, [b, h, c.n, d], device);
        let v = normal_tensor(&mut r, [b, h, c.n, d], device);
        forward(c, &q, &k, &v)?; // warm-up
        let mut times_ms = Vec::new();
        for _ in 0..c.reps {
            let t = Instant::now();
            forward(c, &q, &k, &v)?;
            times_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (out, peak_allocated) = measure_allocated(|| forward(c, &q, &k, &v));
        out?;
        let (out, peak_resident) = measure_peak(|| forward(c, &q, &k, &v));
        out?;
        Ok(ComplexityResult {
            times_ms,
            peak_allocated,
            peak_resident,
        })
    }

    fn describe(&self, c: &Self::Config, r: &Self::Result) -> String {
        format!(
            "{} n = {}: {:.1} ms",
            c.path.label(),
            c.n,
            median(&r.times_ms)
        )
    }
}
