//! What hides keys or shifts scores beyond causal masking, on the host: a boolean mask and an
//! additive bias, each read as if broadcast to `[b, h, n, m]`.

use core::ops::Range;

use super::shape::check_len;
use super::simd;
use crate::error::AttentionError;
use crate::types::AttentionDims;

/// A boolean mask or an additive bias on the host, `[b|1, h|1, n|1, m]` row-major, read as if
/// broadcast to `[b, h, n, m]`.
#[derive(Debug, Clone, Copy)]
pub struct Broadcast<'a, T> {
    data: &'a [T],
    shape: [usize; 4],
}

impl<'a, T> Broadcast<'a, T> {
    /// `data` in the row-major `shape`, whose first three axes are 1 or the call's size and whose
    /// last is m (checked against the call by [`Masking::validate`]).
    pub fn new(data: &'a [T], shape: [usize; 4]) -> Self {
        Self { data, shape }
    }

    /// The values, row-major in [`shape`](Self::shape).
    pub(crate) fn data(&self) -> &'a [T] {
        self.data
    }

    /// The `m` values of row (`batch_idx`, `head_idx`, `query_idx`).
    pub(crate) fn row(&self, batch_idx: usize, head_idx: usize, query_idx: usize) -> &'a [T] {
        let [sb, sh, sn, m] = self.shape;
        let pick = |size: usize, idx: usize| if size == 1 { 0 } else { idx };
        let row = (pick(sb, batch_idx) * sh + pick(sh, head_idx)) * sn + pick(sn, query_idx);
        &self.data[row * m..][..m]
    }

    /// Whether every query of a head reads the same row (a key mask or bias).
    pub(crate) fn same_for_every_query(&self) -> bool {
        self.shape[2] == 1
    }

    fn validate(&self, what: &'static str, dims: &AttentionDims) -> Result<(), AttentionError> {
        let full = [dims.batch, dims.n_heads, dims.n, dims.m];
        let fits = (0..3).all(|i| self.shape[i] == 1 || self.shape[i] == full[i])
            && self.shape[3] == full[3];
        if !fits {
            return Err(AttentionError::NotBroadcastable {
                tensor: what,
                shape: self.shape,
                scores: full,
            });
        }
        check_len(what, self.data.len(), self.shape)
    }
}

/// What hides keys or shifts scores beyond causal masking: a boolean mask (true = masked out)
/// and an additive bias, both broadcast over `[b, h, n, m]`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Masking<'a> {
    /// True = masked out.
    pub mask: Option<Broadcast<'a, bool>>,
    /// Added to the scaled scores; −∞ hides a key.
    pub bias: Option<Broadcast<'a, f32>>,
}

impl<'a> Masking<'a> {
    /// The same mask with other bias values of the same shape.
    pub(crate) fn with_bias_values<'b>(&self, values: &'b [f32]) -> Masking<'b>
    where
        'a: 'b,
    {
        Masking {
            mask: self.mask,
            bias: self.bias.map(|bias| Broadcast::new(values, bias.shape)),
        }
    }

    /// Checks that the mask and bias broadcast to the call's `[b, h, n, m]`.
    pub fn validate(&self, dims: &AttentionDims) -> Result<(), AttentionError> {
        if let Some(mask) = &self.mask {
            mask.validate("mask", dims)?;
        }
        if let Some(bias) = &self.bias {
            bias.validate("bias", dims)?;
        }
        Ok(())
    }

    /// How much of a tile (keys `keys` of the queries `queries` of a head) the mask hides:
    /// (all of it, some of it).
    pub(crate) fn mask_coverage(
        &self,
        batch_idx: usize,
        head_idx: usize,
        queries: Range<usize>,
        keys: Range<usize>,
    ) -> (bool, bool) {
        let Some(mask) = &self.mask else {
            return (false, false);
        };
        let rows = if mask.same_for_every_query() {
            queries.start..queries.start + 1
        } else {
            queries
        };
        let (mut all, mut any) = (true, false);
        for query_idx in rows {
            for &masked in &mask.row(batch_idx, head_idx, query_idx)[keys.clone()] {
                all &= masked;
                any |= masked;
            }
        }
        (all, any)
    }

    /// Adds the bias and applies the mask to the scores of one row (query `query_idx`, keys
    /// from `key_start`).
    pub(crate) fn apply(
        &self,
        row_scores: &mut [f32],
        batch_idx: usize,
        head_idx: usize,
        query_idx: usize,
        key_start: usize,
    ) {
        let keys = key_start..key_start + row_scores.len();
        if let Some(bias) = &self.bias {
            simd::add(
                row_scores,
                &bias.row(batch_idx, head_idx, query_idx)[keys.clone()],
            );
        }
        if let Some(mask) = &self.mask {
            simd::mask(row_scores, &mask.row(batch_idx, head_idx, query_idx)[keys]);
        }
    }
}
