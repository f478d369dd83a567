//! A row-parallel linear layer for the CPU backends: `y = x W + b` on `[rows, d_in]` host
//! slices, with its backward (`dx = dy Wᵀ`, `dW = xᵀ dy`, `db = Σ_rows dy`), registered through
//! the backend extension for Flex and NdArray and for `Autodiff` over them.
//!
//! Burn 0.22.1's Flex matmul runs a tall `[32 768, 64] × [64, 64]` product at about a third of
//! what two single-threaded `gemm` calls on halves of the rows reach, and a 3-D input becomes one
//! small product per batch row; this op splits the rows into blocks of [`ROW_BLOCK`], one
//! single-threaded `gemm` per block on the thread pool (the weight gradient sums at most two
//! partial products per thread). `linear_rows` takes it for `f32` on the backends it serves.

use super::for_each_task;
use super::tile::{View, product};

/// Rows per task: large enough that one `gemm` call amortizes its packing, small enough that
/// the blocks spread over the threads.
pub(crate) const ROW_BLOCK: usize = 512;

/// The row blocks of `rows` rows: `(first row, row count)`.
fn blocks(rows: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..rows.div_ceil(ROW_BLOCK)).map(move |i| (i * ROW_BLOCK, ROW_BLOCK.min(rows - i * ROW_BLOCK)))
}

/// `y = x W (+ b)`: x `[rows, d_in]`, W `[d_in, d_out]`, b `[d_out]`, y `[rows, d_out]`, all
/// row-major.
///
/// # Panics
/// When a slice's length does not match the sizes.
pub(crate) fn forward(
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    d_in: usize,
    d_out: usize,
) -> Vec<f32> {
    assert_eq!(
        weight.len(),
        d_in * d_out,
        "linear: weight is not [d_in, d_out]"
    );
    assert!(
        x.len().is_multiple_of(d_in.max(1)),
        "linear: x is not [rows, d_in]"
    );
    if let Some(b) = bias {
        assert_eq!(b.len(), d_out, "linear: bias is not [d_out]");
    }
    row_blocked_product(x, d_in, View::rows(weight, d_in, d_out, d_out), d_out, bias)
}

/// `out [rows, cols] = a [rows, k] · rhs [k, cols]`, plus `bias` on every row when given, one
/// task per block of [`ROW_BLOCK`] rows of `a`.
fn row_blocked_product(
    a: &[f32],
    k: usize,
    rhs: View<'_>,
    cols: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let rows = a.len() / k.max(1);
    let mut out = vec![0.0f32; rows * cols];
    let tasks: Vec<_> = out
        .chunks_mut((ROW_BLOCK * cols).max(1))
        .zip(blocks(rows))
        .collect();
    for_each_task(
        tasks,
        2 * rows * k * cols,
        || (),
        |_, (out, (start, n))| {
            if let Some(b) = bias {
                out.chunks_mut(cols.max(1))
                    .for_each(|row| row.copy_from_slice(b));
            }
            product(
                out,
                cols,
                View::rows(&a[start * k..(start + n) * k], n, k, k),
                rhs,
                bias.is_some(),
                1.0,
            )
        },
    );
    out
}

/// The gradients of [`forward`], each only when asked for.
#[derive(Debug, Default)]
pub(crate) struct LinearGrads {
    /// `[rows, d_in]`
    pub x: Option<Vec<f32>>,
    /// `[d_in, d_out]`
    pub weight: Option<Vec<f32>>,
    /// `[d_out]`
    pub bias: Option<Vec<f32>>,
}

/// The gradients of [`forward`] asked for by `want` (x, weight, bias) from the output's `grad`.
pub(crate) fn backward(
    x: &[f32],
    weight: &[f32],
    grad: &[f32],
    d_in: usize,
    d_out: usize,
    want: [bool; 3],
) -> LinearGrads {
    let rows = grad.len() / d_out.max(1);
    assert_eq!(
        x.len(),
        rows * d_in,
        "linear backward: x is not [rows, d_in]"
    );
    assert_eq!(
        weight.len(),
        d_in * d_out,
        "linear backward: weight is not [d_in, d_out]"
    );
    // dx = dy · Wᵀ: Wᵀ is the [d_out, d_in] transpose of the row-major weight.
    let grad_x = want[0].then(|| {
        row_blocked_product(
            grad,
            d_out,
            View::transposed(weight, d_out, d_in, d_out),
            d_in,
            None,
        )
    });
    let grad_w = want[1].then(|| {
        // dW = Σ_blocks x_blockᵀ · dy_block: the blocks dealt round-robin into at most two
        // partial sums per thread (memory 2·threads·d_in·d_out), then their sum.
        let all: Vec<(usize, usize)> = blocks(rows).collect();
        let n_parts = all.len().min(2 * super::threads()).max(1);
        let parts: Vec<Vec<(usize, usize)>> = (0..n_parts)
            .map(|part| all.iter().copied().skip(part).step_by(n_parts).collect())
            .collect();
        let mut partials = vec![vec![0.0f32; d_in * d_out]; parts.len()];
        let tasks: Vec<_> = partials.iter_mut().zip(parts).collect();
        for_each_task(
            tasks,
            2 * rows * d_in * d_out,
            || (),
            |_, (acc, part)| {
                for (start, n) in part {
                    product(
                        acc,
                        d_out,
                        View::transposed(&x[start * d_in..(start + n) * d_in], d_in, n, d_in),
                        View::rows(&grad[start * d_out..(start + n) * d_out], n, d_out, d_out),
                        true,
                        1.0,
                    );
                }
            },
        );
        let mut dw = partials.pop().unwrap_or_else(|| vec![0.0; d_in * d_out]);
        for partial in &partials {
            dw.iter_mut().zip(partial).for_each(|(a, b)| *a += b);
        }
        dw
    });
    let grad_b = want[2].then(|| {
        let mut db = vec![0.0f32; d_out];
        for row in grad.chunks(d_out.max(1)) {
            db.iter_mut().zip(row).for_each(|(a, g)| *a += g);
        }
        db
    });
    LinearGrads {
        x: grad_x,
        weight: grad_w,
        bias: grad_b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// y = x W + b the slow way.
    fn naive(x: &[f32], w: &[f32], b: &[f32], d_in: usize, d_out: usize) -> Vec<f32> {
        let rows = x.len() / d_in;
        let mut y = vec![0.0; rows * d_out];
        for r in 0..rows {
            for o in 0..d_out {
                y[r * d_out + o] = b[o]
                    + (0..d_in)
                        .map(|i| x[r * d_in + i] * w[i * d_out + o])
                        .sum::<f32>();
            }
        }
        y
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 16) as f32 / 65_536.0
                    - 0.5
            })
            .collect()
    }

    #[test]
    fn forward_and_backward_match_the_naive_products_across_several_row_blocks() {
        // 1100 rows: two full blocks and a partial one.
        let (rows, d_in, d_out) = (ROW_BLOCK * 2 + 76, 7, 5);
        let (x, w, b) = (
            values(rows * d_in, 1),
            values(d_in * d_out, 2),
            values(d_out, 3),
        );
        let y = forward(&x, &w, Some(&b), d_in, d_out);
        let expected = naive(&x, &w, &b, d_in, d_out);
        for (a, e) in y.iter().zip(&expected) {
            assert!((a - e).abs() < 1e-5, "{a} vs {e}");
        }
        let zero = vec![0.0; d_out];
        assert_eq!(forward(&x, &w, None, d_in, d_out).len(), rows * d_out);
        for (a, e) in forward(&x, &w, None, d_in, d_out)
            .iter()
            .zip(naive(&x, &w, &zero, d_in, d_out))
        {
            assert!((a - e).abs() < 1e-5);
        }
        // L = Σ y ∘ g: dx = g Wᵀ, dW = xᵀ g, db = Σ_rows g.
        let g = values(rows * d_out, 4);
        let grads = backward(&x, &w, &g, d_in, d_out, [true, true, true]);
        let (dx, dw, db) = (grads.x.unwrap(), grads.weight.unwrap(), grads.bias.unwrap());
        for r in [0, ROW_BLOCK - 1, ROW_BLOCK, rows - 1] {
            for i in 0..d_in {
                let e: f32 = (0..d_out)
                    .map(|o| g[r * d_out + o] * w[i * d_out + o])
                    .sum();
                assert!((dx[r * d_in + i] - e).abs() < 1e-5);
            }
        }
        for i in 0..d_in {
            for o in 0..d_out {
                let e: f64 = (0..rows)
                    .map(|r| x[r * d_in + i] as f64 * g[r * d_out + o] as f64)
                    .sum();
                assert!(
                    (dw[i * d_out + o] as f64 - e).abs() < 1e-3,
                    "{} vs {e}",
                    dw[i * d_out + o]
                );
            }
        }
        for o in 0..d_out {
            let e: f64 = (0..rows).map(|r| g[r * d_out + o] as f64).sum();
            assert!((db[o] as f64 - e).abs() < 1e-3);
        }
        let only_w = backward(&x, &w, &g, d_in, d_out, [false, true, false]);
        assert!(only_w.x.is_none() && only_w.bias.is_none());
        assert_eq!(only_w.weight.unwrap(), dw);
    }
}
