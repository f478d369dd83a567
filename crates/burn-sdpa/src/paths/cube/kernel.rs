//! The flash forward pass in CubeCL: one cube per (batch·head, block of `QUERY_ROWS` queries),
//! one unit per query row; the keys and values of each tile of `KEY_ROWS` keys are loaded into
//! shared memory by the cube's units together, and every unit runs the online softmax of its row
//! over them in registers, then writes its context row and log-sum-exp.

use cubecl::prelude::*;

/// Queries per cube (one unit each).
pub(crate) const QUERY_ROWS: usize = 32;
/// Keys per shared-memory tile.
pub(crate) const KEY_ROWS: usize = 32;

/// A score that stands for −∞ (WGSL has no −∞ literal): far below any finite scaled score a
/// visible key gives, and its exponential underflows to 0.
const HIDDEN: f32 = -3.0e38;
/// An entry of `extra` at or below this hides its key: the masks come in as [`HIDDEN`], a −∞
/// bias entry as itself.
pub(crate) const MASKED: f32 = -1.0e38;

/// `context [b, h, n, d_v]` and `lse [b, h, n]` (+∞ for a row with no visible key, whose context
/// row is 0) of softmax(q kᵀ · scale, soft-capped, plus `extra`, causal and windowed) v, with
/// grouped-query heads (query head i reads kv head i / group). `extra` `[b|1, h|1, n|1, m]` (read
/// when `has_extra`) holds the bias, with the masked keys at [`MASKED`] or below. Every tensor is
/// contiguous row-major.
///
/// Visibility of key j to query i (c = i + `offset`, the diagonal): `j ≤ c` when `causal`,
/// `j ≥ c − left` when `has_left`, `j ≤ c + right` when `has_right`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_forward<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    extra: &Tensor<F>,
    context: &mut Tensor<F>,
    lse: &mut Tensor<F>,
    scale: f32,
    softcap: f32,
    offset: i32,
    left: i32,
    right: i32,
    #[comptime] d_k: usize,
    #[comptime] d_v: usize,
    #[comptime] causal: bool,
    #[comptime] has_left: bool,
    #[comptime] has_right: bool,
    #[comptime] capped: bool,
    #[comptime] has_extra: bool,
    #[define(F)] _dtype: ElemType,
) {
    let n = q.shape(2);
    let m = k.shape(2);
    let n_heads = q.shape(1);
    let n_kv_heads = k.shape(1);
    let group = n_heads / n_kv_heads;
    let bh = CUBE_POS_Y as usize;
    let batch_idx = bh / n_heads;
    let head_idx = bh % n_heads;
    let kv = batch_idx * n_kv_heads + head_idx / group;
    let row = UNIT_POS_X as usize;
    let query_idx = CUBE_POS_X as usize * QUERY_ROWS + row;
    let active = query_idx < n;

    let mut k_tile = Shared::<[F]>::new_slice(KEY_ROWS * d_k);
    let mut v_tile = Shared::<[F]>::new_slice(KEY_ROWS * d_v);

    // The query row, scaled, in registers.
    let mut q_row = Array::<F>::new(d_k);
    let q_base = (bh * n + query_idx) * d_k;
    #[unroll]
    for dd in 0..d_k {
        let mut x = F::new(0.0);
        if active {
            x = q[q_base + dd];
        }
        q_row[dd] = x * F::cast_from(scale);
    }
    let mut acc = Array::<F>::new(d_v);
    #[unroll]
    for dd in 0..d_v {
        acc[dd] = F::new(0.0);
    }
    let mut row_max = F::new(HIDDEN);
    let mut row_sum = F::new(0.0);
    let centre = query_idx as i32 + offset;
    // The row of `extra` `[b|1, h|1, n|1, m]` this query reads (a broadcast axis reads index 0).
    let mut extra_row = 0usize;
    if has_extra {
        let (e0, e1, e2) = (extra.shape(0), extra.shape(1), extra.shape(2));
        let eb = if e0 == 1 { 0usize } else { batch_idx };
        let eh = if e1 == 1 { 0usize } else { head_idx };
        let mut ei = 0usize;
        if e2 != 1 && active {
            ei = query_idx;
        }
        extra_row = ((eb * e1 + eh) * e2 + ei) * m;
    }

    let n_tiles = m.div_ceil(KEY_ROWS);
    for tile_idx in 0..n_tiles {
        let key_start = tile_idx * KEY_ROWS;
        // Load the tile together: unit r loads key rows r, r + QUERY_ROWS, ...
        let mut key_row = row;
        while key_row < KEY_ROWS {
            let key_idx = key_start + key_row;
            #[unroll]
            for dd in 0..d_k {
                let mut x = F::new(0.0);
                if key_idx < m {
                    x = k[(kv * m + key_idx) * d_k + dd];
                }
                k_tile[key_row * d_k + dd] = x;
            }
            #[unroll]
            for dd in 0..d_v {
                let mut x = F::new(0.0);
                if key_idx < m {
                    x = v[(kv * m + key_idx) * d_v + dd];
                }
                v_tile[key_row * d_v + dd] = x;
            }
            key_row += QUERY_ROWS;
        }
        sync_cube();
        for key_row in 0..KEY_ROWS {
            let key_idx = key_start + key_row;
            let j = key_idx as i32;
            let mut visible = key_idx < m && active;
            if causal {
                visible = visible && j <= centre;
            }
            if has_left {
                visible = visible && j >= centre - left;
            }
            if has_right {
                visible = visible && j <= centre + right;
            }
            let mut added = F::new(0.0);
            if has_extra && visible {
                added = extra[extra_row + key_idx];
                // A masked key (or a −∞ bias entry) is hidden, not merely down-weighted.
                visible = added > F::new(MASKED);
            }
            if visible {
                let mut s = F::new(0.0);
                #[unroll]
                for dd in 0..d_k {
                    s += q_row[dd] * k_tile[key_row * d_k + dd];
                }
                if capped {
                    let cap = F::cast_from(softcap);
                    s = cap * (s / cap).tanh();
                }
                // The bias is added after the soft-cap, as on every path.
                s += added;
                let new_max = F::max(row_max, s);
                let correction = (row_max - new_max).exp();
                let p = (s - new_max).exp();
                row_sum = row_sum * correction + p;
                #[unroll]
                for dd in 0..d_v {
                    acc[dd] = acc[dd] * correction + p * v_tile[key_row * d_v + dd];
                }
                row_max = new_max;
            }
        }
        sync_cube();
    }
    if active {
        let out_base = (bh * n + query_idx) * d_v;
        if row_sum > F::new(0.0) {
            let inv = F::new(1.0) / row_sum;
            #[unroll]
            for dd in 0..d_v {
                context[out_base + dd] = acc[dd] * inv;
            }
            lse[bh * n + query_idx] = row_max + row_sum.ln();
        } else {
            // No visible key: a zero row, and a log-sum-exp of +∞ (the other paths' rule).
            #[unroll]
            for dd in 0..d_v {
                context[out_base + dd] = F::new(0.0);
            }
            lse[bh * n + query_idx] = F::new(3.0e38);
        }
    }
}
