//! Recording a step of a run in progress ([`Run::record`]): its loss, accuracy, gradient norms
//! and attention diagnostics, read back at once, and the row it appends to `metrics.csv`.

use std::io::Write as _;

use burn::prelude::*;
use burn::tensor::Gradients;
use burn_sdpa::AttentionError;
use burn_sdpa::diagnostics::AttentionDiagnostics;

use super::Run;
use crate::error::ModelError;
use crate::metrics::{LayerMetrics, StepMetrics};
use crate::model::{BatchResult, Block};
use crate::train::evaluate::evaluate;
use crate::train::grad_norms::squared_norm;

impl Run<'_> {
    /// What a recorded step reads back beside its loss and squared gradient norm, left on the
    /// device: the accuracy, the squared gradient norms of the query, key and value projections
    /// (all layers), then per layer the diagnostics' values
    /// ([`DIAGNOSTIC_VALUES`](burn_sdpa::diagnostics::DIAGNOSTIC_VALUES) per head) and the query and key std.
    pub(super) fn record_parts(&self, out: &BatchResult, grads: &Gradients) -> Vec<Tensor<1>> {
        let mut parts = vec![out.accuracy()];
        let inner = &self.inner;
        let blocks = &self.model.blocks;
        let squared = |f: &dyn Fn(&Block) -> Option<Tensor<2>>| {
            blocks
                .iter()
                .map(|b| squared_norm(f(b), inner))
                .reduce(|a, b| a + b)
                .unwrap_or_else(|| Tensor::zeros([1], inner))
        };
        parts.push(squared(&|b| b.attention.query.weight.grad(grads)));
        parts.push(squared(&|b| b.attention.key.weight.grad(grads)));
        parts.push(squared(&|b| b.attention.value.weight.grad(grads)));
        for layer in &out.attention {
            parts.push(burn_sdpa::diagnostics::diagnostics_tensor(&layer.stats));
            parts.push(layer.qk_std.clone());
        }
        parts
    }

    /// Records the step: loss, accuracy, gradient norms, attention diagnostics and, when due, the
    /// held-out evaluation; appends the row to `metrics.csv`. `v` holds the values read back:
    /// [loss, |g|², then [`record_parts`](Self::record_parts)'s].
    pub(super) fn record(&mut self, out: &BatchResult, v: &[f64]) -> Result<(), ModelError> {
        let config = self.config;
        let step = self.step;
        // [loss, |g|², accuracy, |g_q|², |g_k|², |g_v|², per layer: diagnostics, q std, k std]
        let mut rest = &v[6.min(v.len())..];
        let mut layers = out
            .attention
            .iter()
            .map(|a| {
                let n_heads = a.stats.entropy.dims()[1];
                let len = burn_sdpa::diagnostics::DIAGNOSTIC_VALUES * n_heads;
                if rest.len() < len + 2 {
                    return Err(ModelError::Attention(AttentionError::Shape {
                        what: "the recorded values",
                        expected: format!("{} more", len + 2),
                        got: vec![rest.len()],
                    }));
                }
                let d = AttentionDiagnostics::from_tensor_values(&rest[..len], n_heads)?.mean();
                let (query_std, key_std) = (rest[len], rest[len + 1]);
                rest = &rest[len + 2..];
                Ok(LayerMetrics {
                    entropy: d.entropy,
                    normalized_entropy: d.normalized_entropy,
                    max_prob: d.max_prob,
                    saturated_fraction: d.saturated_fraction,
                    logit_std: d.logit_std.unwrap_or(f64::NAN),
                    query_std,
                    key_std,
                    max_logit: d.max_logit.unwrap_or(f64::NAN),
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        if layers.is_empty() {
            // A diverged step that was not due for recording ran without statistics: its row
            // keeps every layer's columns, as NaN.
            let nan = LayerMetrics {
                entropy: f64::NAN,
                normalized_entropy: f64::NAN,
                max_prob: f64::NAN,
                saturated_fraction: f64::NAN,
                logit_std: f64::NAN,
                query_std: f64::NAN,
                key_std: f64::NAN,
                max_logit: f64::NAN,
            };
            layers = vec![nan; self.model.blocks.len()];
        }
        if step == 0 {
            self.initial = layers.clone();
        }
        let eval = if step.is_multiple_of(config.eval_every) {
            Some(evaluate(&self.model, &self.eval_set)?)
        } else {
            None
        };
        let m = StepMetrics {
            step,
            loss: v[0],
            accuracy: v[2],
            grad_norm: v[1].sqrt(),
            grad_norm_query: v[3].sqrt(),
            grad_norm_key: v[4].sqrt(),
            grad_norm_value: v[5].sqrt(),
            eval_loss: eval.map(|e| e.0),
            eval_accuracy: eval.map(|e| e.1),
            layers,
            elapsed_s: self.elapsed(),
        };
        if let Some(csv) = &mut self.csv {
            writeln!(csv, "{}", m.csv_row()).map_err(|e| ModelError::io(&self.metrics_path, e))?;
        }
        let rate = (step + 1 - self.start) as f64 / self.clock.elapsed().as_secs_f64().max(1e-9);
        self.progress.update(
            step as u64,
            &format!(
                "loss {:.4} acc {:.3} {:.1} steps/s",
                m.loss, m.accuracy, rate
            ),
        );
        if let Some((loss, accuracy)) = eval {
            self.progress.println(&format!(
                "step {step:>6}: held-out loss {loss:.4}, accuracy {accuracy:.4}"
            ));
            if accuracy >= config.target_accuracy && self.steps_to_target.is_none() {
                self.steps_to_target = Some(step);
            }
        }
        self.history.push(m);
        Ok(())
    }
}
