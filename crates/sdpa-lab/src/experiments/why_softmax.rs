//! Experiment 9 (`why-softmax`): the article's §3.2. Softmax weights vs raw dot products vs
//! other normalizations: how the scale of the output Σ_j w_ij v_j behaves as the number of keys
//! n grows (fitted exponents over independent draws), and what softmax adds besides a bounded
//! sum: selectivity (the effective number of keys 1/Σp², the entropy), with the scores scaled
//! by 1/√d or not, so that the sweep over d means something.

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::activation::{relu, sigmoid, softmax};
use serde::Serialize;

use super::{Experiment, ExperimentOutput, md_table, out_path, write_csv};
use crate::claims::{Claim, Source, interval_below, show};
use crate::context::{LabContext, LabError, normal_tensor, to_vec};
use crate::plot::{LinePlot, Series, line_plot};
use crate::stats::{Estimate, exponent_ci, mean_ci};

/// The weightings compared.
pub const METHODS: [&str; 5] = [
    "softmax",
    "raw dot products",
    "dot products / n",
    "sigmoid (unnormalized)",
    "ReLU / Σ ReLU",
];

/// Sizes.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Keys (= queries).
    pub ns: Vec<usize>,
    /// q/k dimensions.
    pub ds: Vec<usize>,
    /// Value dimension.
    pub d_v: usize,
    /// Independent draws per cell.
    pub draws: usize,
}

impl Config {
    /// The sweep, or a small one with `quick`.
    pub fn new(quick: bool) -> Self {
        Self {
            ns: if quick {
                vec![16, 64, 256]
            } else {
                vec![16, 64, 256, 1024]
            },
            ds: vec![16, 64, 256],
            d_v: 64,
            draws: if quick { 3 } else { 10 },
        }
    }
}

/// One (method, n, d, scaling) cell over its draws.
#[derive(Debug, Clone, Serialize)]
pub struct WhySoftmaxRow {
    /// Weighting.
    pub method: String,
    /// Keys (= queries).
    pub n: usize,
    /// q/k dimension.
    pub d: usize,
    /// Scores divided by √d (std 1), or raw QKᵀ (std √d).
    pub scaled: bool,
    /// std of the output components (values have std 1), per draw.
    pub output_std: Vec<f64>,
    /// Its mean and interval.
    pub output_std_ci: Estimate,
    /// Mean Σ_j w_ij of a row (1 for normalized weightings).
    pub weight_sum: f64,
    /// Effective number of keys 1/Σ_j w_ij² (normalized weightings only), per draw.
    pub effective_keys_draws: Vec<f64>,
    /// Its mean and interval.
    pub effective_keys: Option<Estimate>,
    /// Row entropy −Σ w ln w in nats (normalized weightings only).
    pub entropy: Option<Estimate>,
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
fn normalized(method: usize) -> bool {
    method == 0 || method == 4
}

/// The experiment.
pub struct WhySoftmax;

impl Experiment for WhySoftmax {
    fn name(&self) -> &'static str {
        "why-softmax"
    }

    fn title(&self) -> &'static str {
        "Why softmax: the output scale of softmax vs raw and other weightings, and its selectivity"
    }

    fn run(&self, ctx: &LabContext) -> Result<ExperimentOutput, LabError> {
        let t0 = Instant::now();
        let device = &ctx.primary().device;
        let config = Config::new(ctx.quick);
        let mut rows: Vec<WhySoftmaxRow> = Vec::new();
        let mut rng = ctx.rng(9);
        for &d in &config.ds {
            for &n in &config.ns {
                // [method][scaled] -> per-draw (output std, weight sum, effective keys, entropy)
                let mut cells = vec![[Vec::new(), Vec::new()]; METHODS.len()];
                for _ in 0..config.draws {
                    let q = normal_tensor(&mut rng, [n, d], device);
                    let k = normal_tensor(&mut rng, [n, d], device);
                    let v = normal_tensor(&mut rng, [n, config.d_v], device);
                    // [n, d] @ [d, n] -> [n, n]
                    let raw = q.matmul(k.transpose());
                    for (si, scaled) in [false, true].into_iter().enumerate() {
                        let scores = if scaled {
                            raw.clone() / (d as f64).sqrt()
                        } else {
                            raw.clone()
                        };
                        for (mi, cell) in cells.iter_mut().enumerate() {
                            let w = weights(mi, scores.clone());
                            let weight_sum = to_vec(w.clone().sum_dim(1).mean())?[0];
                            let selectivity = if normalized(mi) {
                                let eff = to_vec(
                                    (w.clone().square().sum_dim(1).clamp_min(1e-30))
                                        .recip()
                                        .mean(),
                                )?[0];
                                let h = to_vec(
                                    (-(w.clone() * w.clone().clamp_min(1e-30).log()))
                                        .sum_dim(1)
                                        .mean(),
                                )?[0];
                                Some((eff, h))
                            } else {
                                None
                            };
                            let out = to_vec(w.matmul(v.clone()))?;
                            cell[si].push((crate::stats::std(&out), weight_sum, selectivity));
                        }
                    }
                }
                for (mi, cell) in cells.into_iter().enumerate() {
                    for (si, draws) in cell.into_iter().enumerate() {
                        let stds: Vec<f64> = draws.iter().map(|x| x.0).collect();
                        let sel: Vec<(f64, f64)> = draws.iter().filter_map(|x| x.2).collect();
                        rows.push(WhySoftmaxRow {
                            method: METHODS[mi].to_string(),
                            n,
                            d,
                            scaled: si == 1,
                            output_std_ci: mean_ci(&stds),
                            output_std: stds,
                            weight_sum: draws.iter().map(|x| x.1).sum::<f64>() / draws.len() as f64,
                            effective_keys_draws: sel.iter().map(|s| s.0).collect(),
                            effective_keys: (!sel.is_empty())
                                .then(|| mean_ci(&sel.iter().map(|s| s.0).collect::<Vec<_>>())),
                            entropy: (!sel.is_empty())
                                .then(|| mean_ci(&sel.iter().map(|s| s.1).collect::<Vec<_>>())),
                        });
                    }
                }
            }
        }
        let d_ref = 64;
        let exponents: Vec<(String, Estimate)> = METHODS
            .iter()
            .map(|m| (m.to_string(), n_exponent(&rows, m, d_ref, true)))
            .collect();
        let mut headers = vec!["weighting (scores ÷ √d)".to_string()];
        headers.extend(config.ns.iter().map(|n| format!("n = {n}")));
        headers.push("fitted n-exponent [95% CI]".into());
        let header_refs: Vec<&str> = headers.iter().map(|s| s.as_str()).collect();
        let by_n = md_table(
            &header_refs,
            &METHODS
                .iter()
                .zip(&exponents)
                .map(|(m, (_, e))| {
                    let mut r = vec![m.to_string()];
                    for &n in &config.ns {
                        let x = cell(&rows, m, n, d_ref, true);
                        r.push(x.map_or("–".into(), |x| show(x.output_std_ci)));
                    }
                    r.push(show(*e));
                    r
                })
                .collect::<Vec<_>>(),
        );
        let n_ref = 256;
        let selectivity = md_table(
            &[
                "weighting",
                "d",
                "scores",
                "effective keys 1/Σp²",
                "of n",
                "entropy (nats)",
                "output std",
            ],
            &rows
                .iter()
                .filter(|r| r.n == n_ref && r.effective_keys.is_some())
                .map(|r| {
                    let eff = r.effective_keys.unwrap_or(r.output_std_ci);
                    vec![
                        r.method.clone(),
                        r.d.to_string(),
                        if r.scaled {
                            "÷ √d".into()
                        } else {
                            "raw (std √d)".into()
                        },
                        show(eff),
                        format!("{:.1}%", 100.0 * eff.value / r.n as f64),
                        r.entropy.map_or("–".into(), show),
                        show(r.output_std_ci),
                    ]
                })
                .collect::<Vec<_>>(),
        );
        let markdown = format!(
            "Scores QKᵀ (divided by √d, std 1, or raw, std √d), values with unit variance (d_v = {}); the \
             output's component std for each weighting, means with 95% t-intervals over {} independent \
             draws. The n-exponents are least-squares slopes of log std on log n over every draw.\n\n\
             By number of keys n (d = {d_ref}, scores ÷ √d):\n\n{by_n}\n\
             Selectivity of the normalized weightings (n = {n_ref}): how many keys a row really uses, with \
             and without the 1/√d scaling.\n\n{selectivity}",
            config.d_v, config.draws,
        );
        let csv = write_csv(
            ctx,
            "why_softmax.csv",
            "method,n,d,scaled,output_std,output_std_lo,output_std_hi,weight_sum,effective_keys,entropy",
            &rows
                .iter()
                .map(|r| {
                    format!(
                        "{},{},{},{},{},{},{},{},{},{}",
                        r.method,
                        r.n,
                        r.d,
                        r.scaled,
                        r.output_std_ci.value,
                        r.output_std_ci.lo,
                        r.output_std_ci.hi,
                        r.weight_sum,
                        r.effective_keys.map_or(f64::NAN, |e| e.value),
                        r.entropy.map_or(f64::NAN, |e| e.value)
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        let plot = "why_softmax.png";
        line_plot(
            &out_path(ctx, plot),
            &LinePlot {
                title: format!(
                    "Output scale vs number of keys (d = {d_ref}, scores ÷ √d, 95% bands)"
                ),
                x_label: "number of keys n".into(),
                y_label: "std of the output".into(),
                log_x: true,
                log_y: true,
                series: METHODS
                    .iter()
                    .map(|m| {
                        Series::with_band(
                            *m,
                            rows.iter()
                                .filter(|r| r.method == *m && r.d == d_ref && r.scaled)
                                .map(|r| {
                                    (
                                        r.n as f64,
                                        r.output_std_ci.value,
                                        r.output_std_ci.lo,
                                        r.output_std_ci.hi,
                                    )
                                })
                                .collect(),
                        )
                    })
                    .collect(),
            },
        )?;
        let claims = claims(&rows, d_ref, n_ref);
        Ok(ExperimentOutput::new(
            self,
            ctx,
            claims,
            markdown,
            serde_json::json!({ "config": config, "exponents": exponents, "rows": rows }),
            t0,
        )
        .files(vec![plot.into()], vec![csv]))
    }
}

fn cell<'a>(
    rows: &'a [WhySoftmaxRow],
    method: &str,
    n: usize,
    d: usize,
    scaled: bool,
) -> Option<&'a WhySoftmaxRow> {
    rows.iter()
        .find(|r| r.method == method && r.n == n && r.d == d && r.scaled == scaled)
}

/// The fitted exponent of the output std on n over every draw.
fn n_exponent(rows: &[WhySoftmaxRow], method: &str, d: usize, scaled: bool) -> Estimate {
    let (xs, ys): (Vec<f64>, Vec<f64>) = rows
        .iter()
        .filter(|r| r.method == method && r.d == d && r.scaled == scaled)
        .flat_map(|r| r.output_std.iter().map(move |s| (r.n as f64, *s)))
        .unzip();
    exponent_ci(&xs, &ys)
}

/// The claims of `why-softmax`, decided by its rows.
pub fn claims(rows: &[WhySoftmaxRow], d_ref: usize, n_ref: usize) -> Vec<Claim> {
    let exp = |method: &str| n_exponent(rows, method, d_ref, true);
    let mut claims = vec![
        Claim::above(
            "raw-explodes",
            Source::Article("§3.2"),
            "raw dot products as weights make the output grow with the number of keys",
            "fitted n-exponent of the output std, raw dot products",
            exp(METHODS[1]),
            0.0,
        ),
        Claim::below(
            "divide-by-n-vanishes",
            Source::Article("§3.2"),
            "dividing the dot products by n makes the output vanish as n grows",
            "fitted n-exponent of the output std, dot products / n",
            exp(METHODS[2]),
            0.0,
        ),
        Claim::in_range(
            "softmax-bounded-in-n",
            Source::Article("§3.2"),
            "softmax keeps the output's scale stable whatever n",
            "fitted n-exponent of the output std, softmax",
            exp(METHODS[0]),
            -0.1,
            0.1,
        ),
        Claim::in_range(
            "softmax-averages-like-1-over-sqrt-n",
            Source::Lab,
            "with std-1 logits softmax is close to a uniform average: its output std decays like 1/√n, as ÷n's does",
            "fitted n-exponent of the output std, softmax",
            exp(METHODS[0]),
            -0.6,
            -0.4,
        ),
    ];
    let d_max = rows.iter().map(|r| r.d).max().unwrap_or(0);
    if let (Some(raw), Some(scaled)) = (
        cell(rows, METHODS[0], n_ref, d_max, false),
        cell(rows, METHODS[0], n_ref, d_max, true),
    ) && let (Some(raw_eff), Some(scaled_eff)) = (raw.effective_keys, scaled.effective_keys)
    {
        claims.push(Claim::decided(
            "softmax-selects",
            Source::Lab,
            format!(
                "what softmax adds is selectivity: larger logits (unscaled, d = {d_max}) concentrate each row on fewer keys"
            ),
            "effective keys 1/Σp²: the unscaled interval entirely below the scaled one",
            format!("unscaled {}, scaled {} (n = {n_ref})", show(raw_eff), show(scaled_eff)),
            interval_below(raw_eff, scaled_eff),
        ));
    }
    let (xs, ys): (Vec<f64>, Vec<f64>) = rows
        .iter()
        .filter(|r| r.method == METHODS[0] && r.n == n_ref && !r.scaled)
        .flat_map(|r| r.effective_keys_draws.iter().map(move |e| (r.d as f64, *e)))
        .unzip();
    claims.push(Claim::below(
        "unscaled-selectivity-grows-with-d",
        Source::Lab,
        format!(
            "with unscaled scores, the effective number of keys falls as d grows (n = {n_ref})"
        ),
        "fitted d-exponent of softmax's effective keys, raw scores",
        exponent_ci(&xs, &ys),
        0.0,
    ));
    claims
}
