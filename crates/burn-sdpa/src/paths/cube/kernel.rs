//! The flash forward pass in CubeCL: one cube of [`UNITS`] units per (batch·head, block of
//! `UNITS · rows` queries), each unit owning `rows` query rows (rows `u`, `u + UNITS`, ...); every
//! unit runs the online softmax of its rows over the keys in registers, then writes its context
//! rows and log-sum-exps. The tiles of `tile_rows` keys outside the causal band and the window
//! are never visited.
//!
//! Each key and value row reaches the units one of two ways (a compile-time switch, `planes`,
//! chosen with `tile_rows` by `tile.rs` from the device's limits): loaded once per plane of
//! [`LANES`] lanes (each lane loads one element of every group of [`LANES`]) and handed to the
//! other lanes by plane broadcasts, where the device has plane operations and the head sizes are
//! multiples of [`LANES`]; else loaded by the cube's units together into shared memory, tile by
//! tile. Several rows per unit and the broadcasts both make every load feed many multiply-adds,
//! which is what makes the kernel fast on Mesa's lavapipe (a CPU driver, where every load from
//! shared or global memory is a loop over the SIMD lanes); the rows per unit are chosen by the
//! caller (`tile.rs`, measured on lavapipe only). Every sum over d accumulates into an array
//! indexed by the unit's rows, d outermost; the loops over d are unrolled when `unroll_d`.

use cubecl::prelude::*;

pub(crate) use super::bias::{Pair, extra_row, read_bias};
pub(crate) use super::row_stats::{ROW_STATS, write_stats};

/// Units per cube.
pub(crate) const UNITS: usize = 32;

/// Lanes of a plane (subgroup) that share one load when the kernel runs with `planes`: lane `t`
/// loads element `t` of each group of `LANES`, and a plane broadcast hands it to the others.
/// Every plane of at least this many lanes works (lavapipe's are 8 wide with AVX2, GPUs' 32 or 64).
pub(crate) const LANES: usize = 8;

/// A score that stands for −∞ (WGSL has no −∞ literal): far below any finite scaled score a
/// visible key gives, and its exponential underflows to 0.
pub(crate) const HIDDEN: f32 = -3.0e38;

/// The log-sum-exp the forward pass writes for a row with no visible key (the module's −∞; the
/// backward pass's weights `exp(s − lse)` are 0 for it).
pub(crate) const NO_KEY: f32 = 3.0e38;
/// The log-sum-exp the forward pass writes for a row the non-finite policy makes NaN (it sees a
/// key whose key or value row holds a NaN or ±∞, or a NaN or +∞ bias entry, or its own query
/// does and it sees a key): the module then writes NaN into its context, and the backward
/// pass's weights are 0 for it (the row is a constant).
pub(crate) const POISONED: f32 = 2.0e38;

/// Whether key `j` is visible to the query whose diagonal is `centre` under the causal mask and
/// the window.
#[cube]
pub(crate) fn in_band(
    centre: i32,
    j: i32,
    left: i32,
    right: i32,
    #[comptime] causal: bool,
    #[comptime] has_left: bool,
    #[comptime] has_right: bool,
) -> bool {
    let mut visible = true;
    if causal {
        visible = visible && j <= centre;
    }
    if has_left {
        visible = visible && j >= centre - left;
    }
    if has_right {
        visible = visible && j <= centre + right;
    }
    visible
}

/// The keys `[lo, hi)` that some query with a diagonal in `[first_centre, last_centre]` may see
/// under the causal mask and the window (the tiles outside are skipped).
#[cube]
pub(crate) fn key_range(
    first_centre: i32,
    last_centre: i32,
    m: usize,
    left: i32,
    right: i32,
    #[comptime] causal: bool,
    #[comptime] has_left: bool,
    #[comptime] has_right: bool,
) -> (usize, usize) {
    let mut hi = m as i32;
    if causal {
        hi = min(hi, last_centre + 1);
    }
    if has_right {
        hi = min(hi, last_centre + right + 1);
    }
    let mut lo = 0i32;
    if has_left {
        lo = max(lo, first_centre - left);
    }
    hi = max(hi, 0i32);
    lo = min(lo, hi);
    (lo as usize, hi as usize)
}

/// The length of one shared tile of rows of `d` floats: one element with plane broadcasts (the
/// kernels do not read it, and CubeCL needs a length), else `tile_rows · d`.
pub(crate) fn tile_len(planes: bool, tile_rows: usize, d: usize) -> usize {
    if planes { 1 } else { tile_rows * d }
}

/// Loads rows `start..start + tile_rows` of head row `head` of `src` `[.., len, d]` (keys and
/// values of a kv head, or queries and dO of a query head) into `tile` (zeros past `len`), the
/// cube's units loading consecutive elements (unit `u` loads elements `u`, `u + UNITS`, ...).
/// Needs `start < len` (the callers' tiles start below their range's end, which is at most `len`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_tile<F: Float>(
    src: &Tensor<F>,
    tile: &mut Shared<[f32]>,
    head: usize,
    start: usize,
    len: usize,
    unit: usize,
    #[comptime] tile_rows: usize,
    #[comptime] d: usize,
    #[comptime] unroll_d: bool,
) {
    let tile_len = comptime!(tile_rows * d);
    let base = (head * len + start) * d;
    // Elements of the tile that lie inside `src`'s rows (the rest are zeros).
    let valid = (len - start) * d;
    #[unroll(unroll_d)]
    for load in 0..comptime!(tile_len.div_ceil(UNITS)) {
        let idx = load * UNITS + unit;
        if idx < tile_len {
            let mut x = 0.0f32;
            if idx < valid {
                x = f32::cast_from(src[base + idx]);
            }
            tile[idx] = x;
        }
    }
}

/// `vals[dd] = src[base + dd]` (in f32) for the `d` elements of a row, every element loaded by one lane
/// of the plane and broadcast to the others (`d` a multiple of [`LANES`]; called by the whole
/// plane, in uniform control flow).
#[cube]
pub(crate) fn broadcast_row<F: Float>(
    src: &Tensor<F>,
    vals: &mut Array<f32>,
    base: usize,
    lane: usize,
    #[comptime] d: usize,
    #[comptime] unroll_d: bool,
) {
    #[unroll(unroll_d)]
    for chunk in 0..comptime!(d / LANES) {
        let x = f32::cast_from(src[base + chunk * LANES + lane]);
        #[unroll]
        for t in 0..LANES {
            vals[chunk * LANES + t] = plane_broadcast(x, t as u32);
        }
    }
}

/// The (batch·head) index of this cube: `CUBE_POS_Y + CUBE_POS_Z · CUBE_COUNT_Y` (the grid's
/// second and third axes together, since Vulkan and Metal bound each to 65 535), and whether it
/// is one of the `count` there are (the last layer of the grid may be partly empty).
#[cube]
pub(crate) fn grid_row(count: usize) -> (usize, bool) {
    let idx = CUBE_POS_Y as usize + CUBE_POS_Z as usize * CUBE_COUNT_Y as usize;
    (idx, idx < count)
}

/// `context [b, h, n, d_v]` (in `F`) and `lse [b, h, n]` (f32; [`NO_KEY`] for a row with no
/// visible key, whose context row is 0; [`POISONED`] for a row the non-finite policy makes NaN,
/// see [`read_bias`]; `bad_keys [b, h_kv, m]` and `bad_queries [b, h, n]` are 1 for a row that
/// held a non-finite value, the inputs themselves being zeroed) of softmax(q kᵀ · scale, soft-capped, plus `extra` and ALiBi,
/// causal, windowed and within segments) v, with grouped-query heads (query head i reads kv
/// head i / group). Everything is computed in f32 whatever `F` is (f32, f16 or bf16): loads are
/// widened, only the context is rounded to `F`. `extra` `[b|1, h|1, n|1, m]` (read when
/// `has_extra`) holds the bias, with the masked keys at [`MASKED`](super::bias::MASKED) or below; `q_segments [b, n]`
/// and `k_segments [b, m]` (read when `has_segments`) the segment ids; `slopes [2, h]` ALiBi's
/// (row 0, read when `has_alibi`) and the attention sinks (row 1, read when `has_sinks`: finite
/// or −∞). Every tensor is contiguous row-major. Launched with [`UNITS`] units per
/// cube and `(n.div_ceil(UNITS · rows), y, z)` cubes, `y · z ≥ b · h` (see [`grid_row`]);
/// `tile_rows`, `planes` and `unroll_d` are the call's `tile::Tiling`.
///
/// Visibility of key j to query i (c = i + `offset`, the diagonal): `j ≤ c` when `causal`,
/// `j ≥ c − left` when `has_left`, `j ≤ c + right` when `has_right`, and the same segment.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_forward<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    extra: &Tensor<f32>,
    q_segments: &Tensor<i32>,
    k_segments: &Tensor<i32>,
    slopes: &Tensor<f32>,
    bad_keys: &Tensor<f32>,
    bad_queries: &Tensor<f32>,
    context: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    stats: &mut Tensor<f32>,
    scale: f32,
    softcap: f32,
    offset: i32,
    left: i32,
    right: i32,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] rows: usize,
    #[comptime] tile_rows: usize,
    #[comptime] planes: bool,
    #[comptime] unroll_d: bool,
    #[comptime] causal: bool,
    #[comptime] has_left: bool,
    #[comptime] has_right: bool,
    #[comptime] capped: bool,
    #[comptime] has_extra: bool,
    #[comptime] has_segments: bool,
    #[comptime] has_alibi: bool,
    #[comptime] has_sinks: bool,
    #[comptime] has_stats: bool,
    #[define(F)] _dtype: ElemType,
) {
    let n = q.shape(2);
    let m = k.shape(2);
    let n_heads = q.shape(1);
    let n_kv_heads = k.shape(1);
    let group = n_heads / n_kv_heads;
    let (bh, in_grid) = grid_row(q.shape(0) * n_heads);
    if !in_grid {
        terminate!();
    }
    let batch_idx = bh / n_heads;
    let head_idx = bh % n_heads;
    let kv = batch_idx * n_kv_heads + head_idx / group;
    let unit = UNIT_POS_X as usize;
    let block_start = CUBE_POS_X as usize * comptime!(UNITS * rows);
    // Row r of this unit is query block_start + r · UNITS + unit.
    let first_query = block_start + unit;

    let mut k_tile = Shared::<[f32]>::new_slice(comptime!(tile_len(planes, tile_rows, d_k)));
    let mut v_tile = Shared::<[f32]>::new_slice(comptime!(tile_len(planes, tile_rows, d_v)));

    // The query rows, scaled, in registers: q_rows[r · d_k + dd].
    let mut q_rows = Array::<f32>::new(comptime!(rows * d_k));
    let mut acc = Array::<f32>::new(comptime!(rows * d_v));
    let mut row_max = Array::<f32>::new(rows);
    let mut row_sum = Array::<f32>::new(rows);
    let mut scores = Array::<f32>::new(rows);
    let mut weights = Array::<f32>::new(rows);
    let mut corrections = Array::<f32>::new(rows);
    let mut segment_rows = Array::<i32>::new(rows);
    // 1 where the row is poisoned by a key it sees; its own query's state.
    let mut poisoned = Array::<f32>::new(rows);
    let mut bad_query = Array::<f32>::new(rows);
    // The row statistics' accumulators (see `paths/online_stats.rs` for the recurrence): beside
    // the running max m and sum l, keys_sum = Σ e^(s − m) over the keys (the sink apart) and
    // weighted = Σ e^(s − m)·(s − m), rescaled when m grows; the visible max, the count and the
    // moments about the row's first visible score.
    let stat_rows = comptime!(if has_stats { rows } else { 1 });
    let mut keys_sum = Array::<f32>::new(stat_rows);
    let mut weighted = Array::<f32>::new(stat_rows);
    let mut visible_max = Array::<f32>::new(stat_rows);
    let mut count = Array::<f32>::new(stat_rows);
    let mut shift = Array::<f32>::new(stat_rows);
    let mut first_moment = Array::<f32>::new(stat_rows);
    let mut second_moment = Array::<f32>::new(stat_rows);
    // A sink starts every row of its head with one term e^(sink − max) = 1 at max = sink (a sink
    // of −∞ is none).
    let mut start_max = <f32 as Float>::new(HIDDEN);
    let mut start_sum = 0.0f32;
    if has_sinks {
        let sink = slopes[n_heads + head_idx];
        if sink > HIDDEN {
            start_max = sink;
            start_sum = 1.0f32;
        }
    }
    #[unroll]
    for r in 0..rows {
        let query_idx = first_query + r * UNITS;
        let active = query_idx < n;
        let q_base = (bh * n + query_idx) * d_k;
        poisoned[r] = 0.0f32;
        let mut query_state = 0.0f32;
        if active {
            query_state = bad_queries[bh * n + query_idx];
        }
        bad_query[r] = query_state;
        #[unroll(unroll_d)]
        for dd in 0..d_k {
            let mut x = 0.0f32;
            if active {
                x = f32::cast_from(q[q_base + dd]);
            }
            q_rows[r * d_k + dd] = x * scale;
        }
        #[unroll(unroll_d)]
        for dd in 0..d_v {
            acc[r * d_v + dd] = 0.0f32;
        }
        row_max[r] = start_max;
        row_sum[r] = start_sum;
        if has_stats {
            keys_sum[r] = 0.0f32;
            weighted[r] = 0.0f32;
            visible_max[r] = <f32 as Float>::new(HIDDEN);
            count[r] = 0.0f32;
            shift[r] = 0.0f32;
            first_moment[r] = 0.0f32;
            second_moment[r] = 0.0f32;
        }
        let mut segment = 0i32;
        if has_segments && active {
            segment = q_segments[batch_idx * n + query_idx];
        }
        segment_rows[r] = segment;
    }
    let mut slope = 0.0f32;
    if has_alibi {
        slope = slopes[head_idx];
    }
    // The rows of `extra` this unit reads: extra_base + r · UNITS · extra_step.
    let mut extra_base = 0usize;
    let mut extra_step = 0usize;
    if has_extra {
        let (base, step) = extra_row(extra, batch_idx, head_idx, first_query, m);
        extra_base = base;
        extra_step = step * UNITS;
    }
    let first_centre = block_start as i32 + offset;
    let last_centre = first_centre + comptime!((UNITS * rows) as i32) - 1;
    let (key_lo, key_hi) = key_range(
        first_centre,
        last_centre,
        m,
        left,
        right,
        causal,
        has_left,
        has_right,
    );

    let tile_lo = key_lo / tile_rows;
    let tile_hi = key_hi.div_ceil(tile_rows);
    let lane = UNIT_POS_PLANE as usize % LANES;
    let mut k_vals = Array::<f32>::new(d_k);
    let mut v_vals = Array::<f32>::new(d_v);
    for tile_idx in tile_lo..tile_hi {
        let key_start = tile_idx * tile_rows;
        if !planes {
            load_tile::<F>(
                k,
                &mut k_tile,
                kv,
                key_start,
                m,
                unit,
                tile_rows,
                d_k,
                unroll_d,
            );
            load_tile::<F>(
                v,
                &mut v_tile,
                kv,
                key_start,
                m,
                unit,
                tile_rows,
                d_v,
                unroll_d,
            );
            sync_cube();
        }
        let key_end = min(tile_rows, key_hi - key_start);
        for key_row in 0..key_end {
            let key_idx = key_start + key_row;
            let j = key_idx as i32;
            if planes {
                broadcast_row::<F>(
                    k,
                    &mut k_vals,
                    (kv * m + key_idx) * d_k,
                    lane,
                    d_k,
                    unroll_d,
                );
                broadcast_row::<F>(
                    v,
                    &mut v_vals,
                    (kv * m + key_idx) * d_v,
                    lane,
                    d_v,
                    unroll_d,
                );
            } else {
                #[unroll(unroll_d)]
                for dd in 0..d_k {
                    k_vals[dd] = k_tile[key_row * d_k + dd];
                }
                #[unroll(unroll_d)]
                for dd in 0..d_v {
                    v_vals[dd] = v_tile[key_row * d_v + dd];
                }
            }
            let mut key_segment = 0i32;
            if has_segments {
                key_segment = k_segments[batch_idx * m + key_idx];
            }
            let bad_key = bad_keys[kv * m + key_idx] > 0.5f32;
            #[unroll]
            for r in 0..rows {
                scores[r] = 0.0f32;
            }
            // s[r] = q_r · k_j: one load of k per element, `rows` multiply-adds.
            #[unroll(unroll_d)]
            for dd in 0..d_k {
                let kx = k_vals[dd];
                #[unroll]
                for r in 0..rows {
                    scores[r] += q_rows[r * d_k + dd] * kx;
                }
            }
            #[unroll]
            for r in 0..rows {
                let query_idx = first_query + r * UNITS;
                let centre = query_idx as i32 + offset;
                let banded =
                    query_idx < n && in_band(centre, j, left, right, causal, has_left, has_right);
                let pair = Pair {
                    query_segment: segment_rows[r],
                    key_segment,
                    slope,
                    centre,
                    key: j,
                    bad_key,
                };
                let (visible, added, poison) = read_bias(
                    extra,
                    banded,
                    extra_base + r * extra_step + key_idx,
                    pair,
                    has_extra,
                    has_segments,
                    has_alibi,
                );
                if poison {
                    poisoned[r] = 1.0f32;
                }
                let mut p = 0.0f32;
                let mut correction = 1.0f32;
                if visible {
                    let mut s = scores[r];
                    if capped {
                        s = softcap * (s / softcap).tanh();
                    }
                    // The bias is added after the soft-cap, as on every path.
                    s += added;
                    let new_max = f32::max(row_max[r], s);
                    correction = (row_max[r] - new_max).exp();
                    p = (s - new_max).exp();
                    if has_stats {
                        if count[r] < 0.5f32 {
                            shift[r] = s;
                        }
                        let centred = s - shift[r];
                        count[r] += 1.0f32;
                        first_moment[r] += centred;
                        second_moment[r] += centred * centred;
                        visible_max[r] = f32::max(visible_max[r], s);
                        // keys_sum is 0 until the first key, so δ·keys_sum is too.
                        let delta = row_max[r] - new_max;
                        weighted[r] =
                            correction * (weighted[r] + delta * keys_sum[r]) + p * (s - new_max);
                        keys_sum[r] = keys_sum[r] * correction + p;
                    }
                    row_sum[r] = row_sum[r] * correction + p;
                    row_max[r] = new_max;
                }
                weights[r] = p;
                corrections[r] = correction;
            }
            #[unroll(unroll_d)]
            for dd in 0..d_v {
                let vx = v_vals[dd];
                #[unroll]
                for r in 0..rows {
                    acc[r * d_v + dd] = acc[r * d_v + dd] * corrections[r] + weights[r] * vx;
                }
            }
        }
        if !planes {
            sync_cube();
        }
    }
    #[unroll]
    for r in 0..rows {
        let query_idx = first_query + r * UNITS;
        if query_idx < n {
            if has_stats {
                write_stats(
                    stats,
                    (bh * n + query_idx) * ROW_STATS,
                    row_max[r],
                    row_sum[r],
                    keys_sum[r],
                    weighted[r],
                    visible_max[r],
                    count[r],
                    shift[r],
                    first_moment[r],
                    second_moment[r],
                );
            }
            let out_base = (bh * n + query_idx) * d_v;
            if row_sum[r] > 0.0f32 {
                let inv = 1.0f32 / row_sum[r];
                #[unroll(unroll_d)]
                for dd in 0..d_v {
                    context[out_base + dd] = F::cast_from(acc[r * d_v + dd] * inv);
                }
                let mut row_lse = row_max[r] + row_sum[r].ln();
                if poisoned[r] > 0.5f32 || bad_query[r] > 0.5f32 {
                    row_lse = POISONED;
                }
                lse[bh * n + query_idx] = row_lse;
            } else {
                // No visible key: a zero row, and a log-sum-exp of +∞ (the other paths' rule).
                #[unroll(unroll_d)]
                for dd in 0..d_v {
                    context[out_base + dd] = F::new(0.0);
                }
                lse[bh * n + query_idx] = NO_KEY;
            }
        }
    }
}
