//! The flash backward pass in CubeCL (FlashAttention-2): the weights are recomputed key by key
//! from the forward's log-sum-exp, nothing of size n × m is stored, and every unit owns the rows it
//! writes (no atomics: the result does not depend on scheduling).
//!
//! - `flash_backward_dq`: one cube of [`UNITS`](super::steps::UNITS) units per (batch·head,
//!   block of `UNITS · rows` queries), `rows` query rows per unit, the keys and values streamed
//!   past them (`stream.rs`: shared tiles or plane broadcasts): dQ.
//! - `flash_backward_dkdv`: one cube per (batch·kv head, block of `UNITS · rows` keys), `rows` key
//!   rows per unit, the queries of every head of the group (with dO, the log-sum-exp and
//!   D = rowsum(dO ∘ O)) streamed past them: dK and dV, and when the bias wants its
//!   gradient the score gradient (each (query, key) pair is met once, by the unit owning the key).
//!
//! A row the forward pass poisoned or that saw no key has the log-sum-exp `config::POISONED` or
//! `config::NO_KEY`, so its weights `exp(s − lse)` are 0: it adds nothing to any gradient (bad
//! keys are zeroed before the kernels; a NaN or +∞ bias entry counts as 0).
//!
//! As in the forward pass, every element read from shared memory feeds `rows` multiply-adds,
//! every sum over d accumulates into an array indexed by the unit's rows (d outermost, unrolled
//! when `unroll_d`), the tiles are `tile.rs`'s (`tile_rows`, `planes`), everything is computed in
//! f32 whatever the storage type `F` (only dQ, dK, dV are rounded to it), and the grid's second
//! and third axes together index the (batch·head) rows.

use cubecl::prelude::*;

use super::blocks::{KeyStep, KeyStepExpand, QueryBlock, query_block, query_range, stream_keys};
use super::config::{FlashConfig, Scalars, Terms};
use super::pair::{Pair, bias_row, own_segments, read_pair, segment_of, slope_of};
use super::steps::{
    Block, UNITS, add_outer, dot_rows, filled_rows, grid_block, load_rows, load_values, per_row,
    soft_cap, store_row,
};
use super::stream::{RowStream, tile_span};

/// The gradients of one (query, key) score: the weight `p = exp(s − lse)`, the gradient of the
/// score after the soft-cap (the bias's) `p · (dp − D)`, and that of the score before it; all
/// 0 for a hidden key. `score` is q·k (scaled), `added` the bias and ALiBi the key adds.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn score_grads(
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

/// The unit's query rows in the dQ kernel: the scaled queries, dO and the dQ sums in registers
/// (`[r · d + dd]`), per row its log-sum-exp, D and segment; and one key's scratch.
#[derive(CubeType)]
struct QueryRows {
    q: Array<f32>,
    d_out: Array<f32>,
    dq: Array<f32>,
    lse: Array<f32>,
    delta: Array<f32>,
    segment: Array<i32>,
    scores: Array<f32>,
    d_probs: Array<f32>,
    d_weights: Array<f32>,
}

#[cube]
impl QueryRows {
    /// The unit's rows of `block` before any key.
    #[allow(clippy::too_many_arguments)]
    fn new<F: Float>(
        q: &Tensor<F>,
        d_out: &Tensor<F>,
        lse: &Tensor<f32>,
        delta: &Tensor<f32>,
        block: &QueryBlock,
        terms: &Terms,
        scalars: &Scalars,
        #[comptime] config: FlashConfig,
    ) -> QueryRows {
        let (grid, n) = (&block.grid, block.n);
        QueryRows {
            q: load_rows::<F>(q, grid, n, scalars.scale, config.d_k, config),
            d_out: load_rows::<F>(d_out, grid, n, 1.0f32, config.d_v, config),
            lse: load_values(lse, grid, n, config),
            delta: load_values(delta, grid, n, config),
            segment: own_segments(&terms.q_segments, grid, n, config),
            dq: filled_rows(0.0f32, config.d_k, config),
            scores: per_row(config),
            d_probs: per_row(config),
            d_weights: per_row(config),
        }
    }
}

#[cube]
impl KeyStep for QueryRows {
    /// Adds key `key_idx` (in `keys`) to every row's dQ (a row that sees a bad key is poisoned:
    /// its weights are 0 here).
    fn add_key(
        &mut self,
        keys: &RowStream,
        key_idx: usize,
        _bad_keys: &Tensor<f32>,
        block: &QueryBlock,
        terms: &Terms,
        scalars: &Scalars,
        #[comptime] config: FlashConfig,
    ) {
        let key_segment = segment_of(
            &terms.k_segments,
            block.grid.batch_idx,
            key_idx,
            block.m,
            config,
        );
        // s[r] = q_r · k_j and dp[r] = dO_r · v_j, d outermost.
        dot_rows(&mut self.scores, &self.q, &keys.a_vals, config.d_k, config);
        dot_rows(
            &mut self.d_probs,
            &self.d_out,
            &keys.b_vals,
            config.d_v,
            config,
        );
        #[unroll]
        for r in 0..config.rows {
            let (visible, added, _) = block.read(
                terms,
                scalars,
                r,
                key_idx,
                self.segment[r],
                key_segment,
                false,
                config,
            );
            let (_, _, ds) = score_grads(
                self.scores[r],
                added,
                visible,
                self.lse[r],
                self.d_probs[r],
                self.delta[r],
                scalars,
                config,
            );
            self.d_weights[r] = ds;
        }
        add_outer(
            &mut self.dq,
            &self.d_weights,
            &keys.a_vals,
            config.d_k,
            config,
        );
    }
}

/// dQ `[b, h, n, d_k]` of the forward pass with the same options (see
/// [`flash_forward`](super::forward::flash_forward)); `lse` and `delta` (D = rowsum(dO ∘ O)) are
/// `[b, h, n]`. `bad_keys` (the forward's flags) is not read: a row that sees a bad key is
/// poisoned and its weights are 0 here; it is an argument because the forward's and dQ's steps
/// share one key loop ([`stream_keys`]). Launched with [`UNITS`] units per cube and
/// `(n.div_ceil(UNITS · rows), y, z)` cubes, `y · z ≥ b · h`.
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
    bad_keys: &Tensor<f32>,
    dq: &mut Tensor<F>,
    scalars: Scalars,
    #[comptime] config: FlashConfig,
    #[define(F)] _dtype: ElemType,
) {
    let block = query_block::<F>(q, k, &terms, &scalars, config);
    if !block.grid.in_grid {
        terminate!();
    }
    let mut own = QueryRows::new::<F>(q, d_out, lse, delta, &block, &terms, &scalars, config);
    stream_keys::<F, QueryRows>(&mut own, k, v, bad_keys, &block, &terms, &scalars, config);
    #[unroll]
    for r in 0..config.rows {
        let (_, row_idx, active) = block.grid.own(r, block.n);
        if active {
            store_row::<F>(
                dq,
                &own.dq,
                r,
                row_idx,
                scalars.scale,
                config.d_k,
                config.unroll_d,
            );
        }
    }
}

/// The unit's key rows in the dK/dV kernel: the scaled keys, the values and the dK and dV sums
/// in registers (`[r · d + dd]`), per row its segment; and one query's scratch.
#[derive(CubeType)]
struct KeyRows {
    k: Array<f32>,
    v: Array<f32>,
    dk: Array<f32>,
    dv: Array<f32>,
    segment: Array<i32>,
    scores: Array<f32>,
    d_probs: Array<f32>,
    weights: Array<f32>,
    d_weights: Array<f32>,
}

#[cube]
impl KeyRows {
    /// The unit's rows of `block` (a block of keys) before any query.
    fn new<F: Float>(
        k: &Tensor<F>,
        v: &Tensor<F>,
        block: &Block,
        terms: &Terms,
        scalars: &Scalars,
        #[comptime] config: FlashConfig,
    ) -> KeyRows {
        let m = k.shape(2);
        let (d_k, d_v) = comptime!((config.d_k, config.d_v));
        KeyRows {
            k: load_rows::<F>(k, block, m, scalars.scale, d_k, config),
            v: load_rows::<F>(v, block, m, 1.0f32, d_v, config),
            segment: own_segments(&terms.k_segments, block, m, config),
            dk: filled_rows(0.0f32, d_k, config),
            dv: filled_rows(0.0f32, d_v, config),
            scores: per_row(config),
            d_probs: per_row(config),
            weights: per_row(config),
            d_weights: per_row(config),
        }
    }

    /// Adds query `query_idx` of `head` (in `queries`: the query and its dO) to every row's dK
    /// and dV, and with `write_scores` writes the gradients of its scores after the soft-cap
    /// into `d_scores`.
    #[allow(clippy::too_many_arguments)]
    fn add_query(
        &mut self,
        queries: &RowStream,
        lse: &Tensor<f32>,
        delta: &Tensor<f32>,
        d_scores: &mut Tensor<f32>,
        head: &HeadRows,
        query_idx: usize,
        terms: &Terms,
        scalars: &Scalars,
        #[comptime] config: FlashConfig,
    ) {
        let (n, m) = (head.n, head.m);
        let row_idx = head.row * n + query_idx;
        let query_segment = segment_of(&terms.q_segments, head.batch_idx, query_idx, n, config);
        let (bias_base, _) = bias_row(terms, head.batch_idx, head.head_idx, query_idx, m, config);
        // s[r] = q_i · k_r and dp[r] = dO_i · v_r, d outermost.
        dot_rows(
            &mut self.scores,
            &self.k,
            &queries.a_vals,
            config.d_k,
            config,
        );
        dot_rows(
            &mut self.d_probs,
            &self.v,
            &queries.b_vals,
            config.d_v,
            config,
        );
        let (lse_i, delta_i) = (lse[row_idx], delta[row_idx]);
        #[unroll]
        for r in 0..config.rows {
            let key_idx = head.first_key + r * UNITS;
            let pair = Pair {
                query_idx,
                key_idx,
                query_in: true,
                key_in: key_idx < m,
                query_segment,
                key_segment: self.segment[r],
                slope: head.slope,
                bad_key: false,
            };
            let (visible, added, _) = read_pair(terms, scalars, pair, bias_base + key_idx, config);
            let (p, ds_bias, ds) = score_grads(
                self.scores[r],
                added,
                visible,
                lse_i,
                self.d_probs[r],
                delta_i,
                scalars,
                config,
            );
            if config.write_scores && visible {
                d_scores[row_idx * m + key_idx] = ds_bias;
            }
            self.weights[r] = p;
            self.d_weights[r] = ds;
        }
        add_outer(
            &mut self.dv,
            &self.weights,
            &queries.b_vals,
            config.d_v,
            config,
        );
        add_outer(
            &mut self.dk,
            &self.d_weights,
            &queries.a_vals,
            config.d_k,
            config,
        );
    }
}

/// One query head of a key block's group, as the dK/dV kernel streams it: its (batch·head) row
/// and indices, its ALiBi slope, the sizes and the unit's first key.
#[derive(CubeType, Clone, Copy)]
struct HeadRows {
    row: usize,
    batch_idx: usize,
    head_idx: usize,
    slope: f32,
    n: usize,
    m: usize,
    first_key: usize,
}

/// dK `[b, h_kv, m, d_k]` and dV `[b, h_kv, m, d_v]`, summed over the query heads of each group,
/// of the forward pass with the same options; `lse` and `delta` as for
/// [`flash_backward_dq`]. With `write_scores`, also the gradient of the scores after the
/// soft-cap (the bias's) into `d_scores` `[b, h, n, m]`, which must hold zeros (the hidden
/// entries are not written; every other is written once, by the unit owning its key). Launched
/// with [`UNITS`] units per cube and `(m.div_ceil(UNITS · rows), y, z)` cubes, `y · z ≥ b · h_kv`.
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
    d_scores: &mut Tensor<f32>,
    dk: &mut Tensor<F>,
    dv: &mut Tensor<F>,
    scalars: Scalars,
    #[comptime] config: FlashConfig,
    #[define(F)] _dtype: ElemType,
) {
    let (n, m) = (q.shape(2), k.shape(2));
    let (n_heads, n_kv_heads) = (q.shape(1), k.shape(1));
    let group = n_heads / n_kv_heads;
    // The grid's rows are (batch·kv head) rows, its blocks blocks of keys.
    let block = grid_block(q.shape(0), n_kv_heads, config.rows);
    if !block.in_grid {
        terminate!();
    }
    let mut own = KeyRows::new::<F>(k, v, &block, &terms, &scalars, config);
    let last_key = block.start + comptime!(UNITS * config.rows) - 1;
    let (query_lo, query_hi) =
        query_range(block.start as i32, last_key as i32, n, &scalars, config);
    let (first_tile, end_tile) = tile_span(query_lo, query_hi, config);
    let mut queries = RowStream::new(config);
    for g in 0..group {
        let head_idx = block.head_idx * group + g;
        let head = HeadRows {
            row: block.batch_idx * n_heads + head_idx,
            batch_idx: block.batch_idx,
            head_idx,
            slope: slope_of(&terms, head_idx, config),
            n,
            m,
            first_key: block.first,
        };
        for tile_idx in first_tile..end_tile {
            let q_start = queries.load::<F>(q, d_out, head.row, tile_idx, n, config);
            for query_idx in q_start..min(q_start + config.tile_rows, query_hi) {
                let tile_row = query_idx - q_start;
                queries.fetch::<F>(q, d_out, head.row * n + query_idx, tile_row, config);
                own.add_query(
                    &queries, lse, delta, d_scores, &head, query_idx, &terms, &scalars, config,
                );
            }
            queries.end_tile(config);
        }
    }
    #[unroll]
    for r in 0..config.rows {
        let (_, row_idx, active) = block.own(r, m);
        if active {
            let (d_k, d_v) = comptime!((config.d_k, config.d_v));
            store_row::<F>(dk, &own.dk, r, row_idx, scalars.scale, d_k, config.unroll_d);
            store_row::<F>(dv, &own.dv, r, row_idx, 1.0f32, d_v, config.unroll_d);
        }
    }
}
