//! `attention-saturation` (§6 experiment 1, Q1): the article's "unscaled vs scaled" table,
//! recomputed with its faults removed. The article's code takes one softmax over 500 logits
//! q_i·k_i of independent unit-variance vectors: statistically one attention row with m = 500 keys
//! (given q, the logits q·k_j over 500 keys are such a row). Its faults are elsewhere: a single draw
//! per d, an "entropy" column that is −b·ln b of one number b (the max probability), and a
//! "uniform entropy" of ln d where ln m is meant. Here: n queries against m keys, a softmax over
//! the keys of each query, through the library's module and diagnostics, over independent draws
//! and a sweep over m that includes the article's 500, on every backend asked for. The article's
//! claims are decided at its own m.
//!
//! Cells: the article's code replicated (one per d), the corrected measurement (one per (d, m),
//! both scalings on the same draws), and the first draw again on every other backend.

mod analyze;
mod render;

use burn::tensor::activation::softmax;
use burn_sdpa::diagnostics::attention_diagnostics;
use burn_sdpa::{AttentionInput, ScalePolicy, ScaledDotProductAttentionConfig};
use serde::{Deserialize, Serialize};

pub use analyze::{AttentionSaturationData, CorrectedRow, ReplicatedRow, analyze};

use crate::context::{Env, LabError, normal_tensor, normal_vec, rng, scalar, tensor};
use crate::experiment::{AnalyzeFn, Cell, Measured, Plan, RenderFn, Stages, Weight};

/// The article's table: (d, max p unscaled, max p scaled, "entropy (scaled)", "uniform entropy").
pub const ARTICLE: [(usize, f64, f64, f64, f64); 4] = [
    (16, 0.7267, 0.0319, 0.110, 2.773),
    (64, 0.9990, 0.0350, 0.117, 4.159),
    (256, 0.9999, 0.0347, 0.117, 5.545),
    (1024, 0.9999, 0.0170, 0.069, 6.931),
];

/// Draws of the article's code, per d.
pub const REPLICATION_DRAWS: usize = 20;
/// The article's number of logits per softmax (`torch.randn(500, d)`): its m, where its claims
/// are decided.
pub const ARTICLE_M: usize = 500;
/// Keys per query of the full run: the article's 500 among powers of 4 around it (with 1/√d the
/// max p depends on m, so a claim is only comparable at the article's m).
pub const MS: [usize; 4] = [64, 256, ARTICLE_M, 1024];
/// Head dimensions.
pub const DIMS: [usize; 4] = [16, 64, 256, 1024];

/// One cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AttentionSaturationConfig {
    /// The article's code: one softmax over 500 logits q_i·k_i (one row of m = 500), `draws` times.
    Replicate {
        /// d.
        d: usize,
        /// Draws.
        draws: usize,
        /// Seed.
        seed: u64,
        /// Backend.
        backend: String,
    },
    /// n queries against m keys, per-query softmax, both scalings on the same `draws` draws.
    Corrected {
        /// d.
        d: usize,
        /// Keys per query.
        m: usize,
        /// Queries.
        n: usize,
        /// Draws.
        draws: usize,
        /// Seed.
        seed: u64,
        /// Backend.
        backend: String,
    },
    /// The first draw of a `Corrected` cell again, on another backend.
    Cross {
        /// d.
        d: usize,
        /// Keys per query.
        m: usize,
        /// Queries.
        n: usize,
        /// Seed.
        seed: u64,
        /// Backend.
        backend: String,
    },
}

/// What one draw of the corrected measurement gives.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DrawValues {
    /// Mean within-row std of the scores.
    pub logit_std: f64,
    /// Mean largest probability of a row.
    pub max_p: f64,
    /// Mean row entropy (nats).
    pub entropy: f64,
    /// Mean number of keys with p > 1e−3.
    pub keys_above_1e3: f64,
    /// Share of rows with max p > 0.99.
    pub saturated_fraction: f64,
}

/// One cell's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AttentionSaturationResult {
    /// The replicated code's max p per draw.
    Replicate {
        /// Unscaled.
        unscaled: Vec<f64>,
        /// Scaled by 1/√d.
        scaled: Vec<f64>,
    },
    /// Every draw, both scalings.
    Corrected {
        /// Unscaled.
        unscaled: Vec<DrawValues>,
        /// Scaled.
        scaled: Vec<DrawValues>,
    },
    /// The first draw on another backend.
    Cross {
        /// Unscaled.
        unscaled: DrawValues,
        /// Scaled.
        scaled: DrawValues,
    },
}

fn draw_data(seed: u64, d: usize, m: usize, n: usize, draw: usize) -> (Vec<f32>, Vec<f32>) {
    let mut r = rng(
        seed,
        3_000_000 + (d * 10_000 + m) as u64 * 100 + draw as u64,
    );
    (normal_vec(&mut r, n * d), normal_vec(&mut r, m * d))
}

/// One draw through the module and the library's diagnostics.
fn one_draw(
    device: &burn::prelude::Device,
    (q, k): &(Vec<f32>, Vec<f32>),
    (n, m, d): (usize, usize, usize),
    scaled: bool,
) -> Result<DrawValues, LabError> {
    let attn = ScaledDotProductAttentionConfig::new()
        .with_scale(if scaled {
            ScalePolicy::InvSqrtDk
        } else {
            ScalePolicy::Unscaled
        })
        .try_init()?;
    let (q, k) = (
        tensor(q, [1, 1, n, d], device),
        tensor(k, [1, 1, m, d], device),
    );
    let out = attn.try_forward(
        AttentionInput::new(q, k.clone(), k)
            .need_weights()
            .need_scores(),
    )?;
    let weights = out.weights.clone().ok_or_else(|| LabError::Missing {
        from: "the attention module",
        what: "weights".into(),
    })?;
    let diag = attention_diagnostics(weights.clone(), None, out.scores)?.mean();
    let keys = scalar(weights.greater_elem(1e-3).float().sum_dim(3).mean())?;
    Ok(DrawValues {
        logit_std: diag.logit_std.unwrap_or(f64::NAN),
        max_p: diag.max_prob,
        entropy: diag.entropy,
        keys_above_1e3: keys,
        saturated_fraction: diag.saturated_fraction,
    })
}

/// The experiment.
pub struct AttentionSaturation;

impl Stages for AttentionSaturation {
    type Config = AttentionSaturationConfig;
    type Result = AttentionSaturationResult;
    type Data = AttentionSaturationData;
    const ANALYZE: AnalyzeFn<Self> = analyze;
    const RENDER: RenderFn<Self> = render::render;

    fn name(&self) -> &'static str {
        "attention-saturation"
    }

    fn title(&self) -> &'static str {
        "Unscaled vs scaled attention, computed per query (correcting the article's table)"
    }

    fn plan(
        &self,
        plan: &Plan,
        _: usize,
        _: &[Measured<Self::Config, Self::Result>],
    ) -> Vec<Cell<Self::Config>> {
        let (ms, n, draws): (&[usize], usize, usize) = if plan.quick {
            (&[ARTICLE_M], 64, 4)
        } else {
            (&MS, 256, 10)
        };
        let seed = plan.seed;
        let primary = plan.primary().to_string();
        let mut cells: Vec<Cell<Self::Config>> = DIMS
            .iter()
            .map(|&d| Cell {
                id: format!("replicate/d{d}"),
                config: AttentionSaturationConfig::Replicate {
                    d,
                    draws: REPLICATION_DRAWS,
                    seed,
                    backend: primary.clone(),
                },
                weight: Weight::Light,
            })
            .collect();
        for &m in ms {
            for &d in &DIMS {
                cells.push(Cell {
                    id: format!("corrected/m{m}/d{d}"),
                    config: AttentionSaturationConfig::Corrected {
                        d,
                        m,
                        n,
                        draws,
                        seed,
                        backend: primary.clone(),
                    },
                    weight: Weight::Light,
                });
                for other in &plan.backends[1..] {
                    cells.push(Cell {
                        id: format!("cross/{other}/m{m}/d{d}"),
                        config: AttentionSaturationConfig::Cross {
                            d,
                            m,
                            n,
                            seed,
                            backend: other.clone(),
                        },
                        weight: Weight::Light,
                    });
                }
            }
        }
        cells
    }

    fn measure(&self, c: &Self::Config, env: &Env) -> Result<Self::Result, LabError> {
        match c {
            AttentionSaturationConfig::Replicate {
                d,
                draws,
                seed,
                backend,
            } => {
                let device = env.device(backend)?;
                let mut r = rng(*seed, 3_000 + *d as u64);
                let (mut unscaled, mut scaled) = (Vec::new(), Vec::new());
                for _ in 0..*draws {
                    let q = normal_tensor(&mut r, [500, *d], device);
                    let k = normal_tensor(&mut r, [500, *d], device);
                    // [500, d] -> [500]: 500 logits q_i·k_i, one softmax across them (one row, m = 500).
                    let dot = (q * k).sum_dim(1).reshape([500]);
                    unscaled.push(scalar(softmax(dot.clone(), 0).max())?);
                    scaled.push(scalar(softmax(dot / (*d as f64).sqrt(), 0).max())?);
                }
                Ok(AttentionSaturationResult::Replicate { unscaled, scaled })
            }
            AttentionSaturationConfig::Corrected {
                d,
                m,
                n,
                draws,
                seed,
                backend,
            } => {
                let device = env.device(backend)?;
                let (mut unscaled, mut scaled) = (Vec::new(), Vec::new());
                for draw in 0..*draws {
                    let data = draw_data(*seed, *d, *m, *n, draw);
                    unscaled.push(one_draw(device, &data, (*n, *m, *d), false)?);
                    scaled.push(one_draw(device, &data, (*n, *m, *d), true)?);
                }
                Ok(AttentionSaturationResult::Corrected { unscaled, scaled })
            }
            AttentionSaturationConfig::Cross {
                d,
                m,
                n,
                seed,
                backend,
            } => {
                let device = env.device(backend)?;
                let data = draw_data(*seed, *d, *m, *n, 0);
                Ok(AttentionSaturationResult::Cross {
                    unscaled: one_draw(device, &data, (*n, *m, *d), false)?,
                    scaled: one_draw(device, &data, (*n, *m, *d), true)?,
                })
            }
        }
    }

    fn describe(&self, _: &Self::Config, r: &Self::Result) -> String {
        match r {
            AttentionSaturationResult::Corrected { unscaled, .. } => format!(
                "unscaled max p {:.3}",
                unscaled.first().map_or(f64::NAN, |v| v.max_p)
            ),
            _ => String::new(),
        }
    }
}
