//! Measures of one attention call: the softmax Jacobian's norm from the weights, and the share
//! of keys that receive gradient.

use burn::prelude::*;

use crate::context::{LabError, scalar};

/// ‖diag(p) − ppᵀ‖_F of every row of `p` (rows of `m`): Σ p²(1−p)² + (Σp²)² − Σp⁴,
/// square-rooted.
pub fn analytic_jacobian_norms(p: &[f64], m: usize) -> Vec<f64> {
    p.chunks(m)
        .map(|row| {
            let a: f64 = row.iter().map(|x| x * x * (1.0 - x) * (1.0 - x)).sum();
            let s2: f64 = row.iter().map(|x| x * x).sum();
            let s4: f64 = row.iter().map(|x| x.powi(4)).sum();
            (a + s2 * s2 - s4).max(0.0).sqrt()
        })
        .collect()
}

/// The share of a row's keys whose |∂L/∂score| exceeds this fraction of the row's largest.
pub const GRADIENT_SHARE_FLOOR: f64 = 1e-3;

/// The mean share of a row's keys whose |∂L/∂score| exceeds [`GRADIENT_SHARE_FLOOR`] of the
/// row's largest, from the score gradient `[b, h, n, m]`.
pub fn share_of_keys_with_gradient(ds: Tensor<4>) -> Result<f64, LabError> {
    let abs_ds = ds.abs();
    let row_max = abs_ds.clone().max_dim(3);
    scalar(
        abs_ds
            .greater(row_max * GRADIENT_SHARE_FLOOR)
            .float()
            .mean_dim(3)
            .mean(),
    )
}

/// Mean of the largest value of each row of `p` (rows of `m`).
pub fn mean_row_max(p: &[f64], m: usize) -> f64 {
    let maxes: Vec<f64> = p
        .chunks(m)
        .map(|r| r.iter().cloned().fold(0.0, f64::max))
        .collect();
    crate::stats::mean(&maxes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jacobian_norm_of_uniform_and_one_hot_rows() {
        // One-hot: diag(p) − ppᵀ = 0.
        assert_eq!(analytic_jacobian_norms(&[1.0, 0.0, 0.0], 3), vec![0.0]);
        // Uniform over 2: [[¼, −¼], [−¼, ¼]] has Frobenius norm ½.
        assert!((analytic_jacobian_norms(&[0.5, 0.5], 2)[0] - 0.5).abs() < 1e-12);
    }
}
