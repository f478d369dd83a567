//! The textbook computation in f64, forward and backward, against which the kernels are tested
//! (unit tests only).

use super::masking::{Broadcast, Masking};
use super::shape::KernelShape;
use crate::types::AttentionDims;

/// The gradients of q, k, v and of the scaled scores.
pub(crate) struct ReferenceGrads {
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
    pub scores: Vec<f64>,
}

/// (output, log-sum-exp, weights `[b, h, n, m]`) in f64.
pub(crate) fn forward(
    shape: &KernelShape,
    masking: &Masking<'_>,
    q: &[f32],
    k: &[f32],
    v: &[f32],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let AttentionDims {
        batch,
        n_heads,
        n_kv_heads,
        n,
        m,
        d_v,
        ..
    } = shape.dims;
    let group = n_heads / n_kv_heads;
    let mut out = vec![0.0; batch * n_heads * n * d_v];
    let mut lse = vec![f64::INFINITY; batch * n_heads * n];
    let mut weights = vec![0.0; batch * n_heads * n * m];
    for b in 0..batch {
        for h in 0..n_heads {
            let kv = b * n_kv_heads + h / group;
            for i in 0..n {
                let row = (b * n_heads + h) * n + i;
                let visible = shape.visible_keys(i);
                let scores: Vec<f64> = (0..m)
                    .map(|j| {
                        let hidden = !visible.contains(&j)
                            || masking.mask.is_some_and(|mask| mask.row(b, h, i)[j])
                            || masking
                                .segments
                                .is_some_and(|seg| seg.query[b * n + i] != seg.key[b * m + j]);
                        let alibi = masking.alibi.map_or(0.0, |alibi| {
                            -(alibi.slopes[h] as f64)
                                * (i as i64 + alibi.offset - j as i64).abs() as f64
                        });
                        let bias =
                            masking.bias.map_or(0.0, |bias| bias.row(b, h, i)[j] as f64) + alibi;
                        let s = raw_score(shape, q, k, row, kv * m + j);
                        let s = cap(shape, s).0 + bias;
                        if hidden { f64::NEG_INFINITY } else { s }
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if max == f64::NEG_INFINITY {
                    continue;
                }
                let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                lse[row] = max + sum.ln();
                for j in 0..m {
                    let p = (scores[j] - lse[row]).exp();
                    weights[row * m + j] = p;
                    for c in 0..d_v {
                        out[row * d_v + c] += p * v[(kv * m + j) * d_v + c] as f64;
                    }
                }
            }
        }
    }
    (out, lse, weights)
}

/// The scaled score of query row `row` and key row `key_row`, in f64.
fn raw_score(shape: &KernelShape, q: &[f32], k: &[f32], row: usize, key_row: usize) -> f64 {
    let d_k = shape.dims.d_k;
    (0..d_k)
        .map(|c| q[row * d_k + c] as f64 * k[key_row * d_k + c] as f64)
        .sum::<f64>()
        * shape.scale as f64
}

/// (soft-capped score, the cap's derivative) of a scaled score.
fn cap(shape: &KernelShape, s: f64) -> (f64, f64) {
    match shape.softcap {
        Some(c) => {
            let t = (s / c as f64).tanh();
            (c as f64 * t, 1.0 - t * t)
        }
        None => (s, 1.0),
    }
}

/// The gradients for an output gradient `grad_out`, from the explicit weights.
pub(crate) fn backward(
    shape: &KernelShape,
    masking: &Masking<'_>,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    grad_out: &[f32],
) -> ReferenceGrads {
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
    let (_, _, weights) = forward(shape, masking, q, k, v);
    let mut grads = ReferenceGrads {
        q: vec![0.0; q.len()],
        k: vec![0.0; k.len()],
        v: vec![0.0; v.len()],
        scores: vec![0.0; weights.len()],
    };
    let scale = shape.scale as f64;
    for b in 0..batch {
        for h in 0..n_heads {
            let kv = b * n_kv_heads + h / group;
            for i in 0..n {
                let row = (b * n_heads + h) * n + i;
                let p = &weights[row * m..][..m];
                let dp: Vec<f64> = (0..m)
                    .map(|j| {
                        (0..d_v)
                            .map(|c| {
                                grad_out[row * d_v + c] as f64 * v[(kv * m + j) * d_v + c] as f64
                            })
                            .sum()
                    })
                    .collect();
                let d: f64 = (0..m).map(|j| p[j] * dp[j]).sum();
                for j in 0..m {
                    let ds = p[j] * (dp[j] - d);
                    grads.scores[row * m + j] = ds;
                    let ds = ds * cap(shape, raw_score(shape, q, k, row, kv * m + j)).1;
                    for c in 0..d_v {
                        grads.v[(kv * m + j) * d_v + c] += p[j] * grad_out[row * d_v + c] as f64;
                    }
                    for c in 0..d_k {
                        grads.q[row * d_k + c] += scale * ds * k[(kv * m + j) * d_k + c] as f64;
                        grads.k[(kv * m + j) * d_k + c] += scale * ds * q[row * d_k + c] as f64;
                    }
                }
            }
        }
    }
    grads
}

/// The shape the kernel tests use: b = 2, h = 4 over h_kv = 2, d_k = 16, d_v = 8, scale 1/4,
/// n queries and m keys, with an optional causal offset.
pub(crate) fn shape(n: usize, m: usize, causal_offset: Option<i64>) -> KernelShape {
    KernelShape {
        dims: AttentionDims {
            batch: 2,
            n_heads: 4,
            n_kv_heads: 2,
            n,
            m,
            d_k: 16,
            d_v: 8,
        },
        scale: 0.25,
        causal_offset,
        softcap: None,
        window: None,
    }
}

/// Deterministic values in [-2, 2) from a small LCG (no dependency).
pub(crate) fn data(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

/// Asserts `|got − want| ≤ atol + rtol·|want|` element by element.
pub(crate) fn assert_close(what: &str, got: &[f32], want: &[f64], atol: f64, rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (idx, (g, w)) in got.iter().zip(want).enumerate() {
        let g = *g as f64;
        assert!(
            g.is_finite() && (g - w).abs() <= atol + rtol * w.abs(),
            "{what}: element {idx}: {g} vs {w}"
        );
    }
}

/// A mask and a bias owned by a test, with their shapes.
pub(crate) struct TestMasking {
    mask: Vec<bool>,
    mask_shape: [usize; 4],
    bias: Vec<f32>,
    bias_shape: [usize; 4],
}

impl TestMasking {
    /// The kernel's view of it.
    pub fn masking(&self) -> Masking<'_> {
        Masking {
            mask: (!self.mask.is_empty()).then(|| Broadcast::new(&self.mask, self.mask_shape)),
            bias: (!self.bias.is_empty()).then(|| Broadcast::new(&self.bias, self.bias_shape)),
            ..Masking::default()
        }
    }
}

/// A padding mask (batch element 1 hides its last quarter of keys), a full mask (a
/// pseudo-random third, with the first row of head 0 fully hidden) and a bias broadcast over the
/// batch.
pub(crate) fn maskings(dims: &AttentionDims) -> Vec<TestMasking> {
    let AttentionDims {
        batch,
        n_heads,
        n,
        m,
        ..
    } = *dims;
    let padding = (0..batch * m)
        .map(|i| i / m == 1 && i % m >= m - m.div_ceil(4))
        .collect();
    let full = (0..batch * n_heads * n * m)
        .map(|i| i < m || (i * 7919) % 3 == 0)
        .collect();
    let bias = data(n_heads * n * m, 9).iter().map(|x| x * 0.5).collect();
    vec![
        TestMasking {
            mask: padding,
            mask_shape: [batch, 1, 1, m],
            bias: vec![],
            bias_shape: [0; 4],
        },
        TestMasking {
            mask: full,
            mask_shape: [batch, n_heads, n, m],
            bias: vec![],
            bias_shape: [0; 4],
        },
        TestMasking {
            mask: vec![],
            mask_shape: [0; 4],
            bias,
            bias_shape: [1, n_heads, n, m],
        },
    ]
}

/// Segment ids for `b = 2` rows of `len` positions: row 0 packs documents of about 1/7, 2/7 and
/// 4/7 of the row (sorted ids: tiles between documents are skipped), row 1 cycles through three
/// ids (unsorted: every tile is partly masked).
pub(crate) fn segment_ids(len: usize) -> Vec<i64> {
    let (a, b) = (len / 7, len / 7 + 2 * len / 7);
    let packed = (0..len).map(|i| {
        if i < a {
            0
        } else if i < b {
            1
        } else {
            2
        }
    });
    let cycling = (0..len).map(|i| (i % 3) as i64);
    packed.chain(cycling).collect()
}
