//! Experiment 9 (`why-softmax`): the article's §3.2. Softmax weights vs raw dot products vs
//! other normalizations: how the scale of the output Σ_j w_ij v_j behaves as the number of keys
//! n and the dimension d grow.

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::activation::{relu, sigmoid, softmax};
use serde::Serialize;

use super::{Experiment, ExperimentOutput, Verdict, f, md_table, out_path, write_csv};
use crate::context::{LabContext, LabError, normal_tensor, to_vec};
use crate::plot::{LinePlot, Series, line_plot};

/// The weightings compared.
pub const METHODS: [&str; 5] = [
    "softmax",
    "raw dot products",
    "dot products / n",
    "sigmoid (unnormalized)",
    "ReLU / Σ ReLU",
];

/// One (method, n, d) cell.
#[derive(Debug, Clone, Serialize)]
pub struct WhySoftmaxRow {
    /// Weighting.
    pub method: String,
    /// Keys (= queries).
    pub n: usize,
    /// q/k dimension.
    pub d: usize,
    /// std of the output components (values have std 1).
    pub output_std: f64,
    /// Mean Σ_j w_ij of a row (1 for normalized weightings).
    pub weight_sum: f64,
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

/// The experiment.
pub struct WhySoftmax;

impl Experiment for WhySoftmax {
    fn name(&self) -> &'static str {
        "why-softmax"
    }

    fn title(&self) -> &'static str {
        "Why softmax: the output scale of softmax vs raw and other weightings"
    }

    fn run(&self, ctx: &LabContext) -> Result<ExperimentOutput, LabError> {
        let t0 = Instant::now();
        let device = &ctx.primary().device;
        let ns: Vec<usize> = if ctx.quick {
            vec![16, 64, 256]
        } else {
            vec![16, 64, 256, 1024]
        };
        let ds = [16usize, 64, 256];
        let d_v = 64;
        let mut rows = Vec::new();
        let mut rng = ctx.rng(9);
        for &d in &ds {
            for &n in &ns {
                let q = normal_tensor(&mut rng, [n, d], device);
                let k = normal_tensor(&mut rng, [n, d], device);
                let v = normal_tensor(&mut rng, [n, d_v], device);
                // [n, d] @ [d, n] -> [n, n], scaled so that the scores have std 1
                let scores = q.matmul(k.transpose()) / (d as f64).sqrt();
                for (mi, name) in METHODS.iter().enumerate() {
                    let w = weights(mi, scores.clone());
                    let weight_sum = to_vec(w.clone().sum_dim(1).mean())?[0];
                    let out = to_vec(w.matmul(v.clone()))?;
                    rows.push(WhySoftmaxRow {
                        method: name.to_string(),
                        n,
                        d,
                        output_std: crate::stats::std(&out),
                        weight_sum,
                    });
                }
            }
        }
        let d_ref = 64;
        let mut headers = vec!["weighting".to_string()];
        headers.extend(ns.iter().map(|n| format!("n = {n}")));
        let header_refs: Vec<&str> = headers.iter().map(|s| s.as_str()).collect();
        let by_n = md_table(
            &header_refs,
            &METHODS
                .iter()
                .map(|m| {
                    let mut r = vec![m.to_string()];
                    for &n in &ns {
                        let x = rows
                            .iter()
                            .find(|r| r.method == *m && r.n == n && r.d == d_ref);
                        r.push(f(x.map_or(f64::NAN, |x| x.output_std), 3));
                    }
                    r
                })
                .collect::<Vec<_>>(),
        );
        let n_ref = 256;
        let by_d = md_table(
            &["weighting", "d = 16", "d = 64", "d = 256"],
            &METHODS
                .iter()
                .map(|m| {
                    let mut r = vec![m.to_string()];
                    for &d in &ds {
                        let x = rows
                            .iter()
                            .find(|r| r.method == *m && r.n == n_ref && r.d == d);
                        r.push(f(x.map_or(f64::NAN, |x| x.output_std), 3));
                    }
                    r
                })
                .collect::<Vec<_>>(),
        );
        let raw = |n: usize| {
            rows.iter()
                .find(|r| r.method == METHODS[1] && r.n == n && r.d == d_ref)
                .map_or(f64::NAN, |r| r.output_std)
        };
        let soft = |n: usize| {
            rows.iter()
                .find(|r| r.method == METHODS[0] && r.n == n && r.d == d_ref)
                .map_or(f64::NAN, |r| r.output_std)
        };
        let (n0, n1) = (ns[0], *ns.last().unwrap_or(&ns[0]));
        let markdown = format!(
            "Scores QKᵀ/√d (std 1), values with unit variance (d_v = {d_v}); the output's component std for \
             each weighting.\n\nBy number of keys n (d = {d_ref}):\n\n{by_n}\nBy dimension d (n = {n_ref}):\n\n{by_d}\n\
             Raw dot products add up n terms of unit variance: the output std grows like √n ({} → {} from \
             n = {n0} to {n1}), the \"explosion\" of the article; dividing by n makes it vanish like \
             1/√n instead (the \"all very small\" case). Sigmoid gates are not normalized either and grow \
             like √n. Softmax and ReLU/ΣReLU keep Σ_j w_ij = 1: the output is a convex combination of \
             values, so its scale is bounded by the values' whatever n and d ({} → {} for softmax). \
             Only softmax also gives every key a positive, smooth, competitive weight (∂a_i/∂s_j = \
             a_i(δ_ij − a_j)); ReLU/ΣReLU zeroes out negative scores and their gradients.\n",
            f(raw(n0), 2),
            f(raw(n1), 2),
            f(soft(n0), 3),
            f(soft(n1), 3)
        );
        let csv = write_csv(
            ctx,
            "why_softmax.csv",
            "method,n,d,output_std,weight_sum",
            &rows
                .iter()
                .map(|r| {
                    format!(
                        "{},{},{},{},{}",
                        r.method, r.n, r.d, r.output_std, r.weight_sum
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        let plot = "why_softmax.png";
        line_plot(
            &out_path(ctx, plot),
            &LinePlot {
                title: format!("Output scale vs number of keys (d = {d_ref})"),
                x_label: "number of keys n".into(),
                y_label: "std of the output".into(),
                log_x: true,
                log_y: true,
                series: METHODS
                    .iter()
                    .map(|m| {
                        Series::line(
                            *m,
                            rows.iter()
                                .filter(|r| r.method == *m && r.d == d_ref)
                                .map(|r| (r.n as f64, r.output_std))
                                .collect(),
                        )
                    })
                    .collect(),
            },
        )?;
        Ok(ExperimentOutput {
            name: self.name().into(),
            title: self.title().into(),
            verdict: Verdict::Measured,
            summary: format!(
                "output std from n = {n0} to {n1}: raw dot products {} → {}, softmax {} → {}",
                f(raw(n0), 2),
                f(raw(n1), 2),
                f(soft(n0), 3),
                f(soft(n1), 3)
            ),
            markdown,
            results: serde_json::json!({ "rows": rows }),
            plots: vec![plot.into()],
            csv: vec![csv],
            skipped: vec![],
            backends: vec![ctx.primary().name.clone()],
            seconds: t0.elapsed().as_secs_f64(),
        })
    }
}
