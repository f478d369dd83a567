//! `why-softmax` (§3.2): softmax weights vs raw dot products vs other normalizations — how the
//! scale of the output Σ_j w_ij v_j behaves as the number of keys n grows (fitted exponents over
//! independent draws), and what softmax adds besides a bounded sum: selectivity (the effective
//! number of keys 1/Σp², the entropy), with the scores scaled by 1/√d or not. One cell per
//! (d, n): every weighting and both scalings on the same draws.

mod analyze;
mod render;

use burn::prelude::*;
use burn::tensor::activation::{relu, sigmoid, softmax};
use serde::{Deserialize, Serialize};

pub use analyze::{WhySoftmaxData, analyze};

use crate::context::{Env, LabError, normal_tensor, rng, scalar, to_vec};
use crate::experiment::{AnalyzeFn, Cell, Measured, Plan, RenderFn, Stages, Weight};

/// The weightings compared.
pub const METHODS: [&str; 5] = [
    "softmax",
    "raw dot products",
    "dot products / n",
    "sigmoid (unnormalized)",
    "ReLU / Σ ReLU",
];

/// One cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WhySoftmaxConfig {
    /// Keys (= queries).
    pub n: usize,
    /// q/k dimension.
    pub d: usize,
    /// Value dimension.
    pub d_v: usize,
    /// Independent draws.
    pub draws: usize,
    /// Seed.
    pub seed: u64,
    /// Backend.
    pub backend: String,
}

/// One draw of one weighting.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DrawValues {
    /// std of the output components (values have std 1).
    pub output_std: f64,
    /// Mean Σ_j w_ij of a row.
    pub weight_sum: f64,
    /// Effective number of keys 1/Σ_j w_ij² (normalized weightings only).
    pub effective_keys: Option<f64>,
    /// Row entropy −Σ w ln w in nats (normalized weightings only).
    pub entropy: Option<f64>,
}

/// One cell's measurement: `values[method][scaled as usize][draw]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WhySoftmaxResult {
    /// Every weighting, unscaled then scaled, every draw.
    pub values: Vec<[Vec<DrawValues>; 2]>,
}

fn weights(method: usize, scores: Tensor<2>) -> Tensor<2> {
    let [_, n] = scores.dims();
    match method {
        0 => softmax(scores, 1),
        1 => scores,
        2 => scores / n as f64,
        3 => sigmoid(scores),
        _ => {
            let r = relu(scores);
            let s = r.clone().sum_dim(1).clamp_min(1e-12);
            r / s
        }
    }
}

/// Whether a weighting's rows sum to 1 (selectivity is defined for those).
pub fn normalized(method: usize) -> bool {
    method == 0 || method == 4
}

/// The experiment.
pub struct WhySoftmax;

impl Stages for WhySoftmax {
    type Config = WhySoftmaxConfig;
    type Result = WhySoftmaxResult;
    type Data = WhySoftmaxData;
    const ANALYZE: AnalyzeFn<Self> = |_, cells| analyze(cells);
    const RENDER: RenderFn<Self> = render::render;

    fn name(&self) -> &'static str {
        "why-softmax"
    }

    fn title(&self) -> &'static str {
        "Why softmax: the output scale of softmax vs raw and other weightings, and its selectivity"
    }

    fn plan(
        &self,
        plan: &Plan,
        _: usize,
        _: &[Measured<Self::Config, Self::Result>],
    ) -> Vec<Cell<Self::Config>> {
        let ns: &[usize] = if plan.quick {
            &[16, 64, 256]
        } else {
            &[16, 64, 256, 1024]
        };
        let draws = if plan.quick { 3 } else { 10 };
        [16, 64, 256]
            .iter()
            .flat_map(|&d| {
                ns.iter().map(move |&n| Cell {
                    id: format!("d{d}/n{n}"),
                    config: WhySoftmaxConfig {
                        n,
                        d,
                        d_v: 64,
                        draws,
                        seed: plan.seed,
                        backend: plan.primary().into(),
                    },
                    weight: Weight::Light,
                })
            })
            .collect()
    }

    fn measure(&self, c: &Self::Config, env: &Env) -> Result<Self::Result, LabError> {
        let device = env.device(&c.backend)?;
        let mut r = rng(c.seed, 9_000_000 + (c.d * 10_000 + c.n) as u64);
        let mut values: Vec<[Vec<DrawValues>; 2]> = (0..METHODS.len())
            .map(|_| [Vec::new(), Vec::new()])
            .collect();
        for _ in 0..c.draws {
            let q = normal_tensor(&mut r, [c.n, c.d], device);
            let k = normal_tensor(&mut r, [c.n, c.d], device);
            let v = normal_tensor(&mut r, [c.n, c.d_v], device);
            // [n, d] @ [d, n] -> [n, n]
            let raw = q.matmul(k.transpose());
            for (si, scaled) in [false, true].into_iter().enumerate() {
                let scores = if scaled {
                    raw.clone() / (c.d as f64).sqrt()
                } else {
                    raw.clone()
                };
                for (mi, cell) in values.iter_mut().enumerate() {
                    let w = weights(mi, scores.clone());
                    let weight_sum = scalar(w.clone().sum_dim(1).mean())?;
                    let (effective_keys, entropy) = if normalized(mi) {
                        (
                            Some(scalar(
                                w.clone()
                                    .square()
                                    .sum_dim(1)
                                    .clamp_min(1e-30)
                                    .recip()
                                    .mean(),
                            )?),
                            Some(scalar(
                                (-(w.clone() * w.clone().clamp_min(1e-30).log()))
                                    .sum_dim(1)
                                    .mean(),
                            )?),
                        )
                    } else {
                        (None, None)
                    };
                    let out = to_vec(w.matmul(v.clone()))?;
                    cell[si].push(DrawValues {
                        output_std: crate::stats::std(&out),
                        weight_sum,
                        effective_keys,
                        entropy,
                    });
                }
            }
        }
        Ok(WhySoftmaxResult { values })
    }
}
