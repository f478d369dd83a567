//! What hides keys or shifts scores beyond causal masking, on the host: a boolean mask and an
//! additive bias, each read as if broadcast to `[b, h, n, m]`, the segment ids of packed
//! sequences and ALiBi's slopes (both computed on the fly, never as an n×m tensor).

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

/// The segment ids of packed sequences on the host: query i of batch row r sees key j only when
/// `query[r·n + i] == key[r·m + j]`.
#[derive(Debug, Clone, Copy)]
pub struct HostSegments<'a> {
    /// `[b, n]` row-major.
    pub query: &'a [i64],
    /// `[b, m]` row-major.
    pub key: &'a [i64],
}

impl HostSegments<'_> {
    /// The shortest run of one id among the keys of a row (the shortest packed document), for
    /// [`Tiles::fitted_to`](super::shape::Tiles::fitted_to).
    pub fn shortest_run(&self, m: usize) -> usize {
        self.key
            .chunks(m.max(1))
            .flat_map(|row| row.chunk_by(|a, b| a == b).map(<[i64]>::len))
            .min()
            .unwrap_or(m)
    }

    /// The ids of the queries `queries` and of the keys `keys` of batch row `batch_idx`.
    fn ids(
        &self,
        dims: &AttentionDims,
        batch_idx: usize,
        queries: Range<usize>,
        keys: Range<usize>,
    ) -> (&[i64], &[i64]) {
        (
            &self.query[batch_idx * dims.n..][queries],
            &self.key[batch_idx * dims.m..][keys],
        )
    }
}

/// ALiBi on the host: the bias `−slope_h · |c − j|`, `c = i + offset` on the causal diagonal,
/// one slope per query head (constants: no gradient).
#[derive(Debug, Clone, Copy)]
pub struct Alibi<'a> {
    /// `[h]`.
    pub slopes: &'a [f32],
    /// The diagonal's offset (`m − n` for bottom-right alignment).
    pub offset: i64,
}

/// What hides keys or shifts scores beyond causal masking: a boolean mask (true = masked out)
/// and an additive bias, both broadcast over `[b, h, n, m]`, packed sequences' segment ids and
/// ALiBi.
#[derive(Debug, Clone, Copy, Default)]
pub struct Masking<'a> {
    /// True = masked out.
    pub mask: Option<Broadcast<'a, bool>>,
    /// Added to the scaled scores; −∞ hides a key.
    pub bias: Option<Broadcast<'a, f32>>,
    /// Segment ids: a query sees only the keys of its own segment.
    pub segments: Option<HostSegments<'a>>,
    /// ALiBi slopes, added to the scores with the bias.
    pub alibi: Option<Alibi<'a>>,
    /// Attention sinks, `[h]`: a logit per query head in every row's softmax denominator that
    /// takes no value (finite, or −∞ for no sink; the module turns NaN and +∞ into poisoned
    /// rows before the kernel runs).
    pub sinks: Option<&'a [f32]>,
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
            segments: self.segments,
            alibi: self.alibi,
            sinks: self.sinks,
        }
    }

    /// `tiles` fitted to the shortest packed document, when there are segments (see
    /// [`Tiles::fitted_to`](super::shape::Tiles::fitted_to)); `m` keys per row.
    pub(crate) fn fit(&self, tiles: super::shape::Tiles, m: usize) -> super::shape::Tiles {
        tiles.fitted_to(self.segments.map(|seg| seg.shortest_run(m)))
    }

    /// Whether anything beyond the mask shifts the scores (bias or ALiBi): such tiles always go
    /// through [`apply`](Self::apply).
    pub(crate) fn shifts_scores(&self) -> bool {
        self.bias.is_some() || self.alibi.is_some()
    }

    /// Whether the mask, the segments or a −∞ bias hide key `key_idx` from query `query_idx`.
    pub(crate) fn hides(
        &self,
        dims: &AttentionDims,
        batch_idx: usize,
        head_idx: usize,
        query_idx: usize,
        key_idx: usize,
    ) -> bool {
        self.mask
            .is_some_and(|mask| mask.row(batch_idx, head_idx, query_idx)[key_idx])
            || self.bias.is_some_and(|bias| {
                bias.row(batch_idx, head_idx, query_idx)[key_idx] == f32::NEG_INFINITY
            })
            || self.segments.is_some_and(|seg| {
                seg.query[batch_idx * dims.n + query_idx] != seg.key[batch_idx * dims.m + key_idx]
            })
    }

    /// Checks that the mask and bias broadcast to the call's `[b, h, n, m]`, and the segment ids'
    /// and slopes' lengths.
    pub fn validate(&self, dims: &AttentionDims) -> Result<(), AttentionError> {
        if let Some(mask) = &self.mask {
            mask.validate("mask", dims)?;
        }
        if let Some(bias) = &self.bias {
            bias.validate("bias", dims)?;
        }
        if let Some(seg) = &self.segments {
            check_len(
                "query segment ids",
                seg.query.len(),
                [dims.batch, 1, 1, dims.n],
            )?;
            check_len("key segment ids", seg.key.len(), [dims.batch, 1, 1, dims.m])?;
        }
        if let Some(alibi) = &self.alibi {
            check_len("ALiBi slopes", alibi.slopes.len(), [1, 1, 1, dims.n_heads])?;
        }
        if let Some(sinks) = self.sinks {
            check_len("attention sinks", sinks.len(), [1, 1, 1, dims.n_heads])?;
        }
        Ok(())
    }

    /// How much of a tile (keys `keys` of the queries `queries` of a head) the mask hides:
    /// (all of it, some of it).
    pub(crate) fn mask_coverage(
        &self,
        dims: &AttentionDims,
        batch_idx: usize,
        head_idx: usize,
        queries: Range<usize>,
        keys: Range<usize>,
    ) -> (bool, bool) {
        let (seg_all, seg_any) = match &self.segments {
            Some(seg) => {
                // Packed documents have non-decreasing ids, so a tile whose query and key id
                // ranges do not overlap shares no segment and is skipped whole; one whose ids
                // are all the same single segment hides nothing.
                let (q, k) = seg.ids(dims, batch_idx, queries.clone(), keys.clone());
                let range = |ids: &[i64]| {
                    ids.iter()
                        .fold((i64::MAX, i64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)))
                };
                let ((q_lo, q_hi), (k_lo, k_hi)) = (range(q), range(k));
                let disjoint = q_hi < k_lo || k_hi < q_lo;
                let single = q_lo == q_hi && k_lo == k_hi && q_lo == k_lo;
                (disjoint, !single)
            }
            None => (false, false),
        };
        if seg_all {
            return (true, true);
        }
        let Some(mask) = &self.mask else {
            return (false, seg_any);
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
        (all, any || seg_any)
    }

    /// Adds the bias and ALiBi and applies the mask and the segments to the scores of one row
    /// (query `query_idx`, keys from `key_start`).
    pub(crate) fn apply(
        &self,
        dims: &AttentionDims,
        row_scores: &mut [f32],
        batch_idx: usize,
        head_idx: usize,
        query_idx: usize,
        key_start: usize,
    ) {
        let keys = key_start..key_start + row_scores.len();
        if let Some(alibi) = &self.alibi {
            let slope = alibi.slopes[head_idx];
            let centre = query_idx as i64 + alibi.offset;
            for (key_idx, score) in keys.clone().zip(row_scores.iter_mut()) {
                *score -= slope * (centre - key_idx as i64).unsigned_abs() as f32;
            }
        }
        if let Some(seg) = &self.segments {
            let (q, k) = seg.ids(dims, batch_idx, query_idx..query_idx + 1, keys.clone());
            for (score, &key_id) in row_scores.iter_mut().zip(k) {
                if key_id != q[0] {
                    *score = f32::NEG_INFINITY;
                }
            }
        }
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

/// Segment ids, ALiBi slopes and sinks on the host, as the kernel reads them (owned; [`Masking`]
/// borrows them).
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct HostTerms {
    /// `([b, n], [b, m])` query and key segment ids.
    pub segments: Option<(Vec<i64>, Vec<i64>)>,
    /// `[h]` slopes and the diagonal's offset.
    pub alibi: Option<(Vec<f32>, i64)>,
    /// `[h]` attention sinks.
    pub sinks: Option<Vec<f32>>,
}

impl HostTerms {
    /// The kernel's masking with these terms, the host `mask` and the host `bias` (values and
    /// shape of each).
    pub(crate) fn masking<'a>(
        &'a self,
        mask: Option<(&'a [bool], [usize; 4])>,
        bias: Option<(&'a [f32], [usize; 4])>,
    ) -> Masking<'a> {
        Masking {
            mask: mask.map(|(values, shape)| Broadcast::new(values, shape)),
            bias: bias.map(|(values, shape)| Broadcast::new(values, shape)),
            segments: self
                .segments
                .as_ref()
                .map(|(query, key)| HostSegments { query, key }),
            alibi: self.alibi.as_ref().map(|(slopes, offset)| Alibi {
                slopes,
                offset: *offset,
            }),
            sinks: self.sinks.as_deref(),
        }
    }
}
