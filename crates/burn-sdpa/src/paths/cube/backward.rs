//! The flash backward pass in CubeCL (FlashAttention-2): the weights are recomputed key by key
//! from the forward's log-sum-exp, nothing of size n × m is stored, and every unit owns the rows it
//! writes (no atomics: the result does not depend on scheduling).
//!
//! - `flash_backward_dq`: one cube of [`UNITS`](super::steps::UNITS) units per (batch·head, block of `UNITS · rows`
//!   queries), `rows` query rows per unit, the keys and values streamed through shared memory: dQ.
//! - `flash_backward_dkdv`: one cube per (batch·kv head, block of `UNITS · rows` keys), `rows` key
//!   rows per unit, the queries of every head of the group (with dO, the log-sum-exp and
//!   D = rowsum(dO ∘ O)) streamed through shared memory: dK and dV.
//!
//! A row the forward pass poisoned (see `config::POISONED`) or that saw no key has a
//! log-sum-exp of 2e38 or 3e38, so its weights `exp(s − lse)` are 0: it adds nothing to any
//! gradient (bad keys are zeroed before the kernels; a NaN or +∞ bias entry counts as 0).
//!
//! As in the forward pass, every element read from shared memory feeds `rows` multiply-adds,
//! every sum over d accumulates into an array indexed by the unit's rows (d outermost, unrolled
//! when `unroll_d`), the tiles are `tile.rs`'s (`tile_rows`, `planes`), everything is computed in
//! f32 whatever the storage type `F` (only dQ, dK, dV are rounded to it), and the grid's second
//! and third axes together index the (batch·head) rows.

use cubecl::prelude::*;

use super::blocks::{query_block, query_range};
use super::config::{FlashConfig, Scalars, Terms};
use super::pair::{Pair, bias_row, read_pair, segment_of, slope_of};
use super::steps::{
    UNITS, add_outer, dot_rows, end_tiles, fetch_rows, grid_block, load_row, load_tiles, soft_cap,
    store_row, tile_len, zero_row,
};

/// The gradients of one (query, key) score: the weight `p = exp(s − lse)`, the gradient of the
/// score after the soft-cap (the bias's) `p · (dp − D)`, and that of the score before it; all
/// 0 for a hidden key. `score` is q·k (scaled), `added` the bias and ALiBi the key adds.
#[cube]
#[allow(clippy::too_many_arguments)]
fn score_grads(
    score: f32,
    added: f32,
    visible: bool,
    lse: f32,
    d_prob: f32,
    delta: f32,
    scalars: &Scalars,
    #[comptime] config: FlashConfig,
) -> (f32, f32, f32) {
    let mut p = 0.0f32;
    let mut ds_bias = 0.0f32;
    let mut ds = 0.0f32;
    if visible {
        let (capped, cap_grad) = soft_cap(score, scalars, config);
        p = (capped + added - lse).exp();
        ds_bias = p * (d_prob - delta);
        ds = ds_bias * cap_grad;
    }
    (p, ds_bias, ds)
}

/// dQ `[b, h, n, d_k]` of the forward pass with the same options (see
/// [`flash_forward`](super::forward::flash_forward)); `lse` and `delta` (D = rowsum(dO ∘ O)) are
/// `[b, h, n]`. With `write_scores`, also the gradient of the scores after the soft-cap (the
/// bias's) into `d_scores` `[b, h, n, m]`, which must hold zeros (the hidden entries are not
/// written). Launched with [`UNITS`] units per cube and `(n.div_ceil(UNITS · rows), y, z)`
/// cubes, `y · z ≥ b · h`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_backward_dq<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    terms: Terms,
    d_out: &Tensor<F>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    dq: &mut Tensor<F>,
    d_scores: &mut Tensor<f32>,
    scalars: Scalars,
    #[comptime] config: FlashConfig,
    #[define(F)] _dtype: ElemType,
) {
    let d_k = comptime!(config.d_k);
    let d_v = comptime!(config.d_v);
    let rows = comptime!(config.rows);
    let block = query_block::<F>(q, k, &terms, &scalars, config);
    if !block.grid.in_grid {
        terminate!();
    }
    let (n, m, kv) = (block.n, block.m, block.kv);
    let mut k_tile =
        Shared::<[f32]>::new_slice(comptime!(tile_len(config.planes, config.tile_rows, d_k)));
    let mut v_tile =
        Shared::<[f32]>::new_slice(comptime!(tile_len(config.planes, config.tile_rows, d_v)));
    let mut q_rows = Array::<f32>::new(comptime!(rows * d_k));
    let mut do_rows = Array::<f32>::new(comptime!(rows * d_v));
    let mut dq_acc = Array::<f32>::new(comptime!(rows * d_k));
    // Per row: the log-sum-exp, D and the segment.
    let mut row_lse = Array::<f32>::new(rows);
    let mut row_delta = Array::<f32>::new(rows);
    let mut segment_rows = Array::<i32>::new(rows);
    #[unroll]
    for r in 0..rows {
        let query_idx = block.query(r);
        let row_idx = block.grid.row * n + query_idx;
        let active = query_idx < n;
        load_row::<F>(
            q,
            &mut q_rows,
            r,
            row_idx,
            active,
            scalars.scale,
            d_k,
            config.unroll_d,
        );
        zero_row(&mut dq_acc, r, d_k, config.unroll_d);
        load_row::<F>(
            d_out,
            &mut do_rows,
            r,
            row_idx,
            active,
            1.0f32,
            d_v,
            config.unroll_d,
        );
        let mut l = 0.0f32;
        let mut dl = 0.0f32;
        if active {
            l = lse[row_idx];
            dl = delta[row_idx];
        }
        row_lse[r] = l;
        row_delta[r] = dl;
        segment_rows[r] = segment_of(
            &terms.q_segments,
            block.grid.batch_idx,
            query_idx,
            n,
            config,
        );
    }
    let mut k_vals = Array::<f32>::new(d_k);
    let mut v_vals = Array::<f32>::new(d_v);
    let mut scores = Array::<f32>::new(rows);
    let mut d_probs = Array::<f32>::new(rows);
    let mut d_weights = Array::<f32>::new(rows);
    for tile_idx in block.key_lo / config.tile_rows..block.key_hi.div_ceil(config.tile_rows) {
        let key_start = tile_idx * config.tile_rows;
        load_tiles::<F>(
            k,
            v,
            &mut k_tile,
            &mut v_tile,
            kv,
            key_start,
            m,
            block.grid.unit,
            config,
        );
        for key_row in 0..min(config.tile_rows, block.key_hi - key_start) {
            let key_idx = key_start + key_row;
            fetch_rows::<F>(
                k,
                v,
                &k_tile,
                &v_tile,
                &mut k_vals,
                &mut v_vals,
                kv * m + key_idx,
                key_row,
                config,
            );
            let key_segment =
                segment_of(&terms.k_segments, block.grid.batch_idx, key_idx, m, config);
            // s[r] = q_r · k_j and dp[r] = dO_r · v_j, d outermost.
            dot_rows(&mut scores, &q_rows, &k_vals, d_k, config);
            dot_rows(&mut d_probs, &do_rows, &v_vals, d_v, config);
            #[unroll]
            for r in 0..rows {
                let (visible, added, _) = block.read(
                    &terms,
                    &scalars,
                    r,
                    key_idx,
                    segment_rows[r],
                    key_segment,
                    false,
                    config,
                );
                let (_, ds_bias, ds) = score_grads(
                    scores[r],
                    added,
                    visible,
                    row_lse[r],
                    d_probs[r],
                    row_delta[r],
                    &scalars,
                    config,
                );
                if config.write_scores && visible {
                    d_scores[(block.grid.row * n + block.query(r)) * m + key_idx] = ds_bias;
                }
                d_weights[r] = ds;
            }
            add_outer(&mut dq_acc, &d_weights, &k_vals, d_k, config);
        }
        end_tiles(config);
    }
    #[unroll]
    for r in 0..rows {
        let query_idx = block.query(r);
        if query_idx < n {
            store_row::<F>(
                dq,
                &dq_acc,
                r,
                block.grid.row * n + query_idx,
                scalars.scale,
                d_k,
                config.unroll_d,
            );
        }
    }
}

/// dK `[b, h_kv, m, d_k]` and dV `[b, h_kv, m, d_v]`, summed over the query heads of each group.
/// Launched with [`UNITS`] units per cube and `(m.div_ceil(UNITS · rows), y, z)` cubes,
/// `y · z ≥ b · h_kv`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_backward_dkdv<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    terms: Terms,
    d_out: &Tensor<F>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    dk: &mut Tensor<F>,
    dv: &mut Tensor<F>,
    scalars: Scalars,
    #[comptime] config: FlashConfig,
    #[define(F)] _dtype: ElemType,
) {
    let d_k = comptime!(config.d_k);
    let d_v = comptime!(config.d_v);
    let rows = comptime!(config.rows);
    let (n, m) = (q.shape(2), k.shape(2));
    let n_heads = q.shape(1);
    let n_kv_heads = k.shape(1);
    let group = n_heads / n_kv_heads;
    // The grid's rows are (batch·kv head) rows, its blocks blocks of keys.
    let block = grid_block(q.shape(0), n_kv_heads, rows);
    if !block.in_grid {
        terminate!();
    }
    let mut q_tile =
        Shared::<[f32]>::new_slice(comptime!(tile_len(config.planes, config.tile_rows, d_k)));
    let mut do_tile =
        Shared::<[f32]>::new_slice(comptime!(tile_len(config.planes, config.tile_rows, d_v)));
    let mut k_rows = Array::<f32>::new(comptime!(rows * d_k));
    let mut v_rows = Array::<f32>::new(comptime!(rows * d_v));
    let mut dk_acc = Array::<f32>::new(comptime!(rows * d_k));
    let mut dv_acc = Array::<f32>::new(comptime!(rows * d_v));
    let mut segment_rows = Array::<i32>::new(rows);
    #[unroll]
    for r in 0..rows {
        let key_idx = block.first + r * UNITS;
        let row_idx = block.row * m + key_idx;
        let active = key_idx < m;
        load_row::<F>(
            k,
            &mut k_rows,
            r,
            row_idx,
            active,
            scalars.scale,
            d_k,
            config.unroll_d,
        );
        zero_row(&mut dk_acc, r, d_k, config.unroll_d);
        load_row::<F>(
            v,
            &mut v_rows,
            r,
            row_idx,
            active,
            1.0f32,
            d_v,
            config.unroll_d,
        );
        zero_row(&mut dv_acc, r, d_v, config.unroll_d);
        segment_rows[r] = segment_of(&terms.k_segments, block.batch_idx, key_idx, m, config);
    }
    let last_key = block.start + comptime!(UNITS * rows) - 1;
    let (query_lo, query_hi) =
        query_range(block.start as i32, last_key as i32, n, &scalars, config);
    let mut q_vals = Array::<f32>::new(d_k);
    let mut do_vals = Array::<f32>::new(d_v);
    let mut scores = Array::<f32>::new(rows);
    let mut d_probs = Array::<f32>::new(rows);
    let mut weights = Array::<f32>::new(rows);
    let mut d_weights = Array::<f32>::new(rows);
    for g in 0..group {
        let head_idx = block.head_idx * group + g;
        let bh = block.batch_idx * n_heads + head_idx;
        let slope = slope_of(&terms, head_idx, config);
        for tile_idx in query_lo / config.tile_rows..query_hi.div_ceil(config.tile_rows) {
            let q_start = tile_idx * config.tile_rows;
            load_tiles::<F>(
                q,
                d_out,
                &mut q_tile,
                &mut do_tile,
                bh,
                q_start,
                n,
                block.unit,
                config,
            );
            for query_row in 0..min(config.tile_rows, query_hi - q_start) {
                let query_idx = q_start + query_row;
                let row_idx = bh * n + query_idx;
                fetch_rows::<F>(
                    q,
                    d_out,
                    &q_tile,
                    &do_tile,
                    &mut q_vals,
                    &mut do_vals,
                    row_idx,
                    query_row,
                    config,
                );
                let query_segment =
                    segment_of(&terms.q_segments, block.batch_idx, query_idx, n, config);
                let (bias_base, _) =
                    bias_row(&terms, block.batch_idx, head_idx, query_idx, m, config);
                // s[r] = q_i · k_r and dp[r] = dO_i · v_r, d outermost.
                dot_rows(&mut scores, &k_rows, &q_vals, d_k, config);
                dot_rows(&mut d_probs, &v_rows, &do_vals, d_v, config);
                let (lse_i, delta_i) = (lse[row_idx], delta[row_idx]);
                #[unroll]
                for r in 0..rows {
                    let key_idx = block.first + r * UNITS;
                    let pair = Pair {
                        query_idx,
                        key_idx,
                        query_in: true,
                        key_in: key_idx < m,
                        query_segment,
                        key_segment: segment_rows[r],
                        slope,
                        bad_key: false,
                    };
                    let (visible, added, _) =
                        read_pair(&terms, &scalars, pair, bias_base + key_idx, config);
                    let (p, _, ds) = score_grads(
                        scores[r], added, visible, lse_i, d_probs[r], delta_i, &scalars, config,
                    );
                    weights[r] = p;
                    d_weights[r] = ds;
                }
                add_outer(&mut dv_acc, &weights, &do_vals, d_v, config);
                add_outer(&mut dk_acc, &d_weights, &q_vals, d_k, config);
            }
            end_tiles(config);
        }
    }
    #[unroll]
    for r in 0..rows {
        let key_idx = block.first + r * UNITS;
        if key_idx < m {
            let row_idx = block.row * m + key_idx;
            store_row::<F>(dk, &dk_acc, r, row_idx, scalars.scale, d_k, config.unroll_d);
            store_row::<F>(dv, &dv_acc, r, row_idx, 1.0f32, d_v, config.unroll_d);
        }
    }
}
