//! Attention diagnostics: how peaked (saturated) the softmax rows are, per head.
//!
//! [`diagnostics_from_row_stats`] reduces the `[b, h, n]` row statistics that every path returns
//! with [`AttentionInput::need_row_stats`](crate::AttentionInput::need_row_stats) (the fused
//! kernels carry them through their online softmax: no weights, no extra pass);
//! [`attention_diagnostics`] reduces `[b, h, n, m]` weights for callers that have them. Both
//! compute on the device and read back one small table, so they are cheap enough to call at
//! every training step.

use burn::prelude::*;
use burn::tensor::{DType, FloatDType};
use serde::{Deserialize, Serialize};

use crate::error::AttentionError;
use crate::input::read_back;
use crate::types::check_broadcast;

/// The probability above which a row counts as saturated (nearly one-hot).
pub const SATURATION_THRESHOLD: f64 = 0.99;

/// Diagnostics of one head, averaged over the batch and over the query rows that have at least
/// one visible key (fully masked rows are left out).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct HeadDiagnostics {
    /// Mean row entropy H = −Σ p ln p, in nats.
    pub entropy: f64,
    /// Mean of H / ln(k) over rows with k ≥ 2 visible keys: 1 is uniform, 0 is one-hot.
    pub normalized_entropy: f64,
    /// Mean of the row's largest probability.
    pub max_prob: f64,
    /// Mean effective number of keys exp(H).
    pub effective_keys: f64,
    /// Fraction of rows whose largest probability exceeds [`SATURATION_THRESHOLD`].
    pub saturated_fraction: f64,
    /// Mean within-row standard deviation of the scores over the visible keys (what the softmax
    /// sees; a row-wide shift does not change the softmax), when the scores were given.
    pub logit_std: Option<f64>,
    /// The largest visible logit of the head over every row and batch entry (the logit growth
    /// that Wortsman et al. 2023 track), when the scores were given.
    #[serde(default)]
    pub max_logit: Option<f64>,
}

/// Diagnostics of every head of one attention call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct AttentionDiagnostics {
    /// One entry per head.
    pub per_head: Vec<HeadDiagnostics>,
}

impl AttentionDiagnostics {
    /// The mean over heads.
    pub fn mean(&self) -> HeadDiagnostics {
        let n = self.per_head.len().max(1) as f64;
        let sum =
            |f: &dyn Fn(&HeadDiagnostics) -> f64| self.per_head.iter().map(f).sum::<f64>() / n;
        // The mean over heads when every head has one.
        let logit_std = if self.per_head.is_empty() {
            None
        } else {
            let total: Option<f64> = self.per_head.iter().map(|h| h.logit_std).sum();
            total.map(|total| total / n)
        };
        // The largest over heads when every head has one.
        let max_logit = if self.per_head.is_empty() {
            None
        } else {
            self.per_head
                .iter()
                .map(|h| h.max_logit)
                .try_fold(f64::NEG_INFINITY, |a, x| x.map(|x| a.max(x)))
        };
        HeadDiagnostics {
            entropy: sum(&|h| h.entropy),
            normalized_entropy: sum(&|h| h.normalized_entropy),
            max_prob: sum(&|h| h.max_prob),
            effective_keys: sum(&|h| h.effective_keys),
            saturated_fraction: sum(&|h| h.saturated_fraction),
            logit_std,
            max_logit,
        }
    }
}

/// Sums a `[b, h, n, 1]` tensor over batch and rows: `[h]`.
fn per_head_sum(x: Tensor<4>) -> Tensor<1> {
    let [_, h, _, _] = x.dims();
    // [b, h, n, 1] -> [1, h, 1, 1] -> [h]
    x.sum_dim(0).sum_dim(2).reshape([h])
}

/// Computes the diagnostics of attention weights.
///
/// # Shapes
/// - weights: `[b, h, n, m]`, rows summing to 1 (0 for fully masked rows)
/// - mask: `[b|1, h|1, n|1, m]`, true = masked out (optional; without it every key counts as
///   visible, which changes only the normalized entropy)
/// - scores: `[b, h, n, m]` (optional; needed for `logit_std`)
pub fn attention_diagnostics(
    weights: Tensor<4>,
    mask: Option<Tensor<4, Bool>>,
    scores: Option<Tensor<4>>,
) -> Result<AttentionDiagnostics, AttentionError> {
    let shape = weights.dims();
    let [_, h, _, _] = shape;
    if let Some(mask) = &mask {
        check_broadcast("mask", mask.dims(), shape)?;
    }
    if let Some(scores) = &scores
        && scores.dims() != shape
    {
        return Err(AttentionError::Shape {
            what: "scores",
            expected: format!("the weights' shape {shape:?}"),
            got: scores.dims().to_vec(),
        });
    }
    // Diagnostics never take part in a backward pass, and are computed in f32 so that p·ln p of
    // tiny half-precision probabilities does not underflow.
    let prep = |t: Tensor<4>| {
        let t = if t.is_autodiff() {
            t.without_autodiff()
        } else {
            t
        };
        t.cast(FloatDType::F32)
    };
    let weights = prep(weights);
    let device = weights.device();
    let visible: Tensor<4> = match mask {
        Some(mask) => {
            let mask = if mask.is_autodiff() {
                mask.without_autodiff()
            } else {
                mask
            };
            mask.expand(shape).bool_not().float().cast(FloatDType::F32)
        }
        None => Tensor::ones(shape, (&device, DType::F32)),
    };
    // [b, h, n, 1]
    let n_visible = visible.clone().sum_dim(3);
    let row_sum = weights.clone().sum_dim(3);
    // A row counts when it has a visible key and carries probability mass.
    let valid = n_visible
        .clone()
        .greater_elem(0.5)
        .bool_and(row_sum.greater_elem(0.5))
        .float();
    let multi = n_visible.clone().greater_elem(1.5).float() * valid.clone();

    let entropy = -(weights.clone() * weights.clone().clamp_min(1e-30).log()).sum_dim(3);
    let max_prob = weights.max_dim(3);
    let saturated = max_prob.clone().greater_elem(SATURATION_THRESHOLD).float();
    let ln_k = n_visible.clone().clamp_min(2.0).log();

    let mut rows = vec![
        per_head_sum(valid.clone()),
        per_head_sum(multi.clone()),
        per_head_sum(entropy.clone() * valid.clone()),
        per_head_sum(entropy.clone() / ln_k * multi.clone()),
        per_head_sum(max_prob * valid.clone()),
        per_head_sum(entropy.exp() * valid.clone()),
        per_head_sum(saturated * valid.clone()),
    ];
    let has_scores = scores.is_some();
    if let Some(scores) = scores {
        let scores = prep(scores);
        let hidden = visible.clone().lower_elem(0.5);
        let k = n_visible.clamp_min(1.0);
        let zeroed = scores.clone().mask_fill(hidden.clone(), 0.0);
        let mean = zeroed.clone().sum_dim(3) / k.clone();
        let centered = (zeroed - mean).mask_fill(hidden.clone(), 0.0);
        let std = (centered.square().sum_dim(3) / k).sqrt();
        rows.push(per_head_sum(std * multi));
        // [b, h, n, m] -> [b, h, n, 1], the largest visible score of each row
        let row_max = scores.mask_fill(hidden, f32::NEG_INFINITY).max_dim(3);
        rows.push(per_head_max(
            row_max.mask_fill(valid.lower_elem(0.5), f32::NEG_INFINITY),
        ));
    }
    // [rows, h], read back in one transfer.
    let table: Vec<f64> = read_back("the diagnostics", Tensor::stack::<2>(rows, 0))?;
    Ok(AttentionDiagnostics::from_table(&table, h, has_scores))
}

/// The largest entry of a `[b, h, n, 1]` tensor over batch and rows: `[h]`.
fn per_head_max(x: Tensor<4>) -> Tensor<1> {
    let [_, h, _, _] = x.dims();
    // [b, h, n, 1] -> [1, h, 1, 1] -> [h]
    x.max_dim(0).max_dim(2).reshape([h])
}

/// The diagnostics of one attention call from its row statistics `[b, h, n]` (what every path
/// returns with [`AttentionInput::need_row_stats`](crate::AttentionInput::need_row_stats)),
/// without the `[b, h, n, m]` weights. The same numbers as [`attention_diagnostics`] of the
/// call's weights, mask and scores (the rows that count are those with a visible key and a
/// finite entropy; `normalized_entropy` and `logit_std` average over the rows with at least two
/// visible keys; `logit_std` and `max_logit` are always given), except with sinks or quiet
/// softmax: [`attention_diagnostics`] leaves out a row whose weights sum to 0.5 or less (a sink
/// holding most of its mass), this counts every row that sees a key.
///
/// # Example
/// ```
/// use burn::prelude::*;
/// use burn::tensor::Distribution;
/// use burn_sdpa::diagnostics::diagnostics_from_row_stats;
/// use burn_sdpa::{AttentionInput, ScaledDotProductAttentionConfig};
///
/// let device = Device::flex();
/// let q = Tensor::<4>::random([2, 4, 16, 8], Distribution::Normal(0.0, 1.0), &device);
/// let attention = ScaledDotProductAttentionConfig::new().init();
/// let out = attention.forward(AttentionInput::new(q.clone(), q.clone(), q).causal().need_row_stats());
/// let diagnostics = diagnostics_from_row_stats(&out.row_stats.unwrap()).unwrap();
/// assert_eq!(diagnostics.per_head.len(), 4);
/// assert!(diagnostics.mean().max_prob <= 1.0);
/// ```
pub fn diagnostics_from_row_stats(
    stats: &crate::RowStats,
) -> Result<AttentionDiagnostics, AttentionError> {
    let n_heads = stats.entropy.dims()[1];
    let values: Vec<f64> = read_back("the diagnostics", diagnostics_tensor(stats))?;
    AttentionDiagnostics::from_tensor_values(&values, n_heads)
}

/// How many values per head [`diagnostics_tensor`] holds.
pub const DIAGNOSTIC_VALUES: usize = 9;

// The CPU backends' one-pass sums write the same layout.
#[cfg(any(feature = "flex", feature = "ndarray"))]
const _: () = assert!(DIAGNOSTIC_VALUES == crate::paths::cpu::reduce::ROW_DIAGNOSTIC_VALUES);

/// The reductions behind [`diagnostics_from_row_stats`], left on the device: `[DIAGNOSTIC_VALUES
/// · h]` values (f32) that [`AttentionDiagnostics::from_tensor_values`] turns into the
/// diagnostics once read back. A training loop concatenates them with its other numbers to read
/// everything a step records in one transfer. On the CPU backends (with `f32` statistics) the
/// sums come from one pass over the statistics' buffers (in `f64`) instead of tensor ops.
pub fn diagnostics_tensor(stats: &crate::RowStats) -> Tensor<1> {
    #[cfg(any(feature = "flex", feature = "ndarray"))]
    {
        let columns = [
            &stats.entropy,
            &stats.max_prob,
            &stats.visible_keys,
            &stats.logit_std,
            &stats.max_logit,
        ];
        if stats.entropy.shape().num_elements() > 0
            && columns
                .iter()
                .all(|t| t.dtype() == burn::tensor::DType::F32)
            && crate::cpu_kernel::runs_in_place(&stats.entropy.device())
        {
            let detached = columns.map(|t| {
                if t.is_autodiff() {
                    t.clone().without_autodiff()
                } else {
                    t.clone()
                }
            });
            let saturation = SATURATION_THRESHOLD as f32;
            return crate::paths::cpu::reduce::cpu_row_diagnostics(detached, saturation);
        }
    }
    diagnostics_tensor_ops(stats)
}

/// [`diagnostics_tensor`] in Burn's tensor ops (every backend and dtype).
fn diagnostics_tensor_ops(stats: &crate::RowStats) -> Tensor<1> {
    let [b, h, n] = stats.entropy.dims();
    let prep = |t: &Tensor<3>| {
        let t = t.clone();
        let t = if t.is_autodiff() {
            t.without_autodiff()
        } else {
            t
        };
        // [b, h, n] -> [b, h, n, 1]
        t.cast(FloatDType::F32).reshape([b, h, n, 1])
    };
    let (entropy, max_prob, keys) = (
        prep(&stats.entropy),
        prep(&stats.max_prob),
        prep(&stats.visible_keys),
    );
    // A row counts when it sees a key and is not poisoned (NaN).
    let valid = keys
        .clone()
        .greater_elem(0.5)
        .bool_and(entropy.clone().is_nan().bool_not());
    let multi = keys.clone().greater_elem(1.5).bool_and(valid.clone());
    let zero_unless =
        |t: Tensor<4>, rows: &Tensor<4, Bool>| t.mask_fill(rows.clone().bool_not(), 0.0);
    let ln_k = keys.clamp_min(2.0).log();
    let saturated = max_prob.clone().greater_elem(SATURATION_THRESHOLD).float();
    let rows = vec![
        per_head_sum(valid.clone().float()),
        per_head_sum(multi.clone().float()),
        per_head_sum(zero_unless(entropy.clone(), &valid)),
        per_head_sum(zero_unless(entropy.clone() / ln_k, &multi)),
        per_head_sum(zero_unless(max_prob, &valid)),
        per_head_sum(zero_unless(entropy.exp(), &valid)),
        per_head_sum(zero_unless(saturated, &valid)),
        per_head_sum(zero_unless(prep(&stats.logit_std), &multi)),
        per_head_max(prep(&stats.max_logit).mask_fill(valid.bool_not(), f32::NEG_INFINITY)),
    ];
    // [DIAGNOSTIC_VALUES, h] -> [DIAGNOSTIC_VALUES · h]
    Tensor::stack::<2>(rows, 0).reshape([DIAGNOSTIC_VALUES * h])
}

impl AttentionDiagnostics {
    /// The diagnostics from the values of [`diagnostics_tensor`] read back, for `n_heads`
    /// heads; an error names a length that does not fit.
    pub fn from_tensor_values(values: &[f64], n_heads: usize) -> Result<Self, AttentionError> {
        if values.len() != DIAGNOSTIC_VALUES * n_heads {
            return Err(AttentionError::Shape {
                what: "diagnostics values",
                expected: format!("{DIAGNOSTIC_VALUES} × {n_heads} heads"),
                got: vec![values.len()],
            });
        }
        Ok(Self::from_table(values, n_heads, true))
    }

    /// The diagnostics from a table `[rows, n_heads]` of per-head sums: rows that count, rows
    /// with two keys or more, then the sums of entropy, normalized entropy, largest weight,
    /// effective keys and saturated rows, and with `has_scores` the sum of logit stds and the
    /// largest logit.
    fn from_table(table: &[f64], n_heads: usize, has_scores: bool) -> Self {
        let at = |r: usize, head: usize| table[r * n_heads + head];
        let per_head = (0..n_heads)
            .map(|head| {
                let n_valid = at(0, head).max(1.0);
                let n_multi = at(1, head).max(1.0);
                HeadDiagnostics {
                    entropy: at(2, head) / n_valid,
                    normalized_entropy: at(3, head) / n_multi,
                    max_prob: at(4, head) / n_valid,
                    effective_keys: at(5, head) / n_valid,
                    saturated_fraction: at(6, head) / n_valid,
                    logit_std: has_scores.then(|| at(7, head) / n_multi),
                    max_logit: has_scores.then(|| at(8, head)),
                }
            })
            .collect();
        Self { per_head }
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;

    /// The CPU backends' one-pass sums equal the tensor ops' (f32 sums against f64 ones:
    /// within 1e-5 relative), on statistics with rows of no key, one key, poisoned (NaN) rows,
    /// saturated rows and a head where no row counts.
    #[test]
    fn the_cpu_pass_equals_the_tensor_ops() {
        let device = Device::flex();
        let (b, h, n) = (3, 4, 50);
        let len = b * h * n;
        let mut rng = 12345u64;
        let mut uniform = || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 40) as f32 / (1u64 << 24) as f32
        };
        let mut columns: [Vec<f32>; 6] = Default::default();
        for idx in 0..len {
            let head = (idx / n) % h;
            let keys = if head == 3 {
                0.0
            } else {
                (uniform() * 5.0).floor()
            };
            let poisoned = uniform() < 0.05;
            let max_prob = if keys == 0.0 {
                0.0
            } else {
                0.5 + 0.5 * uniform()
            };
            let entropy = if keys <= 1.0 {
                0.0
            } else {
                uniform() * keys.ln()
            };
            let values = [
                if poisoned { f32::NAN } else { entropy },
                max_prob,
                keys,
                uniform() * 3.0,
                if keys == 0.0 {
                    f32::NEG_INFINITY
                } else {
                    uniform() * 10.0 - 5.0
                },
                uniform(),
            ];
            for (column, x) in columns.iter_mut().zip(values) {
                column.push(x);
            }
        }
        let tensor = |values: &Vec<f32>| {
            Tensor::<3>::from_data(
                burn::tensor::TensorData::new(values.clone(), [b, h, n]),
                &device,
            )
        };
        let stats = crate::RowStats {
            entropy: tensor(&columns[0]),
            max_prob: tensor(&columns[1]),
            visible_keys: tensor(&columns[2]),
            logit_std: tensor(&columns[3]),
            max_logit: tensor(&columns[4]),
            lse: tensor(&columns[5]),
            logit_mean: tensor(&columns[5]),
        };
        let read = |t: Tensor<1>| t.into_data().try_to_vec::<f32>().expect("f32 values");
        let (fast, ops) = (
            read(diagnostics_tensor(&stats)),
            read(diagnostics_tensor_ops(&stats)),
        );
        assert_eq!(fast.len(), DIAGNOSTIC_VALUES * h);
        for (idx, (f, o)) in fast.iter().zip(&ops).enumerate() {
            let same = f == o || (f - o).abs() <= 1e-5 * o.abs().max(1.0);
            assert!(same, "value {idx}: {f} vs {o}");
        }
        // The last head has no counting row: its largest logit is −∞ on both.
        assert_eq!(fast[8 * h + 3], f32::NEG_INFINITY);
        // Some rows are saturated (largest weight above 0.99) and some poisoned rows are left
        // out, so that those branches are exercised.
        assert!((0..h).map(|head| fast[6 * h + head]).sum::<f32>() > 0.0);
        let counted: f32 = (0..h).map(|head| fast[head]).sum();
        let visible = columns[2].iter().filter(|&&k| k > 0.5).count() as f32;
        assert!(counted < visible, "the poisoned rows are left out");
    }
}
