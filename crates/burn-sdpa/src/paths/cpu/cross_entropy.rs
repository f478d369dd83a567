//! Mean cross-entropy of `[rows, classes]` logits against class ids on host slices, with the
//! vectorized `exp` of the softmax loops ([`super::simd`]): the forward keeps each row's
//! log-sum-exp, the backward recomputes the softmax from it.
//!
//! Burn 0.22.1's `CrossEntropyLoss` on Flex runs `log_softmax` with the scalar `expf` and
//! `logf` and builds its gradient from several more passes over the logits; at the model's
//! seq_len 512 (16 384 rows of 256 classes) that was about a tenth of a training step.

use super::{for_each_task, simd};

/// Rows per task.
const ROW_BLOCK: usize = 256;

/// `(mean over rows of lse_r − x[r, t_r], lse [rows])` for logits `[rows, classes]` and
/// targets `t_r ∈ 0..classes` (checked by the caller).
pub(crate) fn forward(logits: &[f32], targets: &[usize], classes: usize) -> (f32, Vec<f32>) {
    let rows = targets.len();
    assert_eq!(
        logits.len(),
        rows * classes,
        "cross-entropy: logits are not [rows, classes]"
    );
    let mut lse = vec![0.0f32; rows];
    let mut sums = vec![0.0f64; rows.div_ceil(ROW_BLOCK)];
    let tasks: Vec<_> = lse
        .chunks_mut(ROW_BLOCK)
        .zip(sums.iter_mut())
        .enumerate()
        .collect();
    for_each_task(
        tasks,
        16 * rows * classes,
        || vec![0.0f32; classes],
        |scratch, (block_idx, (lse, sum))| {
            for (i, lse_r) in lse.iter_mut().enumerate() {
                let r = block_idx * ROW_BLOCK + i;
                let row = &logits[r * classes..(r + 1) * classes];
                let max = simd::max(row);
                scratch.copy_from_slice(row);
                *lse_r = max + simd::exp_sub_sum(scratch, max).ln();
                *sum += (*lse_r - row[targets[r]]) as f64;
            }
        },
    );
    let total: f64 = sums.iter().sum();
    ((total / rows.max(1) as f64) as f32, lse)
}

/// The gradient of the mean loss with respect to the logits, scaled by `grad` (the loss's own
/// gradient): `grad / rows · (softmax(x_r) − onehot(t_r))`.
pub(crate) fn backward(
    logits: &[f32],
    targets: &[usize],
    lse: &[f32],
    classes: usize,
    grad: f32,
) -> Vec<f32> {
    let rows = targets.len();
    let factor = grad / rows.max(1) as f32;
    let mut out = logits.to_vec();
    let tasks: Vec<_> = out
        .chunks_mut((ROW_BLOCK * classes).max(1))
        .enumerate()
        .collect();
    for_each_task(
        tasks,
        16 * rows * classes,
        || (),
        |_, (block_idx, block)| {
            for (i, row) in block.chunks_mut(classes.max(1)).enumerate() {
                let r = block_idx * ROW_BLOCK + i;
                simd::exp_sub(row, lse[r]);
                simd::scale(row, factor);
                row[targets[r]] -= factor;
            }
        },
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_and_gradient_match_the_f64_formulas() {
        let (rows, classes) = (ROW_BLOCK + 7, 5);
        let logits: Vec<f32> = (0..rows * classes)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.7)
            .collect();
        let targets: Vec<usize> = (0..rows).map(|r| r * 3 % classes).collect();
        let (loss, lse) = forward(&logits, &targets, classes);
        let mut expected = 0.0f64;
        let mut probs = vec![0.0f64; rows * classes];
        for r in 0..rows {
            let row = &logits[r * classes..(r + 1) * classes];
            let m = row.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x as f64));
            let z: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum();
            let lse_r = m + z.ln();
            assert!((lse[r] as f64 - lse_r).abs() < 1e-5);
            expected += lse_r - row[targets[r]] as f64;
            for c in 0..classes {
                probs[r * classes + c] = (row[c] as f64 - lse_r).exp();
            }
        }
        expected /= rows as f64;
        assert!(
            (loss as f64 - expected).abs() < 1e-5,
            "{loss} vs {expected}"
        );
        let grad = backward(&logits, &targets, &lse, classes, 2.0);
        for r in 0..rows {
            for c in 0..classes {
                let onehot = if c == targets[r] { 1.0 } else { 0.0 };
                let e = 2.0 / rows as f64 * (probs[r * classes + c] - onehot);
                assert!((grad[r * classes + c] as f64 - e).abs() < 1e-7, "{r} {c}");
            }
        }
    }
}
