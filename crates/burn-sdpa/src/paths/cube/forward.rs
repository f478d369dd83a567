//! The flash forward pass in CubeCL: one cube of [`UNITS`](super::steps::UNITS) units per (batch·head, block of
//! `UNITS · rows` queries), each unit owning `rows` query rows (rows `u`, `u + UNITS`, ...); every
//! unit runs the online softmax of its rows over the keys in registers, then writes its context
//! rows and log-sum-exps. The tiles of `tile_rows` keys outside the causal band and the window
//! are never visited.
//!
//! Each key and value row reaches the units one of two ways (a compile-time switch, `planes`,
//! chosen with `tile_rows` by `tile.rs` from the device's limits): loaded once per plane of
//! [`LANES`](super::steps::LANES) lanes (each lane loads one element of every group of [`LANES`](super::steps::LANES)) and handed to the
//! other lanes by plane broadcasts, where the device has plane operations and the head sizes are
//! multiples of [`LANES`](super::steps::LANES); else loaded by the cube's units together into shared memory, tile by
//! tile. Several rows per unit and the broadcasts both make every load feed many multiply-adds,
//! which is what makes the kernel fast on Mesa's lavapipe (a CPU driver, where every load from
//! shared or global memory is a loop over the SIMD lanes); the rows per unit are chosen by the
//! caller (`tile.rs`, measured on lavapipe only). Every sum over d accumulates into an array
//! indexed by the unit's rows, d outermost; the loops over d are unrolled when `unroll_d`.

use cubecl::prelude::*;

use super::blocks::query_block;
use super::config::{FlashConfig, HIDDEN, NO_KEY, POISONED, Scalars, Terms};
use super::pair::segment_of;
use super::row_stats::{ROW_STATS, StatsAcc};
use super::steps::{
    dot_rows, end_tiles, fetch_rows, load_row, load_tiles, soft_cap, store_row, tile_len, zero_row,
};

/// The running max and sum a row starts from: a sink starts every row of its head with one
/// term e^(sink − max) = 1 at max = sink (a sink of −∞ is none); else [`HIDDEN`] and 0.
#[cube]
fn sink_start(
    terms: &Terms,
    n_heads: usize,
    head_idx: usize,
    #[comptime] config: FlashConfig,
) -> (f32, f32) {
    let mut start_max = <f32 as Float>::new(HIDDEN);
    let mut start_sum = 0.0f32;
    if config.has_sinks {
        let sink = terms.per_head[n_heads + head_idx];
        if sink > HIDDEN {
            start_max = sink;
            start_sum = 1.0f32;
        }
    }
    (start_max, start_sum)
}

/// `acc[r · d_v + dd] = acc[r · d_v + dd] · corrections[r] + weights[r] · vals[dd]`: the online
/// softmax's step of the unit's context rows.
#[cube]
fn rescale_add(
    acc: &mut Array<f32>,
    corrections: &Array<f32>,
    weights: &Array<f32>,
    vals: &Array<f32>,
    #[comptime] config: FlashConfig,
) {
    let d_v = comptime!(config.d_v);
    #[unroll(config.unroll_d)]
    for dd in 0..d_v {
        let x = vals[dd];
        #[unroll]
        for r in 0..config.rows {
            acc[r * d_v + dd] = acc[r * d_v + dd] * corrections[r] + weights[r] * x;
        }
    }
}

/// Writes the unit's row `r` (query row `row_idx` of `[b·h·n]`): its context `acc / sum` and its
/// log-sum-exp, or [`POISONED`] when `poisoned`; a zero row and [`NO_KEY`] when it saw no key
/// (the other paths' rule).
#[cube]
#[allow(clippy::too_many_arguments)]
fn write_row<F: Float>(
    context: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    acc: &Array<f32>,
    r: usize,
    row_idx: usize,
    row_max: f32,
    row_sum: f32,
    poisoned: bool,
    #[comptime] config: FlashConfig,
) {
    let d_v = comptime!(config.d_v);
    if row_sum > 0.0f32 {
        store_row::<F>(
            context,
            acc,
            r,
            row_idx,
            1.0f32 / row_sum,
            d_v,
            config.unroll_d,
        );
        let mut row_lse = row_max + row_sum.ln();
        if poisoned {
            row_lse = POISONED;
        }
        lse[row_idx] = row_lse;
    } else {
        store_row::<F>(context, acc, r, row_idx, 0.0f32, d_v, config.unroll_d);
        lse[row_idx] = NO_KEY;
    }
}

/// `context [b, h, n, d_v]` (in `F`) and `lse [b, h, n]` (f32; [`NO_KEY`] for a row with no
/// visible key, whose context row is 0; [`POISONED`] for a row the non-finite policy makes NaN,
/// see [`read_pair`](super::pair::read_pair); `bad_keys [b, h_kv, m]` and `bad_queries [b, h, n]`
/// are 1 for a row that held a non-finite value, the inputs themselves being zeroed) of
/// softmax(q kᵀ · scale, soft-capped, plus the bias and ALiBi, causal, windowed and within
/// segments) v, with grouped-query heads (query head i reads kv head i / group), and with
/// `has_stats` the row statistics into `stats [b, h, n, ROW_STATS]`. Everything is computed in
/// f32 whatever `F` is (f32, f16 or bf16): loads are widened, only the context is rounded to
/// `F`. Every tensor is contiguous row-major. Launched with [`UNITS`] units per cube and
/// `(n.div_ceil(UNITS · rows), y, z)` cubes, `y · z ≥ b · h` (see
/// [`grid_block`](super::steps::grid_block)).
///
/// Visibility of key j to query i (c = i + `offset`, the diagonal): `j ≤ c` when `causal`,
/// `j ≥ c − left` when `has_left`, `j ≤ c + right` when `has_right`, and the same segment.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_forward<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    terms: Terms,
    bad_keys: &Tensor<f32>,
    bad_queries: &Tensor<f32>,
    context: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    stats: &mut Tensor<f32>,
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
    // The query rows, scaled, in registers: q_rows[r · d_k + dd]; the context rows likewise.
    let mut q_rows = Array::<f32>::new(comptime!(rows * d_k));
    let mut acc = Array::<f32>::new(comptime!(rows * d_v));
    let mut row_max = Array::<f32>::new(rows);
    let mut row_sum = Array::<f32>::new(rows);
    // 1 where the row is poisoned: by its own query, or by a key it sees.
    let mut poisoned = Array::<f32>::new(rows);
    let mut segment_rows = Array::<i32>::new(rows);
    let mut stats_acc = StatsAcc::new(config);
    let (start_max, start_sum) = sink_start(&terms, q.shape(1), block.grid.head_idx, config);
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
        zero_row(&mut acc, r, d_v, config.unroll_d);
        row_max[r] = start_max;
        row_sum[r] = start_sum;
        let mut bad_query = 0.0f32;
        if active {
            bad_query = bad_queries[row_idx];
        }
        poisoned[r] = bad_query;
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
    let mut weights = Array::<f32>::new(rows);
    let mut corrections = Array::<f32>::new(rows);
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
            let bad_key = bad_keys[kv * m + key_idx] > 0.5f32;
            // s[r] = q_r · k_j: one load of k per element, `rows` multiply-adds.
            dot_rows(&mut scores, &q_rows, &k_vals, d_k, config);
            #[unroll]
            for r in 0..rows {
                let (visible, added, poison) = block.read(
                    &terms,
                    &scalars,
                    r,
                    key_idx,
                    segment_rows[r],
                    key_segment,
                    bad_key,
                    config,
                );
                if poison {
                    poisoned[r] = 1.0f32;
                }
                let mut p = 0.0f32;
                let mut correction = 1.0f32;
                if visible {
                    // The bias is added after the soft-cap, as on every path.
                    let (capped, _) = soft_cap(scores[r], &scalars, config);
                    let s = capped + added;
                    let new_max = f32::max(row_max[r], s);
                    correction = (row_max[r] - new_max).exp();
                    p = (s - new_max).exp();
                    if config.has_stats {
                        stats_acc.add(r, s, p, correction, row_max[r], new_max);
                    }
                    row_sum[r] = row_sum[r] * correction + p;
                    row_max[r] = new_max;
                }
                weights[r] = p;
                corrections[r] = correction;
            }
            rescale_add(&mut acc, &corrections, &weights, &v_vals, config);
        }
        end_tiles(config);
    }
    #[unroll]
    for r in 0..rows {
        let query_idx = block.query(r);
        if query_idx < n {
            let row_idx = block.grid.row * n + query_idx;
            if config.has_stats {
                stats_acc.write(stats, row_idx * ROW_STATS, r, row_max[r], row_sum[r]);
            }
            write_row::<F>(
                context,
                lse,
                &acc,
                r,
                row_idx,
                row_max[r],
                row_sum[r],
                poisoned[r] > 0.5f32,
                config,
            );
        }
    }
}
