//! What the CubeCL kernels read per (query, key) pair besides q, k and v: the row of the bias
//! and masks (`extra`), segment ids and ALiBi's slope, and the non-finite policy's flags.

use cubecl::prelude::*;

/// An entry of `extra` at or below this hides its key: the masks come in as the kernel's
/// `HIDDEN` (−3e38), a −∞ bias entry as itself.
pub(crate) const MASKED: f32 = -1.0e38;

/// The offset of row (`batch_idx`, `head_idx`, `query_idx`) in `extra` `[b|1, h|1, n|1, m]`, and
/// the step from one query row to the next (0 when the query axis is broadcast).
#[cube]
pub(crate) fn extra_row(
    extra: &Tensor<f32>,
    batch_idx: usize,
    head_idx: usize,
    query_idx: usize,
    m: usize,
) -> (usize, usize) {
    let (e0, e1, e2) = (extra.shape(0), extra.shape(1), extra.shape(2));
    let eb = if e0 == 1 { 0usize } else { batch_idx };
    let eh = if e1 == 1 { 0usize } else { head_idx };
    let ei = if e2 == 1 { 0usize } else { query_idx };
    let step = if e2 == 1 { 0usize } else { m };
    (((eb * e1 + eh) * e2 + ei) * m, step)
}

/// The segment ids and ALiBi slope of one (query, key) pair; zeros where the call has none.
#[derive(CubeType, Clone, Copy)]
pub(crate) struct Pair {
    /// The query's segment.
    pub query_segment: i32,
    /// The key's segment.
    pub key_segment: i32,
    /// The head's ALiBi slope.
    pub slope: f32,
    /// The query's diagonal `i + offset`.
    pub centre: i32,
    /// The key's index.
    pub key: i32,
    /// Whether the key's key or value row holds a NaN or ±∞ (zeroed before the kernel).
    pub bad_key: bool,
}

/// The score added to a key `in_band` leaves visible (the bias entry `extra[idx]` plus ALiBi's
/// `−slope · |centre − key|`), whether the key stays visible, and whether it poisons the row: a
/// key of another segment is hidden, and so is one whose `extra` entry is at or below [`MASKED`]
/// (a mask, or a −∞ bias entry) rather than merely down-weighted; a visible key poisons the row
/// when it is a bad key or its bias entry is NaN or +∞ (which then counts as 0). A hidden key
/// reads nothing.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_bias(
    extra: &Tensor<f32>,
    in_band: bool,
    idx: usize,
    pair: Pair,
    #[comptime] has_extra: bool,
    #[comptime] has_segments: bool,
    #[comptime] has_alibi: bool,
) -> (bool, f32, bool) {
    let mut visible = in_band;
    if has_segments {
        visible = visible && pair.query_segment == pair.key_segment;
    }
    let mut added = 0.0f32;
    let mut bad_bias = false;
    if has_extra && visible {
        added = extra[idx];
        if added.is_nan() || (added.is_inf() && added > 0.0f32) {
            bad_bias = true;
            added = 0.0f32;
        }
        visible = added > MASKED;
    }
    // Only a key the row still sees can poison it (a −∞ bias entry hides a bad key).
    let poison = visible && (pair.bad_key || bad_bias);
    if has_alibi {
        let mut distance = pair.centre - pair.key;
        if distance < 0i32 {
            distance = -distance;
        }
        added -= pair.slope * f32::cast_from(distance);
    }
    (visible, added, poison)
}
