//! The flash backward pass in CubeCL (FlashAttention-2): the weights are recomputed key by key
//! from the forward's log-sum-exp, nothing of size n × m is stored, and every unit owns the rows it
//! writes (no atomics: the result does not depend on scheduling).
//!
//! - `flash_backward_dq`: one cube of [`UNITS`] units per (batch·head, block of `UNITS · rows`
//!   queries), `rows` query rows per unit, the keys and values streamed through shared memory: dQ.
//! - `flash_backward_dkdv`: one cube per (batch·kv head, block of `UNITS · rows` keys), `rows` key
//!   rows per unit, the queries of every head of the group (with dO, the log-sum-exp and
//!   D = rowsum(dO ∘ O)) streamed through shared memory: dK and dV.
//!
//! A row the forward pass poisoned (see `kernel::POISONED`) or that saw no key has a
//! log-sum-exp of 2e38 or 3e38, so its weights `exp(s − lse)` are 0: it adds nothing to any
//! gradient (bad keys are zeroed before the kernels; a NaN or +∞ bias entry counts as 0).
//!
//! As in the forward pass, every element read from shared memory feeds `rows` multiply-adds,
//! every sum over d accumulates into an array indexed by the unit's rows (d outermost, unrolled
//! when `unroll_d`), the tiles are `tile.rs`'s (`tile_rows`, `planes`), everything is computed in
//! f32 whatever the storage type `F` (only dQ, dK, dV are rounded to it), and the grid's second
//! and third axes together index the (batch·head) rows.

use cubecl::prelude::*;

use super::kernel::{
    LANES, Pair, UNITS, broadcast_row, extra_row, grid_row, in_band, key_range, load_tile,
    read_bias, tile_len,
};

/// dQ `[b, h, n, d_k]` of the forward pass with the same options (see `flash_forward`); `lse` and
/// `delta` (D = rowsum(dO ∘ O)) are `[b, h, n]`. With `write_scores`, also the gradient of the
/// scores after the soft-cap (the bias's) into `d_scores` `[b, h, n, m]`, which must hold zeros
/// (the hidden entries are not written). Launched with [`UNITS`] units per cube and
/// `(n.div_ceil(UNITS · rows), y, z)` cubes, `y · z ≥ b · h`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_backward_dq<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    extra: &Tensor<f32>,
    q_segments: &Tensor<i32>,
    k_segments: &Tensor<i32>,
    slopes: &Tensor<f32>,
    d_out: &Tensor<F>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    dq: &mut Tensor<F>,
    d_scores: &mut Tensor<f32>,
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
    #[comptime] write_scores: bool,
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
    // Row r of this unit is query first_query + r · UNITS.
    let first_query = block_start + unit;

    let mut k_tile = Shared::<[f32]>::new_slice(comptime!(tile_len(planes, tile_rows, d_k)));
    let mut v_tile = Shared::<[f32]>::new_slice(comptime!(tile_len(planes, tile_rows, d_v)));

    let mut q_rows = Array::<f32>::new(comptime!(rows * d_k));
    let mut do_rows = Array::<f32>::new(comptime!(rows * d_v));
    let mut dq_acc = Array::<f32>::new(comptime!(rows * d_k));
    let mut lse_rows = Array::<f32>::new(rows);
    let mut delta_rows = Array::<f32>::new(rows);
    let mut k_vals = Array::<f32>::new(d_k);
    let mut v_vals = Array::<f32>::new(d_v);
    let mut scores = Array::<f32>::new(rows);
    let mut d_probs = Array::<f32>::new(rows);
    let mut d_weights = Array::<f32>::new(rows);
    let mut segment_rows = Array::<i32>::new(rows);
    #[unroll]
    for r in 0..rows {
        let query_idx = first_query + r * UNITS;
        let active = query_idx < n;
        let row_idx = bh * n + query_idx;
        #[unroll(unroll_d)]
        for dd in 0..d_k {
            let mut x = 0.0f32;
            if active {
                x = f32::cast_from(q[row_idx * d_k + dd]);
            }
            q_rows[r * d_k + dd] = x * scale;
            dq_acc[r * d_k + dd] = 0.0f32;
        }
        #[unroll(unroll_d)]
        for dd in 0..d_v {
            let mut x = 0.0f32;
            if active {
                x = f32::cast_from(d_out[row_idx * d_v + dd]);
            }
            do_rows[r * d_v + dd] = x;
        }
        let mut l = 0.0f32;
        let mut dl = 0.0f32;
        let mut segment = 0i32;
        if active {
            l = lse[row_idx];
            dl = delta[row_idx];
            if has_segments {
                segment = q_segments[batch_idx * n + query_idx];
            }
        }
        lse_rows[r] = l;
        delta_rows[r] = dl;
        segment_rows[r] = segment;
    }
    let mut slope = 0.0f32;
    if has_alibi {
        slope = slopes[head_idx];
    }
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

    let lane = UNIT_POS_PLANE as usize % LANES;
    for tile_idx in key_lo / tile_rows..key_hi.div_ceil(tile_rows) {
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
            // s[r] = q_r · k_j and dp[r] = dO_r · v_j, d outermost.
            #[unroll]
            for r in 0..rows {
                scores[r] = 0.0f32;
                d_probs[r] = 0.0f32;
            }
            #[unroll(unroll_d)]
            for dd in 0..d_k {
                let kx = k_vals[dd];
                #[unroll]
                for r in 0..rows {
                    scores[r] += q_rows[r * d_k + dd] * kx;
                }
            }
            #[unroll(unroll_d)]
            for dd in 0..d_v {
                let vx = v_vals[dd];
                #[unroll]
                for r in 0..rows {
                    d_probs[r] += do_rows[r * d_v + dd] * vx;
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
                    bad_key: false,
                };
                let (visible, added, _) = read_bias(
                    extra,
                    banded,
                    extra_base + r * extra_step + key_idx,
                    pair,
                    has_extra,
                    has_segments,
                    has_alibi,
                );
                let mut ds = 0.0f32;
                if visible {
                    let mut s = scores[r];
                    let mut cap_grad = 1.0f32;
                    if capped {
                        let t = (s / softcap).tanh();
                        s = softcap * t;
                        cap_grad = 1.0f32 - t * t;
                    }
                    s += added;
                    let p = (s - lse_rows[r]).exp();
                    // The gradient of the score after the soft-cap, which is the bias's.
                    let ds_bias = p * (d_probs[r] - delta_rows[r]);
                    if write_scores {
                        d_scores[(bh * n + query_idx) * m + key_idx] = ds_bias;
                    }
                    ds = ds_bias * cap_grad;
                }
                d_weights[r] = ds;
            }
            #[unroll(unroll_d)]
            for dd in 0..d_k {
                let kx = k_vals[dd];
                #[unroll]
                for r in 0..rows {
                    dq_acc[r * d_k + dd] += d_weights[r] * kx;
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
            let row_idx = bh * n + query_idx;
            #[unroll(unroll_d)]
            for dd in 0..d_k {
                dq[row_idx * d_k + dd] = F::cast_from(dq_acc[r * d_k + dd] * scale);
            }
        }
    }
}

/// The queries `[lo, hi)` that may see some key in `[first_key, last_key]` under the causal mask
/// and the window (query i's diagonal is i + `offset`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn query_range(
    first_key: i32,
    last_key: i32,
    n: usize,
    offset: i32,
    left: i32,
    right: i32,
    #[comptime] causal: bool,
    #[comptime] has_left: bool,
    #[comptime] has_right: bool,
) -> (usize, usize) {
    // Key j is visible to query i when j ≤ i + offset (causal), j ≤ i + offset + right and
    // j ≥ i + offset − left.
    let mut lo = 0i32;
    if causal {
        lo = max(lo, first_key - offset);
    }
    if has_right {
        lo = max(lo, first_key - offset - right);
    }
    let mut hi = n as i32;
    if has_left {
        hi = min(hi, last_key - offset + left + 1);
    }
    lo = min(lo, n as i32);
    hi = max(hi, lo);
    (lo as usize, hi as usize)
}

/// dK `[b, h_kv, m, d_k]` and dV `[b, h_kv, m, d_v]`, summed over the query heads of each group.
/// Launched with [`UNITS`] units per cube and `(m.div_ceil(UNITS · rows), y, z)` cubes, `y · z ≥ b · h_kv`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_backward_dkdv<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    extra: &Tensor<f32>,
    q_segments: &Tensor<i32>,
    k_segments: &Tensor<i32>,
    slopes: &Tensor<f32>,
    d_out: &Tensor<F>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    dk: &mut Tensor<F>,
    dv: &mut Tensor<F>,
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
    #[define(F)] _dtype: ElemType,
) {
    let n = q.shape(2);
    let m = k.shape(2);
    let n_heads = q.shape(1);
    let n_kv_heads = k.shape(1);
    let group = n_heads / n_kv_heads;
    let (kvb, in_grid) = grid_row(q.shape(0) * n_kv_heads);
    if !in_grid {
        terminate!();
    }
    let batch_idx = kvb / n_kv_heads;
    let kv_head = kvb % n_kv_heads;
    let unit = UNIT_POS_X as usize;
    let block_start = CUBE_POS_X as usize * comptime!(UNITS * rows);
    // Row r of this unit is key first_key + r · UNITS.
    let first_key = block_start + unit;

    let mut q_tile = Shared::<[f32]>::new_slice(comptime!(tile_len(planes, tile_rows, d_k)));
    let mut do_tile = Shared::<[f32]>::new_slice(comptime!(tile_len(planes, tile_rows, d_v)));

    let mut k_rows = Array::<f32>::new(comptime!(rows * d_k));
    let mut v_rows = Array::<f32>::new(comptime!(rows * d_v));
    let mut dk_acc = Array::<f32>::new(comptime!(rows * d_k));
    let mut dv_acc = Array::<f32>::new(comptime!(rows * d_v));
    let mut q_vals = Array::<f32>::new(d_k);
    let mut do_vals = Array::<f32>::new(d_v);
    let mut scores = Array::<f32>::new(rows);
    let mut d_probs = Array::<f32>::new(rows);
    let mut weights = Array::<f32>::new(rows);
    let mut d_weights = Array::<f32>::new(rows);
    let mut segment_rows = Array::<i32>::new(rows);
    #[unroll]
    for r in 0..rows {
        let key_idx = first_key + r * UNITS;
        let active = key_idx < m;
        let key_row_idx = kvb * m + key_idx;
        #[unroll(unroll_d)]
        for dd in 0..d_k {
            let mut x = 0.0f32;
            if active {
                x = f32::cast_from(k[key_row_idx * d_k + dd]);
            }
            k_rows[r * d_k + dd] = x * scale;
            dk_acc[r * d_k + dd] = 0.0f32;
        }
        #[unroll(unroll_d)]
        for dd in 0..d_v {
            let mut x = 0.0f32;
            if active {
                x = f32::cast_from(v[key_row_idx * d_v + dd]);
            }
            v_rows[r * d_v + dd] = x;
            dv_acc[r * d_v + dd] = 0.0f32;
        }
        let mut segment = 0i32;
        if has_segments && active {
            segment = k_segments[batch_idx * m + key_idx];
        }
        segment_rows[r] = segment;
    }
    let lane = UNIT_POS_PLANE as usize % LANES;
    let last_key = block_start + comptime!(UNITS * rows) - 1;
    let (query_lo, query_hi) = query_range(
        block_start as i32,
        last_key as i32,
        n,
        offset,
        left,
        right,
        causal,
        has_left,
        has_right,
    );

    for g in 0..group {
        let head_idx = kv_head * group + g;
        let bh = batch_idx * n_heads + head_idx;
        let mut slope = 0.0f32;
        if has_alibi {
            slope = slopes[head_idx];
        }
        for tile_idx in query_lo / tile_rows..query_hi.div_ceil(tile_rows) {
            let q_start = tile_idx * tile_rows;
            if !planes {
                load_tile::<F>(
                    q,
                    &mut q_tile,
                    bh,
                    q_start,
                    n,
                    unit,
                    tile_rows,
                    d_k,
                    unroll_d,
                );
                load_tile::<F>(
                    d_out,
                    &mut do_tile,
                    bh,
                    q_start,
                    n,
                    unit,
                    tile_rows,
                    d_v,
                    unroll_d,
                );
                sync_cube();
            }
            let query_end = min(tile_rows, query_hi - q_start);
            for query_row in 0..query_end {
                let query_idx = q_start + query_row;
                let centre = query_idx as i32 + offset;
                if planes {
                    let q_base = (bh * n + query_idx) * d_k;
                    let do_base = (bh * n + query_idx) * d_v;
                    broadcast_row::<F>(q, &mut q_vals, q_base, lane, d_k, unroll_d);
                    broadcast_row::<F>(d_out, &mut do_vals, do_base, lane, d_v, unroll_d);
                } else {
                    #[unroll(unroll_d)]
                    for dd in 0..d_k {
                        q_vals[dd] = q_tile[query_row * d_k + dd];
                    }
                    #[unroll(unroll_d)]
                    for dd in 0..d_v {
                        do_vals[dd] = do_tile[query_row * d_v + dd];
                    }
                }
                let lse_i = lse[bh * n + query_idx];
                let delta_i = delta[bh * n + query_idx];
                let mut query_segment = 0i32;
                if has_segments {
                    query_segment = q_segments[batch_idx * n + query_idx];
                }
                let mut extra_base = 0usize;
                if has_extra {
                    let (base, _) = extra_row(extra, batch_idx, head_idx, query_idx, m);
                    extra_base = base;
                }
                // s[r] = q_i · k_r and dp[r] = dO_i · v_r, d outermost.
                #[unroll]
                for r in 0..rows {
                    scores[r] = 0.0f32;
                    d_probs[r] = 0.0f32;
                }
                #[unroll(unroll_d)]
                for dd in 0..d_k {
                    let qx = q_vals[dd];
                    #[unroll]
                    for r in 0..rows {
                        scores[r] += qx * k_rows[r * d_k + dd];
                    }
                }
                #[unroll(unroll_d)]
                for dd in 0..d_v {
                    let dox = do_vals[dd];
                    #[unroll]
                    for r in 0..rows {
                        d_probs[r] += dox * v_rows[r * d_v + dd];
                    }
                }
                #[unroll]
                for r in 0..rows {
                    let key_idx = first_key + r * UNITS;
                    let banded = key_idx < m
                        && in_band(
                            centre,
                            key_idx as i32,
                            left,
                            right,
                            causal,
                            has_left,
                            has_right,
                        );
                    let pair = Pair {
                        query_segment,
                        key_segment: segment_rows[r],
                        slope,
                        centre,
                        key: key_idx as i32,
                        bad_key: false,
                    };
                    let (visible, added, _) = read_bias(
                        extra,
                        banded,
                        extra_base + key_idx,
                        pair,
                        has_extra,
                        has_segments,
                        has_alibi,
                    );
                    let mut p = 0.0f32;
                    let mut ds = 0.0f32;
                    if visible {
                        let mut s = scores[r];
                        let mut cap_grad = 1.0f32;
                        if capped {
                            let t = (s / softcap).tanh();
                            s = softcap * t;
                            cap_grad = 1.0f32 - t * t;
                        }
                        s += added;
                        p = (s - lse_i).exp();
                        ds = p * (d_probs[r] - delta_i) * cap_grad;
                    }
                    weights[r] = p;
                    d_weights[r] = ds;
                }
                #[unroll(unroll_d)]
                for dd in 0..d_v {
                    let dox = do_vals[dd];
                    #[unroll]
                    for r in 0..rows {
                        dv_acc[r * d_v + dd] += weights[r] * dox;
                    }
                }
                #[unroll(unroll_d)]
                for dd in 0..d_k {
                    let qx = q_vals[dd];
                    #[unroll]
                    for r in 0..rows {
                        dk_acc[r * d_k + dd] += d_weights[r] * qx;
                    }
                }
            }
            if !planes {
                sync_cube();
            }
        }
    }
    #[unroll]
    for r in 0..rows {
        let key_idx = first_key + r * UNITS;
        if key_idx < m {
            let key_row_idx = kvb * m + key_idx;
            #[unroll(unroll_d)]
            for dd in 0..d_k {
                dk[key_row_idx * d_k + dd] = F::cast_from(dk_acc[r * d_k + dd] * scale);
            }
            #[unroll(unroll_d)]
            for dd in 0..d_v {
                dv[key_row_idx * d_v + dd] = F::cast_from(dv_acc[r * d_v + dd]);
            }
        }
    }
}
