//! A row-parallel layer norm for the CPU backends: `y = (x − μ) / √(σ² + ε) · γ + β` over the
//! last axis of `[rows, d]` host slices (biased variance, as Burn's `layer_norm`), with its
//! backward, registered through the backend extension for Flex and NdArray and for `Autodiff`
//! over them.
//!
//! Burn 0.22.1's `layer_norm` is composed of generic ops (mean, subtraction, variance, square
//! root, division, products), each a pass over the whole tensor with its own buffer, and as many
//! again in the backward: 18 ms forward and 46 ms forward + backward for the seq_len-512 model's
//! `[64, 512, 64]` activations on 2 cores of the Intel Xeon this was written on. This op makes
//! one pass forward (keeping each row's mean and 1/σ) and one backward.

use super::for_each_task;

/// Rows per task.
const ROW_BLOCK: usize = 512;

/// Each row's mean and 1 / √(σ² + ε), kept by the forward pass for the backward.
#[derive(Debug, Clone, Default)]
pub(crate) struct RowStats {
    /// `[rows]`
    pub mean: Vec<f32>,
    /// `[rows]`
    pub inv_std: Vec<f32>,
}

/// The forward pass: `y [rows, d]` and the rows' statistics.
///
/// # Panics
/// When `x` is not `[rows, d]` or γ, β are not `[d]`.
pub(crate) fn forward(
    x: &[f32],
    gamma: &[f32],
    beta: Option<&[f32]>,
    d: usize,
    epsilon: f64,
) -> (Vec<f32>, RowStats) {
    assert_eq!(gamma.len(), d, "layer norm: gamma is not [d]");
    assert!(
        d > 0 && x.len().is_multiple_of(d),
        "layer norm: x is not [rows, d]"
    );
    if let Some(b) = beta {
        assert_eq!(b.len(), d, "layer norm: beta is not [d]");
    }
    let rows = x.len() / d;
    let mut y = vec![0.0f32; x.len()];
    let mut stats = RowStats {
        mean: vec![0.0; rows],
        inv_std: vec![0.0; rows],
    };
    let tasks: Vec<_> = y
        .chunks_mut(ROW_BLOCK * d)
        .zip(x.chunks(ROW_BLOCK * d))
        .zip(stats.mean.chunks_mut(ROW_BLOCK))
        .zip(stats.inv_std.chunks_mut(ROW_BLOCK))
        .collect();
    for_each_task(
        tasks,
        8 * x.len(),
        || (),
        |_, (((y_block, x_block), mean_block), inv_block)| {
            for (((y_row, x_row), mean), inv) in y_block
                .chunks_mut(d)
                .zip(x_block.chunks(d))
                .zip(mean_block.iter_mut())
                .zip(inv_block.iter_mut())
            {
                let (mu, inv_std) = row_stats(x_row, epsilon);
                let columns = y_row.iter_mut().zip(x_row).zip(gamma);
                match beta {
                    Some(beta) => {
                        for (((out, &value), &scale), &shift) in columns.zip(beta) {
                            *out = (value - mu) * inv_std * scale + shift;
                        }
                    }
                    None => {
                        for ((out, &value), &scale) in columns {
                            *out = (value - mu) * inv_std * scale;
                        }
                    }
                }
                (*mean, *inv) = (mu, inv_std);
            }
        },
    );
    (y, stats)
}

/// A row's mean and 1 / √(σ² + ε) (σ² the biased variance), summed in f64.
fn row_stats(row: &[f32], epsilon: f64) -> (f32, f32) {
    let d = row.len() as f64;
    let mean = lane_sum(row, |v| v as f64) / d;
    let var = lane_sum(row, |v| {
        let c = v as f64 - mean;
        c * c
    }) / d;
    (mean as f32, (1.0 / (var + epsilon).sqrt()) as f32)
}

/// Σ f(v) over `row` in f64, in [`SUM_LANES`] independent running sums (which the compiler
/// keeps in vector registers) added pairwise at the end, then the tail. One chain of dependent
/// f64 additions per row held the forward pass at 18% of a training step of the seq-128 lab
/// model (d = 64, `perf record` on `sdpa train`); with the lanes it is 6%.
#[inline(always)]
fn lane_sum(row: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut lanes = [0.0f64; SUM_LANES];
    let chunks = row.chunks_exact(SUM_LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += f(v);
        }
    }
    let mut width = SUM_LANES / 2;
    while width > 0 {
        for i in 0..width {
            lanes[i] += lanes[i + width];
        }
        width /= 2;
    }
    tail.iter().fold(lanes[0], |acc, &v| acc + f(v))
}

/// Independent running sums of [`lane_sum`]: one AVX-512 register of f64.
const SUM_LANES: usize = 8;

/// The gradients of x, γ and β (each when asked for, in that order in `want`).
#[derive(Debug, Default)]
pub(crate) struct LayerNormGrads {
    pub x: Option<Vec<f32>>,
    pub gamma: Option<Vec<f32>>,
    pub beta: Option<Vec<f32>>,
}

/// The backward pass for the output gradient `grad [rows, d]`: with x̂ = (x − μ)/σ and
/// g = grad ∘ γ, `dx = (g − mean(g) − x̂ · mean(g ∘ x̂)) / σ`, `dγ = Σ_rows grad ∘ x̂`,
/// `dβ = Σ_rows grad`.
///
/// # Panics
/// When the slices do not match the sizes.
pub(crate) fn backward(
    x: &[f32],
    gamma: &[f32],
    stats: &RowStats,
    grad: &[f32],
    d: usize,
    want: [bool; 3],
) -> LayerNormGrads {
    let rows = stats.mean.len();
    assert_eq!(x.len(), rows * d, "layer norm backward: x is not [rows, d]");
    assert_eq!(
        grad.len(),
        rows * d,
        "layer norm backward: grad is not [rows, d]"
    );
    assert_eq!(gamma.len(), d, "layer norm backward: gamma is not [d]");
    let mut dx = vec![0.0f32; if want[0] { x.len() } else { 0 }];
    // Per task: the partial dγ and dβ of its rows.
    let n_blocks = rows.div_ceil(ROW_BLOCK);
    let mut partials = vec![(vec![0.0f32; d], vec![0.0f32; d]); n_blocks];
    let dx_blocks: Vec<Option<&mut [f32]>> = if want[0] {
        dx.chunks_mut(ROW_BLOCK * d).map(Some).collect()
    } else {
        (0..n_blocks).map(|_| None).collect()
    };
    let tasks: Vec<_> = partials.iter_mut().zip(dx_blocks).enumerate().collect();
    for_each_task(
        tasks,
        12 * x.len(),
        || vec![0.0f32; d],
        |normed, (block_idx, ((dgamma, dbeta), mut dx_block))| {
            let first = block_idx * ROW_BLOCK;
            for row_idx in first..(first + ROW_BLOCK).min(rows) {
                let x_row = &x[row_idx * d..][..d];
                let g_row = &grad[row_idx * d..][..d];
                let (mu, inv_std) = (stats.mean[row_idx], stats.inv_std[row_idx]);
                let (mut mean_g, mut mean_gx) = (0.0f32, 0.0f32);
                let columns = normed
                    .iter_mut()
                    .zip(x_row)
                    .zip(g_row)
                    .zip(gamma)
                    .zip(dgamma.iter_mut().zip(dbeta.iter_mut()));
                for ((((xhat, &x), &dy), &scale), (dg, db)) in columns {
                    *xhat = (x - mu) * inv_std;
                    *dg += dy * *xhat;
                    *db += dy;
                    let g = dy * scale;
                    mean_g += g;
                    mean_gx += g * *xhat;
                }
                if let Some(dx_block) = dx_block.as_deref_mut() {
                    let (mean_g, mean_gx) = (mean_g / d as f32, mean_gx / d as f32);
                    let dx_row = &mut dx_block[(row_idx - first) * d..][..d];
                    let columns = dx_row.iter_mut().zip(g_row).zip(gamma).zip(normed.iter());
                    for (((dx, &dy), &scale), &xhat) in columns {
                        *dx = (dy * scale - mean_g - xhat * mean_gx) * inv_std;
                    }
                }
            }
        },
    );
    let (mut dgamma, mut dbeta) = (vec![0.0f32; d], vec![0.0f32; d]);
    for (pg, pb) in &partials {
        dgamma.iter_mut().zip(pg).for_each(|(a, b)| *a += b);
        dbeta.iter_mut().zip(pb).for_each(|(a, b)| *a += b);
    }
    LayerNormGrads {
        x: want[0].then_some(dx),
        gamma: want[1].then_some(dgamma),
        beta: want[2].then_some(dbeta),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::cpu::reference::data;

    /// y and the loss Σ y ∘ w in f64, for finite differences.
    fn loss(x: &[f64], gamma: &[f64], beta: &[f64], w: &[f64], d: usize, eps: f64) -> f64 {
        x.chunks(d)
            .zip(w.chunks(d))
            .map(|(row, w_row)| {
                let mean = row.iter().sum::<f64>() / d as f64;
                let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
                let inv = 1.0 / (var + eps).sqrt();
                (0..d)
                    .map(|i| ((row[i] - mean) * inv * gamma[i] + beta[i]) * w_row[i])
                    .sum::<f64>()
            })
            .sum()
    }

    #[test]
    fn forward_and_gradients_match_an_f64_layer_norm() {
        // 1030 rows: three row blocks, the last one short.
        let (rows, d, eps) = (1030, 12, 1e-5);
        let x = data(rows * d, 1);
        let gamma: Vec<f32> = data(d, 2).iter().map(|v| 1.0 + 0.5 * v).collect();
        let beta = data(d, 3);
        let w = data(rows * d, 4);
        let (y, stats) = forward(&x, &gamma, Some(&beta), d, eps);
        let f64s = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<_>>();
        let (x64, g64, b64, w64) = (f64s(&x), f64s(&gamma), f64s(&beta), f64s(&w));
        for (row_idx, row) in x64.chunks(d).enumerate() {
            let mean = row.iter().sum::<f64>() / d as f64;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
            for i in 0..d {
                let want = (row[i] - mean) / (var + eps).sqrt() * g64[i] + b64[i];
                let got = y[row_idx * d + i] as f64;
                assert!(
                    (got - want).abs() < 1e-5,
                    "y[{row_idx}, {i}]: {got} vs {want}"
                );
            }
        }
        let grads = backward(&x, &gamma, &stats, &w, d, [true, true, true]);
        let h = 1e-5;
        let numeric = |which: usize, idx: usize| {
            let bump = |delta: f64| {
                let (mut xs, mut gs, mut bs) = (x64.clone(), g64.clone(), b64.clone());
                [&mut xs, &mut gs, &mut bs][which][idx] += delta;
                loss(&xs, &gs, &bs, &w64, d, eps)
            };
            (bump(h) - bump(-h)) / (2.0 * h)
        };
        let check = |what: &str, which: usize, got: &[f32], indices: &[usize]| {
            for &idx in indices {
                let want = numeric(which, idx);
                let tol = 1e-3 * (1.0 + want.abs());
                assert!(
                    (got[idx] as f64 - want).abs() < tol,
                    "d{what}[{idx}]: {} vs {want}",
                    got[idx]
                );
            }
        };
        check(
            "x",
            0,
            grads.x.as_deref().unwrap(),
            &[0, 5, 6000, rows * d - 1],
        );
        check("gamma", 1, grads.gamma.as_deref().unwrap(), &[0, 7, d - 1]);
        check("beta", 2, grads.beta.as_deref().unwrap(), &[0, 3, d - 1]);
    }

    #[test]
    fn only_the_asked_gradients_are_computed() {
        let (x, gamma) = (data(24, 5), vec![1.0f32; 6]);
        let (_, stats) = forward(&x, &gamma, None, 6, 1e-5);
        let grads = backward(&x, &gamma, &stats, &data(24, 6), 6, [false, true, false]);
        assert!(grads.x.is_none() && grads.beta.is_none());
        assert_eq!(grads.gamma.map(|g| g.len()), Some(6));
    }
}
