//! The policy for NaN and infinite inputs (see the crate's `paths/nonfinite.rs`) on host data:
//! one vectorized scan finds whether anything is not finite; only then are the poisoned rows
//! worked out and the inputs copied with their non-finite values replaced by zeros, so that the
//! kernels themselves never see them.

use rayon::prelude::*;

use super::masking::Masking;
use super::shape::KernelShape;
use super::simd;
use super::stats_scratch::VISIBLE_KEYS;
use crate::types::AttentionDims;

/// Sanitized copies of a call's inputs and the rows the policy makes NaN.
pub(crate) struct Sanitized {
    /// q with non-finite values replaced by 0.
    pub q: Vec<f32>,
    /// k, likewise.
    pub k: Vec<f32>,
    /// v, likewise.
    pub v: Vec<f32>,
    /// The bias with NaN and +∞ replaced by 0 (−∞ still hides its key).
    pub bias: Option<Vec<f32>>,
    /// `[b, h, n]`: the rows whose output is NaN.
    pub poisoned: Vec<bool>,
}

/// Whether a slice holds a NaN or an infinity (x · 0 is NaN exactly for those).
fn has_non_finite(xs: &[f32]) -> bool {
    if xs.len() < super::PARALLEL_WORK / 16 {
        return simd::non_finite(xs);
    }
    xs.par_chunks(1 << 16).any(simd::non_finite)
}

/// Whether a bias value poisons the rows that see its key.
fn bad_bias(x: f32) -> bool {
    x.is_nan() || x == f32::INFINITY
}

/// Whether the bias holds a value that poisons the rows that see its key (NaN or +∞).
pub(crate) fn bias_poisons(masking: &Masking<'_>) -> bool {
    masking
        .bias
        .is_some_and(|b| b.data().iter().any(|&x| bad_bias(x)))
}

/// `None` when q, k, v and the bias are finite (a −∞ bias is a mask, not a problem): the common
/// case, one pass over the data. Otherwise the sanitized inputs and the poisoned rows.
pub(crate) fn check(
    shape: &KernelShape,
    masking: &Masking<'_>,
    q: &[f32],
    k: &[f32],
    v: &[f32],
) -> Option<Sanitized> {
    let bias = masking.bias.map(|b| b.data());
    if !(bias_poisons(masking) || has_non_finite(q) || has_non_finite(k) || has_non_finite(v)) {
        return None;
    }
    let AttentionDims {
        batch,
        n_heads,
        n_kv_heads,
        n,
        m,
        d_k,
        d_v,
    } = shape.dims;
    let group = n_heads / n_kv_heads;
    let row_bad = |xs: &[f32], d: usize| -> Vec<bool> {
        xs.chunks(d)
            .map(|row| row.iter().any(|x| !x.is_finite()))
            .collect()
    };
    let q_bad = row_bad(q, d_k);
    let k_bad = row_bad(k, d_k);
    let v_bad = row_bad(v, d_v);
    let mut poisoned = vec![false; batch * n_heads * n];
    poisoned
        .par_chunks_mut(n)
        .enumerate()
        .for_each(|(bh, rows)| {
            let (b, h) = (bh / n_heads, bh % n_heads);
            let kv = b * n_kv_heads + h / group;
            for (i, poisoned) in rows.iter_mut().enumerate() {
                let bias_row = masking.bias.map(|bias| bias.row(b, h, i));
                let (mut sees_key, mut sees_bad) = (false, false);
                for j in shape.visible_keys(i) {
                    let bias = bias_row.map_or(0.0, |row| row[j]);
                    if masking.hides(&shape.dims, b, h, i, j) {
                        continue;
                    }
                    sees_key = true;
                    if k_bad[kv * m + j] || v_bad[kv * m + j] || bad_bias(bias) {
                        sees_bad = true;
                        break;
                    }
                }
                *poisoned = sees_bad || (sees_key && q_bad[bh * n + i]);
            }
        });
    let zeroed = |xs: &[f32]| -> Vec<f32> {
        xs.iter()
            .map(|&x| if x.is_finite() { x } else { 0.0 })
            .collect()
    };
    Some(Sanitized {
        q: zeroed(q),
        k: zeroed(k),
        v: zeroed(v),
        bias: bias.map(|b| {
            b.iter()
                .map(|&x| if bad_bias(x) { 0.0 } else { x })
                .collect()
        }),
        poisoned,
    })
}

impl Sanitized {
    /// The forward's output and log-sum-exp with the poisoned rows set to NaN.
    pub fn poison_output(
        &self,
        out: &mut [f32],
        lse: &mut [f32],
        stats: Option<&mut [f32]>,
        d_v: usize,
    ) {
        for ((row, out_row), lse) in self
            .poisoned
            .iter()
            .zip(out.chunks_mut(d_v))
            .zip(lse.iter_mut())
        {
            if *row {
                out_row.fill(f32::NAN);
                *lse = f32::NAN;
            }
        }
        if let Some(stats) = stats {
            // [ROW_STATS, rows]: every statistic but the count of visible keys, which the mask
            // decides.
            let rows = self.poisoned.len();
            for (stat_idx, column) in stats.chunks_mut(rows.max(1)).enumerate() {
                if stat_idx == VISIBLE_KEYS {
                    continue;
                }
                for (row, x) in self.poisoned.iter().zip(column) {
                    if *row {
                        *x = f32::NAN;
                    }
                }
            }
        }
    }

    /// The forward's output and log-sum-exp as the backward pass must read them: poisoned rows
    /// are constants, so their output is 0 (D = 0) and their log-sum-exp +∞ (P = 0).
    pub fn backward_view(&self, out: &[f32], lse: &[f32], d_v: usize) -> (Vec<f32>, Vec<f32>) {
        let mut out = out.to_vec();
        let mut lse = lse.to_vec();
        for ((row, out_row), lse) in self
            .poisoned
            .iter()
            .zip(out.chunks_mut(d_v))
            .zip(lse.iter_mut())
        {
            if *row {
                out_row.fill(0.0);
                *lse = f32::INFINITY;
            }
        }
        (out, lse)
    }
}

/// [`try_forward`](super::kernel::try_forward) under the policy: the kernel runs on sanitized
/// inputs when something is not finite, and the poisoned rows of `out` and `lse` become NaN.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    shape: &KernelShape,
    tiles: super::shape::Tiles,
    masking: &Masking<'_>,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    lse: &mut [f32],
    mut stats: Option<&mut [f32]>,
) -> Result<(), crate::error::AttentionError> {
    use super::kernel::forward as kernel_forward;
    match check(shape, masking, q, k, v) {
        None => kernel_forward(shape, tiles, masking, q, k, v, out, Some(lse), stats),
        Some(s) => {
            let masking = match &s.bias {
                Some(bias) => masking.with_bias_values(bias),
                None => *masking,
            };
            let (q, k, v) = (&s.q[..], &s.k[..], &s.v[..]);
            let stats_out = stats.as_deref_mut();
            kernel_forward(shape, tiles, &masking, q, k, v, out, Some(lse), stats_out)?;
            s.poison_output(out, lse, stats, shape.dims.d_v);
            Ok(())
        }
    }
}

/// [`try_backward`](super::backward::try_backward) under the policy: on sanitized inputs, with the
/// poisoned rows held constant (no gradient flows through them).
pub(crate) fn backward(
    shape: &KernelShape,
    tiles: super::shape::Tiles,
    masking: &Masking<'_>,
    inputs: super::backward::BackwardInputs<'_>,
    outputs: super::backward::BackwardOutputs<'_>,
) -> Result<(), crate::error::AttentionError> {
    use super::backward::{BackwardInputs, try_backward};
    let Some(s) = check(shape, masking, inputs.q, inputs.k, inputs.v) else {
        return try_backward(shape, tiles, masking, inputs, outputs);
    };
    let masking = match &s.bias {
        Some(bias) => masking.with_bias_values(bias),
        None => *masking,
    };
    let (out, lse) = s.backward_view(inputs.out, inputs.lse, shape.dims.d_v);
    let inputs = BackwardInputs {
        q: &s.q,
        k: &s.k,
        v: &s.v,
        out: &out,
        grad_out: inputs.grad_out,
        lse: &lse,
    };
    try_backward(shape, tiles, &masking, inputs, outputs)
}
