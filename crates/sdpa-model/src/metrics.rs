//! What the training loop records at a step, and its CSV form.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// Attention diagnostics of one layer at one step (mean over heads).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct LayerMetrics {
    /// Mean row entropy (nats).
    #[serde(with = "crate::json_float")]
    pub entropy: f64,
    /// Entropy / ln(keys): 1 uniform, 0 one-hot.
    #[serde(with = "crate::json_float")]
    pub normalized_entropy: f64,
    /// Mean largest probability of a row.
    #[serde(with = "crate::json_float")]
    pub max_prob: f64,
    /// Fraction of rows with max p > 0.99.
    #[serde(with = "crate::json_float")]
    pub saturated_fraction: f64,
    /// Mean within-row std of the scaled scores.
    #[serde(with = "crate::json_float")]
    pub logit_std: f64,
    /// Std of the query components entering the scores (after LayerNorm, projection and
    /// QK-norm; before the scale).
    #[serde(with = "crate::json_float", default)]
    pub query_std: f64,
    /// Std of the key components entering the scores.
    #[serde(with = "crate::json_float", default)]
    pub key_std: f64,
    /// The largest scaled score any row of the layer sees (max over heads, rows and batch; NaN
    /// in records written before it was recorded).
    #[serde(with = "crate::json_float", default = "not_recorded")]
    pub max_logit: f64,
}

/// The value of a metric that an older record does not hold.
fn not_recorded() -> f64 {
    f64::NAN
}

/// One recorded step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct StepMetrics {
    /// Optimizer steps taken before this batch (0 = the initial model).
    pub step: usize,
    /// Training loss of the batch.
    pub loss: f64,
    /// Training accuracy of the batch.
    pub accuracy: f64,
    /// Global gradient norm over all parameters.
    pub grad_norm: f64,
    /// Gradient norm of the query projections (all layers).
    pub grad_norm_query: f64,
    /// Gradient norm of the key projections (all layers).
    pub grad_norm_key: f64,
    /// Gradient norm of the value projections (all layers).
    pub grad_norm_value: f64,
    /// Held-out loss, at evaluation steps.
    pub eval_loss: Option<f64>,
    /// Held-out accuracy, at evaluation steps.
    pub eval_accuracy: Option<f64>,
    /// Per attention layer.
    pub layers: Vec<LayerMetrics>,
    /// Seconds since the run started (resumed runs continue the count).
    pub elapsed_s: f64,
}

/// CSV columns per attention layer.
const PER_LAYER: usize = 8;
/// CSV columns per attention layer in files written before `max_logit` was recorded.
const PER_LAYER_BEFORE_MAX_LOGIT: usize = 7;

/// The CSV header for `n_layers` attention layers.
pub fn csv_header(n_layers: usize) -> String {
    header_with(n_layers, PER_LAYER)
}

/// The CSV header of files written before `max_logit` was recorded (a resumed run reads them
/// and rewrites them with [`csv_header`]).
pub fn csv_header_before_max_logit(n_layers: usize) -> String {
    header_with(n_layers, PER_LAYER_BEFORE_MAX_LOGIT)
}

/// The header with the first `per_layer` columns of each layer.
fn header_with(n_layers: usize, per_layer: usize) -> String {
    let mut h = String::from(
        "step,loss,accuracy,grad_norm,grad_norm_query,grad_norm_key,grad_norm_value,eval_loss,eval_accuracy",
    );
    for l in 0..n_layers {
        for name in [
            "entropy",
            "normalized_entropy",
            "max_prob",
            "saturated_fraction",
            "logit_std",
            "query_std",
            "key_std",
            "max_logit",
        ]
        .into_iter()
        .take(per_layer)
        {
            let _ = write!(h, ",{name}_l{l}");
        }
    }
    h.push_str(",elapsed_s");
    h
}

fn opt(x: Option<f64>) -> String {
    x.map(|v| format!("{v}")).unwrap_or_default()
}

impl StepMetrics {
    /// One CSV line (no newline), matching [`csv_header`].
    pub fn csv_row(&self) -> String {
        let mut r = format!(
            "{},{},{},{},{},{},{},{},{}",
            self.step,
            self.loss,
            self.accuracy,
            self.grad_norm,
            self.grad_norm_query,
            self.grad_norm_key,
            self.grad_norm_value,
            opt(self.eval_loss),
            opt(self.eval_accuracy)
        );
        for l in &self.layers {
            let _ = write!(
                r,
                ",{},{},{},{},{},{},{},{}",
                l.entropy,
                l.normalized_entropy,
                l.max_prob,
                l.saturated_fraction,
                l.logit_std,
                l.query_std,
                l.key_std,
                l.max_logit
            );
        }
        let _ = write!(r, ",{:.3}", self.elapsed_s);
        r
    }

    /// Parses a line written by [`csv_row`](Self::csv_row) (or by a version that did not
    /// record `max_logit`, which then reads NaN).
    pub fn from_csv_row(line: &str, n_layers: usize) -> Option<Self> {
        let f: Vec<&str> = line.trim().split(',').collect();
        let per_layer = [PER_LAYER, PER_LAYER_BEFORE_MAX_LOGIT]
            .into_iter()
            .find(|per| f.len() == 10 + per * n_layers)?;
        let num = |i: usize| f[i].parse::<f64>().ok();
        let maybe = |i: usize| {
            if f[i].is_empty() {
                Some(None)
            } else {
                num(i).map(Some)
            }
        };
        let layers = (0..n_layers)
            .map(|l| {
                let b = 9 + per_layer * l;
                Some(LayerMetrics {
                    entropy: num(b)?,
                    normalized_entropy: num(b + 1)?,
                    max_prob: num(b + 2)?,
                    saturated_fraction: num(b + 3)?,
                    logit_std: num(b + 4)?,
                    query_std: num(b + 5)?,
                    key_std: num(b + 6)?,
                    max_logit: if per_layer == PER_LAYER {
                        num(b + 7)?
                    } else {
                        f64::NAN
                    },
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(StepMetrics {
            step: f[0].parse().ok()?,
            loss: num(1)?,
            accuracy: num(2)?,
            grad_norm: num(3)?,
            grad_norm_query: num(4)?,
            grad_norm_key: num(5)?,
            grad_norm_value: num(6)?,
            eval_loss: maybe(7)?,
            eval_accuracy: maybe(8)?,
            layers,
            elapsed_s: num(9 + per_layer * n_layers)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_round_trip() {
        let m = StepMetrics {
            step: 3,
            loss: 1.5,
            accuracy: 0.25,
            grad_norm: 2.0,
            grad_norm_query: 0.1,
            grad_norm_key: 0.2,
            grad_norm_value: 0.3,
            eval_loss: None,
            eval_accuracy: Some(0.5),
            layers: vec![LayerMetrics {
                entropy: 1.0,
                normalized_entropy: 0.5,
                max_prob: 0.4,
                saturated_fraction: 0.0,
                logit_std: 2.5,
                query_std: 0.9,
                key_std: 1.1,
                max_logit: 4.5,
            }],
            elapsed_s: 1.25,
        };
        assert_eq!(
            csv_header(1).split(',').count(),
            m.csv_row().split(',').count()
        );
        assert_eq!(StepMetrics::from_csv_row(&m.csv_row(), 1), Some(m.clone()));
        // A row written before max_logit was recorded still reads, with NaN for it.
        let old = "3,1.5,0.25,2,0.1,0.2,0.3,,0.5,1,0.5,0.4,0,2.5,0.9,1.1,1.250";
        let read = StepMetrics::from_csv_row(old, 1).expect("an older row");
        assert!(read.layers[0].max_logit.is_nan());
        assert_eq!(read.layers[0].key_std, 1.1);
        assert_eq!(read.elapsed_s, 1.25);
    }
}
