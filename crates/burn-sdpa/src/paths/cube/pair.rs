//! What the CubeCL kernels read per (query, key) pair besides q, k and v: the causal band and
//! the window, the row of the bias and masks, segment ids and ALiBi's slope ([`Terms`]), and the
//! non-finite policy's flags.

use cubecl::prelude::*;

use super::config::{FlashConfig, MASKED, Scalars, Terms};
use super::steps::Block;

/// Whether key `j` is visible to the query whose diagonal is `centre` under the causal mask and
/// the window.
#[cube]
pub(crate) fn in_band(
    centre: i32,
    j: i32,
    scalars: &Scalars,
    #[comptime] config: FlashConfig,
) -> bool {
    let mut visible = true;
    if config.causal {
        visible = visible && j <= centre;
    }
    if config.has_left {
        visible = visible && j >= centre - scalars.left;
    }
    if config.has_right {
        visible = visible && j <= centre + scalars.right;
    }
    visible
}

/// The offset of row (`batch_idx`, `head_idx`, `query_idx`) in the bias `[b|1, h|1, n|1, m]`,
/// and the step from one query row to the next (0 when the query axis is broadcast); both 0
/// when the call has no bias.
#[cube]
pub(crate) fn bias_row(
    terms: &Terms,
    batch_idx: usize,
    head_idx: usize,
    query_idx: usize,
    m: usize,
    #[comptime] config: FlashConfig,
) -> (usize, usize) {
    let mut base = 0usize;
    let mut step = 0usize;
    if config.has_bias {
        let (e0, e1, e2) = (
            terms.bias.shape(0),
            terms.bias.shape(1),
            terms.bias.shape(2),
        );
        let eb = if e0 == 1 { 0usize } else { batch_idx };
        let eh = if e1 == 1 { 0usize } else { head_idx };
        let ei = if e2 == 1 { 0usize } else { query_idx };
        step = if e2 == 1 { 0usize } else { m };
        base = ((eb * e1 + eh) * e2 + ei) * m;
    }
    (base, step)
}

/// One (query, key) pair: its indices, segment ids and ALiBi slope (zeros where the call has
/// none), and the non-finite flags of its key.
#[derive(CubeType, Clone, Copy)]
pub(crate) struct Pair {
    /// The query's index.
    pub query_idx: usize,
    /// The key's index.
    pub key_idx: usize,
    /// Whether the query is one of the `n` (a unit's row past the end is not).
    pub query_in: bool,
    /// Whether the key is one of the `m`.
    pub key_in: bool,
    /// The query's segment.
    pub query_segment: i32,
    /// The key's segment.
    pub key_segment: i32,
    /// The head's ALiBi slope.
    pub slope: f32,
    /// Whether the key's key or value row holds a NaN or ±∞ (zeroed before the kernel).
    pub bad_key: bool,
}

/// What `pair` adds to its score and whether the query sees the key: the causal band and the
/// window, the segments, the bias entry `terms.bias[bias_idx]` and ALiBi's
/// `−slope · |centre − key|` (the centre is the query's diagonal `query_idx + offset`); and
/// whether the key poisons the row. A key of another segment is hidden, and so is one whose bias
/// entry is at or below [`MASKED`] (a mask, or a −∞ bias entry) rather than merely down-weighted;
/// a visible key poisons the row when it is a bad key or its bias entry is NaN or +∞ (which then
/// counts as 0). A hidden key reads nothing.
#[cube]
pub(crate) fn read_pair(
    terms: &Terms,
    scalars: &Scalars,
    pair: Pair,
    bias_idx: usize,
    #[comptime] config: FlashConfig,
) -> (bool, f32, bool) {
    let centre = pair.query_idx as i32 + scalars.offset;
    let key = pair.key_idx as i32;
    let mut visible = pair.query_in && pair.key_in && in_band(centre, key, scalars, config);
    if config.has_segments {
        visible = visible && pair.query_segment == pair.key_segment;
    }
    let mut added = 0.0f32;
    let mut bad_bias = false;
    if config.has_bias && visible {
        added = terms.bias[bias_idx];
        if added.is_nan() || (added.is_inf() && added > 0.0f32) {
            bad_bias = true;
            added = 0.0f32;
        }
        visible = added > MASKED;
    }
    // Only a key the row still sees can poison it (a −∞ bias entry hides a bad key).
    let poison = visible && (pair.bad_key || bad_bias);
    if config.has_alibi {
        let mut distance = centre - key;
        if distance < 0i32 {
            distance = -distance;
        }
        added -= pair.slope * f32::cast_from(distance);
    }
    (visible, added, poison)
}

/// The segment id of row `idx` of `segments` `[b, len]` (0 when the call has none or the row is
/// past the end).
#[cube]
pub(crate) fn segment_of(
    segments: &OwnedTensor<i32>,
    batch_idx: usize,
    idx: usize,
    len: usize,
    #[comptime] config: FlashConfig,
) -> i32 {
    let mut segment = 0i32;
    if config.has_segments && idx < len {
        segment = segments[batch_idx * len + idx];
    }
    segment
}

/// The segment ids of the unit's rows of `block` in `segments` `[b, len]` (see
/// [`segment_of`]).
#[cube]
pub(crate) fn own_segments(
    segments: &OwnedTensor<i32>,
    block: &Block,
    len: usize,
    #[comptime] config: FlashConfig,
) -> Array<i32> {
    let mut own = Array::<i32>::new(config.rows);
    #[unroll]
    for r in 0..config.rows {
        let (idx, _, _) = block.own(r, len);
        own[r] = segment_of(segments, block.batch_idx, idx, len, config);
    }
    own
}

/// ALiBi's slope of head `head_idx` (0 when the call has none).
#[cube]
pub(crate) fn slope_of(terms: &Terms, head_idx: usize, #[comptime] config: FlashConfig) -> f32 {
    let mut slope = 0.0f32;
    if config.has_alibi {
        slope = terms.per_head[head_idx];
    }
    slope
}
