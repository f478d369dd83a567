//! The flash backward pass in CubeCL (FlashAttention-2): the weights are recomputed tile by tile
//! from the forward's log-sum-exp, nothing of size n × m is stored, and every unit owns the rows it
//! writes (no atomics: the result does not depend on scheduling).
//!
//! - `flash_backward_dq`: one cube per (batch·head, 32 queries), one unit per query row, the keys
//!   and values streamed through shared memory: dQ.
//! - `flash_backward_dkdv`: one cube per (batch·kv head, 32 keys), one unit per key row, the
//!   queries of every head of the group (with dO, the log-sum-exp and D = rowsum(dO ∘ O)) streamed
//!   through shared memory: dK and dV.

use cubecl::prelude::*;

use super::kernel::{KEY_ROWS, MASKED, QUERY_ROWS};

/// Whether key `key_idx` is visible to query `query_idx` under the causal mask and the window
/// (diagonal `query_idx + offset`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn in_band(
    query_idx: usize,
    key_idx: usize,
    offset: i32,
    left: i32,
    right: i32,
    #[comptime] causal: bool,
    #[comptime] has_left: bool,
    #[comptime] has_right: bool,
) -> bool {
    let centre = query_idx as i32 + offset;
    let j = key_idx as i32;
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

/// The offset of row (`batch_idx`, `head_idx`, `query_idx`) in `extra` `[b|1, h|1, n|1, m]`.
#[cube]
fn extra_row<F: Float>(
    extra: &Tensor<F>,
    batch_idx: usize,
    head_idx: usize,
    query_idx: usize,
    m: usize,
) -> usize {
    let (e0, e1, e2) = (extra.shape(0), extra.shape(1), extra.shape(2));
    let eb = if e0 == 1 { 0usize } else { batch_idx };
    let eh = if e1 == 1 { 0usize } else { head_idx };
    let ei = if e2 == 1 { 0usize } else { query_idx };
    ((eb * e1 + eh) * e2 + ei) * m
}

/// dQ `[b, h, n, d_k]` of the forward pass with the same options (see `flash_forward`); `lse` and
/// `delta` (D = rowsum(dO ∘ O)) are `[b, h, n]`. With `write_scores`, also the gradient of the
/// scores after the soft-cap (the bias's) into `d_scores` `[b, h, n, m]`, which must hold zeros
/// (the hidden entries are not written).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_backward_dq<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    extra: &Tensor<F>,
    d_out: &Tensor<F>,
    lse: &Tensor<F>,
    delta: &Tensor<F>,
    dq: &mut Tensor<F>,
    d_scores: &mut Tensor<F>,
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
    #[comptime] write_scores: bool,
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
    let mut safe_query = 0usize;
    if active {
        safe_query = query_idx;
    }

    let mut k_tile = Shared::<[F]>::new_slice(KEY_ROWS * d_k);
    let mut v_tile = Shared::<[F]>::new_slice(KEY_ROWS * d_v);

    let mut q_row = Array::<F>::new(d_k);
    let mut do_row = Array::<F>::new(d_v);
    let mut dq_acc = Array::<F>::new(d_k);
    let row_idx = bh * n + safe_query;
    #[unroll]
    for dd in 0..d_k {
        q_row[dd] = q[row_idx * d_k + dd] * F::cast_from(scale);
        dq_acc[dd] = F::new(0.0);
    }
    #[unroll]
    for dd in 0..d_v {
        do_row[dd] = d_out[row_idx * d_v + dd];
    }
    let lse_i = lse[row_idx];
    let delta_i = delta[row_idx];
    let mut extra_base = 0usize;
    if has_extra {
        extra_base = extra_row::<F>(extra, batch_idx, head_idx, safe_query, m);
    }

    let n_tiles = m.div_ceil(KEY_ROWS);
    for tile_idx in 0..n_tiles {
        let key_start = tile_idx * KEY_ROWS;
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
            let mut visible = active
                && key_idx < m
                && in_band(
                    query_idx, key_idx, offset, left, right, causal, has_left, has_right,
                );
            let mut added = F::new(0.0);
            if has_extra && visible {
                added = extra[extra_base + key_idx];
                visible = added > F::new(MASKED);
            }
            if visible {
                let mut s = F::new(0.0);
                #[unroll]
                for dd in 0..d_k {
                    s += q_row[dd] * k_tile[key_row * d_k + dd];
                }
                let mut cap_grad = F::new(1.0);
                if capped {
                    let cap = F::cast_from(softcap);
                    let t = (s / cap).tanh();
                    s = cap * t;
                    cap_grad = F::new(1.0) - t * t;
                }
                s += added;
                let p = (s - lse_i).exp();
                let mut dp = F::new(0.0);
                #[unroll]
                for dd in 0..d_v {
                    dp += do_row[dd] * v_tile[key_row * d_v + dd];
                }
                // The gradient of the score after the soft-cap, which is the bias's.
                let ds_bias = p * (dp - delta_i);
                if write_scores {
                    d_scores[row_idx * m + key_idx] = ds_bias;
                }
                let ds = ds_bias * cap_grad;
                #[unroll]
                for dd in 0..d_k {
                    dq_acc[dd] += ds * k_tile[key_row * d_k + dd];
                }
            }
        }
        sync_cube();
    }
    if active {
        #[unroll]
        for dd in 0..d_k {
            dq[row_idx * d_k + dd] = dq_acc[dd] * F::cast_from(scale);
        }
    }
}

/// dK `[b, h_kv, m, d_k]` and dV `[b, h_kv, m, d_v]`, summed over the query heads of each group.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_backward_dkdv<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    extra: &Tensor<F>,
    d_out: &Tensor<F>,
    lse: &Tensor<F>,
    delta: &Tensor<F>,
    dk: &mut Tensor<F>,
    dv: &mut Tensor<F>,
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
    let kvb = CUBE_POS_Y as usize;
    let batch_idx = kvb / n_kv_heads;
    let kv_head = kvb % n_kv_heads;
    let row = UNIT_POS_X as usize;
    let key_idx = CUBE_POS_X as usize * KEY_ROWS + row;
    let active = key_idx < m;
    let mut safe_key = 0usize;
    if active {
        safe_key = key_idx;
    }

    let mut q_tile = Shared::<[F]>::new_slice(QUERY_ROWS * d_k);
    let mut do_tile = Shared::<[F]>::new_slice(QUERY_ROWS * d_v);
    let mut lse_tile = Shared::<[F]>::new_slice(QUERY_ROWS);
    let mut delta_tile = Shared::<[F]>::new_slice(QUERY_ROWS);

    let mut k_row = Array::<F>::new(d_k);
    let mut v_row = Array::<F>::new(d_v);
    let mut dk_acc = Array::<F>::new(d_k);
    let mut dv_acc = Array::<F>::new(d_v);
    let key_row_idx = kvb * m + safe_key;
    #[unroll]
    for dd in 0..d_k {
        k_row[dd] = k[key_row_idx * d_k + dd];
        dk_acc[dd] = F::new(0.0);
    }
    #[unroll]
    for dd in 0..d_v {
        v_row[dd] = v[key_row_idx * d_v + dd];
        dv_acc[dd] = F::new(0.0);
    }
    let scale_f = F::cast_from(scale);

    let n_tiles = n.div_ceil(QUERY_ROWS);
    for g in 0..group {
        let head_idx = kv_head * group + g;
        let bh = batch_idx * n_heads + head_idx;
        for tile_idx in 0..n_tiles {
            let q_start = tile_idx * QUERY_ROWS;
            // Unit r loads query row r of the tile (KEY_ROWS = QUERY_ROWS units).
            let load_idx = q_start + row;
            let loads = load_idx < n;
            #[unroll]
            for dd in 0..d_k {
                let mut x = F::new(0.0);
                if loads {
                    x = q[(bh * n + load_idx) * d_k + dd];
                }
                q_tile[row * d_k + dd] = x;
            }
            #[unroll]
            for dd in 0..d_v {
                let mut x = F::new(0.0);
                if loads {
                    x = d_out[(bh * n + load_idx) * d_v + dd];
                }
                do_tile[row * d_v + dd] = x;
            }
            let mut l = F::new(0.0);
            let mut dl = F::new(0.0);
            if loads {
                l = lse[bh * n + load_idx];
                dl = delta[bh * n + load_idx];
            }
            lse_tile[row] = l;
            delta_tile[row] = dl;
            sync_cube();
            for query_row in 0..QUERY_ROWS {
                let query_idx = q_start + query_row;
                let mut visible = active
                    && query_idx < n
                    && in_band(
                        query_idx, key_idx, offset, left, right, causal, has_left, has_right,
                    );
                let mut added = F::new(0.0);
                if has_extra && visible {
                    let base = extra_row::<F>(extra, batch_idx, head_idx, query_idx, m);
                    added = extra[base + key_idx];
                    visible = added > F::new(MASKED);
                }
                if visible {
                    let mut s = F::new(0.0);
                    #[unroll]
                    for dd in 0..d_k {
                        s += q_tile[query_row * d_k + dd] * k_row[dd];
                    }
                    s *= scale_f;
                    let mut cap_grad = F::new(1.0);
                    if capped {
                        let cap = F::cast_from(softcap);
                        let t = (s / cap).tanh();
                        s = cap * t;
                        cap_grad = F::new(1.0) - t * t;
                    }
                    s += added;
                    let p = (s - lse_tile[query_row]).exp();
                    let mut dp = F::new(0.0);
                    #[unroll]
                    for dd in 0..d_v {
                        let d_o = do_tile[query_row * d_v + dd];
                        dv_acc[dd] += p * d_o;
                        dp += d_o * v_row[dd];
                    }
                    let ds = p * (dp - delta_tile[query_row]) * cap_grad;
                    #[unroll]
                    for dd in 0..d_k {
                        dk_acc[dd] += ds * q_tile[query_row * d_k + dd];
                    }
                }
            }
            sync_cube();
        }
    }
    if active {
        #[unroll]
        for dd in 0..d_k {
            dk[key_row_idx * d_k + dd] = dk_acc[dd] * scale_f;
        }
        #[unroll]
        for dd in 0..d_v {
            dv[key_row_idx * d_v + dd] = dv_acc[dd];
        }
    }
}
