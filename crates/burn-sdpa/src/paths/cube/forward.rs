//! The flash forward pass in CubeCL: one cube of [`UNITS`] units per (batch·head, block of
//! `UNITS · rows` queries), each unit owning `rows` query rows (rows `u`, `u + UNITS`, ...); every
//! unit runs the online softmax of its rows over the keys in registers, then writes its context
//! rows and log-sum-exps. The tiles of `tile_rows` keys outside the causal band and the window
//! are never visited.
//!
//! Each key and value row reaches the units one of two ways (`stream.rs`; a compile-time switch,
//! `planes`, chosen with `tile_rows` by `tile.rs` from the device's limits): loaded once per
//! plane of [`LANES`] lanes (each lane loads one element of every group of [`LANES`]) and handed
//! to the other lanes by plane broadcasts, where the device has plane operations and the head
//! sizes are multiples of [`LANES`]; else loaded by the cube's units together into shared memory,
//! tile by tile. Several rows per unit and the broadcasts both make every load feed many
//! multiply-adds, which is what makes the kernel fast on Mesa's lavapipe (a CPU driver, where
//! every load from shared or global memory is a loop over the SIMD lanes); the rows per unit are
//! chosen by the caller (`tile.rs`, measured on lavapipe only). Every sum over d accumulates into
//! an array indexed by the unit's rows, d outermost; the loops over d are unrolled when
//! `unroll_d`.
//!
//! [`UNITS`]: super::steps::UNITS
//! [`LANES`]: super::stream::LANES

use cubecl::prelude::*;

use super::blocks::{KeyStep, KeyStepExpand, QueryBlock, query_block, stream_keys};
use super::config::{FlashConfig, HIDDEN, NO_KEY, POISONED, Scalars, Terms};
use super::pair::{own_segments, segment_of};
use super::row_stats::{ROW_STATS, StatsAcc};
use super::steps::{
    chunk_of, dot_rows, filled_rows, load_rows, load_values, per_row, soft_cap, store_row,
};
use super::stream::RowStream;

/// The running max and sum a row starts from: a sink starts every row of its head with one
/// term e^(sink − max) = 1 at max = sink (a sink of −∞ is none); else [`HIDDEN`] and 0.
#[cube]
pub(crate) fn sink_start(
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

/// The unit's query rows and their online softmax: the scaled queries and the context sums in
/// registers (`[r · d_k + dd]`, `[r · d_v + dd]`), per row the running max and sum, whether it
/// is poisoned (1, by its own query or by a key it sees), its segment and its statistics; and
/// one key's scratch (the scores, weights and corrections of every row).
#[derive(CubeType)]
struct OnlineRows {
    q: Array<f32>,
    acc: Array<f32>,
    max: Array<f32>,
    sum: Array<f32>,
    poisoned: Array<f32>,
    segment: Array<i32>,
    stats: StatsAcc,
    scores: Array<f32>,
    weights: Array<f32>,
    corrections: Array<f32>,
}

#[cube]
impl OnlineRows {
    /// The unit's rows of `block` before any key: the queries loaded and scaled, the running max
    /// and sum at the sink's (see [`sink_start`]), the rows whose query held a non-finite value
    /// poisoned.
    fn new<F: Float>(
        q: &Tensor<F>,
        bad_queries: &Tensor<f32>,
        block: &QueryBlock,
        terms: &Terms,
        scalars: &Scalars,
        #[comptime] config: FlashConfig,
    ) -> OnlineRows {
        let (grid, n) = (&block.grid, block.n);
        let (start_max, start_sum) = sink_start(terms, q.shape(1), grid.head_idx, config);
        OnlineRows {
            q: load_rows::<F>(q, grid, n, scalars.scale, config.d_k, config),
            acc: filled_rows(0.0f32, config.d_v, config),
            max: filled_rows(start_max, 1usize, config),
            sum: filled_rows(start_sum, 1usize, config),
            poisoned: load_values(bad_queries, grid, n, config),
            segment: own_segments(&terms.q_segments, grid, n, config),
            stats: StatsAcc::new(config),
            scores: per_row(config),
            weights: per_row(config),
            corrections: per_row(config),
        }
    }

    /// Writes every row of the unit that is one of the `n`: its context `acc / sum` and its
    /// log-sum-exp, or [`POISONED`] when poisoned; a zero row and [`NO_KEY`] when it saw no key
    /// (the other paths' rule); and its statistics when `has_stats`.
    fn write<F: Float>(
        &self,
        context: &mut Tensor<F>,
        lse: &mut Tensor<f32>,
        stats: &mut Tensor<f32>,
        block: &QueryBlock,
        #[comptime] config: FlashConfig,
    ) {
        #[unroll]
        for r in 0..config.rows {
            let (_, row_idx, active) = block.grid.own(r, block.n);
            if active {
                let (row_max, row_sum) = (self.max[r], self.sum[r]);
                if config.has_stats {
                    self.stats
                        .write(stats, row_idx * ROW_STATS, r, row_max, row_sum);
                }
                let mut factor = 0.0f32;
                let mut row_lse = <f32 as Float>::new(NO_KEY);
                if row_sum > 0.0f32 {
                    factor = 1.0f32 / row_sum;
                    row_lse = row_max + row_sum.ln();
                    if self.poisoned[r] > 0.5f32 {
                        row_lse = POISONED;
                    }
                }
                store_row::<F>(
                    context,
                    &self.acc,
                    r,
                    row_idx,
                    factor,
                    config.d_v,
                    config.unroll_d,
                );
                lse[row_idx] = row_lse;
            }
        }
    }
}

#[cube]
impl KeyStep for OnlineRows {
    /// One step of every row's online softmax: key `key_idx` (in `keys`, flagged in `bad_keys`)
    /// scored, masked, and added to the running max and sum, the statistics and the context.
    fn add_key(
        &mut self,
        keys: &RowStream,
        key_idx: usize,
        bad_keys: &Tensor<f32>,
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
        let bad_key = bad_keys[block.kv * block.m + key_idx] > 0.5f32;
        // s[r] = q_r · k_j: one load of k per element, `rows` multiply-adds.
        dot_rows(&mut self.scores, &self.q, &keys.a_vals, config.d_k, config);
        #[unroll]
        for r in 0..config.rows {
            let (visible, added, poison) = block.read(
                terms,
                scalars,
                r,
                key_idx,
                self.segment[r],
                key_segment,
                bad_key,
                config,
            );
            if poison {
                self.poisoned[r] = 1.0f32;
            }
            let mut p = 0.0f32;
            let mut correction = 1.0f32;
            if visible {
                // The bias is added after the soft-cap, as on every path.
                let (capped, _) = soft_cap(self.scores[r], scalars, config);
                let s = capped + added;
                let old_max = self.max[r];
                let new_max = f32::max(old_max, s);
                correction = (old_max - new_max).exp();
                p = (s - new_max).exp();
                if config.has_stats {
                    self.stats.add(r, s, p, correction, old_max, new_max);
                }
                self.sum[r] = self.sum[r] * correction + p;
                self.max[r] = new_max;
            }
            self.weights[r] = p;
            self.corrections[r] = correction;
        }
        // acc[r · d_v + dd] = acc[r · d_v + dd] · correction[r] + weight[r] · v_j[dd].
        #[unroll(config.unroll_d)]
        for c in 0..comptime!(config.d_v / chunk_of(config.d_v)) {
            #[unroll]
            for i in 0..comptime!(chunk_of(config.d_v)) {
                let dd = c * comptime!(chunk_of(config.d_v)) + i;
                let x = keys.b_vals[dd];
                #[unroll]
                for r in 0..config.rows {
                    let idx = r * config.d_v + dd;
                    self.acc[idx] = self.acc[idx] * self.corrections[r] + self.weights[r] * x;
                }
            }
        }
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
/// `F`. Every tensor is contiguous row-major. Launched with [`UNITS`](super::steps::UNITS) units
/// per cube and `(n.div_ceil(UNITS · rows), y, z)` cubes, `y · z ≥ b · h` (see
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
    let block = query_block::<F>(q, k, &terms, &scalars, config);
    if !block.grid.in_grid {
        terminate!();
    }
    let mut own = OnlineRows::new::<F>(q, bad_queries, &block, &terms, &scalars, config);
    stream_keys::<F, OnlineRows>(&mut own, k, v, bad_keys, &block, &terms, &scalars, config);
    own.write::<F>(context, lse, stats, &block, config);
}
